-- Tool sets have an owner: every kind (a static list, a watched folder, an
-- MCP server's tools) is closed by close(), which stops what it runs, and
-- holds its own state (two sets of one folder watch it each on their own).
-- The tool layer's modules form one direction (tool <- set <- dir, mcp <-
-- tools), with no require inside a function. Real file watching (inotify)
-- and a real child process, on the real clock.
local luagent = require "luagent"
local tools = require "luagent.agent.tools"
local set_base = require "luagent.agent.tools.set"
local policies = require "luagent.model.policy"

local FAKE = { "lua5.4", "spec/fixtures/mcp/fake_server.lua" }

local function write(path, text)
  local f = assert(io.open(path, "w"))
  f:write(text)
  f:close()
end

local function tool_file(name)
  return 'return { name = "' .. name .. '", description = "D", run = function() return "x" end }\n'
end

-- Waits (real clock, at most `bound` s) until pred() holds; whether it did.
local function eventually(pred, bound)
  local t0 = luagent.now()
  while not pred() do
    if luagent.now() - t0 > (bound or 5) then return false end
    luagent.sleep(0.01)
  end
  return true
end

local dir
before_each(function()
  luagent.configure { log_sink = function() end }
  dir = os.tmpname()
  os.remove(dir)
  assert(os.execute("mkdir " .. dir))
end)
after_each(function()
  os.execute("rm -rf " .. dir)
  luagent.configure { log_sink = false }
end)

