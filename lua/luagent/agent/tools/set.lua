-- What a tool set is: the base every kind builds on (a static list, here;
-- a watched folder, dir.lua; an MCP server's tools, mcp/init.lua), so that
-- none of them requires another. A set offers
--   set:snapshot() -> {version=, tools={name=tool}, names={sorted names}}
--   set:version()  -> the snapshot's version (counts published changes)
--   set:events_since(cursor) -> the tools_changed / tools_reload_failed
--                    events after cursor (nil: from the start of its log),
--                    and the new cursor
--   set:close()    stops what the set runs (a folder's watcher, a server
--                    and its supervisor); the last snapshot stays usable;
--                    closing twice is nothing
--   set.label      the name it goes by in reports (a folder's path, a
--                    server's name)
--   set.policy     the tool section it was opened with, when it has one
--                    (an MCP set's trust in its server's hints)
-- A set's state, its watcher and tasks included, is its own (no module
-- holds any): whoever opened it owns it and closes it (a runtime closes the
-- sets it watches).
local json = require "luagent.base.json"
local secrets = require "luagent.base.secrets"
local tool = require "luagent.agent.tools.tool"

local M = {}

M.max_log = 256 -- events kept for agents that have not looked yet

---What a tool set hands an agent at the start of each turn.
---@class luagent.ToolSnapshot
---@field version integer counts the changes published
---@field tools table<string, luagent.Tool> the tools, keyed by name
---@field names string[] their names, sorted

---A tool set: a static list, a watched folder (`luagent.tools.dir`) or an
---MCP server's tools (`luagent.tools.mcp`); anything with `:snapshot()`.
---@class luagent.ToolSet
---@field label string the name it goes by in reports (a folder's path, a server's name)
local Set = { __name = "luagent.ToolSet" }
Set.__index = Set
M.Set = Set

-- class(name) -> a kind of tool set: a metatable for its sets whose
-- methods fall back to Set's, closed at the end of a to-be-closed variable.
function M.class(name)
  local class = setmetatable({ __name = name }, { __index = Set })
  class.__index = class
  class.__close = function(self) self:close() end
  return class
end

-- new(class, fields) -> fields as a set of that kind, given the base's
-- state: an empty snapshot (version 0) unless fields has one, an empty log.
function M.new(class, fields)
  fields.snap = fields.snap or { version = 0, tools = {}, names = {} }
  fields.log, fields.seq, fields.closed = {}, 0, false
  return setmetatable(fields, class)
end

-- Appends an event to the set's log (bounded), scrubbed of keys: a tool
-- file's error or an MCP server's message may hold one.
function Set:record(ev)
  secrets.scrub(ev)
  self.seq = self.seq + 1
  ev.seq = self.seq
  self.log[#self.log + 1] = ev
  if #self.log > M.max_log then table.remove(self.log, 1) end
end

-- events_since(cursor) -> the events after cursor (nil: from the start of
-- the log), and the new cursor.
---The `tools_changed` and `tools_reload_failed` events after `cursor`.
---@param cursor? integer nil: from the start of the set's log
---@return luagent.Event[] events
---@return integer cursor the new cursor
function Set:events_since(cursor)
  cursor = cursor or 0
  local out = {}
  for _, ev in ipairs(self.log) do
    if ev.seq > cursor then out[#out + 1] = ev end
  end
  return out, self.seq
end

-- The current snapshot {version=, tools={name=tool}, names={sorted}}.
---The set's tools now.
---@return luagent.ToolSnapshot
function Set:snapshot() return self.snap end

-- The version of the snapshot (counts the changes published).
---The snapshot's version.
---@return integer
function Set:version() return self.snap.version end

-- publish(map): the set's new tools {name = tool}; when any was added,
-- removed or replaced (a tool that did not change keeps its table), a new
-- snapshot replaces the old one whole and a tools_changed event is logged.
function Set:publish(map)
  local added, removed, changed_names = {}, {}, {}
  local old = self.snap.tools
  for name, t in pairs(map) do
    if not old[name] then added[#added + 1] = name
    elseif old[name] ~= t then changed_names[#changed_names + 1] = name end
  end
  for name in pairs(old) do if not map[name] then removed[#removed + 1] = name end end
  if #added + #removed + #changed_names > 0 then
    table.sort(added) table.sort(removed) table.sort(changed_names)
    local list = {}
    for name in pairs(map) do list[#list + 1] = name end
    table.sort(list)
    self.snap = { version = self.snap.version + 1, tools = map, names = list }
    self:record { type = "tools_changed", added = json.array(added), removed = json.array(removed),
                  changed = json.array(changed_names),
                  version = self.snap.version }
  end
end

-- A set that runs nothing has nothing to stop: close() only marks it.
---Stops what the set runs (a folder's watcher, a server); its last
---snapshot stays usable. Twice is harmless.
function Set:close() self.closed = true end

-- True when `v` is a tool set (not a tool, not a list): anything with
-- :snapshot(), so a script may bring its own.
function M.is_set(v)
  return type(v) == "table" and type(v.snapshot) == "function" and getmetatable(v) ~= tool.Tool
end

local Static = M.class("luagent.StaticToolSet")
M.Static = Static

-- static(list) -> a set of these tools, that never changes; raises on a
-- bad tool or a name given twice.
function M.static(list)
  local snap = { version = 1, tools = {}, names = {} }
  for i, t in ipairs(list) do
    local checked, err = tool.check(t)
    if not checked then error("tools[" .. i .. "]: " .. err, 3) end
    if snap.tools[checked.name] then
      error("tools[" .. i .. "]: tool name '" .. checked.name .. "' is given twice", 3)
    end
    snap.tools[checked.name] = checked
    snap.names[#snap.names + 1] = checked.name
  end
  table.sort(snap.names)
  return M.new(Static, { snap = snap, label = "tools" })
end

return M
