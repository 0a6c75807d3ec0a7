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
-- The watcher and its task are the set's own: set:close() stops them.
--
-- A tool with neither read_only nor idempotent is told of once each time a
-- definition of it loads (a note in the log of the runtime the set was
-- opened with: what its timeout does; tool.unflagged_note).
--
-- Events (taken by agents through set:events_since, EVENTS.md):
--   tools_reload_failed {file, line, message}
--   tools_changed {added, removed, changed}   (lists of tool names)
local core = require "luagent.core"
local policies = require "luagent.model.policy"
local sandbox = require "luagent.base.sandbox"
local tool = require "luagent.agent.tools.tool"
local set = require "luagent.agent.tools.set"
local options = require "luagent.base.options"

local M = {}

M.debounce = 0.05 -- seconds of quiet after a change before the rescan

-- The options `luagent.tools.dir(path, {...})` takes (open reads them;
-- tools.dir's annotation in agent/tools/init.lua documents them): any
-- other raises, naming the nearest. A new one is added here.
M.OPTIONS = options.known { "watch", "debounce" }

-- A folder's set: a tool set (set.lua) that reads and watches its folder.
local Set = set.class("luagent.ToolSet")

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
    local checked, why, field = tool.check(t, path)
    local name = type(t) == "table" and type(rawget(t, "name")) == "string" and rawget(t, "name") or nil
    if not checked then
      return fail((#list > 1 and ("tools[" .. i .. "]: ") or "") .. why, line_of(text, field, name))
    end
    if seen[checked.name] then
      return fail("tool name '" .. checked.name .. "' is given twice", line_of(text, "name", checked.name))
    end
    seen[checked.name] = true
    out[#out + 1] = checked
  end
  return out
end

-- open(path [, opts [, rt]]) -> set | nil, err. opts: watch (default
-- true), debounce (seconds). The first load happens now; its failures are
-- the set's first events. With rt (a runtime), its notes go to rt's log.
function M.open(path, opts, rt)
  if type(path) ~= "string" then error("tools.dir: expects a folder path", 3) end
  opts = opts or {}
  if type(opts) ~= "table" then error("tools.dir: options must be a table {watch=, debounce=}", 3) end
  options.check(opts, M.OPTIONS, "tools.dir", 2)
  if opts.watch ~= nil and type(opts.watch) ~= "boolean" then error("tools.dir: watch must be true or false", 3) end
  if opts.debounce ~= nil and not (type(opts.debounce) == "number" and opts.debounce >= 0 and opts.debounce < math.huge) then
    error("tools.dir: debounce must be a number of seconds >= 0", 3)
  end
  path = path:gsub("/+$", "")
  if path == "" then path = "/" end
  local names, err = core.list_dir(path)
  if not names then return nil, err end
  local self = set.new(Set, { path = path, label = path, files = {}, debounce = opts.debounce or M.debounce,
    rt = rt })
  self:rescan()
  if opts.watch ~= false then self:watch() end
  return self
end

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
          self:note_unflagged(list)
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
  self:publish(map)
  return failed
end

-- Tells the runtime's log, once per definition loaded, what a timeout of
-- each tool of `list` with neither read_only nor idempotent does.
function Set:note_unflagged(list)
  local rt = self.rt
  if not rt then return end
  local timeout
  for _, t in ipairs(list) do
    if tool.first_note(rt.noted, t) then
      timeout = timeout or tool.section_in_force(nil, nil, rt.policies).timeout
      local line = tool.unflagged_note(t, timeout)
      if line then rt.diag:write("note", line) end
    end
  end
end

-- Watches the folder (a daemon task): after a change, waits for
-- `debounce` seconds of quiet, then rescans. true | nil, err; raises on a
-- set that is closed or already watched.
function Set:watch()
  if self.closed then error("tools.dir: the tool set is closed", 2) end
  if self.watcher then error("tools.dir: the folder is watched already", 2) end
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

-- Stops watching: the watcher task is cancelled and the watcher closed.
-- The last snapshot stays usable, and rescan() still reads the folder.
function Set:close()
  if self.task then self.task:cancel("tool set closed") self.task = nil end
  if self.watcher then self.watcher:close() self.watcher = nil end
  self.closed = true
end

M.Set = Set
return M
