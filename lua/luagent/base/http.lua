-- HTTP on the loop: luagent.http.request{...} returns a response once its
-- headers arrive; the body is read as a stream (SSE events, NDJSON lines or
-- raw chunks). A failure while the body streams is raised from the iterator
-- and left in resp.error, so a loop over events never ends silently on a cut
-- stream. Transport failures are error records (lua/luagent/EVENTS.md):
-- the core reports what curl saw (code, message, errno, phase) under the
-- neutral kind `transport`, and M.name_kind below names the kind; whether a
-- failure is worth another attempt is lua/luagent/model/classify.lua's business.
local core = require "luagent.core"
local errors = require "luagent.base.errors"
local secrets = require "luagent.base.secrets"
local json = require "luagent.base.json"

local M = {}

-- Error bodies are kept up to this size in `http` error records (scrubbed
-- of keys before the cut: lua/luagent/base/secrets.lua).
M.ERROR_BODY_MAX = 64 * 1024

-- The kind of a failure curl reported, by its code (curl/curl.h). Codes
-- 7, 55 and 56 depend on more facts (M.name_kind); the rest stay `transport`.
M.curl_kinds = {
  [5] = "dns", [6] = "dns",         -- couldn't resolve proxy, host
  [28] = "timeout",                 -- the connect timeout (the only one curl runs)
  [35] = "tls", [58] = "tls", [59] = "tls", [60] = "tls", [77] = "tls",
  [83] = "tls", [90] = "tls", [91] = "tls", -- handshake, certificates, pinning
  [52] = "eof",                     -- got nothing
  [18] = "truncated",               -- partial file
  [8] = "protocol", [61] = "protocol", -- weird server reply, bad content encoding
  [16] = "protocol", [92] = "protocol", -- HTTP/2 framing, HTTP/2 stream
}

-- Phrases of curl's message for a receive error that mean the response
-- itself was malformed (chunked framing it could not parse, headers over its
-- limit or without a colon): a fault of the server's bytes, not of the
-- connection.
M.malformed_phrases = { "chunked-encoding", "response headers", "Header without colon" }

local function malformed(message)
  for _, phrase in ipairs(M.malformed_phrases) do
    if message:find(phrase, 1, true) then return true end
  end
  return false
end

-- name_kind(err) -> err: gives a `transport` record from the core (one with
-- a curl_code) the kind its facts mean (EVENTS.md, "Error records"). Other
-- records are returned as they are.
function M.name_kind(err)
  local code = err.curl_code
  if err.kind ~= "transport" or not code or code == 0 then return err end
  local kind = M.curl_kinds[code]
  if code == 7 then
    kind = (err.errno == nil or err.errno == "ECONNREFUSED") and "refused" or nil
  elseif code == 55 or code == 56 then
    if code == 56 and malformed(err.message) then
      kind = "protocol"
    elseif err.errno == "ECONNRESET" or err.errno == "EPIPE" then
      kind = "reset"
    else
      kind = err.status and "truncated" or "eof"
    end
  end
  if kind == "timeout" then err.which = "connect" end
  err.kind = kind or "transport"
  return err
end

-- What an error body says, at most this many bytes of it, in a message.
M.SAID_MAX = 300

-- Text for a message: whitespace runs (line ends too) as one space, at
-- most M.SAID_MAX bytes (cut on a UTF-8 boundary, "..." added).
local function brief(s)
  s = s:gsub("%s+", " "):gsub("^ ", ""):gsub(" $", "")
  if #s <= M.SAID_MAX then return s end
  local n = M.SAID_MAX
  while n > 0 and (s:byte(n + 1) or 0) & 0xC0 == 0x80 do n = n - 1 end
  return s:sub(1, n) .. "..."
end

-- A JSON value as a word of a message: a non-empty string, or an integer
-- (a code such as 1003); nil for anything else.
local function word(v)
  if type(v) == "string" and v:match("%S") then return brief(v) end
  if math.type(v) == "integer" then return tostring(v) end
end

