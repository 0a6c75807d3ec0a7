-- Handoffs (`handoffs = {other_agent, ...}` on an agent): a transfer tool
-- per target; calling it hands the rest of the run to that agent, with the
-- history kept, after a `handoff {from, to}` event. Against the mock on
-- loopback.
local luagent = require "luagent"
local mock = require "luagent.mock"

local servers = {}
local function serve(opts)
  local srv = assert(mock.start(opts))
  servers[#servers + 1] = srv
  return srv
end
local function model(srv) return { kind = "openai", model = "m", base_url = srv.url .. "/v1", api_key = "k" } end
before_each(function() luagent.clock.virtual() end)
after_each(function()
  for _, s in ipairs(servers) do s:close() end
  servers = {}
  luagent.clock.real()
end)

describe("handoffs", function()
  it("are checked: a list of agents", function()
    local srv = serve {}
    assert.has_error(function() luagent.agent { model = model(srv), handoffs = { "billing" } } end,
      "agent: handoffs[1] must be an agent (luagent.agent{...})")
    assert.has_error(function() luagent.agent { model = model(srv), handof = {} } end,
      "agent: unknown option 'handof' (did you mean 'handoffs'?)")
  end)

  it("hand the rest of the run to the target, the history kept, with a handoff event", function()
    local triage_srv = serve { script = function()
      return { text = "passing on", tools = { { id = "h1", name = "transfer_to_billing", arguments = {} } } }
    end }
    local seen_by_billing
    local billing_srv = serve { script = function(_, _, body)
      seen_by_billing = body
      return { text = "billing here: refund done" }
    end }
    local billing = luagent.agent { name = "billing", model = model(billing_srv), system = "You do billing." }
    local triage = luagent.agent { name = "triage", model = model(triage_srv), handoffs = { billing } }
    local evs = {}
    for ev in triage:prompt("I want a refund") do evs[#evs + 1] = ev end
    local last = evs[#evs]
    assert.equal("agent_end", last.type)
    assert.equal("triage", last.agent)
    assert.equal("stop", last.stop_reason)
    assert.equal("billing here: refund done", last.messages[#last.messages].content)
    -- the transfer tool was offered
    local offered = triage_srv:requests()[1].body.tools
    assert.equal("transfer_to_billing", offered[1]["function"].name)
    -- the handoff event, then the target's run
    local h
    for k, ev in ipairs(evs) do if ev.type == "handoff" then h = k end end
    assert.is_truthy(h)
    assert.equal("triage", evs[h].from)
    assert.equal("billing", evs[h].to)
    assert.equal("agent_start", evs[h + 1].type)
    assert.equal("billing", evs[h + 1].agent)
    -- the target got the whole history, under its own system prompt
    assert.equal("You do billing.", seen_by_billing.messages[1].content)
    assert.equal("I want a refund", seen_by_billing.messages[2].content)
    assert.equal("tool", seen_by_billing.messages[4].role)
    assert.equal(1, #billing_srv:requests())
    assert.equal(1, #triage_srv:requests())
    -- the history is kept in both
    assert.equal(4, #triage.messages)
    assert.equal("billing here: refund done", triage.messages[4].content)
    assert.is_true(last.usage.input_tokens > 0)
  end)

  it("nest the target's span under the first agent's, in one trace, and roll its cost up", function()
    local file = os.tmpname()
    local rt = luagent.default_runtime()
    local tracer = assert(rt:trace { file = file })
    local meter = rt:meter("cost")
    meter:reset()
    assert(meter:set_prices { m = { input = 1, output = 2 } })
    local a_srv = serve { script = function()
      return { tools = { { id = "h1", name = "transfer_to_billing", arguments = {} } } }
    end }
    local b_srv = serve { script = function() return { text = "done" } end }
    local billing = luagent.agent { name = "billing", model = model(b_srv) }
    local triage = luagent.agent { name = "triage", model = model(a_srv), handoffs = { billing } }
    local last = triage:run("hi")
    tracer:stop()
    assert.equal(2, last.cost.calls)
    local total = 0
    for _, r in ipairs(meter:records()) do total = total + r.cost end
    assert.near(total, last.cost.total, 1e-12)
    local spans = {}
    for line in require("spec.support.helpers").slurp(file):gmatch("[^\n]+") do
      for _, rs in ipairs(require("cjson").decode(line).resourceSpans) do
        for _, ss in ipairs(rs.scopeSpans) do
          for _, sp in ipairs(ss.spans) do spans[sp.name] = sp end
        end
      end
    end
    os.remove(file)
    local top, target = spans["invoke_agent triage"], spans["invoke_agent billing"]
    assert.is_truthy(top and target)
    assert.equal(top.spanId, target.parentSpanId)
    assert.equal(top.traceId, target.traceId)
  end)
end)
