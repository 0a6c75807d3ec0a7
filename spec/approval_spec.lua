-- Human approval of a tool call (issue 27): a tool's needs_approval (true
-- or a function of the call), approval_requested / approval_decided, the
-- run stopping with approval_required once the turn's other calls are
-- done, agent:approve / agent:deny then agent:continue, a denial as the
-- tool's error result "denied: <reason>". In process, against the mock;
-- the durable side (another process approves, resume, kill -9) is in
-- spec/approval_durable_spec.lua.
local luagent = require "luagent"
local mock = require "luagent.mock"
local helpers = require "helpers"

local srv

local function start(replies)
  srv = assert(mock.start { seed = 1, script = function(view, n)
    local r = replies[n]
    if type(r) == "function" then r = r(view, n) end
    return r or { text = "done" }
  end })
end

local function model() return { kind = "openai", model = "m", base_url = srv.url .. "/v1", api_key = "k" } end
local function call(id, name, args) return { id = id, name = name, arguments = args or {} } end
local of_type = helpers.of_type

local function collect(iter)
  local evs = {}
  for ev in iter do evs[#evs + 1] = ev end
  return evs, evs[#evs]
end

before_each(function()
  luagent.configure { log_sink = function() end }
  luagent.clock.virtual()
end)
after_each(function()
  if srv then srv:close() srv = nil end
  luagent.configure { log_sink = false }
  luagent.clock.real()
end)

-- a tool that changes the world (counted), and one that only reads
local function tools_used(ran)
  local pay = { name = "pay", description = "Pays", needs_approval = true,
    params = { type = "object", properties = { amount = { type = "integer" } } },
    run = function(args) ran.pay = (ran.pay or 0) + 1 return "paid " .. tostring(args.amount) end }
  local look = { name = "look", description = "Looks", read_only = true,
    run = function() ran.look = (ran.look or 0) + 1 return "looked" end }
  return pay, look
end

local function bodies()
  local out = {}
  for _, r in ipairs(srv:requests()) do out[#out + 1] = r.body end
  return out
end

describe("a tool with needs_approval", function()
  it("stops the run with approval_required after the turn's other calls; approve + continue runs it once", function()
    start { { text = "Paying.", tools = { call("c1", "pay", { amount = 5 }), call("c2", "look") } },
            { text = "Paid." } }
    local ran = {}
    local pay, look = tools_used(ran)
    local a = luagent.agent { name = "ap", model = model(), tools = { pay, look } }
    local evs, last = collect(a:prompt("pay 5"))
    assert.equal("approval_required", last.stop_reason)
    assert.is_nil(ran.pay)
    assert.equal(1, ran.look) -- the turn's other call finished first
    local req = of_type(evs, "approval_requested")
    assert.equal(1, #req)
    assert.equal("call_mockc1", req[1].call_id)
    assert.equal("pay", req[1].name)
    assert.same({ amount = 5 }, req[1].arguments)
    assert.is_string(req[1].approval_id)
    assert.equal(1, #last.approvals)
    assert.equal("call_mockc1", last.approvals[1].call_id)
    assert.equal("call_mockc1", a:pending_approvals()[1].call_id)
    assert.equal(1, #srv:requests()) -- no request until it is decided
    -- misuse raises, naming the call
    assert.has_error(function() a:approve("nope") end, "agent:approve: no tool call 'nope' waits for approval (waiting: call_mockc1)")
    assert.has_error(function() a:continue() end)
    assert.has_error(function() a:prompt("again") end)
    assert.is_true(a:approve("call_mockc1"))
    evs, last = collect(a:continue())
    assert.equal("stop", last.stop_reason)
    assert.equal(1, ran.pay)
    assert.equal(1, ran.look)
    local dec = of_type(evs, "approval_decided")
    assert.equal(1, #dec)
    assert.is_true(dec[1].approved)
    assert.equal(req[1].approval_id, dec[1].approval_id)
    -- the decision is told before the tool starts
    local order = {}
    for _, e in ipairs(evs) do
      if e.type == "approval_decided" or e.type == "tool_execution_start" then order[#order + 1] = e.type end
    end
    assert.same({ "approval_decided", "tool_execution_start" }, order)
    -- the model got both results, in call order
    local second = bodies()[2]
    local n = #second.messages
    assert.equal("paid 5", second.messages[n - 1].content)
    assert.equal("looked", second.messages[n].content)
    assert.equal(0, #a:pending_approvals())
  end)

  it("denied: the tool does not run and the model gets the error result 'denied: <reason>'", function()
    start { { text = "Paying.", tools = { call("c1", "pay", { amount = 500 }) } }, { text = "I may not." } }
    local ran = {}
    local pay = tools_used(ran)
    local a = luagent.agent { name = "dn", model = model(), tools = { pay } }
    local _, last = collect(a:prompt("pay 500"))
    assert.equal("approval_required", last.stop_reason)
    a:deny("call_mockc1", "too much")
    local evs
    evs, last = collect(a:continue())
    assert.equal("stop", last.stop_reason)
    assert.is_nil(ran.pay)
    local dec = of_type(evs, "approval_decided")[1]
    assert.is_false(dec.approved)
    assert.equal("too much", dec.reason)
    local en = of_type(evs, "tool_execution_end")[1]
    assert.equal("denied: too much", en.error.message)
    local second = bodies()[2]
    local m = second.messages[#second.messages]
    assert.equal("tool", m.role)
    assert.equal("denied: too much", m.content)
  end)

  it("as a function is evaluated once per call, with the call's arguments", function()
    start { { text = "Two.", tools = { call("s", "pay", { amount = 5 }), call("b", "pay", { amount = 900 }) } },
            { text = "ok" } }
    local asked, ran = 0, {}
    local pay = { name = "pay", description = "Pays",
      params = { type = "object", properties = { amount = { type = "integer" } } },
      needs_approval = function(args) asked = asked + 1 return args.amount > 100 end,
      run = function(args) ran[#ran + 1] = args.amount return "paid" end }
    local a = luagent.agent { name = "fn", model = model(), tools = { pay } }
    local _, last = collect(a:prompt("pay"))
    assert.equal("approval_required", last.stop_reason)
    assert.same({ 5 }, ran)
    assert.equal(1, #last.approvals)
    assert.equal("call_mockb", last.approvals[1].call_id)
    a:approve("call_mockb")
    _, last = collect(a:continue())
    assert.equal("stop", last.stop_reason)
    assert.same({ 5, 900 }, ran)
    assert.equal(2, asked) -- not asked again by the continue
  end)

  it("is checked: not a boolean or a function raises naming the field", function()
    assert.has_error(function()
      luagent.tools.new { name = "x", description = "x", needs_approval = "yes", run = function() end }
    end, "tool: tool 'x': needs_approval must be true, false or a function(args, ctx) returning true or false")
  end)
end)
