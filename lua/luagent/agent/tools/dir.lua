-- A tool set loaded from a folder: every *.lua file returns one tool or a
-- list of tools. The folder is watched; after a burst of changes (debounced)
-- it is rescanned whole, since editors save by writing a temporary file and
-- renaming it. Each file loads as policies do: text only, its own
-- environment (sandbox.tool_env: the host's globals but debug, globals it
-- sets stay its own), under the load bounds of a policy file, called with
-- its own path as `...`; what it returns is read raw (next, rawget), so no
-- metamethod of its tables runs, and no metatable is kept.
-- A file that fails keeps its previous tools and is reported; a removed
-- file's tools go. Each good rescan publishes a new snapshot, which agents
-- take between turns: an agent never sees half a folder.
--
-- Events (taken by agents through set:events_since, EVENTS.md):
--   tools_reload_failed {file, line, message}
--   tools_changed {added, removed, changed}   (lists of tool names)
local core = require "luagent.core"
local json = require "luagent.base.json"
local policies = require "luagent.model.policy"
local sandbox = require "luagent.base.sandbox"
local secrets = require "luagent.base.secrets"
local tools = require "luagent.agent.tools"

local M = {}

M.debounce = 0.05 -- seconds of quiet after a change before the rescan
M.max_log = 256   -- events kept for agents that have not looked yet

local Set = {}
Set.__index = Set
Set.__name = "luagent.ToolSet"

