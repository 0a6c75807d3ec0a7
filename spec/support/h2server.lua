-- A tiny HTTP/2 server over cleartext TCP (h2c with prior knowledge, RFC
-- 9113 section 3.3) for transport specs: enough framing to answer a request
-- or to break it the ways a provider's edge does (RST_STREAM, GOAWAY), so
-- specs provoke curl's real HTTP/2 errors on loopback. Request headers are
-- not decoded (HPACK): each request is its stream id, in arrival order.
local testserver = require "testserver"

local M = {}

local PREFACE = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
local DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY = 0, 1, 3, 4, 6, 7
local END_STREAM, ACK, END_HEADERS = 0x1, 0x1, 0x4

M.errors = { NO_ERROR = 0, PROTOCOL_ERROR = 1, INTERNAL_ERROR = 2, REFUSED_STREAM = 7 }

local function frame(type_, flags, stream, payload)
  payload = payload or ""
  return string.pack(">I3BBI4", #payload, type_, flags, stream) .. payload
end

-- An HPACK string literal (no Huffman), for lengths under 127.
local function hstr(s) return string.char(#s) .. s end

-- The response head: ":status" and content-type, as literals without
-- indexing on static-table names (8 is ":status 200", 31 content-type).
local function head_block(status, content_type)
  local block = status == 200 and "\x88" or ("\x08" .. hstr(tostring(status)))
  if content_type then block = block .. "\x0f\x10" .. hstr(content_type) end
  return block
end

-- What a stream's answer may do, as a list of steps:
--   {"headers", status, content_type}, {"data", bytes [, true (ends the stream)]},
--   {"rst", error_code}, {"goaway", error_code [, last_stream_id (default:
--   this stream)]}, {"close"}
M.steps = {}

-- A complete answer: 200, `content_type`, `body` in one DATA frame.
function M.answer(body, content_type)
  return { { "headers", 200, content_type or "text/event-stream" }, { "data", body, true } }
end

-- serve(plan) -> server {url=, port=, close=, streams=<requests seen>}.
-- plan(n) -> the steps for the n-th request (1-based, over every
-- connection).
function M.serve(plan)
  local srv
  srv = testserver.serve(function(conn)
    local buf = ""
    local function need(n)
      while #buf < n do
        local chunk = conn:read()
        if not chunk then return false end
        buf = buf .. chunk
      end
      return true
    end
    if not need(#PREFACE) or buf:sub(1, #PREFACE) ~= PREFACE then return end
    buf = buf:sub(#PREFACE + 1)
    conn:write(frame(SETTINGS, 0, 0))
    while need(9) do
      local len, type_, flags, stream = string.unpack(">I3BBI4", buf)
      stream = stream & 0x7fffffff
      if not need(9 + len) then return end
      local payload = buf:sub(10, 9 + len)
      buf = buf:sub(10 + len)
      if type_ == SETTINGS and flags & ACK == 0 then
        conn:write(frame(SETTINGS, ACK, 0))
      elseif type_ == PING and flags & ACK == 0 then
        conn:write(frame(PING, ACK, 0, payload))
      elseif type_ == GOAWAY then
        return
      elseif (type_ == HEADERS or type_ == DATA) and flags & END_STREAM ~= 0 then
        srv.streams = srv.streams + 1
        for _, step in ipairs(plan(srv.streams)) do
          local what = step[1]
          if what == "headers" then
            conn:write(frame(HEADERS, END_HEADERS, stream, head_block(step[2], step[3])))
          elseif what == "data" then
            conn:write(frame(DATA, step[3] and END_STREAM or 0, stream, step[2]))
          elseif what == "rst" then
            conn:write(frame(RST_STREAM, 0, stream, string.pack(">I4", step[2])))
          elseif what == "goaway" then
            conn:write(frame(GOAWAY, 0, 0, string.pack(">I4I4", step[3] or stream, step[2])))
          elseif what == "close" then
            return
          end
        end
      end
    end
  end, { raw = true })
  srv.streams = 0
  return srv
end

return M
