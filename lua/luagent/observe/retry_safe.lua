-- The retry-safe filter, for append-only sinks (pipes, logs): what a
-- retried attempt streamed never reaches them (luagent.events.retry_safe,
-- `luagent run --retry-safe`).
local queue = require "luagent.base.queue"

local M = {}

-- Events that belong to one attempt's message (held); others pass at once.
local ATTEMPT_EVENTS = {
  message_start = true, text_delta = true, thinking_delta = true, tool_call_start = true,
  tool_call_delta = true, tool_call_end = true, usage = true, message_end = true,
}

local RetrySafe = {}
RetrySafe.__index = RetrySafe

-- RetrySafe.new(sink) -> filter. filter:push(ev) for each event of ONE
-- call's stream, filter:finish() at its end (which also resets it):
-- - a successful attempt reaches sink whole, when it ends;
-- - a retried attempt disappears, leaving only its provider_retry (or the
--   model_fallback after a model's last attempt: the call goes on with the
--   next model, as after a retry);
-- - an attempt that fails for good (or is aborted) arrives as its
--   message_start and its error (or aborted) message_end, without its
--   deltas (the end event keeps the content);
-- - an attempt left open (the stream ends, or a retry or another attempt
--   starts, before its message_end) is dropped, never released, and logged
--   at warn with its call and attempt (as yoagent's filter does);
-- - stream_reset is dropped (nothing partial was shown); every other event
--   passes at once.
-- `diag` (lua/luagent/base/diagnostics.lua), when given, is told of an
-- attempt dropped.
function M.retry_safe_filter(sink, diag)
  -- next_attempt: per call in flight, the number of its next attempt (from
  -- its provider_retry), to name an attempt that is dropped
  return setmetatable({ sink = sink, diag = diag, held = nil, failed_end = nil, next_attempt = {} }, RetrySafe)
end

-- Drops the attempt held open and says so (`why`: what came before its end).
function RetrySafe:drop_open(why)
  local held = self.held
  self.held = nil
  if not self.diag then return end
  self.diag:write("warn", string.format("retry-safe: dropped attempt %d of call %s, left open: %s before its message_end",
    held.attempt, tostring(held.call), why), { call = held.call, attempt = held.attempt })
end

-- Releases a held failed attempt: its start and its error end.
function RetrySafe:release_failure()
  local start, stop = self.held and self.held[1], self.failed_end
  self.held, self.failed_end = nil, nil
  if start then self.sink(start) end
  if stop then self.sink(stop) end
end

function RetrySafe:push(ev)
  local t = ev.type
  if t == "model_fallback" then
    -- a retry on the next model: a refusal before any attempt ended none
    if ev.attempt then t = "provider_retry" else self.sink(ev) return end
  end
  if t == "provider_retry" then
    self.next_attempt[ev.call or 0] = (ev.attempt or 0) + 1
  elseif ev.final then
    self.next_attempt[ev.call or 0] = nil
  end
  if self.held and not self.failed_end then
    if t == "provider_retry" then self:drop_open("a retry started")
    elseif t == "message_start" then self:drop_open("another attempt started") end
  end
  if self.failed_end then
    if t == "provider_retry" then
      self.held, self.failed_end = nil, nil -- retried: it disappears
    elseif not ATTEMPT_EVENTS[t] then
      self.sink(ev) -- an endpoint event: the failed attempt's fate is still open
      return
    else
      self:release_failure()
    end
  end
  if t == "message_start" then
    self.held = { ev, attempt = self.next_attempt[ev.call or 0] or 1, call = ev.call }
  elseif t == "stream_reset" then
    return
  elseif not ATTEMPT_EVENTS[t] then
    self.sink(ev) -- provider_retry, endpoint events, ...: never held
  elseif self.held and t == "message_end" then
    if ev.stop_reason == "error" or ev.stop_reason == "aborted" then
      self.failed_end = ev
      if ev.final then self:release_failure() end -- failed for good: no retry follows
    else
      local held = self.held
      self.held = nil
      for _, e in ipairs(held) do self.sink(e) end
      self.sink(ev)
    end
  elseif self.held then
    self.held[#self.held + 1] = ev
  else
    self.sink(ev)
  end
end

-- Ends the stream (and resets the filter): a failed attempt still held is
-- released; an attempt left open (no message_end) is dropped and logged.
function RetrySafe:finish()
  if self.failed_end then self:release_failure() end
  if self.held then self:drop_open("the stream ended") end
  self.next_attempt = {}
end

-- retry_safe(iter) -> iterator with the same filtering, for `for ev in ...`.
function M.retry_safe(iter, diag)
  local out = queue.new()
  local filter = M.retry_safe_filter(function(ev) out:push(ev) end, diag)
  local done = false
  return function()
    while true do
      local ev = out:pop()
      if ev then return ev end
      if done then return nil end
      local ev = iter()
      if ev == nil then
        done = true
        filter:finish()
      else
        filter:push(ev)
      end
    end
  end
end

-- retry_safe_consumer(sink) -> a bus consumer keeping one filter per call
-- (events carry `call`), finishing a call's filter at its final event.
function M.retry_safe_consumer(sink, diag)
  local filters = {}
  return function(ev)
    local id = ev.call or 0
    local f = filters[id]
    if not f then
      f = M.retry_safe_filter(sink, diag)
      filters[id] = f
    end
    f:push(ev)
    if ev.final then
      f:finish()
      filters[id] = nil
    end
  end
end

return M
