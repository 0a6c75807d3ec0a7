-- MCP servers that misbehave on purpose (spec/fixtures/mcp/hostile_server.lua):
-- a tools/list entry luagent cannot use (a schema holding 1e999, or nested
-- 100 levels), a server whose list "changes" each time it is read, one that
-- offers too many tools, one that floods requests and never reads its
-- stdin. None may hang the opener or the agent, exhaust the host, or drop
-- anything silently. Real child processes and the real clock; every wait
-- that would hang without the fix has a bound of its own, so the spec fails
-- instead of hanging the suite.
local luagent = require "luagent"
local mcp = require "luagent.agent.tools.mcp"
local mock = require "luagent.mock"
local json = require "luagent.base.json"
local helpers = require "helpers"

local SERVER = { "lua5.4", "spec/fixtures/mcp/hostile_server.lua" }
local BOUND = 20 -- seconds, generous: real processes on a loaded machine

local files, srv = {}, nil

-- A temporary file holding `text`, removed after the test.
local function file(text)
  local path = helpers.tempfile(text, ".json")
  files[#files + 1] = path
  return path
end

-- opens a set on the hostile server with `env` and extra options, within
-- BOUND seconds: set | nil, err; a hang fails the test.
local function open(env, extra)
  local o = { command = SERVER, name = "hostile", env = env, ping_interval = false,
    restart = { strategy = "fixed", base = 30, jitter = 0 } }
  for k, v in pairs(extra or {}) do o[k] = v end
  -- this file's own copy of the MCP module (busted insulates spec files, so
  -- the face may hold another): the spies below patch its Set
  local ok, set, err = pcall(luagent.deadline, BOUND, mcp.open, o, luagent.default_runtime())
  assert(ok, "tools.mcp{} did not return within " .. BOUND .. " s: " .. tostring(set))
  return set, err
end

