-- Tool sets from MCP servers (lua/luagent/mcp/): against the reference
-- servers from npm (@modelcontextprotocol/server-everything over stdio and
-- Streamable HTTP, server-filesystem), a server on the official SDK whose
-- list changes, a small Lua server that is killed mid-call, and broken
-- servers (garbage, an oversized message, silence). Real child processes,
-- real pipes and sockets, the real clock with short timeouts (the servers
-- are real processes: virtual time would run as real time anyway). The
-- node servers are skipped, with the reason, without node or `make peers`.
local luagent = require "luagent"
local mock = require "luagent.mock"
local retry = require "luagent.model.call"
local tools = require "luagent.agent.tools"
local json = require "luagent.base.json"
local peers = require "peers"
local helpers = require "helpers"

local FAKE = { "lua5.4", "spec/fixtures/mcp/fake_server.lua" }

local everything, why_everything = peers.find("@modelcontextprotocol/server-everything", "mcp-server-everything")
local filesystem, why_filesystem = peers.find("@modelcontextprotocol/server-filesystem", "mcp-server-filesystem")

local srv

-- Marks the enclosing describe pending (and returns true) without `peer`.
local function skipped(peer, why)
  if peer then return false end
  pending("not installed: run `make peers` (needs node and npm): " .. why)
  return true
end

-- Waits (real time, at most 5 s) until the set's state is `state`.
local function wait_state(set, state)
  local deadline = luagent.now() + 5
  while set:status().state ~= state and luagent.now() < deadline do luagent.sleep(0.005) end
end

-- A mock whose replies are `replies[n]` for request n (a function of the
-- request view, or a content table); past the list it answers "done".
local function start_mock(replies)
  srv = assert(mock.start { seed = 1, script = function(view, n)
    local r = replies[n]
    if type(r) == "function" then r = r(view, n) end
    return r or { text = "done" }
  end })
end

local function model()
  return { kind = "openai", model = "m", base_url = srv.url .. "/v1", api_key = "k" }
end

local function call(id, name, args) return { id = id, name = name, arguments = args or {} } end

local TOOL_POLICY = { max_retries = 2, backoff = { strategy = "fixed", base = 0.05 }, timeout = 20, grace = 0.2 }

local drain, of_type = helpers.drain, helpers.of_type

local function offered(view, name)
  for _, t in ipairs(view.tools) do if t.name == name then return true end end
  return false
end

-- A fresh temporary folder (removed by the caller).
local function tempdir()
  local p = io.popen("mktemp -d")
  local d = p:read("l")
  p:close()
  return d
end

local function write(path, text)
  local f = assert(io.open(path, "w"))
  f:write(text)
  f:close()
end

local function exists(path)
  local f = io.open(path)
  if f then f:close() end
  return f ~= nil
end

-- Gives the enclosing describe a fresh folder for the fake server in each
-- test, with read_slow marked as called (so it answers at once); returns
-- the function that gives the folder.
local function fake_dir()
  local dir
  before_each(function()
    dir = tempdir()
    write(dir .. "/read_slow", "called before\n")
  end)
  after_each(function() os.execute("rm -rf '" .. dir .. "'") end)
  return function() return dir end
end

