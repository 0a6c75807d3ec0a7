-- Events are the spine: every model call's events are returned to its
-- caller and published here, where consumers (the JSON-lines writer, the
-- retry-safe filter, logs, traces and the cost meter) subscribe. A new kind
-- of observer is a new consumer; the retry loop does not change.
local json = require "luagent.base.json"
local errors = require "luagent.base.errors"
local queue = require "luagent.base.queue"
local secrets = require "luagent.base.secrets"

local M = {}

-- A line at warn. log.lua is a consumer of this bus, so it is loaded when
-- first needed (requiring it above would be a cycle).
local function warn(msg, fields) require("luagent.observe.log").write("warn", msg, fields) end

------------------------------------------------------------------------------
-- The bus
------------------------------------------------------------------------------

-- Consumers in two groups: annotators (they add fields to events, so they
-- run first) and the others; in each, consumers of every event (`all`) and
-- consumers of some types only (`typed[type]`).
local groups = { { all = {}, typed = {} }, { all = {}, typed = {} } }
local ANNOTATE, NORMAL = groups[1], groups[2]

-- Per event type, the consumers it goes to, in delivery order; `every`
-- for a type no consumer asked for by name (a text delta reaches only the
-- `all` consumers). Made anew at each subscribe and unsubscribe, so that a
-- publish is one lookup and one loop. In each list the consumer subscribed
-- last runs first.
local routes, every

local function rebuild()
  local function route(t)
    local r = {}
    for _, group in ipairs(groups) do
      for _, list in ipairs({ t and group.typed[t] or {}, group.all }) do
        for i = #list, 1, -1 do r[#r + 1] = list[i] end
      end
    end
    return r
  end
  routes, every = {}, route(nil)
  for _, group in ipairs(groups) do
    for t, list in pairs(group.typed) do
      if list[1] and not routes[t] then routes[t] = route(t) end
    end
  end
end
rebuild()

-- Removes fn once from each of `lists`.
local function remove(lists, fn)
  for _, list in ipairs(lists) do
    for i, f in ipairs(list) do
      if f == fn then table.remove(list, i) break end
    end
  end
  rebuild()
end