-- The tools_reload_failed events of a set so far.
local function reports(set)
  local out = {}
  for _, e in ipairs(set:events_since(nil)) do
    if e.type == "tools_reload_failed" then out[#out + 1] = e end
  end
  return out
end

-- Waits (real time, at most BOUND s) until fn() is true; returns fn().
local function eventually(fn)
  local deadline = luagent.now() + BOUND
  while not fn() and luagent.now() < deadline do luagent.sleep(0.01) end
  return fn()
end

-- A schema nested `levels` deep: {properties = {x = {properties = ...}}}.
local function deep_schema(levels)
  local s = '{"type":"object"}'
  for _ = 1, levels do s = '{"type":"object","properties":{"x":' .. s .. "}}" end
  return s
end

local INF_TOOL = '{"name":"inf","inputSchema":{"type":"object","properties":{"n":{"type":"number","maximum":1e999}}}}'
local DEEP_TOOL = '{"name":"deep","inputSchema":' .. deep_schema(100) .. "}"
local OK_TOOL = '{"name":"ok","description":"fine","inputSchema":{"type":"object"}}'
local CHANGE_TOOL = '{"name":"change","inputSchema":{"type":"object"}}'

before_each(function() luagent.configure { log_sink = function() end } end)
after_each(function()
  for _, p in ipairs(files) do os.remove(p) end
  files = {}
  if srv then srv:close() srv = nil end
  luagent.configure { log_sink = false }
end)

describe("a tools/list entry luagent cannot use", function()
  it("is left out and reported when its inputSchema holds 1e999; the others are offered", function()
    local set = assert(open { HOSTILE_LIST = file('{"tools":[' .. INF_TOOL .. "," .. OK_TOOL .. "]}") })
    assert.same({ "ok" }, set:snapshot().names)
    local r = reports(set)
    assert.equal(1, #r)
    assert.equal("hostile", r[1].server)
    assert.equal("inf", r[1].tool)
    assert.equal("hostile: tool 'inf' is left out: its inputSchema holds a number JSON cannot carry "
      .. "(1e999, NaN or Infinity) at properties.n.maximum", r[1].message)
    set:close()
  end)

  it("is left out and reported when its inputSchema is nested 100 levels", function()
    local set = assert(open { HOSTILE_LIST = file('{"tools":[' .. DEEP_TOOL .. "," .. OK_TOOL .. "]}") })
    assert.same({ "ok" }, set:snapshot().names)
    local r = reports(set)
    assert.equal(1, #r)
    assert.equal("deep", r[1].tool)
    assert.equal("hostile: tool 'deep' is left out: its inputSchema is nested more than "
      .. mcp.MAX_SCHEMA_DEPTH .. " levels deep", r[1].message)
    set:close()
  end)

  it("is left out and reported on a re-list after list_changed too", function()
    local set = assert(open {
      HOSTILE_LIST = file('{"tools":[' .. CHANGE_TOOL .. "]}"),
      HOSTILE_RELIST = file('{"tools":[' .. CHANGE_TOOL .. "," .. INF_TOOL .. "," .. DEEP_TOOL .. "," .. OK_TOOL .. "]}"),
    })
    assert.equal("change done", set:call("change", {}, {}))
    assert.is_true(eventually(function() return set:snapshot().tools.ok ~= nil end), "the re-list was not taken")
    assert.same({ "change", "ok" }, set:snapshot().names)
    local left = {}
    for _, e in ipairs(reports(set)) do left[#left + 1] = e.tool end
    table.sort(left)
    assert.same({ "deep", "inf" }, left)
    set:close()
  end)

  it("is reported by `luagent mcp list` on stderr", function()
    local list = file('{"tools":[{"description":"no name"},' .. OK_TOOL .. "]}")
    local r = helpers.run("mcp", "list", "--name", "hostile", "--", "env", "HOSTILE_LIST=" .. list,
      SERVER[1], SERVER[2])
    assert.equal(0, r.code, r.stderr)
    assert.matches("1 tool;", r.stdout)
    assert.matches("\nok ", r.stdout)
    assert.equal('luagent mcp: hostile: a tool without a name: {"description":"no name"}\n', r.stderr)
  end)

  it("any error while the handshake lists wakes the opener with nil, err", function()
    local make_tool = mcp.Set.make_tool
    mcp.Set.make_tool = function() error("boom", 0) end
    local ok, set, err = pcall(open, { HOSTILE_LIST = file('{"tools":[' .. OK_TOOL .. "]}") })
    mcp.Set.make_tool = make_tool
    assert(ok, set)
    assert.is_nil(set)
    assert.equal("protocol", err.kind)
    assert.equal("hostile: the handshake failed: boom", err.message)
  end)
end)

describe("list_changed during a re-list", function()
  it("does not leave the agent's next turn waiting, even when every re-list is announced again", function()
    local set = assert(open {
      HOSTILE_ANNOUNCE = "1",
      HOSTILE_LIST = file('{"tools":[' .. CHANGE_TOOL .. "]}"),
      HOSTILE_RELIST = file('{"tools":[' .. CHANGE_TOOL .. "," .. OK_TOOL .. "]}"),
    })
    local saw_ok
    srv = assert(mock.start { seed = 1, script = function(view, n)
      if n == 1 then return { tools = { { id = "1", name = "change", arguments = {} } } } end
      for _, t in ipairs(view.tools) do if t.name == "ok" then saw_ok = true end end
      return { text = "done" }
    end })
    local a = luagent.agent { model = { kind = "openai", model = "m", base_url = srv.url .. "/v1", api_key = "k" },
      tools = set }
    local ok, evs, last = pcall(luagent.deadline, BOUND, helpers.drain, a)
    assert(ok, "the agent did not finish within " .. BOUND .. " s: " .. tostring(evs))
    assert.equal("stop", last.stop_reason)
    assert.is_true(saw_ok, "the next turn did not get the re-listed tools")
    -- the server announces a change during every re-list: luagent stops
    -- after a few in a row, and says so
    assert.is_true(eventually(function() return not set.relisting end), "the re-lists never stopped")
    local r = reports(set)
    assert.equal(1, #r)
    assert.equal(string.format("hostile: the list changed again during each of %d re-lists in a row; "
      .. "the last list is kept until the next notice", mcp.MAX_RELISTS), r[1].message)
    set:close()
  end)
end)

describe("the tools taken from one server", function()
  it("are at most 1,000 by default; the rest are reported, and no further page is read", function()
    local set = assert(open { HOSTILE_TOOLS = "2500", HOSTILE_PAGE = "600" })
    assert.equal(1000, #set:snapshot().names)
    assert.equal(1000, mcp.defaults.max_tools)
    assert.is_truthy(set:snapshot().tools.t1000)
    assert.is_nil(set:snapshot().tools.t1001)
    local r = reports(set)
    assert.equal(1, #r)
    assert.equal("hostile: more than 1000 tools (max_tools); the first 1000 are offered, these and any "
      .. "on later pages are left out: t1001, t1002, t1003, t1004, t1005 and 195 more", r[1].message)
    assert.equal("listed from 1 | listed from 601", set.transport:stderr_tail())
    set:close()
  end)

  it("are capped by max_tools", function()
    assert.has_error(function() luagent.tools.mcp { command = SERVER, max_tools = 0 } end,
      "tools.mcp: max_tools must be a number > 0")
    local set = assert(open({ HOSTILE_TOOLS = "8", HOSTILE_PAGE = "3" }, { max_tools = 5 }))
    assert.same({ "t1", "t2", "t3", "t4", "t5" }, set:snapshot().names)
    assert.equal("hostile: more than 5 tools (max_tools); the first 5 are offered, these and any "
      .. "on later pages are left out: t6", reports(set)[1].message)
    set:close()
  end)

  it("hold at most max_message bytes of definitions", function()
    -- one tool a page, each message under max_message, together over it
    local set = assert(open({ HOSTILE_TOOLS = "8", HOSTILE_PAGE = "1", HOSTILE_DESCRIPTION = "3000" },
      { max_message = 10000 }))
    assert.same({ "t1", "t2", "t3" }, set:snapshot().names)
    assert.equal("hostile: the tools' definitions pass 10000 bytes (max_message); the first 3 are offered, "
      .. "these and any on later pages are left out: t4", reports(set)[1].message)
    set:close()
  end)
end)

describe("a server that floods requests and never reads its stdin", function()
  it("is dropped as misbehaving once max_message bytes of replies wait for it, and reported by name", function()
    local set = assert(open({ HOSTILE_LIST = file('{"tools":[{"name":"flood"}]}') },
      { max_message = 10000, name = "flood" }))
    local ok, r, err = pcall(luagent.deadline, BOUND, set.call, set, "flood", {}, {})
    assert(ok, "the call did not end within " .. BOUND .. " s: " .. tostring(r))
    assert.is_nil(r)
    assert.is_true(err.died) -- the call may have run: it got no answer
    assert.is_true(eventually(function() return set:status().state == "down" end), "the server was not dropped")
    err = set:status().last_error
    assert.equal("protocol", err.kind)
    assert.equal("flood does not read its stdin: more than 10000 bytes wait for it (max_message); "
      .. "the connection is dropped", err.message)
    assert.is_true(eventually(function() return #reports(set) > 0 end), "the restart was not reported")
    assert.matches("^flood: flood does not read its stdin: .*; restarting in 30 s$", reports(set)[1].message)
    set:close()
  end)

  it("fails open() with that error when it floods from the start", function()
    local set, err = open({ HOSTILE_FLOOD = "200000" }, { max_message = 10000, name = "flood" })
    assert.is_nil(set)
    assert.equal("flood does not read its stdin: more than 10000 bytes wait for it (max_message); "
      .. "the connection is dropped", err.message)
  end)
end)
