-- Response plans: what the mock provider's connection task executes. A plan
-- is a list of steps {write=bytes} / {sleep=seconds} / {reset=true} /
-- {close=true}, built here from a response (lua/luagent/mock/replies.lua)
-- with the pacing (ttft, tps, recorded times) and transport faults (reset,
-- stall) applied. Pure: specs check plans without sockets.
local replies = require "luagent.mock.replies"

local M = {}

-- Appends a write to a plan, merging it with a write just before.
local function put(plan, bytes)
  if bytes == "" then return end
  local last = plan[#plan]
  if last and last.write then last.write = last.write .. bytes
  else plan[#plan + 1] = { write = bytes } end
end

-- Appends a sleep to a plan (none for zero).
local function pause(plan, seconds)
  if seconds and seconds > 0 then plan[#plan + 1] = { sleep = seconds } end
end

-- The status line and header block of `resp`; `framing` is the
-- Content-Length or Transfer-Encoding line, `close` adds Connection: close.
local function head(resp, framing, close)
  local out = { string.format("HTTP/1.1 %d %s\r\n", resp.status,
    replies.reasons[resp.status] or "Unknown") }
  for _, h in ipairs(resp.headers or {}) do
    -- CR or LF in a name or value would start a header of its own
    out[#out + 1] = h[1]:gsub("[\r\n]", "") .. ": " .. h[2]:gsub("[\r\n]", " ") .. "\r\n"
  end
  out[#out + 1] = framing .. "\r\n"
  if close then out[#out + 1] = "Connection: close\r\n" end
  out[#out + 1] = "\r\n"
  return table.concat(out)
end

-- The body of a stream as pieces {data=} / {sleep=}, one piece per event,
-- paced as recorded (state.recorded_speed and recorded events) or by
-- state.ttft before the first non-opening event and 1/state.tps between
-- deltas.
local function stream_pieces(state, resp)
  local pieces, prev_t, started = {}, 0, false
  local phase_of = replies.phaser(resp.format)
  local function wait(s)
    if s and s > 0 then pieces[#pieces + 1] = { sleep = s } end
  end
  for _, e in ipairs(resp.events) do
    if resp.recorded then
      if state.recorded_speed and e.t then
        wait(e.t - prev_t)
        prev_t = math.max(prev_t, e.t)
      end
    else
      local phase = phase_of(e)
      if not started and phase ~= "open" then
        started = true
        wait(state.ttft)
      elseif started and phase == "delta" and state.tps then
        wait(1 / state.tps)
      end
    end
    pieces[#pieces + 1] = { data = replies.sse({ e }) }
  end
  return pieces
end

-- Splits pieces after `n` body bytes: the pieces before and after.
local function split(pieces, n)
  local before, after, left = {}, {}, n
  for _, p in ipairs(pieces) do
    if p.sleep then
      if left > 0 then before[#before + 1] = p else after[#after + 1] = p end
    elseif left >= #p.data then
      before[#before + 1] = p
      left = left - #p.data
    elseif left > 0 then
      before[#before + 1] = { data = p.data:sub(1, left) }
      after[#after + 1] = { data = p.data:sub(left + 1) }
      left = 0
    else
      after[#after + 1] = p
    end
  end
  return before, after
end

-- Appends pieces to a plan, in chunked framing when `chunked`.
local function emit(plan, pieces, chunked)
  for _, p in ipairs(pieces) do
    if p.sleep then pause(plan, p.sleep)
    elseif chunked then put(plan, string.format("%x\r\n", #p.data) .. p.data .. "\r\n")
    else put(plan, p.data) end
  end
end

-- The plan that sends `resp` for `req`, with the transport faults (reset,
-- stall) and a non-stream `cut` (resp.truncate) applied.
function M.respond(state, req, resp, fault)
  local kind = fault and fault.kind
  local args = fault and fault.args or {}
  local close = req.close or resp.truncate or kind == "reset"
  local plan, pieces, chunked, framing = {}, nil, resp.events ~= nil, nil
  if chunked then
    pieces = stream_pieces(state, resp)
    framing = "Transfer-Encoding: chunked"
  else
    pieces = { { data = resp.body } }
    framing = "Content-Length: " .. #resp.body
    if resp.tokens then
      pause(plan, (state.ttft or 0) + (state.tps and resp.tokens / state.tps or 0))
    end
  end
  if kind == "stall" and not args.after then pause(plan, args.secs) end
  put(plan, head(resp, framing, close))
  if resp.truncate then
    emit(plan, { { data = resp.body:sub(1, #resp.body // 2) } }, false)
    plan[#plan + 1] = { close = true }
    return plan
  end
  if kind == "reset" then
    emit(plan, (split(pieces, args.bytes)), chunked)
    plan[#plan + 1] = { reset = true }
    return plan
  end
  if kind == "stall" and args.after then
    local before, after = split(pieces, args.after)
    emit(plan, before, chunked)
    pause(plan, args.secs)
    emit(plan, after, chunked)
  else
    emit(plan, pieces, chunked)
  end
  if chunked then put(plan, "0\r\n\r\n") end
  if close then plan[#plan + 1] = { close = true } end
  return plan
end

-- A plain JSON response plan (routing errors, the request log).
function M.json(req, status, body, extra)
  local headers = { { "Content-Type", replies.json_type } }
  for _, h in ipairs(extra or {}) do headers[#headers + 1] = h end
  return M.respond({}, req, { status = status, headers = headers, body = body })
end

-- The plan answering a request that could not be parsed; the connection

-- closes after it.
function M.bad_request_plan(failure)
  return M.json({ close = true }, failure.status, replies.encode(replies.object("error",
    replies.object("message", failure.message, "type", "invalid_request_error"))))
end

return M