-- Removes every subscription of fn (a consumer that raised).
local function drop(fn)
  for _, group in ipairs(groups) do
    local lists = { group.all }
    for _, list in pairs(group.typed) do lists[#lists + 1] = list end
    for _, list in ipairs(lists) do
      for i = #list, 1, -1 do
        if list[i] == fn then table.remove(list, i) end
      end
    end
  end
  rebuild()
end

-- subscribe(fn [, opts]) -> unsubscribe function. fn(event) runs for every
-- event published (or, with opts.types = {"agent_end", ...}, for events of
-- those types only), in order. A consumer that raises is removed and
-- reported once: an observer must never break the call it observes. With
-- opts.annotate, fn runs before every other consumer, so the fields it adds
-- (the cost meter's `agent_end.cost`) reach them all.
function M.subscribe(fn, opts)
  if type(fn) ~= "function" then error("events.subscribe: expects a function", 2) end
  local group = opts and opts.annotate and ANNOTATE or NORMAL
  local lists = {}
  if opts and opts.types then
    for _, t in ipairs(opts.types) do
      group.typed[t] = group.typed[t] or {}
      lists[#lists + 1] = group.typed[t]
    end
  else
    lists[1] = group.all
  end
  for _, list in ipairs(lists) do list[#list + 1] = fn end
  rebuild()
  return function() remove(lists, fn) end
end

-- Per task (a coroutine; the main thread too), a slot holding the position
-- in its route of the consumer running now: publish reads it when one
-- raises. Per task, because a consumer may wait while other tasks publish;
-- a publish from inside a consumer (the same task) puts the outer position
-- back when it returns.
local slots = setmetatable({}, { __mode = "k" })

-- Runs route[from], route[from + 1], ... with ev, noting each position.
local function run(route, from, ev, slot)
  for i = from, #route do
    slot[1] = i
    route[i](ev)
  end
end

-- publish(event): hands the event to every subscriber that wants it, the
-- subscribers there when it is published. One protected call covers the
-- whole route; when a consumer raises, it is removed (every subscription
-- of it) and reported, and the ones after it still get the event.
function M.publish(ev)
  local route = routes[ev.type] or every
  if not route[1] then return end
  local co = coroutine.running()
  local slot = slots[co]
  if not slot then
    slot = { 0 }
    slots[co] = slot
  end
  local outer, from = slot[1], 1
  while true do
    local ok, err = pcall(run, route, from, ev, slot)
    local failed = slot[1]
    slot[1] = outer
    if ok then return end
    if errors.is_cancel(err) then error(err, 0) end -- the publisher's task was cancelled
    local fn = route[failed]
    drop(fn)
    local told, text = pcall(tostring, err)
    warn("an event consumer failed on a " .. tostring(ev.type)
      .. " event and was removed: " .. secrets.text(told and tostring(text) or "(an error that cannot be printed)"))
    -- the rest of the route, without the consumer just removed
    local rest = {}
    for i = failed + 1, #route do
      if route[i] ~= fn then rest[#rest + 1] = route[i] end
    end
    route, from = rest, 1
  end
end

------------------------------------------------------------------------------
-- JSON lines
------------------------------------------------------------------------------

-- Plain copy of an event for encoding: error records become their fields,
-- functions and other non-data values are left out.
local function plain(v, depth)
  if type(v) ~= "table" then
    if type(v) == "function" or type(v) == "userdata" or type(v) == "thread" then return nil end
    return v
  end
  if depth > 20 then return nil end
  local out = {}
  for k, x in pairs(v) do
    if type(k) == "string" or math.type(k) == "integer" then out[k] = plain(x, depth + 1) end
  end
  if getmetatable(v) == json.array_mt then setmetatable(out, json.array_mt) end
  return out
end

-- plain(v) -> a plain copy of v as above (the run journal stores events' data so).
function M.plain(v) return plain(v, 0) end

-- to_json(event) -> one line of JSON (no newline), valid UTF-8, keys
-- scrubbed (lua/luagent/base/secrets.lua). Non-finite numbers (a server's
-- `1e999`, a policy's math.huge) are written as null.
function M.to_json(ev)
  return secrets.text(json.encode(plain(ev, 0), { nonfinite = "null" }))
end

-- jsonl(file) -> a consumer writing each event as one JSON line to file
-- (default stdout; a Lua file, or an output file: lua/luagent/base/outfile.lua),
-- flushed at each line. A write that fails (a full disk) raises: the bus
-- removes the consumer and reports it once, and no more lines are written.
function M.jsonl(file)
  file = file or io.stdout
  return function(ev)
    local ok, err = file:write(M.to_json(ev), "\n")
    if ok then ok, err = file:flush() end
    if not ok then error("events.jsonl: " .. tostring(err) .. "; no more events are written", 0) end
  end
end

------------------------------------------------------------------------------
-- Retry-safe filter, for append-only sinks (pipes, logs)
------------------------------------------------------------------------------

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
-- - a retried attempt disappears, leaving only its provider_retry;
-- - an attempt that fails for good (or is aborted) arrives as its
--   message_start and its error (or aborted) message_end, without its
--   deltas (the end event keeps the content);
-- - an attempt left open (the stream ends, or a retry or another attempt
--   starts, before its message_end) is dropped, never released, and logged
--   at warn with its call and attempt (as yoagent's filter does);
-- - stream_reset is dropped (nothing partial was shown); every other event
--   passes at once.
function M.retry_safe_filter(sink)
  -- next_attempt: per call in flight, the number of its next attempt (from
  -- its provider_retry), to name an attempt that is dropped
  return setmetatable({ sink = sink, held = nil, failed_end = nil, next_attempt = {} }, RetrySafe)
end

-- Drops the attempt held open and says so (`why`: what came before its end).
function RetrySafe:drop_open(why)
  local held = self.held
  self.held = nil
  warn(string.format("retry-safe: dropped attempt %d of call %s, left open: %s before its message_end",
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
function M.retry_safe(iter)
  local out = queue.new()
  local filter = M.retry_safe_filter(function(ev) out:push(ev) end)
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
function M.retry_safe_consumer(sink)
  local filters = {}
  return function(ev)
    local id = ev.call or 0
    local f = filters[id]
    if not f then
      f = M.retry_safe_filter(sink)
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
