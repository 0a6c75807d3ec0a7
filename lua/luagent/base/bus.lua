-- Events are the spine: every model call's events are returned to its
-- caller and published on its runtime's bus, where consumers (the
-- JSON-lines writer, the retry-safe filter, logs, traces and the cost
-- meter) subscribe. A new kind of observer is a new consumer; the call
-- layer does not change. Each runtime owns one bus (lua/luagent/runtime.lua).
local json = require "luagent.base.json"
local errors = require "luagent.base.errors"
local secrets = require "luagent.base.secrets"

local M = {}

local Bus = {}
Bus.__index = Bus

------------------------------------------------------------------------------
-- The bus
------------------------------------------------------------------------------

-- A bus holds its consumers in three groups: the first annotators, the
-- other annotators (they add fields to events, so they run first) and the
-- others; in each, consumers of every event (`all`) and consumers of some
-- types only (`typed[type]`).
-- Per event type, `routes` lists the consumers it goes to, in delivery
-- order; `every` is the route of a type no consumer asked for by name (a
-- text delta reaches only the `all` consumers). Routes are made anew at
-- each subscribe and unsubscribe, so that a publish is one lookup and one
-- loop. In each list the consumer subscribed last runs first.
local function rebuild(self)
  local groups = self.groups
  local function route(t)
    local r = {}
    for _, group in ipairs(groups) do
      for _, list in ipairs({ t and group.typed[t] or {}, group.all }) do
        for i = #list, 1, -1 do r[#r + 1] = list[i] end
      end
    end
    return r
  end
  local routes = {}
  for _, group in ipairs(groups) do
    for t, list in pairs(group.typed) do
      if list[1] and not routes[t] then routes[t] = route(t) end
    end
  end
  self.routes, self.every = routes, route(nil)
end

-- new{diag=} -> a bus; diag (lua/luagent/base/diagnostics.lua) is told of
-- a consumer that failed and was removed.
function M.new(opts)
  local self = setmetatable({
    groups = { { all = {}, typed = {} }, { all = {}, typed = {} }, { all = {}, typed = {} } },
    diag = opts and opts.diag,
    -- per task (a coroutine; the main thread too), a slot holding the
    -- position in its route of the consumer running now: publish reads it
    -- when one raises. Per task, because a consumer may wait while other
    -- tasks publish; a publish from inside a consumer (the same task) puts
    -- the outer position back when it returns.
    slots = setmetatable({}, { __mode = "k" }),
  }, Bus)
  rebuild(self)
  return self
end

-- Removes fn once from each of `lists`.
local function remove(self, lists, fn)
  for _, list in ipairs(lists) do
    for i, f in ipairs(list) do
      if f == fn then table.remove(list, i) break end
    end
  end
  rebuild(self)
end

-- Removes every subscription of fn (a consumer that raised).
local function drop(self, fn)
  for _, group in ipairs(self.groups) do
    local lists = { group.all }
    for _, list in pairs(group.typed) do lists[#lists + 1] = list end
    for _, list in ipairs(lists) do
      for i = #list, 1, -1 do
        if list[i] == fn then table.remove(list, i) end
      end
    end
  end
  rebuild(self)
end

-- bus:subscribe(fn [, opts]) -> unsubscribe function. fn(event) runs for every
-- event published (or, with opts.types = {"agent_end", ...}, for events of
-- those types only), in order. A consumer that raises is removed and
-- reported once: an observer must never break the call it observes. With
-- opts.annotate, fn runs before every other consumer, so the fields it adds
-- reach them all; with opts.annotate = "first", before the other annotators
-- too (the cost meter's `agent_end.cost` reaches the tracer's span, whichever
-- of them subscribed first).
function Bus:subscribe(fn, opts)
  if type(fn) ~= "function" then error("events.subscribe: expects a function", 2) end
  local annotate = opts and opts.annotate
  local group = self.groups[annotate == "first" and 1 or annotate and 2 or 3]
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
  rebuild(self)
  return function() remove(self, lists, fn) end
end

-- Runs route[from], route[from + 1], ... with ev, noting each position.
local function run(route, from, ev, slot)
  for i = from, #route do
    slot[1] = i
    route[i](ev)
  end
end

-- bus:publish(event): hands the event to every subscriber that wants it, the
-- subscribers there when it is published. One protected call covers the
-- whole route; when a consumer raises, it is removed (every subscription
-- of it) and reported, and the ones after it still get the event.
function Bus:publish(ev)
  local route = self.routes[ev.type] or self.every
  if not route[1] then return end
  local co = coroutine.running()
  local slots = self.slots
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
    drop(self, fn)
    local told, text = pcall(tostring, err)
    if self.diag then
      self.diag:write("warn", "an event consumer failed on a " .. tostring(ev.type)
        .. " event and was removed: " .. secrets.text(told and tostring(text) or "(an error that cannot be printed)"))
    end
    -- the rest of the route, without the consumer just removed
    local rest = {}
    for i = failed + 1, #route do
      if route[i] ~= fn then rest[#rest + 1] = route[i] end
    end
    route, from = rest, 1
  end
end

------------------------------------------------------------------------------
-- Events as data
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

return M
