-- The agent loop against the mock provider on loopback, with the mock
-- scripted to ask for tool calls: events, tool safety flags (retries,
-- outcome_unknown), timeouts that really stop tools, argument checks,
-- unknown tools, parallel calls, abort, the loop guard and max_turns.
local luagent = require "luagent"
local mock = require "luagent.mock"
local events = require("luagent").events
local helpers = require "helpers"

local srv, requests_seen

-- A mock whose replies are `replies[n]` for request n (a function of the
-- request view, or a content table); past the list it answers "done".
local function start(replies, faults)
  srv = assert(mock.start { faults = faults, seed = 1, script = function(view, n)
    local r = replies[n]
    if type(r) == "function" then r = r(view, n) end
    return r or { text = "done" }
  end })
  return srv
end

local function model(kind)
  return { kind = kind or "openai", model = "m", base_url = srv.url .. "/v1", api_key = "k" }
end

local function call(id, name, args) return { id = id, name = name, arguments = args or {} } end

-- A fast tool policy: fixed 0.1 s backoff (virtual time).
local POLICY = { max_retries = 2, backoff = { strategy = "fixed", base = 0.1 },
                 tool = { max_retries = 2, backoff = { strategy = "fixed", base = 0.1 }, timeout = 5, grace = 0.2 } }

local function agent(opts)
  opts.model = opts.model or model(opts.kind)
  opts.kind = nil
  opts.policy = opts.policy or POLICY
  return luagent.agent(opts)
end

local drain, of_type = helpers.drain, helpers.of_type

local AGENT_EVENTS = { agent_start = true, turn_start = true, turn_end = true, agent_end = true,
  tool_execution_start = true, tool_execution_update = true, tool_execution_end = true, tool_retry = true,
  message_start = true, message_end = true, provider_retry = true, tools_changed = true,
  tools_reload_failed = true }