describe("closing a tool set", function()
  it("a static set closes, twice, and its tools stay", function()
    local set = tools.static { { name = "a", description = "A", run = function() return "a" end } }
    assert.is_true(tools.is_set(set))
    assert.is_false(set.closed)
    set:close()
    set:close()
    assert.is_true(set.closed)
    assert.same({ "a" }, set:snapshot().names)
    local evs, cursor = set:events_since(nil)
    assert.same({}, evs)
    assert.equal(0, cursor)
  end)

  it("a folder set's close stops its watcher: later edits are not read", function()
    write(dir .. "/a.lua", tool_file("a"))
    local set = assert(tools.dir(dir, { debounce = 0.02 }))
    assert.equal(dir, set.label)
    local task = set.task
    assert.is_not_nil(task)
    assert.is_not_nil(set.watcher)
    -- watching works while open
    write(dir .. "/b.lua", tool_file("b"))
    assert.is_true(eventually(function() return set:snapshot().tools.b ~= nil end))
    set:close()
    assert.is_true(set.closed)
    assert.is_nil(set.task)
    assert.is_nil(set.watcher)
    assert.is_true(eventually(function() return task:status() == "failed" or task:status() == "done" end, 1))
    local seq, version = set.seq, set:version()
    write(dir .. "/c.lua", tool_file("c"))
    os.remove(dir .. "/a.lua")
    luagent.sleep(0.3) -- many debounce periods: a watcher still running would have reloaded
    assert.equal(seq, set.seq)
    assert.equal(version, set:version())
    assert.same({ "a", "b" }, set:snapshot().names)
    set:close() -- twice is nothing
    assert.has_error(function() set:watch() end, "tools.dir: the tool set is closed")
    -- reading the folder by hand still works
    set:rescan()
    assert.same({ "b", "c" }, set:snapshot().names)
  end)

  it("each folder set owns its watcher: closing one leaves the other watching", function()
    write(dir .. "/a.lua", tool_file("a"))
    local one = assert(tools.dir(dir, { debounce = 0.02 }))
    local two = assert(tools.dir(dir, { debounce = 0.02 }))
    finally(function() two:close() end)
    assert.are_not.equal(one.watcher, two.watcher)
    one:close()
    write(dir .. "/b.lua", tool_file("b"))
    assert.is_true(eventually(function() return two:snapshot().tools.b ~= nil end))
    assert.is_nil(one:snapshot().tools.b)
  end)

  it("a to-be-closed variable closes a set of any kind", function()
    write(dir .. "/a.lua", tool_file("a"))
    local folder, static
    do
      local f <close> = assert(tools.dir(dir, { debounce = 0.02 }))
      local s <close> = tools.static { { name = "a", description = "A", run = function() return "a" end } }
      folder, static = f, s
    end
    assert.is_true(folder.closed)
    assert.is_nil(folder.watcher)
    assert.is_true(static.closed)
  end)

  it("an MCP set's close stops its server and supervisor; its tools then fail as closed", function()
    local set = assert(tools.mcp { command = { FAKE[1], FAKE[2], dir }, name = "fake" })
    local supervisor = set.task
    assert.equal("fake", set.label)
    assert.equal("ready", set:status().state)
    set:close()
    set:close()
    assert.is_true(set.closed)
    assert.equal("closed", set:status().state)
    assert.is_nil(set.task)
    assert.is_true(supervisor:status() == "failed" or supervisor:status() == "done")
    local out, err = set:call("read_slow", {}, {})
    assert.is_nil(out)
    assert.matches("the tool set is closed", err.message)
    assert.is_true(#set:snapshot().names > 0) -- the last list stays
  end)
end)

describe("the tool set base", function()
  it("gives a new kind of set the snapshot, the log and publish", function()
    local Kind = set_base.class("spec.Kind")
    local s = set_base.new(Kind, { label = "mine" })
    assert.equal(0, s:version())
    local t = tools.new { name = "x", description = "X", run = function() return "x" end }
    s:publish { x = t }
    assert.equal(1, s:version())
    assert.same({ "x" }, s:snapshot().names)
    local evs, cursor = s:events_since(nil)
    assert.equal(1, #evs)
    assert.equal("tools_changed", evs[1].type)
    assert.same({ "x" }, evs[1].added)
    s:publish { x = t } -- nothing changed: no new snapshot, no event
    assert.equal(1, s:version())
    assert.same({}, (s:events_since(cursor)))
    s:close()
    assert.is_true(s.closed)
  end)

  it("section_in_force: tool_policy first, else the policy's tool section, else the defaults", function()
    local mine = policies.tool_section { timeout = 7 }
    assert.equal(mine, tools.section_in_force(mine, nil))
    local p = { tool = { timeout = 3 } }
    local cache = require("luagent").default_runtime().policies
    assert.equal(3, tools.section_in_force(nil, p, cache).timeout)
    assert.same(policies.tool_section(nil), tools.section_in_force(nil, "no-such-policy-file", cache))
  end)
end)

-- The require graph of the tool layer's own files.
local FILES = {
  ["luagent.agent.tools"] = "lua/luagent/agent/tools/init.lua",
  ["luagent.agent.tools.tool"] = "lua/luagent/agent/tools/tool.lua",
  ["luagent.agent.tools.schema"] = "lua/luagent/agent/tools/schema.lua",
  ["luagent.agent.tools.set"] = "lua/luagent/agent/tools/set.lua",
  ["luagent.agent.tools.dir"] = "lua/luagent/agent/tools/dir.lua",
  ["luagent.agent.tools.mcp"] = "lua/luagent/agent/tools/mcp/init.lua",
  ["luagent.agent.tools.mcp.rpc"] = "lua/luagent/agent/tools/mcp/rpc.lua",
  ["luagent.agent.tools.mcp.stdio"] = "lua/luagent/agent/tools/mcp/stdio.lua",
  ["luagent.agent.tools.mcp.http"] = "lua/luagent/agent/tools/mcp/http.lua",
  ["luagent.agent.tools.mcp.content"] = "lua/luagent/agent/tools/mcp/content.lua",
  ["luagent.base.deadline"] = "lua/luagent/base/deadline.lua",
}

-- module -> {required module = true}; raises on a require inside a function
-- (an indented line) or one not of the form `local x = require "name"`.
local function requires(path)
  local out = {}
  local n = 0
  for line in io.lines(path) do
    n = n + 1
    local code = line:gsub("%-%-.*$", "")
    if code:find("%f[%w_]require%f[^%w_]") then
      local name = code:match('^local [%w_]+ = require%(?%s*"([%w_.]+)"%)?') or
        code:match('^local [%w_]+ = require%("([%w_.]+)"%)%.[%w_]+$')
      assert(name, path .. ":" .. n .. ": a require that is not at the top of the file: " .. line)
      out[name] = true
    end
  end
  return out
end

describe("the tool layer's modules", function()
  it("require only at the top of each file, and never the face, the agent or tools/init", function()
    for mod, path in pairs(FILES) do
      for dep in pairs(requires(path)) do
        assert(dep ~= "luagent", mod .. " requires the public face")
        assert(dep ~= "luagent.agent.loop", mod .. " requires the agent loop")
        if mod ~= "luagent.agent.tools" then
          assert(dep ~= "luagent.agent.tools", mod .. " requires the tools layer's entry")
        end
      end
    end
  end)

  it("form one direction: tool <- set <- dir, mcp <- tools, with no cycle", function()
    local graph = {}
    for mod, path in pairs(FILES) do graph[mod] = requires(path) end
    assert.is_nil(graph["luagent.agent.tools.set"]["luagent.agent.tools.dir"])
    assert.is_nil(graph["luagent.agent.tools.set"]["luagent.agent.tools.mcp"])
    assert.is_nil(graph["luagent.agent.tools.dir"]["luagent.agent.tools.mcp"])
    assert.is_nil(graph["luagent.agent.tools.mcp"]["luagent.agent.tools.dir"])
    assert.is_true(graph["luagent.agent.tools.dir"]["luagent.agent.tools.set"])
    assert.is_true(graph["luagent.agent.tools.mcp"]["luagent.agent.tools.set"])
    local state = {}
    local function visit(mod, trail)
      if state[mod] == "done" or not graph[mod] then return end
      assert(state[mod] ~= "open", "a require cycle: " .. table.concat(trail, " -> ") .. " -> " .. mod)
      state[mod] = "open"
      trail[#trail + 1] = mod
      for dep in pairs(graph[mod]) do visit(dep, trail) end
      trail[#trail] = nil
      state[mod] = "done"
    end
    for mod in pairs(graph) do visit(mod, {}) end
  end)
end)