-- The line of `text` where `field =` is set, searching from the line that
-- names the tool (when known). nil when not found.
local function line_of(text, field, tool_name)
  local n, start = 0, 1
  local lines = {}
  for line in (text .. "\n"):gmatch("([^\n]*)\n") do lines[#lines + 1] = line end
  if tool_name then
    for i, line in ipairs(lines) do
      if line:find('"' .. tool_name .. '"', 1, true) or line:find("'" .. tool_name .. "'", 1, true) then
        start = i
        break
      end
    end
  end
  if not field then return tool_name and start or nil end
  local pattern = "%f[%w_]" .. field .. "%s*=[^=]"
  for i = start, #lines do
    if (lines[i] .. " "):find(pattern) then n = i break end
  end
  return n > 0 and n or nil
end

-- The tools a file returned: the table itself when it is one tool (it has
-- name, run or command), else its list part; read raw.
local function tool_list(result)
  if rawget(result, "name") ~= nil or rawget(result, "run") ~= nil or rawget(result, "command") ~= nil then
    return { result }
  end
  local list, i = {}, 1
  while rawget(result, i) ~= nil do
    list[i] = rawget(result, i)
    i = i + 1
  end
  return list
end

-- Loads one tool file. Returns the list of checked tools, or nil and
-- {line=, message="file:line: what"}.
function M.load_file(path, text)
  local function fail(msg, line)
    line = line or tonumber(msg:match("^[^\n]-:(%d+):"))
    if not msg:find(path, 1, true) then msg = path .. (line and (":" .. line) or "") .. ": " .. msg end
    return nil, { line = line, message = msg }
  end
  local chunk, perr = load(text, "@" .. path, "t", sandbox.tool_env())
  if not chunk then return fail(perr) end
  local limits = policies.limits
  local ok, result = sandbox.call(chunk, { path }, { instructions = limits.load, wall = limits.load_wall,
    memory = limits.memory, who = "a tool file" })
  if not ok then return fail(result) end
  if type(result) ~= "table" then
    return fail("a tool file must return a tool or a list of tools (it returned " .. type(result) .. ")")
  end
  local list = tool_list(result)
  if #list == 0 then return fail("a tool file must return a tool or a list of tools (got an empty table)") end
  local out, seen = {}, {}
  for i, t in ipairs(list) do
    local tool, why, field = tools.check(t, path)
    local name = type(t) == "table" and type(rawget(t, "name")) == "string" and rawget(t, "name") or nil
    if not tool then
      return fail((#list > 1 and ("tools[" .. i .. "]: ") or "") .. why, line_of(text, field, name))
    end
    if seen[tool.name] then
      return fail("tool name '" .. tool.name .. "' is given twice", line_of(text, "name", tool.name))
    end
    seen[tool.name] = true
    out[#out + 1] = tool
  end
  return out
end

-- open(path [, opts]) -> set | nil, err. opts: watch (default true),
-- debounce (seconds). The first load happens now; its failures are the
-- set's first events.
function M.open(path, opts)
  if type(path) ~= "string" then error("tools.dir: expects a folder path", 3) end
  opts = opts or {}
  path = path:gsub("/+$", "")
  if path == "" then path = "/" end
  local names, err = core.list_dir(path)
  if not names then return nil, err end
  local self = setmetatable({
    path = path, files = {}, snap = { version = 0, tools = {}, names = {} },
    log = {}, seq = 0, debounce = opts.debounce or M.debounce,
  }, Set)
  self:rescan()
  if opts.watch ~= false then self:watch() end
  return self
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
function Set:events_since(cursor)
  cursor = cursor or 0
  local out = {}
  for _, ev in ipairs(self.log) do
    if ev.seq > cursor then out[#out + 1] = ev end
  end
  return out, self.seq
end

-- The current snapshot {version=, tools={name=tool}, names={sorted}}.
function Set:snapshot() return self.snap end

-- The version of the snapshot (counts good rescans that changed something).
function Set:version() return self.snap.version end

-- Reads the folder again and publishes a new snapshot if anything changed.
-- Returns the number of files that failed.
function Set:rescan()
  local listing = core.list_dir(self.path) or {}
  local names = {}
  for _, n in ipairs(listing) do
    if n:match("%.lua$") and n:sub(1, 1) ~= "." then names[#names + 1] = n end
  end
  table.sort(names)
  local present, changed, failed = {}, {}, 0
  for _, n in ipairs(names) do
    local file = self.path .. "/" .. n
    -- only a regular file (links followed) under the policy files' bound,
    -- read without waiting: a FIFO, a device or a huge file named *.lua
    -- would hold the loop. Gone since the listing: skipped; refused:
    -- reported once, its last good tools stay
    local text, why, reason = sandbox.read_file(file, policies.limits.max_bytes)
    local st = self.files[n]
    if not text and reason ~= "missing" then
      present[n] = true
      failed = failed + 1
      if not (st and st.refused == why) then
        self:record { type = "tools_reload_failed", file = file, message = why }
      end
      self.files[n] = { text = st and st.text, tools = st and st.tools or {}, previous = st and st.tools or {},
                        refused = why }
    elseif text then
      present[n] = true
      if st then st.refused = nil end
      if not st or st.text ~= text then
        local list, ferr = M.load_file(file, text)
        if list then
          self.files[n] = { text = text, tools = list, previous = st and st.tools or {} }
          changed[n] = true
        else
          failed = failed + 1
          self.files[n] = { text = text, tools = st and st.tools or {}, previous = st and st.tools or {} }
          self:record { type = "tools_reload_failed", file = file, line = ferr.line, message = ferr.message }
        end
      end
    end
  end
  for n in pairs(self.files) do
    if not present[n] then self.files[n] = nil end
  end
  -- unique names: files that did not change keep theirs; a changed file
  -- that takes a name another file has fails and keeps its previous tools
  local map, owner = {}, {}
  local order = {}
  for _, n in ipairs(names) do if self.files[n] and not changed[n] then order[#order + 1] = n end end
  for _, n in ipairs(names) do if changed[n] then order[#order + 1] = n end end
  for _, n in ipairs(order) do
    local st = self.files[n]
    local clash
    for _, t in ipairs(st.tools) do
      if map[t.name] then clash = t break end
    end
    if clash then
      failed = failed + 1
      local file = self.path .. "/" .. n
      local line = line_of(st.text, "name", clash.name)
      self:record { type = "tools_reload_failed", file = file, line = line,
        message = string.format("%s%s: tool name '%s' is already defined in %s", file,
          line and (":" .. line) or "", clash.name, owner[clash.name]) }
      st.tools = st.previous or {}
    end
    for _, t in ipairs(st.tools) do
      if not map[t.name] then
        map[t.name], owner[t.name] = t, self.path .. "/" .. n
      end
    end
    st.previous = st.tools
  end
  M.publish(self, map)
  return failed
end

-- publish(set, map): the set's new tools {name = tool}; when any was added,
-- removed or replaced (a tool that did not change keeps its table), a new
-- snapshot replaces the old one whole and a tools_changed event is logged.
-- Shared by every tool set that changes (folders, MCP servers).
function M.publish(self, map)
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

-- Watches the folder (a daemon task): after a change, waits for
-- `debounce` seconds of quiet, then rescans.
function Set:watch()
  local w, err = core.watch(self.path .. "/")
  if not w then return nil, err end
  self.watcher = w
  self.task = core.spawn(function()
    while true do
      w:wait()
      repeat
        core.sleep(self.debounce)
        local more = w:pending() > 0
        if more then w:wait() end
      until not more
      self:rescan()
    end
  end)
  self.task:set_daemon(true)
  return true
end

-- Stops watching. The last snapshot stays usable.
function Set:close()
  if self.task then self.task:cancel("tool set closed") self.task = nil end
  if self.watcher then self.watcher:close() self.watcher = nil end
end
Set.__close = Set.close

M.Set = Set
return M