-- Records what the client sends through the set's transport.
local function record_sent(set)
  local sent, t = {}, set.transport
  local orig = t.send
  t.send = function(self, text)
    sent[#sent + 1] = json.decode(text)
    return orig(self, text)
  end
  return sent
end

before_each(function() luagent.configure { log_sink = function() end } end)
after_each(function()
  if srv then srv:close() srv = nil end
  luagent.configure { log_sink = false }
end)

describe("an MCP tool set on server-everything (stdio)", function()
  if skipped(everything, why_everything) then return end
  local cmd = { everything.node, everything.bin }

  it("does the handshake, lists the tools and reports them as a tools_changed event", function()
    local set = assert(luagent.tools.mcp { command = cmd, name = "everything" })
    local st = set:status()
    assert.equal("ready", st.state)
    assert.equal("2025-11-25", st.protocol)
    assert.equal("mcp-servers/everything", st.server.name)
    local snap = set:snapshot()
    for _, n in ipairs({ "echo", "get-sum", "get-tiny-image", "trigger-long-running-operation" }) do
      assert.is_truthy(snap.tools[n], n)
    end
    assert.same({ "message" }, snap.tools.echo.params.required)
    assert.equal("Echoes back the input string", snap.tools.echo.description)
    local evs = set:events_since(nil)
    assert.equal("tools_changed", evs[1].type)
    assert.same(snap.names, evs[1].added)
    assert.is_true(tools.is_set(set))
    set:close()
  end)

  it("maps annotations onto flags only for trusted servers; overrides per tool win", function()
    local plain = assert(luagent.tools.mcp { command = cmd, name = "everything" })
    local t = plain:snapshot().tools
    assert.is_false(t.echo.read_only)
    assert.is_false(t.echo.idempotent)
    assert.is_true(t.echo.mcp.hints.read_only) -- known, not used
    assert.is_false(t.echo.mcp.trusted)
    plain:close()

    local trusted = assert(luagent.tools.mcp { command = cmd, name = "everything",
      tool_policy = { trust_hints = { "everything" }, overrides = { ["get-sum"] = { read_only = false } } } })
    t = trusted:snapshot().tools
    assert.is_true(t.echo.read_only)
    assert.is_true(t.echo.idempotent)
    assert.is_false(t["gzip-file-as-resource"].read_only) -- readOnlyHint false, idempotentHint true
    assert.is_true(t["gzip-file-as-resource"].idempotent)
    assert.is_false(t["toggle-simulated-logging"].read_only)
    assert.is_false(t["toggle-simulated-logging"].idempotent)
    assert.is_false(t["get-sum"].read_only) -- the override
    assert.is_true(t["get-sum"].idempotent)
    trusted:close()

    -- a server not in the list is not trusted
    local other = assert(luagent.tools.mcp { command = cmd, name = "other",
      tool_policy = { trust_hints = { "everything" } } })
    assert.is_false(other:snapshot().tools.echo.read_only)
    other:close()
  end)

  it("calls tools: text, structured content as JSON, images described, errors as error results", function()
    local set = assert(luagent.tools.mcp { command = cmd })
    local t = set:snapshot().tools
    local pol = require("luagent.model.policy").tool_section(nil)
    local function run(name, args)
      return tools.execute(t[name], { id = "c", name = name, arguments = args }, { policy = pol })
    end
    assert.equal("Echo: hi there", run("echo", { message = "hi there" }).content)
    assert.equal("The sum of 2 and 3 is 5.", run("get-sum", { a = 2, b = 3 }).content)
    local sc = run("get-structured-content", { location = "Chicago" })
    assert.is_nil(sc.error)
    local decoded = json.decode(sc.content:match("(%b{})"))
    assert.is_number(decoded.temperature)
    local img = run("get-tiny-image", {})
    assert.matches("%[image content: image/png, %d+ bytes, not shown%]", img.content)
    assert.matches("MCP logo", img.content)
    -- arguments are checked against the server's inputSchema before it is asked
    local bad = run("get-sum", { a = 1, b = "x" })
    assert.equal("invalid_arguments", bad.error.kind)
    assert.equal("invalid arguments for get-sum: arguments.b: expected number, got string", bad.content)
    -- the server's own refusal is an error result
    local r, err = set:call("get-sum", { a = 1, b = "x" }, {})
    assert.is_nil(r)
    assert.equal("tool_error", err.kind)
    assert.is_false(err.retryable)
    assert.matches("get%-sum failed: .*expected number", err.message)
    -- a tool the server does not have
    local none, nerr = set:call("no-such-tool", {}, {})
    assert.is_nil(none)
    assert.matches("no%-such%-tool failed: .*not found", nerr.message)
    set:close()
  end)

  it("cancels a long-running call at its timeout with notifications/cancelled", function()
    local set = assert(luagent.tools.mcp { command = cmd, timeout = 0.3 })
    local sent = record_sent(set)
    local tool = set:snapshot().tools["trigger-long-running-operation"]
    local pol = require("luagent.model.policy").tool_section(nil)
    local t0 = luagent.now()
    local out = tools.execute(tool, call("c1", tool.name, { duration = 30, steps = 30 }), { policy = pol })
    assert.is_true(luagent.now() - t0 < 5)
    -- untrusted hints: no flags, so a timed-out call's outcome is unknown
    assert.is_true(out.unknown)
    assert.equal("tool_timeout", out.error.cause.kind)
    local call_id, cancelled
    for _, m in ipairs(sent) do
      if m.method == "tools/call" then call_id = m.id end
      if m.method == "notifications/cancelled" then cancelled = m end
    end
    assert.is_truthy(cancelled, "no notifications/cancelled sent")
    assert.equal(call_id, cancelled.params.requestId)
    -- the server still answers
    assert.equal("Echo: still here", set:call("echo", { message = "still here" }, {}))
    set:close()
  end)

  it("cancels the call in flight with notifications/cancelled when the agent is aborted", function()
    local set = assert(luagent.tools.mcp { command = cmd })
    local sent = record_sent(set)
    start_mock { { tools = { call("1", "trigger-long-running-operation", { duration = 30, steps = 30 }) } } }
    local a = luagent.agent { model = model(), tools = set, tool_policy = TOOL_POLICY }
    local last
    for ev in a:prompt("go") do
      if ev.type == "tool_execution_start" then a:abort("user stop") end
      last = ev
    end
    assert.equal("aborted", last.stop_reason)
    local cancelled
    for _, m in ipairs(sent) do if m.method == "notifications/cancelled" then cancelled = m end end
    assert.is_truthy(cancelled, "no notifications/cancelled sent")
    assert.equal("cancelled by the client", cancelled.params.reason)
    local call
    for _, m in ipairs(sent) do if m.method == "tools/call" then call = m end end
    assert.is_truthy(call, "no tools/call sent")
    assert.equal(call.id, cancelled.params.requestId)
    set:close()
  end)

  it("passes progress notifications on as tool_execution_update", function()
    local set = assert(luagent.tools.mcp { command = cmd })
    local updates = {}
    local text = set:call("trigger-long-running-operation", { duration = 0.2, steps = 2 }, {
      progress = function(_, d) updates[#updates + 1] = d end })
    assert.matches("Long running operation completed", text)
    assert.equal(2, #updates)
    assert.equal(2, updates[2].progress)
    set:close()
  end)
end)

describe("an MCP tool set over Streamable HTTP (server-everything)", function()
  if skipped(everything, why_everything) then return end
  local server
  lazy_setup(function()
    local err
    server, err = peers.start { node = everything.node, script = "spec/fixtures/mcp/everything_http.cjs",
      args = { "{port}" }, ready = "/mcp" }
    assert(server, "server-everything did not start: " .. tostring(err))
  end)
  lazy_teardown(function() if server then server:stop() end end)

  it("does the handshake with a session, calls tools (SSE replies included) and ends the session", function()
    local set = assert(luagent.tools.mcp { url = server.url .. "/mcp", tool_policy = { trust_hints = true } })
    assert.equal("2025-11-25", set:status().protocol)
    assert.is_string(set.transport.session_id)
    assert.is_true(set:snapshot().tools.echo.read_only)
    assert.equal("Echo: over http", set:call("echo", { message = "over http" }, {}))
    local updates = {}
    local text = set:call("trigger-long-running-operation", { duration = 0.2, steps = 2 }, {
      progress = function(_, d) updates[#updates + 1] = d end })
    assert.matches("Long running operation completed", text)
    assert.equal(2, #updates) -- progress came on the call's SSE stream
    local none, err = set:call("get-sum", { a = "x" }, {})
    assert.is_nil(none)
    assert.matches("expected number", err.message)
    local id = set.transport.session_id
    set:close()
    assert.matches("termination request for session " .. id:gsub("%-", "%%-"), server:log())
  end)

  it("hears list_changed on the session's GET stream", function()
    local changing = assert(peers.start { node = everything.node, script = "spec/fixtures/mcp/changing_server.cjs",
      args = { "http", "{port}" }, ready = "/mcp" })
    local set = assert(luagent.tools.mcp { url = changing.url .. "/mcp", name = "changing" })
    assert.same({ "add_tool" }, set:snapshot().names)
    assert.equal("extra_tool added", set:call("add_tool", {}, {}))
    -- the notice comes on the GET stream, on its own time
    local deadline = luagent.now() + 5
    while #set:snapshot().names < 2 and luagent.now() < deadline do luagent.sleep(0.01) end
    assert.same({ "add_tool", "extra_tool" }, set:snapshot().names)
    assert.same({ "extra_tool" }, set:events_since(nil)[2].added)
    assert.equal("extra says hi", set:call("extra_tool", { word = "hi" }, {}))
    set:close()
    changing:stop()
  end)

  it("fails with a clear error when nothing listens", function()
    local set, err = luagent.tools.mcp { url = "http://127.0.0.1:9/mcp", name = "nowhere" }
    assert.is_nil(set)
    assert.matches("nowhere at http://127.0.0.1:9/mcp", err.message)
  end)
end)

describe("list_changed", function()
  if skipped(everything, why_everything) then return end

  it("is picked up while an agent runs: the next turn has the new tool", function()
    local set = assert(luagent.tools.mcp { command = { everything.node, "spec/fixtures/mcp/changing_server.cjs" },
      name = "changing" })
    start_mock {
      function(view)
        assert.is_false(offered(view, "extra_tool"))
        return { tools = { call("1", "add_tool") } }
      end,
      function(view)
        assert.is_true(offered(view, "extra_tool"))
        return { tools = { call("2", "extra_tool", { word = "hello" }) } }
      end,
      function(view) return { text = "got: " .. tostring(view.last_text) } end,
    }
    local a = luagent.agent { model = model(), tools = { set }, tool_policy = TOOL_POLICY }
    local evs, last = drain(a)
    assert.equal("stop", last.stop_reason)
    local seq = {}
    for _, e in ipairs(evs) do
      if e.type == "tools_changed" or e.type == "turn_start" then seq[#seq + 1] = e.type end
    end
    assert.equal("tools_changed turn_start tools_changed turn_start turn_start", table.concat(seq, " "))
    assert.same({ "extra_tool" }, of_type(evs, "tools_changed")[2].added)
    assert.equal("got: extra says hello", last.messages[#last.messages].content)
    set:close()
  end)
end)

describe("an agent with server-filesystem's tools", function()
  if skipped(filesystem, why_filesystem) then return end

  it("answers a question about files in a folder", function()
    local dir = tempdir()
    write(dir .. "/apples.txt", "12 green apples\n")
    write(dir .. "/pears.txt", "3 ripe pears\n")
    local set = assert(luagent.tools.mcp { command = { filesystem.node, filesystem.bin, dir }, name = "files",
      tool_policy = { trust_hints = { "files" } } })
    start_mock {
      function(view)
        assert.is_true(offered(view, "list_directory"))
        return { text = "Let me look.", tools = { call("1", "list_directory", { path = dir }) } }
      end,
      function(view)
        local file = view.last_text:match("%[FILE%] (pear%S*)")
        return { tools = { call("2", "read_text_file", { path = dir .. "/" .. tostring(file) }) } }
      end,
      function(view) return { text = "The folder says: " .. view.last_text } end,
    }
    local a = luagent.agent { model = model(), tools = set, tool_policy = TOOL_POLICY }
    local evs, last = drain(a, "How many pears are there?")
    os.execute("rm -rf '" .. dir .. "'")
    assert.equal("stop", last.stop_reason)
    local ends = of_type(evs, "tool_execution_end")
    assert.equal(2, #ends)
    assert.matches("%[FILE%] apples.txt", ends[1].result)
    assert.matches("%[FILE%] pears.txt", ends[1].result)
    assert.equal("3 ripe pears\n", ends[2].result)
    assert.equal("The folder says: 3 ripe pears\n", last.messages[#last.messages].content)
    assert.is_true(set:snapshot().tools.read_text_file.read_only)
    set:close()
  end)
end)

describe("server-filesystem given its folder as a root", function()
  if skipped(filesystem, why_filesystem) then return end

  it("asks the client for roots/list and serves the folder it is given", function()
    local dir = tempdir()
    write(dir .. "/note.txt", "from a root\n")
    local set = assert(luagent.tools.mcp { command = { filesystem.node, filesystem.bin }, roots = { dir } })
    local deadline = luagent.now() + 5
    local text
    repeat -- the server asks for the roots once initialized
      text = set:call("list_allowed_directories", {}, {})
      if not text:find(dir, 1, true) then luagent.sleep(0.02) end
    until text:find(dir, 1, true) or luagent.now() > deadline
    assert.matches(dir:gsub("%p", "%%%0"), text)
    assert.equal("from a root\n", set:call("read_text_file", { path = dir .. "/note.txt" }, {}))
    set:close()
    os.execute("rm -rf '" .. dir .. "'")
  end)
end)

describe("a server killed mid-call", function()
  local dir, set
  before_each(function()
    dir = tempdir()
    local cmd = { FAKE[1], FAKE[2], dir }
    set = assert(luagent.tools.mcp { command = cmd, name = "fake", tool_policy = { trust_hints = true },
      restart = { strategy = "fixed", base = 0.02 } })
  end)
  after_each(function()
    set:close()
    os.execute("rm -rf '" .. dir .. "'")
  end)

  -- Kills the server's process group once `marker` exists (the call is in).
  local function kill_when(marker)
    return luagent.spawn(function()
      while not exists(dir .. "/" .. marker) do luagent.sleep(0.01) end
      os.execute("kill -9 -" .. set.transport.proc:pid())
    end)
  end

  it("retries a read-only call once the server is back", function()
    start_mock { { tools = { call("1", "read_slow") } }, function(view) return { text = view.last_text } end }
    local killer = kill_when("read_slow")
    local a = luagent.agent { model = model(), tools = set, tool_policy = TOOL_POLICY }
    local evs, last = drain(a)
    killer:join()
    assert.equal("stop", last.stop_reason)
    local retries = of_type(evs, "tool_retry")
    assert.equal(1, #retries)
    assert.matches("fake stopped while the call ran: fake was killed by signal 9", retries[1].error)
    local en = of_type(evs, "tool_execution_end")[1]
    assert.equal("read_slow done", en.result)
    assert.equal(2, en.attempts)
    assert.equal(1, set:status().restarts)
    assert.equal("tools_reload_failed", set:events_since(nil)[2].type) -- the restart is reported
  end)

  it("stops the run with outcome_unknown for a tool without flags", function()
    start_mock { { tools = { call("1", "write_slow") } } }
    local killer = kill_when("write_slow")
    local a = luagent.agent { model = model(), tools = set, tool_policy = TOOL_POLICY }
    local evs, last = drain(a)
    killer:join()
    assert.equal("error", last.stop_reason)
    assert.equal("outcome_unknown", last.error.kind)
    assert.matches("write_slow .*died without a result", last.error.message)
    assert.equal(0, #of_type(evs, "tool_retry"))
    -- the server came back: its tools work again
    wait_state(set, "ready")
    assert.equal("write_slow done", set:call("write_slow", {}, {}))
  end)

  it("fails fast while the server is down", function()
    set.restart = { strategy = "fixed", base = 30, max = 30, multiplier = 2, jitter = 0 }
    os.execute("kill -9 -" .. set.transport.proc:pid())
    wait_state(set, "down")
    local t0 = luagent.now()
    local r, err = set:call("read_slow", {}, {})
    assert.is_nil(r)
    assert.is_true(luagent.now() - t0 < 0.5)
    assert.is_true(err.retryable)
    assert.equal("fake is down (fake was killed by signal 9 (stderr: fake server started)); restarting in 30 s", err.message)
  end)
end)

describe("the protocol with a small server", function()
  local dir = fake_dir()

  local function fake(env, extra)
    local o = { command = { FAKE[1], FAKE[2], dir() }, name = "fake", env = env }
    for k, v in pairs(extra or {}) do o[k] = v end
    return luagent.tools.mcp(o)
  end

  it("accepts an older version the server answers with, and refuses one it does not speak", function()
    local set = assert(fake { FAKE_VERSION = "2024-11-05" })
    assert.equal("2024-11-05", set:status().protocol)
    set:close()
    local bad, err = fake { FAKE_VERSION = "1999-01-01" }
    assert.is_nil(bad)
    assert.equal("protocol", err.kind)
    assert.equal("fake speaks MCP 1999-01-01; luagent speaks 2024-11-05, 2025-03-26, 2025-06-18, 2025-11-25",
      err.message)
  end)

  it("reads every page of tools/list", function()
    local set = assert(fake({ FAKE_PAGED = "1" }, { prefix = "f_" }))
    local sent = record_sent(set)
    assert.same({ "f_garble", "f_read_slow", "f_write_slow" }, set:snapshot().names)
    assert.equal("read_slow", set:snapshot().tools.f_read_slow.mcp.name)
    set:close()
    assert.same({}, sent) -- the pages were read in the handshake
  end)

  it("drops the connection when the server answers a call with garbage, and restarts it", function()
    local set = assert(fake(nil, { restart = { strategy = "fixed", base = 0.01 } }))
    local r, err = set:call("garble", {}, {})
    assert.is_nil(r)
    assert.is_true(err.died)
    assert.equal('garble got no answer: fake stopped while the call ran: fake wrote "oops not json": '
      .. "not JSON-RPC (not a JSON object); the connection is dropped", err.message)
    wait_state(set, "ready")
    assert.equal("read_slow done", set:call("read_slow", {}, {}))
    assert.equal(1, set:status().restarts)
    set:close()
  end)

  it("restarts a server that keeps exiting with growing backoff", function()
    local set = assert(fake({ FAKE_EXIT_AFTER_LIST = "1" }, { restart = { strategy = "exponential", base = 0.01,
      multiplier = 2, jitter = 0, max = 10 } }))
    local deadline = luagent.now() + 10
    while set:status().restarts < 4 and luagent.now() < deadline do luagent.sleep(0.01) end
    set:close()
    local waits = {}
    for _, e in ipairs(set:events_since(nil)) do
      if e.type == "tools_reload_failed" then
        assert.matches("^fake: fake exited with code 3 %(stderr: fake server started%); restarting in", e.message)
        waits[#waits + 1] = e.message:match("restarting in (%S+) s$")
      end
    end
    assert.same({ "0.01", "0.02", "0.04", "0.08" }, { table.unpack(waits, 1, 4) })
  end)

  it("restarts a server that stops answering pings; the read-only call in flight is retried", function()
    os.remove(dir() .. "/read_slow") -- the first call hangs the server
    local set = assert(fake(nil, { ping_interval = 0.05, ping_timeout = 0.2, tool_policy = { trust_hints = true },
      restart = { strategy = "fixed", base = 0.01 } }))
    local out = tools.execute(set:snapshot().tools.read_slow, call("c", "read_slow"),
      { policy = require("luagent.model.policy").tool_section(TOOL_POLICY) })
    assert.equal("read_slow done", out.content)
    assert.equal(2, out.attempts)
    assert.equal(1, set:status().restarts)
    assert.equal("fake did not answer a ping within 0.2 s", set:status().last_error.message)
    set:close()
  end)
end)

describe("a broken server", function()
  after_each(function()
    -- nothing of a closed or failed set is left on the loop
    assert.equal(0, luagent.stats().timers)
  end)

  it("writing garbage on stdout gives a clear error", function()
    local set, err = luagent.tools.mcp { command = { "sh", "-c", "echo hello world; while read -r l; do :; done" },
      name = "garbage" }
    assert.is_nil(set)
    assert.equal("protocol", err.kind)
    assert.equal('garbage wrote "hello world": not JSON-RPC (not a JSON object); the connection is dropped',
      err.message)
  end)

  it("sending an oversized message gives a clear error", function()
    local set, err = luagent.tools.mcp { command = { "sh", "-c",
      "head -c 5000 /dev/zero | tr '\\0' x; echo; while read -r l; do :; done" }, name = "big", max_message = 1000 }
    assert.is_nil(set)
    assert.equal("protocol", err.kind)
    assert.equal("big wrote a message longer than 1000 bytes (max_message); the connection is dropped", err.message)
  end)

  it("never answering initialize gives a clear error with its stderr", function()
    local t0 = luagent.now()
    local got = os.tmpname()
    local set, err = luagent.tools.mcp { command = { "sh", "-c", 'echo waiting forever >&2; cat >"$0"', got },
      name = "silent", init_timeout = 0.3 }
    assert.is_nil(set)
    assert.is_true(luagent.now() - t0 < 3)
    assert.equal("timeout", err.kind)
    assert.equal("silent did not answer initialize within 0.3 s (stderr: waiting forever)", err.message)
    -- it was asked once, and (as the spec says) initialize is never cancelled
    local f = assert(io.open(got))
    local lines = {}
    for line in f:lines() do lines[#lines + 1] = json.decode(line) end
    f:close()
    os.remove(got)
    assert.equal(1, #lines)
    assert.equal("initialize", lines[1].method)
    assert.equal("2025-11-25", lines[1].params.protocolVersion)
  end)

  it("that does not exist gives a clear error", function()
    local set, err = luagent.tools.mcp { command = { "/nonexistent/mcp-server" } }
    assert.is_nil(set)
    assert.matches("cannot start '/nonexistent/mcp%-server'", err.message)
  end)

  it("leaves the host running: the next server works", function()
    local dir = tempdir()
    write(dir .. "/read_slow", "called before\n") -- answers at once
    local set = assert(luagent.tools.mcp { command = { FAKE[1], FAKE[2], dir }, name = "fake" })
    assert.equal("ready", set:status().state)
    assert.equal("read_slow done", set:call("read_slow", {}, {}))
    set:close()
    os.execute("rm -rf '" .. dir .. "'")
  end)

  it("that closes its stdout is reported so", function()
    local set, err = luagent.tools.mcp { command = { "sh", "-c", "exec 1>&-; echo bye >&2; sleep 30" },
      name = "closer" }
    assert.is_nil(set)
    assert.equal("eof", err.kind)
    assert.equal("closer closed its stdout (stderr: bye)", err.message)
  end)

  it("rejects bad trust_hints and overrides in a tool policy, naming the field", function()
    local policy = require "luagent.model.policy"
    local _, err = policy.check_tool_section({ trust_hints = "yes" })
    assert.equal('tool_policy: trust_hints must be true, false, or a list of MCP server names (got "yes")', err.message)
    _, err = policy.check_tool_section({ overrides = { echo = { read_only = "no" } } })
    assert.matches("^tool_policy: overrides must be a table {tool_name = {read_only = true|false, "
      .. "idempotent = true|false}}", err.message)
    _, err = policy.check_tool_section({ overrides = { echo = { retries = 1 } } })
    assert.matches("^tool_policy: overrides must be", err.message)
    assert.has_error(function() luagent.tools.mcp { command = FAKE, tool_policy = { trust_hints = 1 } } end,
      "tools.mcp tool_policy: trust_hints must be true, false, or a list of MCP server names (got 1)")
  end)

  it("raises for bad options, naming them", function()
    assert.has_error(function() luagent.tools.mcp {} end,
      'tools.mcp: needs exactly one of command (an argv list) and url')
    assert.has_error(function() luagent.tools.mcp { command = { "x" }, colour = 1 } end,
      "tools.mcp: unknown option 'colour' (known: command, env, cwd, url, headers, name, prefix, timeout, policy, "
        .. "tool_policy, roots, restart, init_timeout, request_timeout, ping_interval, ping_timeout, max_message, "
        .. "max_tools)")
    assert.has_error(function() luagent.tools.mcp { command = { "x" }, prefx = "a" } end,
      "tools.mcp: unknown option 'prefx' (did you mean 'prefix'?)")
    assert.has_error(function() luagent.tools.mcp { url = "ftp://x" } end,
      "tools.mcp: url must be an http:// or https:// address")
    assert.has_error(function() luagent.tools.mcp { command = { "x" }, env = { A = 1 } } end,
      "tools.mcp: env.A must be a string (or false to leave it out)")
    assert.has_error(function() luagent.tools.mcp { url = "http://x", env = {} } end,
      "tools.mcp: env is for a server started as a command")
  end)
end)

describe("luagent mcp list", function()
  local dir = fake_dir()

  it("prints a server's tools with their flags and hints", function()
    local r = helpers.run("mcp", "list", "--name", "fake", "--", FAKE[1], FAKE[2], dir())
    assert.equal(0, r.code, r.stderr)
    assert.equal("fake 1, MCP 2025-11-25, 3 tools; hints not trusted (--trust, or trust_hints in a policy, uses them)\n"
      .. "TOOL        FLAGS                  HINTS\n"
      .. "garble      -                      destructive open-world\n"
      .. "read_slow   -                      read-only open-world\n"
      .. "write_slow  -                      destructive open-world\n", r.stdout)
    r = helpers.run("mcp", "list", "--trust", "--", FAKE[1], FAKE[2], dir())
    assert.equal(0, r.code, r.stderr)
    assert.matches("hints trusted\n", r.stdout)
    assert.matches("\nread_slow   read_only              read%-only open%-world\n", r.stdout)
  end)

  it("takes trust and overrides from a policy file", function()
    local policy = helpers.tempfile('return { tool = { trust_hints = { "fake" }, '
      .. 'overrides = { write_slow = { idempotent = true } } } }', ".lua")
    local r = helpers.run("mcp", "list", "--name", "fake", "--policy", policy, "--", FAKE[1], FAKE[2], dir())
    os.remove(policy)
    assert.equal(0, r.code, r.stderr)
    assert.matches("\nread_slow   read_only              read%-only open%-world\n", r.stdout)
    assert.matches("\nwrite_slow  idempotent             destructive open%-world\n", r.stdout)
  end)

  it("exits 1 with the server's error, 2 for usage, 0 for --help", function()
    local r = helpers.run("mcp", "list", "--name", "bad", "--", "sh", "-c", "echo nope; while read -r l; do :; done")
    assert.equal(1, r.code)
    assert.equal('luagent mcp: bad wrote "nope": not JSON-RPC (not a JSON object); the connection is dropped\n',
      r.stderr)
    r = helpers.run("mcp", "list")
    assert.equal(2, r.code)
    assert.matches("give a server", r.stderr)
    r = helpers.run("mcp", "list", "--colour", "--", "x")
    assert.equal(2, r.code)
    assert.matches("list: unknown flag '%-%-colour'", r.stderr)
    r = helpers.run("mcp", "list", "node", "server.js")
    assert.equal(2, r.code)
    assert.matches("list: the command comes after %-%-, not 'node'", r.stderr)
    r = helpers.run("mcp", "--help")
    assert.equal(0, r.code)
    assert.matches("usage: luagent mcp list", r.stdout)
  end)
end)