local function sequence(evs)
  local out = {}
  for _, e in ipairs(evs) do
    if AGENT_EVENTS[e.type] then out[#out + 1] = e.type end
  end
  return table.concat(out, " ")
end

-- The request bodies the mock received.
local function bodies()
  local out = {}
  for _, r in ipairs(srv:requests()) do out[#out + 1] = r.body end
  return out
end

local tempfile, slurp = os.tmpname, helpers.slurp

local echo = { name = "echo", description = "Echoes its text", read_only = true,
  params = { type = "object", properties = { text = { type = "string", maxLength = 20 } }, required = { "text" },
             additionalProperties = false },
  run = function(args, ctx)
    ctx:progress { step = "echoing" }
    return "echo: " .. args.text
  end }

before_each(function()
  luagent.configure { log_sink = function() end }
  luagent.clock.virtual()
end)
after_each(function()
  if srv then srv:close() srv = nil end
  luagent.configure { log_sink = false }
  luagent.clock.real()
end)

describe("an agent", function()
  it("runs turns until an answer, with the documented events in order", function()
    start { { text = "Let me check.", tools = { call("1", "echo", { text = "hi" }) } }, { text = "It said hi." } }
    local a = agent { name = "t1", tools = { echo } }
    local evs, last = drain(a, "say hi")
    assert.equal("agent_start turn_start message_start message_end tool_execution_start "
      .. "tool_execution_update tool_execution_end turn_end turn_start message_start message_end "
      .. "turn_end agent_end", sequence(evs))
    assert.equal("stop", last.stop_reason)
    assert.equal(2, last.turns)
    assert.equal("t1", last.agent)
    assert.is_true(last.usage.input_tokens > 0)
    local st = of_type(evs, "tool_execution_start")[1]
    assert.equal("call_mock1", st.call_id)
    assert.equal("echo", st.name)
    assert.same({ text = "hi" }, st.arguments)
    local upd = of_type(evs, "tool_execution_update")[1]
    assert.same({ step = "echoing" }, upd.data)
    assert.equal("call_mock1", upd.call_id)
    local en = of_type(evs, "tool_execution_end")[1]
    assert.equal("echo: hi", en.result)
    assert.is_nil(en.error)
    assert.equal(1, en.attempts)
    assert.is_number(en.duration)
    local te = of_type(evs, "turn_end")
    assert.equal("Let me check.", te[1].message.content)
    assert.equal("echo: hi", te[1].tool_results[1].content)
    assert.equal("It said hi.", te[2].message.content)
    -- history: user, assistant with the call, the tool result, the answer
    local m = a.messages
    assert.equal(4, #m)
    assert.same({ "user", "assistant", "tool", "assistant" }, { m[1].role, m[2].role, m[3].role, m[4].role })
    assert.equal("call_mock1", m[3].tool_call_id)
    assert.is_false(m[3].is_error)
    -- the model got the tool's result in the second request
    local second = bodies()[2]
    assert.equal("tool", second.messages[#second.messages].role)
    assert.equal("echo: hi", second.messages[#second.messages].content)
    -- events are on the bus too
    assert.equal(last, evs[#evs])
  end)

  it("publishes its events on the bus, and continue() runs on the history", function()
    start { { text = "one" }, { text = "two" } }
    local seen = {}
    local unsub = events.subscribe(function(ev) if ev.agent == "bus" then seen[#seen + 1] = ev.type end end)
    local a = agent { name = "bus" }
    drain(a, "first")
    unsub()
    -- the model call's events carry the agent too (and its id)
    assert.same({ "agent_start", "turn_start", "message_start", "text_delta", "usage", "message_end",
                  "turn_end", "agent_end" }, seen)
    local evs = {}
    for ev in a:continue() do evs[#evs + 1] = ev end
    assert.equal("stop", evs[#evs].stop_reason)
    assert.equal(3, #a.messages) -- user, "one", "two"
    assert.equal("two", a.messages[3].content)
  end)

  it("retries a read-only tool that timed out once, and it succeeds", function()
    local runs = 0
    local keys = {}
    local slow = { name = "lookup", description = "Looks up", read_only = true, timeout = 2,
      params = { type = "object", properties = {} },
      run = function(_, ctx)
        runs = runs + 1
        keys[#keys + 1] = ctx.idempotency_key
        if runs == 1 then luagent.sleep(100) end
        return "found"
      end }
    start { { tools = { call("1", "lookup") } }, { text = "ok" } }
    local t0 = luagent.now()
    local evs, last = drain(agent { tools = { slow } })
    assert.equal("stop", last.stop_reason)
    assert.equal(2, runs)
    assert.equal(keys[1], keys[2]) -- one key for every attempt of a call
    local r = of_type(evs, "tool_retry")
    assert.equal(1, #r)
    assert.matches("tool_timeout: lookup timed out after 2 s", r[1].error_message)
    assert.equal("tool_timeout", r[1].error.kind)
    assert.equal(100, r[1].delay_ms)
    assert.equal(0.1, r[1].delay)
    assert.equal(r[1].error_message, tostring(r[1].error))
    local en = of_type(evs, "tool_execution_end")[1]
    assert.equal("found", en.result)
    assert.equal(2, en.attempts)
    assert.is_true(luagent.now() - t0 >= 2.1) -- the timeout and the backoff, on the virtual clock
    assert.is_true(luagent.now() - t0 < 10)
  end)

  it("stops with outcome_unknown when a tool with neither flag times out; it ran exactly once", function()
    local counter = tempfile()
    local create = { name = "create_issue", description = "Creates an issue", timeout = 3,
      params = { type = "object", properties = { title = { type = "string" } }, required = { "title" } },
      run = function(args)
        local f = assert(io.open(counter, "a"))
        f:write(args.title, "\n")
        f:close()
        luagent.sleep(60) -- hangs after doing its work
        return "created"
      end }
    start { { tools = { call("7", "create_issue", { title = "crash" }), call("8", "create_issue", { title = "other" }) } },
            { text = "should not be asked" } }
    local evs, last = drain(agent { tools = { create }, max_parallel_tools = 1 })
    assert.equal("crash\n", slurp(counter))
    os.remove(counter)
    assert.equal(0, #of_type(evs, "tool_retry"))
    local en = of_type(evs, "tool_execution_end")[1]
    assert.equal("outcome_unknown", en.error.kind)
    assert.equal("create_issue", en.error.tool)
    assert.equal("call_mock7", en.error.call_id)
    assert.same({ title = "crash" }, en.error.arguments)
    assert.equal("tool_timeout", en.error.cause.kind)
    assert.matches('create_issue %(call call_mock7, arguments {"title":"crash"}%) timed out after 3 s', en.error.message)
    assert.equal("error", last.stop_reason)
    assert.equal(en.error, last.error)
    assert.equal(1, #srv:requests()) -- the model was not asked again
    -- the model-facing result names the timeout
    local results = of_type(evs, "turn_end")[1].tool_results
    assert.equal("create_issue timed out after 3 s", results[1].content)
    -- the call not yet started is not run: the run stops
    assert.equal("not run: the run stops because the outcome of create_issue (call call_mock7) is unknown",
      results[2].content)
    assert.equal(1, #of_type(evs, "tool_execution_start"))
  end)

  it("stops a Lua tool stuck computing (never waiting) at its timeout", function()
    local spin = { name = "spin", description = "Never yields", timeout = 0.2, read_only = true,
      run = function() local x = 0 while true do x = x + 1 end end }
    start { { tools = { call("1", "spin") } }, { text = "gave up" } }
    local evs, last = drain(agent { tools = { spin }, policy = { tool = { max_retries = 0, timeout = 5 } } })
    local en = of_type(evs, "tool_execution_end")[1]
    assert.equal("tool_timeout", en.error.kind)
    assert.equal("spin timed out after 0.2 s", en.error.message)
    assert.equal("stop", last.stop_reason) -- a flagged tool's failure is the model's to answer
  end)

  it("kills a command tool's process group at the timeout: a child ignoring SIGTERM and its child", function()
    luagent.clock.real()
    local pidfile = tempfile()
    local stubborn = { name = "stubborn", description = "Ignores SIGTERM", timeout = 0.2,
      command = { "sh", "-c", 'trap "" TERM; sleep 30 & echo $! > "$1"; cat >/dev/null; wait; wait', "sh", pidfile } }
    start { { tools = { call("1", "stubborn", { x = 1 }) } } }
    local t0 = luagent.now()
    local evs, last = drain(agent { tools = { stubborn },
      policy = { tool = { timeout = 5, grace = 0.2, max_retries = 0 } } })
    local gpid = tonumber(slurp(pidfile))
    os.remove(pidfile)
    local en = of_type(evs, "tool_execution_end")[1]
    assert.equal("outcome_unknown", en.error.kind)
    assert.equal("tool_timeout", en.error.cause.kind)
    assert.equal("error", last.stop_reason)
    assert.is_true(luagent.now() - t0 >= 0.4) -- timeout, then the grace before SIGKILL
    assert.is_number(gpid)
    local deadline = luagent.now() + 5
    local function gone() return not helpers.alive(gpid) end
    while not gone() and luagent.now() < deadline do luagent.sleep(0.01) end
    assert.is_true(gone())
  end)

  it("kills what a command tool left running in its group when it ends, on time or at its timeout", function()
    luagent.clock.real()
    local pidfiles = { tempfile(), tempfile() }
    -- a job in the background, its output elsewhere, then the tool answers
    local leaves = { name = "leaves", description = "Leaves a job behind", read_only = true,
      command = { "sh", "-c", 'sleep 1000 </dev/null >/dev/null 2>&1 & echo $! > "$1"; cat >/dev/null; echo hi',
                  "sh", pidfiles[1] } }
    -- a job that ignores SIGTERM; the tool itself ends on it at its timeout
    local slow = { name = "slow", description = "Times out", read_only = true, timeout = 0.2,
      command = { "sh", "-c", 'trap "" TERM; sleep 1000 </dev/null >/dev/null 2>&1 & echo $! > "$1"; trap - TERM; '
                  .. 'cat >/dev/null; sleep 30', "sh", pidfiles[2] } }
    start { { tools = { call("1", "leaves"), call("2", "slow") } }, { text = "ok" } }
    local evs, last = drain(agent { tools = { leaves, slow },
      policy = { tool = { timeout = 5, grace = 10, max_retries = 0 } } })
    local pids = {}
    for i, f in ipairs(pidfiles) do
      pids[i] = tonumber(slurp(f))
      os.remove(f)
    end
    finally(function() for _, pid in ipairs(pids) do os.execute("kill -9 " .. pid .. " 2>/dev/null") end end)
    assert.equal("stop", last.stop_reason)
    local ends = {}
    for _, e in ipairs(of_type(evs, "tool_execution_end")) do ends[e.name] = e end
    assert.equal("hi\n", ends.leaves.result)
    assert.equal("tool_timeout", ends.slow.error.kind)
    for i, pid in ipairs(pids) do
      local deadline = luagent.now() + 5
      while helpers.alive(pid) and luagent.now() < deadline do luagent.sleep(0.01) end
      assert.is_false(helpers.alive(pid), "the job of tool " .. i .. " outlived it")
    end
  end)

  it("runs a command tool: JSON arguments on stdin, stdout is the result, stderr shown on failure", function()
    luagent.clock.real()
    local cat = { name = "cat", description = "Returns its input", read_only = true, command = { "cat" },
      params = { type = "object", properties = { q = { type = "string" } } } }
    local fail = { name = "fail", description = "Fails", command = { "sh", "-c", "echo 'no such crash' >&2; exit 4" } }
    start { { tools = { call("1", "cat", { q = "x" }), call("2", "fail") } } }
    local evs = drain(agent { tools = { cat, fail } })
    local ends = {}
    for _, e in ipairs(of_type(evs, "tool_execution_end")) do ends[e.call_id == "call_mock1" and 1 or 2] = e end
    assert.equal('{"q":"x"}', ends[1].result)
    assert.equal("tool_error", ends[2].error.kind)
    assert.equal("fail exited with code 4: no such crash", ends[2].error.message)
    assert.equal(4, ends[2].error.exit_code)
  end)

  it("answers invalid arguments with an error result naming the field", function()
    start { { tools = { call("1", "echo", { text = 5 }), call("2", "echo", { text = "x", extra = true }),
                        call("3", "echo", {}) } }, { text = "sorry" } }
    local evs, last = drain(agent { tools = { echo } })
    local ends = of_type(evs, "tool_execution_end")
    assert.equal("invalid_arguments", ends[1].error.kind)
    assert.equal("invalid arguments for echo: arguments.text: expected string, got integer", ends[1].error.message)
    assert.equal("invalid arguments for echo: arguments: unknown field 'extra'", ends[2].error.message)
    assert.equal("invalid arguments for echo: arguments: missing required field 'text'", ends[3].error.message)
    assert.equal(0, ends[1].attempts)
    assert.equal("stop", last.stop_reason)
    local sent = bodies()[2].messages
    assert.equal("invalid arguments for echo: arguments.text: expected string, got integer", sent[#sent - 2].content)
  end)

  it("answers arguments that are not JSON with an error result", function()
    start { function()
      return { tools = { { id = "1", name = "echo", json = '{"text": "unclosed', pieces = { '{"text": "unclosed' } } } }
    end, { text = "sorry" } }
    local evs = drain(agent { tools = { echo } })
    local en = of_type(evs, "tool_execution_end")[1]
    assert.equal("invalid_arguments", en.error.kind)
    assert.matches("^invalid arguments for echo: invalid JSON arguments", en.error.message)
  end)

  it("answers non-finite numbers in arguments with an error result; the tool is not run, the run goes on", function()
    -- 1e999 is JSON that no double holds; NaN and Infinity are not JSON at all
    local texts = { ['{"i": 1e999}'] = "arguments.i: not a finite number", ['{"i": -1e999}'] = "arguments.i: not a finite number",
      ['{"n": {"i": [1, 1e999]}}'] = "arguments.n.i[2]: not a finite number",
      ['{"i": NaN}'] = "invalid token", ['{"i": Infinity}'] = "invalid token" }
    local ran = 0
    local count = { name = "count", description = "Counts", read_only = true,
      params = { type = "object", properties = { i = { type = "number" } } },
      run = function() ran = ran + 1 return "counted" end }
    for text, why in pairs(texts) do
      start { function() return { tools = { { id = "1", name = "count", json = text, pieces = { text } } } } end,
              { text = "sorry" } }
      local evs, last = drain(agent { tools = { count } })
      assert.equal("agent_end", last.type, text)
      assert.equal("stop", last.stop_reason, text)
      local st = of_type(evs, "tool_execution_start")[1]
      assert.is_nil(st.arguments, text)
      assert.equal(text, st.raw_arguments)
      local en = of_type(evs, "tool_execution_end")[1]
      assert.equal("invalid_arguments", en.error.kind, text)
      assert.matches("^invalid arguments for count: invalid JSON arguments: .*" .. why:gsub("%p", "%%%0"), en.error.message)
      assert.equal(2, #srv:requests(), text) -- the model got the error result and answered
      srv:close() srv = nil
    end
    assert.equal(0, ran)
  end)

  it("refuses arguments that give a key twice, naming the key: a command tool never gets them", function()
    luagent.clock.real()
    local marker = tempfile()
    os.remove(marker)
    local reader = { name = "reader", description = "Reads a file", read_only = true,
      command = { "sh", "-c", 'cat > "$1"', "sh", marker },
      params = { type = "object", properties = { path = { type = "string", enum = { "a" } } } } }
    -- the schema (enum) passes the last value; a reader that keeps the first would get /etc/passwd
    local text = '{"path": "/etc/passwd", "path": "a"}'
    start { function() return { tools = { { id = "1", name = "reader", json = text, pieces = { text } } } } end,
            { text = "sorry" } }
    local evs, last = drain(agent { tools = { reader } })
    assert.equal("stop", last.stop_reason)
    local en = of_type(evs, "tool_execution_end")[1]
    assert.equal("invalid_arguments", en.error.kind)
    assert.equal('invalid arguments for reader: invalid JSON arguments: arguments: key "path" is given twice',
      en.error.message)
    local got = slurp(marker) -- what the command got, had it run
    os.remove(marker)
    assert.equal("", got)
  end)

  it("turns a tool that raises or returns nil, err into an error result; the host keeps running", function()
    local boom = { name = "boom", description = "Raises", run = function() error("kaput") end }
    local soft = { name = "soft", description = "Returns an error", run = function() return nil, "not found" end }
    start { { tools = { call("1", "boom"), call("2", "soft") } }, { text = "ok" } }
    local evs, last = drain(agent { tools = { boom, soft } })
    local ends = {}
    for _, e in ipairs(of_type(evs, "tool_execution_end")) do ends[e.name] = e end
    assert.equal("tool_error", ends.boom.error.kind)
    assert.matches("^boom failed: .*agent_spec.lua:%d+: kaput$", ends.boom.error.message)
    assert.equal("soft failed: not found", ends.soft.error.message)
    assert.equal("stop", last.stop_reason) -- a failure, not an unknown outcome: the model answers it
  end)

  it("answers an unknown tool with an error result listing the tools", function()
    start { { tools = { call("1", "delete_everything") } }, { text = "ok" } }
    local evs, last = drain(agent { tools = { echo } })
    local en = of_type(evs, "tool_execution_end")[1]
    assert.equal("unknown_tool", en.error.kind)
    assert.equal("unknown tool 'delete_everything' (available: echo)", en.error.message)
    assert.equal("stop", last.stop_reason)
  end)

  it("runs parallel calls at most max_parallel_tools at once; results come back in call order", function()
    local running, peak, finished = 0, 0, {}
    local wait = { name = "wait", description = "Waits", read_only = true,
      params = { type = "object", properties = { s = { type = "number" } } },
      run = function(args)
        running = running + 1
        peak = math.max(peak, running)
        luagent.sleep(args.s)
        running = running - 1
        finished[#finished + 1] = args.s
        return "waited " .. args.s
      end }
    start { { tools = { call("1", "wait", { s = 4 }), call("2", "wait", { s = 1 }), call("3", "wait", { s = 2 }),
                        call("4", "wait", { s = 3 }) } }, { text = "ok" } }
    local t0 = luagent.now()
    local evs = drain(agent { tools = { wait }, max_parallel_tools = 2 })
    assert.equal(2, peak)
    assert.same({ 1, 2, 4, 3 }, finished) -- they finish out of order...
    local results = of_type(evs, "turn_end")[1].tool_results
    assert.same({ "waited 4", "waited 1", "waited 2", "waited 3" },
      { results[1].content, results[2].content, results[3].content, results[4].content })
    local sent = bodies()[2].messages -- ...and reach the model in call order
    assert.same({ "call_mock1", "call_mock2", "call_mock3", "call_mock4" },
      { sent[3].tool_call_id, sent[4].tool_call_id, sent[5].tool_call_id, sent[6].tool_call_id })
    assert.is_true(math.abs((luagent.now() - t0) - 6) < 0.5) -- 2 slots: 4 | 1, 2, 3 = 6 s
  end)

  it("aborts during a tool: the tool is cancelled, calls not started get an error result", function()
    local cancelled = false
    local hang = { name = "hang", description = "Hangs", read_only = true,
      run = function()
        local ok, err = pcall(luagent.sleep, 100)
        if not ok then cancelled = true error(err, 0) end
      end }
    start { { tools = { call("1", "hang"), call("2", "hang") } }, { text = "never" } }
    local a = agent { tools = { hang }, max_parallel_tools = 1 }
    local evs = {}
    for ev in a:prompt("go") do
      evs[#evs + 1] = ev
      if ev.type == "tool_execution_start" then a:abort("user pressed stop") end
    end
    local last = evs[#evs]
    assert.equal("agent_end", last.type)
    assert.equal("aborted", last.stop_reason)
    assert.is_true(cancelled)
    local ends = of_type(evs, "tool_execution_end")
    assert.equal(1, #ends)
    assert.equal("cancelled", ends[1].error.kind)
    local results = of_type(evs, "turn_end")[1].tool_results
    assert.equal(2, #results)
    assert.is_true(results[2].is_error)
    assert.equal("not run: the agent was aborted", results[2].content)
    assert.equal(1, #srv:requests())
    assert.is_false(a.running)
  end)

  it("aborts during a command tool: its process group is killed", function()
    luagent.clock.real()
    local pidfile = tempfile()
    local sleeper = { name = "sleeper", description = "Sleeps", idempotent = true,
      command = { "sh", "-c", 'sleep 30 & echo $! > "$1"; wait', "sh", pidfile } }
    start { { tools = { call("1", "sleeper") } }, { text = "never" } }
    local a = agent { tools = { sleeper }, policy = { tool = { grace = 0.1, timeout = 60 } } }
    local evs, started = {}, false
    for ev in a:prompt("go") do
      evs[#evs + 1] = ev
      if ev.type == "tool_execution_start" then
        luagent.spawn(function()
          while slurp(pidfile) == "" do luagent.sleep(0.01) end
          a:abort()
        end)
        started = true
      end
    end
    assert.is_true(started)
    local gpid = tonumber(slurp(pidfile))
    os.remove(pidfile)
    assert.equal("aborted", evs[#evs].stop_reason)
    assert.equal("cancelled", of_type(evs, "tool_execution_end")[1].error.kind)
    assert.is_false(helpers.alive(gpid)) -- the tool's end waited until its group was gone
  end)

  it("aborts during the model call's backoff: no further request is sent", function()
    start({ { text = "never" } }, "503@1")
    local a = agent { policy = { backoff = { strategy = "fixed", base = 30 } } }
    local evs = {}
    for ev in a:prompt("go") do
      evs[#evs + 1] = ev
      if ev.type == "provider_retry" then a:abort("user pressed stop") end
    end
    local last = evs[#evs]
    assert.equal("aborted", last.stop_reason)
    assert.equal("aborted: user pressed stop", last.reason)
    assert.equal(1, #srv:requests())
    assert.is_nil(of_type(evs, "turn_end")[1].message)
  end)

  it("keeps the history a context overflow compacted: the next turn sends it, not the full one", function()
    local function U(t) return { role = "user", content = t } end
    local function A(t) return { role = "assistant", content = t } end
    -- request 1 overflows (its reply is never sent); 2 is the compacted resend
    start({ { text = "unsent" }, { tools = { call("1", "echo", { text = "x" }) } }, { text = "done" } }, "400:overflow@1")
    local a = agent { tools = { echo }, messages = { U("u1"), A("a1"), U("u2"), A("a2"), U("u3"), A("a3") },
      policy = { on_context_overflow = "drop_oldest", max_retries = 2 } }
    local evs, last = drain(a, "u4")
    assert.equal("stop", last.stop_reason)
    local c = of_type(evs, "context_compacted")[1]
    assert.equal(7, c.before)
    assert.equal(3, c.after)
    local b = bodies()
    assert.equal(3, #b)
    assert.equal(7, #b[1].messages)
    assert.equal(3, #b[2].messages)
    -- turn 2: the compacted three, the call and its result (not the nine of the full history)
    assert.equal(5, #b[3].messages)
    assert.equal("u3", b[3].messages[1].content)
    -- the compacted list is on the event, and is the agent's history from then on
    assert.same({ "u3", "a3", "u4" }, { c.messages[1].content, c.messages[2].content, c.messages[3].content })
    assert.equal(6, #a.messages) -- u3 a3 u4, the call, its result, the answer
    assert.equal(a.messages, last.messages)
    assert.same({ "u3", "a3", "u4" }, { a.messages[1].content, a.messages[2].content, a.messages[3].content })
  end)

  -- "Hello", " wor", " ld": a stream error after two deltas leaves "Hello wor"
  local HELLO = { text = "Hello wor ld" }

  it("keeps a failed attempt's text on its message_end; a retried one stays out of history", function()
    start({ HELLO, HELLO }, "stream-error:overloaded_error:after=2@1")
    local a = agent {}
    local evs, last = drain(a, "hi")
    assert.equal("stop", last.stop_reason)
    local ends = of_type(evs, "message_end")
    assert.equal(2, #ends)
    assert.equal("error", ends[1].stop_reason)
    assert.is_nil(ends[1].final)
    assert.is_table(ends[1].message)
    assert.equal("assistant", ends[1].message.role)
    assert.equal("Hello wor", ends[1].message.content)
    assert.equal("Hello wor ld", ends[2].message.content)
    assert.equal(2, #a.messages) -- the prompt and the answer that succeeded
    assert.is_nil(a.messages[2].incomplete)
  end)

  it("keeps the text of a call that failed for good: on the final message_end, turn_end and history", function()
    start({ HELLO }, "stream-error:invalid_request_error:after=2")
    local a = agent {}
    local evs, last = drain(a, "hi")
    assert.equal("error", last.stop_reason)
    local fin = of_type(evs, "message_end")[1]
    assert.is_true(fin.final)
    assert.equal("Hello wor", fin.message and fin.message.content)
    local msg = of_type(evs, "turn_end")[1].message
    assert.equal("Hello wor", msg and msg.content)
    assert.is_true(msg.incomplete)
    assert.equal("error", msg.stop_reason)
    assert.equal(2, #a.messages)
    assert.equal(msg, a.messages[2])
  end)

  it("keeps an aborted turn's partial answer: turn_end.message and history, marked; the next prompt sends it", function()
    srv = assert(mock.start { seed = 1, tps = 1, script = function(_, n)
      return n == 1 and HELLO or { text = "fine" }
    end })
    local a = agent {}
    local evs, deltas = {}, 0
    for ev in a:prompt("hi") do
      evs[#evs + 1] = ev
      if ev.type == "text_delta" then
        deltas = deltas + 1
        if deltas == 2 then a:abort("user pressed stop") end
      end
    end
    local last = evs[#evs]
    assert.equal("aborted", last.stop_reason)
    local fin = of_type(evs, "message_end")[1]
    assert.equal("aborted", fin.stop_reason)
    assert.equal("Hello wor", fin.message and fin.message.content)
    local msg = of_type(evs, "turn_end")[1].message
    assert.equal("Hello wor", msg and msg.content)
    assert.is_true(msg.incomplete)
    assert.equal("aborted", msg.stop_reason)
    assert.same({ "user", "assistant" }, { a.messages[1].role, a.messages[2].role })
    assert.equal(msg, a.messages[2])
    -- the next request carries it as the assistant's turn
    local _, again = drain(a, "go on")
    assert.equal("stop", again.stop_reason)
    local sent = bodies()[2].messages
    assert.same({ "user", "assistant", "user" }, { sent[1].role, sent[2].role, sent[3].role })
    assert.equal("Hello wor", sent[2].content)
  end)

  it("keeps the failed attempt's text when aborted during the retry's backoff", function()
    start({ HELLO }, "stream-error:overloaded_error:after=2@1")
    local a = agent { policy = { backoff = { strategy = "fixed", base = 30 } } }
    local evs = {}
    for ev in a:prompt("go") do
      evs[#evs + 1] = ev
      if ev.type == "provider_retry" then a:abort("user pressed stop") end
    end
    assert.equal("aborted", evs[#evs].stop_reason)
    assert.equal(1, #of_type(evs, "call_aborted"))
    local msg = of_type(evs, "turn_end")[1].message
    assert.equal("Hello wor", msg and msg.content)
    assert.equal("aborted", msg.stop_reason)
    assert.equal(msg, a.messages[2])
  end)

  it("stops at the loop guard: the same call with the same arguments 3 times in a row", function()
    local runs = 0
    local same = { name = "same", description = "x", read_only = true,
      params = { type = "object", properties = { q = { type = "string" } } },
      run = function() runs = runs + 1 return "again" end }
    local r = function() return { tools = { call("1", "same", { q = "a" }) } } end
    start { r, r, r, r, r }
    local evs, last = drain(agent { tools = { same } })
    assert.equal("loop_guard", last.stop_reason)
    assert.equal('loop guard: same called 3 times in a row with the same arguments {"q":"a"}', last.reason)
    assert.equal(2, runs)
    assert.equal(3, last.turns)
    assert.equal(3, #srv:requests())
  end)

  it("stops at max_turns with a clear stop reason", function()
    local r = function(_, n) return { tools = { call(tostring(n), "echo", { text = "t" .. n }) } } end
    start { r, r, r, r, r, r }
    local evs, last = drain(agent { tools = { echo }, max_turns = 2 })
    assert.equal("max_turns", last.stop_reason)
    assert.equal("max_turns (2) reached", last.reason)
    assert.equal(2, last.turns)
    assert.equal(2, #srv:requests())
    assert.equal(2, #of_type(evs, "turn_end"))
  end)

  it("cuts a result above the size bound with a note", function()
    local big = { name = "big", description = "Big", read_only = true, run = function() return string.rep("a", 100) end }
    start { { tools = { call("1", "big") } }, { text = "ok" } }
    local evs = drain(agent { tools = { big }, tool_policy = { max_result_bytes = 10 } })
    assert.equal("aaaaaaaaaa\n[result cut: 90 of 100 bytes left out]", of_type(evs, "tool_execution_end")[1].result)
  end)

  it("works with the retry-safe filter: a retried attempt disappears, tool events pass", function()
    start({ { tools = { call("1", "echo", { text = "x" }) } }, { text = "fine" } }, "stream-error:overloaded_error:after=1@2")
    local a = agent { tools = { echo } }
    local out = {}
    for ev in events.retry_safe(a:prompt("go")) do out[#out + 1] = ev end
    assert.equal("agent_start turn_start message_start message_end tool_execution_start tool_execution_update "
      .. "tool_execution_end turn_end turn_start provider_retry message_start message_end turn_end agent_end",
      sequence(out))
    assert.equal(0, #of_type(out, "stream_reset"))
    assert.equal("stop", out[#out].stop_reason)
  end)

  it("ends with stop_reason error when the model call fails for good; retry-safe keeps the order", function()
    start({ { tools = { call("1", "echo", { text = "x" }) } } }, "stream-error:invalid_request_error:after=1@2")
    local a = agent { tools = { echo } }
    local out = {}
    for ev in events.retry_safe(a:prompt("go")) do out[#out + 1] = ev end
    assert.equal("agent_start turn_start message_start message_end tool_execution_start tool_execution_update "
      .. "tool_execution_end turn_end turn_start message_start message_end turn_end agent_end", sequence(out))
    local last = out[#out]
    assert.equal("error", last.stop_reason)
    assert.equal("stream_error", last.error.kind)
  end)

  it("refuses bad tools and options at creation", function()
    start {}
    assert.has_error(function() agent { tools = { { name = "bad name", description = "x", run = print } } } end)
    assert.has_error(function() agent { tools = { { name = "x", description = "x" } } } end)
    assert.has_error(function() agent { tools = { { name = "x", description = "x", run = print, command = { "ls" } } } } end)
    assert.has_error(function() agent { tools = { echo, echo } } end)
    assert.has_error(function() agent { max_turns = 0 } end)
    assert.has_error(function() agent { tool_policy = { timeout = -1 } } end)
  end)
end)
