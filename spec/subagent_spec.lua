-- Sub-agents (`luagent.tools.agent(child, {name =, description =, params =})`):
-- an agent as a tool of another. Its run nests under the parent's
-- execute_tool span in the same trace, its text reaches the parent as
-- tool_execution_update, its cost and tokens roll up into the parent's
-- agent_end, an abort of the parent aborts it, and a child that stops with
-- an error gives the parent an error result. Against the mock on loopback.
local luagent = require "luagent"
local mock = require "luagent.mock"
local events = luagent.events
local cjson = require "cjson"
local slurp = require("spec.support.helpers").slurp

local servers, tracer_left = {}, nil
local function serve(opts)
  local srv = assert(mock.start(opts))
  servers[#servers + 1] = srv
  return srv
end
local function model(srv, name)
  return { kind = "openai", model = name or "m", base_url = srv.url .. "/v1", api_key = "k" }
end
before_each(function() luagent.clock.virtual() end)
after_each(function()
  for _, s in ipairs(servers) do s:close() end
  servers = {}
  if tracer_left then tracer_left:stop() tracer_left = nil end
  luagent.clock.real()
end)

-- The parent's server: asks for the `research` tool once, then answers
-- with what the tool said.
local function parent_script(_, _, body)
  for _, m in ipairs(body.messages or {}) do
    if m.role == "tool" then return { text = "parent got: " .. tostring(m.content) } end
  end
  return { text = "delegating", tools = { { id = "c1", name = "research", arguments = { input = "find x" } } } }
end

describe("luagent.tools.agent", function()
  it("checks its options like the others", function()
    local srv = serve {}
    local child = luagent.agent { name = "child", model = model(srv) }
    assert.has_error(function() luagent.tools.agent(child, { name = "r", descripton = "x" }) end,
      "tools.agent: unknown option 'descripton' (did you mean 'description'?)")
    assert.has_error(function() luagent.tools.agent({}, { name = "r" }) end)
  end)

  it("runs the child under the parent's execute_tool span, its text as updates, costs rolled up", function()
    local file = os.tmpname()
    local rt = luagent.default_runtime()
    local tracer = assert(rt:trace { file = file })
    tracer_left = tracer
    local meter = rt:meter("cost")
    meter:reset()
    assert(meter:set_prices { ["model-p"] = { input = 1, output = 2 }, ["model-c"] = { input = 10, output = 20 } })
    local ps = serve { script = parent_script }
    local cs = serve { script = function(_, _, body)
      return { text = "child found: " .. body.messages[#body.messages].content }
    end }
    local child = luagent.agent { name = "researcher", model = model(cs, "model-c") }
    local parent = luagent.agent { name = "lead", model = model(ps, "model-p"),
      tools = { luagent.tools.agent(child, { name = "research", description = "Researches a question" }) } }
    local seen, ends = {}, {}
    for ev in parent:prompt("go") do
      seen[#seen + 1] = ev
    end
    tracer:stop()
    tracer_left = nil
    local last = seen[#seen]
    assert.equal("agent_end", last.type)
    assert.equal("stop", last.stop_reason)
    assert.equal("parent got: child found: find x", last.messages[#last.messages].content)
    -- the child's text reached the parent's stream as tool_execution_update
    local text = {}
    for _, ev in ipairs(seen) do
      if ev.type == "tool_execution_update" and ev.name == "research" then
        assert.equal("researcher", ev.data.agent)
        text[#text + 1] = ev.data.delta
      end
      if ev.type == "tool_execution_end" then ends[#ends + 1] = ev end
    end
    assert.equal("child found: find x", table.concat(text))
    assert.equal("child found: find x", ends[1].result)
    -- tokens and cost: the parent's agent_end holds the child's
    assert.equal(1, #cs:requests())
    local recs = meter:records()
    assert.equal(3, #recs)
    local total, tokens = 0, 0
    for _, r in ipairs(recs) do total = total + r.cost tokens = tokens + r.usage.input_tokens end
    assert.near(total, last.cost.total, 1e-12)
    assert.equal(3, last.cost.calls)
    assert.equal(tokens, last.usage.input_tokens)
    -- shown per agent in the cost table
    local report = table.concat(meter:report(), "\n")
    assert.matches("researcher", report)
    assert.matches("lead", report)
    -- one trace: the child's invoke_agent under the parent's execute_tool
    local spans = {}
    for line in slurp(file):gmatch("[^\n]+") do
      for _, rs in ipairs(cjson.decode(line).resourceSpans) do
        for _, ss in ipairs(rs.scopeSpans) do
          for _, s in ipairs(ss.spans) do spans[#spans + 1] = s end
        end
      end
    end
    os.remove(file)
    local by = {}
    for _, s in ipairs(spans) do by[s.name] = s end
    local tool, sub, top = by["execute_tool research"], by["invoke_agent researcher"], by["invoke_agent lead"]
    assert.is_truthy(tool and sub and top)
    assert.equal(tool.spanId, sub.parentSpanId)
    assert.equal(top.traceId, sub.traceId)
    assert.equal("chat model-c", (function()
      for _, s in ipairs(spans) do if s.parentSpanId == sub.spanId and s.name:match("^chat") then return s.name end end
    end)())
  end)

  it("gives the parent an error result when the child stops with an error", function()
    local ps = serve { script = parent_script }
    local cs = serve { faults = "401@1-100" }
    local child = luagent.agent { name = "researcher", model = model(cs), policy = { max_retries = 0 } }
    local parent = luagent.agent { name = "lead", model = model(ps),
      tools = { luagent.tools.agent(child, { name = "research", description = "Researches" }) } }
    local last = parent:run("go")
    assert.equal("stop", last.stop_reason)
    local tool_msg = last.messages[3]
    assert.equal("tool", tool_msg.role)
    assert.is_true(tool_msg.is_error)
    assert.matches("sub%-agent researcher stopped with an error", tool_msg.content)
  end)

  it("gives the parent an error result saying so when the child's outcome is unknown", function()
    local ps = serve { script = parent_script }
    local cs = serve { script = function() return { tools = { { id = "p1", name = "pay", arguments = {} } } } end }
    local pay = { name = "pay", description = "Pays", timeout = 1, run = function() luagent.sleep(60) return "paid" end }
    local child = luagent.agent { name = "researcher", model = model(cs), tools = { pay } }
    local parent = luagent.agent { name = "lead", model = model(ps),
      tools = { luagent.tools.agent(child, { name = "research", description = "Researches" }) } }
    local last = parent:run("go")
    assert.equal("stop", last.stop_reason)
    local tool_msg = last.messages[3]
    assert.is_true(tool_msg.is_error)
    assert.matches("sub%-agent researcher stopped with an error: outcome_unknown: pay", tool_msg.content)
  end)

  it("is aborted with the parent", function()
    local ps = serve { script = parent_script }
    local cs = serve { script = function() return { tools = { { id = "h1", name = "hang", arguments = {} } } } end }
    local hang = { name = "hang", description = "Hangs", read_only = true, run = function() luagent.sleep(60) return "late" end }
    local child = luagent.agent { name = "researcher", model = model(cs), tools = { hang } }
    local parent = luagent.agent { name = "lead", model = model(ps),
      tools = { luagent.tools.agent(child, { name = "research", description = "Researches" }) } }
    local child_end
    local unsub = events.subscribe(function(ev)
      if ev.type == "agent_end" and ev.agent == "researcher" then child_end = ev end
      if ev.type == "tool_execution_start" and ev.name == "hang" then parent:abort("enough") end
    end)
    local last
    for ev in parent:prompt("go") do last = ev end
    unsub()
    assert.equal("aborted", last.stop_reason)
    assert.is_truthy(child_end)
    assert.equal("aborted", child_end.stop_reason)
    assert.is_false(child.running)
  end)
end)

describe("a durable parent killed during its sub-agent's second turn", function()
  local helpers = require "spec.support.helpers"
  it("resumes without re-sending the child's first turn", function()
    local dir = helpers.tempdir()
    local env = { LUAGENT_HOME = dir, SUB_LOG = dir .. "/child.log", SUB_KILL = "1" }
    local r = helpers.run_env(env, "run", "spec/fixtures/durable/subagent.lua")
    assert.equal(137, r.code, r.stderr)
    local id = assert(r.stderr:match("luagent: durable run (%S+)"), r.stderr)
    assert.same({ "child turn 1" }, helpers.lines(env.SUB_LOG))
    env.SUB_KILL = nil
    local s = helpers.run_env(env, "resume", id)
    assert.equal(0, s.code, s.stderr)
    assert.equal("answer: lead: found 42\n", s.stdout)
    -- the child's first turn came from the journal: only its second was sent
    assert.same({ "child turn 1", "child turn 2" }, helpers.lines(env.SUB_LOG))
    -- its steps are under the parent call's position
    local show = helpers.run_env({ LUAGENT_HOME = dir }, "runs", "show", id).stdout
    assert.matches("lead#1/1/t1/c1/researcher/1/t1", show, 1, true)
    assert.matches("lead#1/1/t1/c1/researcher/1/t1/c1", show, 1, true)
    os.execute("rm -rf " .. helpers.quote(dir))
  end)
end)
