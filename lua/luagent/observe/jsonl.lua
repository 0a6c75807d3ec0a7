-- The JSON-lines writer: a bus consumer writing each event as one line
-- (`luagent run --events jsonl`; luagent.events.jsonl).
local core = require "luagent.core"
local bus = require "luagent.base.bus"

local M = {}

-- "2026-12-01T01:01:02.752Z" for now: the time a log line carries (UTC to
-- the millisecond, the wall clock, as lua/luagent/observe/log.lua writes
-- it; on the virtual clock too, as the log).
local iso_time, wall = core.iso_time, core.wall
local function now_text() return iso_time(wall()) end

-- The fields a line of agent_end carries instead of the history (the Lua
-- event keeps `messages`): `history`, its length (as agent_start's
-- `history`), and `last_message`, its last message. A run of many turns
-- would otherwise write its whole conversation again at every end.
local function short_end(ev)
  local out = {}
  for k, v in pairs(ev) do
    if k ~= "messages" then out[k] = v end
  end
  local messages = ev.messages
  out.history, out.last_message = #messages, messages[#messages]
  return out
end

-- line(ev, time) -> the JSON line of `ev` (no newline), `time` its first
-- field (an event that has its own `time` keeps it).
function M.line(ev, time)
  if ev.type == "agent_end" and type(ev.messages) == "table" then ev = short_end(ev) end
  local body = bus.to_json(ev)
  if ev.time ~= nil or body:sub(1, 1) ~= "{" then return body end
  if body == "{}" then return '{"time":"' .. time .. '"}' end
  return '{"time":"' .. time .. '",' .. body:sub(2)
end

-- jsonl(file [, opts]) -> a consumer writing each event as one JSON line to
-- file (default stdout; a Lua file, or an output file:
-- lua/luagent/base/outfile.lua), flushed at each line. Each line leads with
-- `time`, when its event was published; an agent_end line carries the
-- history's length and last message instead of the history (short_end
-- above). `opts.filter`: a function(sink) -> consumer put between the bus
-- and the writer (the retry-safe filter, which holds an attempt's events
-- until it ends): the lines still carry the times their events were
-- published. A write that fails (a full disk) raises: the bus removes the
-- consumer and reports it once, and no more lines are written.
function M.jsonl(file, opts)
  file = file or io.stdout
  local times -- event -> the time it was published, while a filter holds it
  local function write(ev)
    local ok, err = file:write(M.line(ev, times and times[ev] or now_text()), "\n")
    if ok then ok, err = file:flush() end
    if not ok then error("events.jsonl: " .. tostring(err) .. "; no more events are written", 0) end
  end
  local filter = opts and opts.filter
  if not filter then return write end
  times = setmetatable({}, { __mode = "k" })
  local inner = filter(write)
  return function(ev)
    times[ev] = now_text()
    return inner(ev)
  end
end

return M