-- error_said(status, headers, body) -> text, said: what an error body says
-- in a few words, and its parts {type=, code=, message=} (each nil when
-- absent). A JSON error as OpenAI, Anthropic, OpenRouter and most JSON APIs
-- send it ({"error": {"type":, "code":, "message":}}, {"error": "text"},
-- {"message":}, {"detail":}) gives "type (code): message" (a code equal to
-- the status is left out); a text body its first line; an HTML page its
-- title. text is nil when the body says nothing (it is empty, or binary).
function M.error_said(status, headers, body)
  if type(body) ~= "string" or not body:match("%S") then return nil, {} end
  local ctype = (headers and headers["content-type"] or ""):lower()
  local v = body:match("^%s*[{[]") and json.decode(body)
  if type(v) == "table" then
    local e = v.error
    local said = {}
    if type(e) == "table" then
      said.type = word(e.type) or word(e.status)
      said.code = word(e.code)
      said.message = word(e.message)
    else
      said.message = word(e) or word(v.message) or word(v.detail) or word(v.error_description)
    end
    if said.code == said.type or said.code == tostring(status) then said.code = nil end
    local name = said.type and said.code and said.type .. " (" .. said.code .. ")" or said.type or said.code
    if name and said.message then return name .. ": " .. said.message, said end
    return name or said.message, said
  end
  if ctype:find("html", 1, true) or body:match("^%s*<") then
    local title = body:match("<[Tt][Ii][Tt][Ll][Ee][^>]*>([^<]*)<")
    if title and title:match("%S") then return brief(title), { message = brief(title) } end
    return string.format("an HTML page of %d bytes", #body), {}
  end
  if body:find("%z") then
    return string.format("%d bytes of %s", #body, ctype ~= "" and ctype or "a body without Content-Type"), {}
  end
  local line = brief(body:match("^%s*([^\r\n]*)"))
  return line, { message = line }
end

local Response = {}
Response.__index = Response

-- Raises `err` after recording it on the response.
local function raise(resp, err)
  err = M.name_kind(err)
  resp.error = err
  error(err, 0)
end

-- resp:next_event([into]) -> the next SSE event {event=, data=, id=, retry=,
-- offset=} (offset: the body byte just past the event), nil at the end, or
-- nil and the error record of a failure (also left in resp.error). `into`
-- is for a reader that keeps no event past its next call (the provider): a
-- table it lends, filled and returned instead of a new one per event; with
-- a tap, which may keep what it is told, each event is a new table.
-- This is the one way SSE events leave a response: the provider's hot path
-- calls it per event, so the request's own event method is looked up once
-- per response (_event), not per call.
function Response:next_event(into)
  local tap = self._tap
  local ev, err = self._event(self._req, not tap and into or nil)
  if ev then
    if tap then tap:event(ev) end
    return ev
  end
  if err then
    err = M.name_kind(err)
    self.error = err
    return nil, err
  end
  return nil
end

-- resp:event_source() -> fn, state: the transport's own reader, for a loop
-- that reads every event (the provider's hot path) without a Lua call per
-- event: fn(state, into) -> the next event (in `into`), or nil at the end
-- or on a failure, which resp:next_event() then returns (nil, or nil and
-- the error record). nil when a tap watches the response: every event must
-- then go through next_event, which tells it.
function Response:event_source()
  if self._tap then return nil end
  return self._event, self._req
end

-- resp:events() -> iterator of SSE events (resp:next_event()); a failure
-- is raised.
function Response:events()
  return function()
    local ev, err = self:next_event()
    if err then error(err, 0) end
    return ev
  end
end

-- resp:read() -> the next chunk of raw body bytes, or nil at the end.
function Response:read()
  local chunk, err = self._req:read()
  if chunk then
    if self._tap then self._tap:chunk(chunk) end
    return chunk
  end
  if err then raise(self, err) end
  return nil
end

-- resp:lines() -> iterator of body lines without their line ends (NDJSON);
-- a last line without a newline is returned too.
function Response:lines()
  local pending, pos, done = "", 1, false
  return function()
    while true do
      local nl = pending:find("\n", pos, true)
      if nl then
        local line = pending:sub(pos, nl - 1):gsub("\r$", "")
        pos = nl + 1
        return line
      end
      if done then
        if pos <= #pending then
          local line = pending:sub(pos)
          pending, pos = "", 1
          return line
        end
        return nil
      end
      local chunk = self:read()
      if chunk then
        pending, pos = pending:sub(pos) .. chunk, 1
      else
        done = true
      end
    end
  end
end

-- resp:body([max]) -> the whole remaining body (up to `max` bytes, default
-- unlimited); for small responses.
function Response:body(max)
  local parts, size = {}, 0
  while true do
    local chunk = self:read()
    if not chunk then break end
    parts[#parts + 1] = chunk
    size = size + #chunk
    if max and size >= max then break end
  end
  local s = table.concat(parts)
  if max and #s > max then s = s:sub(1, max) end
  return s
end

-- resp:info() -> {bytes=, delivered=, done=, partial=}.
function Response:info() return self._req:info() end

-- resp:close(): aborts the transfer (if still running) and frees it; the
-- tap's exchange ends here (with the error the body raised, if any).
function Response:close()
  self._req:close()
  local tap = self._tap
  self._tap = false
  if tap then tap:finish(self.error) end
end
Response.__close = Response.close

-- method_of(opts) -> the method a request of these options is sent with:
-- its own, else POST with a body and GET without (as curl sends them).
function M.method_of(opts)
  return opts.method or (opts.body and "POST" or "GET")
end

-- request{method=, url=, headers=, body=, timeout={connect=, first_byte=,
-- idle=, total=}, sse={max_line=, max_event=}, max_buffer=, http_errors=true,
-- http_version=, ca_file=, tap=} -> resp {status=, headers=} | nil, err.
-- max_buffer: body bytes received and not yet read that a response holds
-- before its transfer pauses until they are read (the rest waits in the
-- socket). Default: 64 KiB, or 16 KiB once the process's responses hold
-- 4 MiB in all (many streams at once).
-- With http_errors (the default), a status >= 400 is returned as nil and an
-- `http` error record with status, headers, the body (up to 64 KiB), the
-- method and the URL (scrubbed: secrets.url), and what the body says
-- (error_type, error_code, error_message: M.error_said); its message says
-- them all: "HTTP 404 from POST https://host/v1/messages: not_found_error:
-- model: claude-x".
-- http_version: "2" (the default: HTTP/2 when TLS offers it, else 1.1),
-- "1.1", or "2-prior-knowledge" (HTTP/2 from the first byte, h2c on plain
-- TCP). ca_file: the CA bundle for TLS; default $CURL_CA_BUNDLE, else
-- $SSL_CERT_FILE, else curl's own.
-- `tap` observes the exchange as it happens (recording does:
-- lua/luagent/observe/record.lua): tap:begin(opts) returns an observer told
-- :response(status, headers), each :event(sse) the body delivers as SSE,
-- each raw :chunk(bytes) read, and once :finish(err) (err: the failure,
-- nil when the body ended or the response was closed).
function M.request(opts)
  if type(opts) ~= "table" then error("http.request: expects a table", 2) end
  if opts.ca_file == nil then
    local ca = os.getenv("CURL_CA_BUNDLE") or os.getenv("SSL_CERT_FILE")
    if ca then
      local copy = {}
      for k, v in pairs(opts) do copy[k] = v end
      copy.ca_file, opts = ca, copy
    end
  end
  local tap = opts.tap and opts.tap:begin(opts)
  local req, err = core.http_request(opts)
  if not req then
    err = M.name_kind(err)
    if tap then tap:finish(err) end
    return nil, err
  end
  -- _tap is false, not nil, without a tap: read per event, it is found
  -- without looking into the metatable
  local resp = setmetatable({ status = req:status(), headers = req:headers(), _req = req,
    _event = req.event, _tap = tap or false }, Response)
  if tap then tap:response(resp.status, resp.headers) end
  if resp.status >= 400 and opts.http_errors ~= false then
    local limit = M.ERROR_BODY_MAX + secrets.margin
    local ok, body = pcall(resp.body, resp, limit)
    resp._tap = false -- this exchange ends with the error record below
    resp:close()
    if not ok and errors.is_cancel(body) then error(body, 0) end -- the tap's exchange is dropped
    body = ok and secrets.cut(body, M.ERROR_BODY_MAX, #body >= limit) or ""
    -- the message says what to fix: the request, the status, what the
    -- server said (the record is scrubbed of keys as a whole below)
    local method, url = M.method_of(opts), secrets.url(opts.url)
    local text, said = M.error_said(resp.status, resp.headers, body)
    err = secrets.scrub(errors.new("http", string.format("HTTP %d from %s %s%s", resp.status, method, url,
      text and ": " .. text or ""), {
      status = resp.status, headers = resp.headers, body = body, method = method, url = url,
      error_type = said.type, error_code = said.code, error_message = said.message,
    }))
    if tap then tap:finish(err) end
    return nil, err
  end
  return resp
end

-- fetch{...} -> {status=, headers=, body=} | nil, err: a request read whole.
function M.fetch(opts)
  local resp, err = M.request(opts)
  if not resp then return nil, err end
  local ok, body = pcall(resp.body, resp)
  resp:close()
  if not ok then
    if errors.is_cancel(body) or not errors.is(body) then error(body, 0) end
    return nil, body
  end
  return { status = resp.status, headers = resp.headers, body = body }
end

return M
