-- Guardrails on an agent (`guard = {input =, output =, name =}`): the input
-- guard sees the messages before each model call is sent, the output guard
-- the model's message before it is accepted (history, tool calls); a guard
-- that says no stops the run with stop_reason "guardrail" and its reason; a
-- guard that raises or passes its sandbox bound stops the run with an
-- error of kind `guardrail` naming it. Against the mock on loopback.
local luagent = require "luagent"
local mock = require "luagent.mock"

local srv, lines
before_each(function()
  lines = {}
  luagent.configure { log_sink = function(_, line) lines[#lines + 1] = line end, log_level = "warn" }
  luagent.clock.virtual()
end)
after_each(function()
  if srv then srv:close() srv = nil end
  luagent.configure { log_sink = false }
  luagent.clock.real()
end)

local function start(script)
  srv = assert(mock.start { script = script or function() return { text = "fine answer" } end })
end

local function agent(opts)
  opts.model = opts.model or { kind = opts.kind or "openai", model = "m", base_url = srv.url .. "/v1", api_key = "k" }
  opts.kind = nil
  return luagent.agent(opts)
end

describe("an input guard", function()
  it("stops the run before the call is sent, with its reason", function()
    start()
    local seen
    local a = agent { guard = { input = function(messages)
      seen = #messages
      if messages[#messages].content:find("password") then return nil, "no passwords" end
      return true
    end } }
    local last = a:run("my password is hunter2")
    assert.equal("guardrail", last.stop_reason)
    assert.equal("input guard: no passwords", last.reason)
    assert.equal("input", last.guard)
    assert.equal(1, seen)
    assert.equal(0, #srv:requests()) -- nothing was sent
    -- a prompt the guard lets through is answered
    last = a:run("hello")
    assert.equal("stop", last.stop_reason)
    assert.equal(1, #srv:requests())
  end)

  it("is named in the reason when it has a name, and sees each turn's messages", function()
    start(function(_, n)
      if n == 1 then return { tools = { { id = "c1", name = "echo", arguments = { text = "secret" } } } } end
      return { text = "done" }
    end)
    local calls = 0
    local a = agent { tools = { { name = "echo", description = "Echoes", read_only = true, run = function(args) return args.text end } },
      guard = { name = "no-secrets", input = function(messages)
        calls = calls + 1
        for _, m in ipairs(messages) do
          if m.role == "tool" and m.content:find("secret") then return false, "a tool said a secret" end
        end
        return true
      end } }
    local last = a:run("go")
    assert.equal("guardrail", last.stop_reason)
    assert.equal("input guard 'no-secrets': a tool said a secret", last.reason)
    assert.equal(2, calls)
    assert.equal(1, #srv:requests()) -- the second turn's request was not sent
  end)

  it("that raises stops the run with a guardrail error naming the guard", function()
    start()
    local a = agent { guard = { name = "broken", input = function() error("boom") end } }
    local last = a:run("hi")
    assert.equal("error", last.stop_reason)
    assert.equal("guardrail", last.error.kind)
    assert.equal("input", last.error.guard)
    assert.matches("input guard 'broken' failed: .*guard_spec.lua:%d+: boom", last.error.message)
    assert.equal(0, #srv:requests())
    assert.matches("input guard 'broken' failed", table.concat(lines, "\n"))
  end)

  it("that passes its sandbox bound stops the run safely", function()
    start()
    local a = agent { guard = { input = function() while true do end end } }
    local last = a:run("hi")
    assert.equal("error", last.stop_reason)
    assert.equal("guardrail", last.error.kind)
    assert.matches("input guard failed: .*instruction", last.error.message)
    assert.equal(0, #srv:requests())
  end)

  it("cannot change the history it is shown", function()
    start()
    local a = agent { guard = { input = function(messages) messages[1].content = "changed" return true end } }
    a:run("original")
    assert.equal("original", a.messages[1].content)
    assert.equal("original", srv:requests()[1].body.messages[1].content)
  end)
end)

describe("an output guard", function()
  for _, kind in ipairs { "openai", "anthropic", "openai_responses" } do
    it("stops the run before the answer is accepted (" .. kind .. ")", function()
      start(function() return { text = "the launch code is 1234" } end)
      local a = agent { kind = kind, guard = { output = function(message)
        if message.content:find("%d%d%d%d") then return nil, "leaks a code" end
        return true
      end } }
      local last = a:run("tell me")
      assert.equal("guardrail", last.stop_reason)
      assert.equal("output guard: leaks a code", last.reason)
      assert.equal("output", last.guard)
      assert.equal(1, #a.messages) -- the answer is not in the history
    end)
  end

  it("stops tool calls of a blocked message from running", function()
    start(function() return { tools = { { id = "c1", name = "rm", arguments = {} } } } end)
    local ran = false
    local a = agent { tools = { { name = "rm", description = "Removes", run = function() ran = true return "gone" end } },
      guard = { output = function(message)
        for _, c in ipairs(message.tool_calls or {}) do
          if c.name == "rm" then return nil, "rm is not allowed" end
        end
        return true
      end } }
    local last = a:run("clean up")
    assert.equal("guardrail", last.stop_reason)
    assert.equal("output guard: rm is not allowed", last.reason)
    assert.is_false(ran)
  end)

  it("that returns nothing blocks (only true lets an answer through)", function()
    start()
    local a = agent { guard = { output = function() end } }
    local last = a:run("hi")
    assert.equal("guardrail", last.stop_reason)
    assert.equal("output guard: blocked", last.reason)
  end)

  it("that raises stops the run with a guardrail error", function()
    start()
    local a = agent { guard = { output = function() error("bad guard") end } }
    local last = a:run("hi")
    assert.equal("error", last.stop_reason)
    assert.equal("guardrail", last.error.kind)
    assert.equal("output", last.error.guard)
    assert.matches("output guard failed: .*bad guard", last.error.message)
  end)
end)

describe("guard options", function()
  it("are checked when the agent is made", function()
    start()
    assert.has_error(function() agent { guard = { input = 1 } } end, "agent: guard.input must be a function")
    assert.has_error(function() agent { guard = { inputs = function() end } } end,
      "agent: guard: unknown option 'inputs' (did you mean 'input'?)")
    assert.has_error(function() agent { guard = "x" } end, "agent: guard must be a table {input =, output =, name =}")
  end)

  it("take a list of guards, run in order", function()
    start()
    local order = {}
    local a = agent { guard = {
      { name = "a", input = function() order[#order + 1] = "a" return true end },
      { name = "b", input = function() order[#order + 1] = "b" return nil, "b says no" end },
    } }
    local last = a:run("hi")
    assert.equal("a b", table.concat(order, " "))
    assert.equal("input guard 'b': b says no", last.reason)
  end)
end)

describe("a guard option it cannot use", function()
  local FILE = debug.getinfo(1, "S").short_src
  local function raises_here(f, msg)
    local line = debug.getinfo(f, "S").linedefined
    local ok, err = pcall(f)
    assert.is_false(ok)
    assert.equal(FILE .. ":" .. line .. ": " .. msg, err)
  end
  it("raises at the line that made the agent; an unknown key gets the nearest name", function()
    local m = "mock/m"
    raises_here(function() luagent.agent { model = m, guard = { inputs = function() end } } end,
      "agent: guard: unknown option 'inputs' (did you mean 'input'?)")
    raises_here(function() luagent.agent { model = m, guard = { { input = 1 } } } end,
      "agent: guard[1].input must be a function")
    raises_here(function() luagent.agent { model = m, guard = 5 } end,
      "agent: guard must be a table {input =, output =, name =}")
    raises_here(function() luagent.agent { model = m, guard = { name = 1 } } end, "agent: guard.name must be a string")
  end)
end)
