-- Two runtimes in one process (issue 25, lua/luagent/runtime.lua): each has
-- its own default policy, cost cap, logger, tracer and subscribers, and
-- agents of both run at the same time (spawned tasks) against one mock
-- server on loopback, on the virtual clock. Each runtime's agents ask for a
-- model name of their own, so the mock's request log tells the runtimes'
-- requests apart. Each sees only its own events and lines; one's policy
-- decides its own retries; one's cap refuses its own calls only; one's
-- tracer holds its own spans and closes with its runtime.
local luagent = require "luagent"
local mock = require "luagent.mock"
local cjson = require "cjson"
local slurp = require("spec.support.helpers").slurp

-- A runtime of these settings whose log lines (JSON, at info) and events
-- are collected: {rt=, name=, model=, lines=, events=}. `model` is a model
-- name with a price in lua/luagent/observe/prices.lua.
local function runtime(name, model, settings)
  local x = { name = name, model = model, lines = {}, events = {} }
  settings.log_sink = function(_, line) x.lines[#x.lines + 1] = cjson.decode(line) end
  settings.log_level, settings.log_format = "info", "json"
  x.rt = luagent.runtime(settings)
  x.rt:subscribe(function(ev) x.events[#x.events + 1] = ev end)
  return x
end

-- An agent of runtime x on the mock at srv.
local function agent(x, srv, name)
  return x.rt:agent { name = name or x.name,
    model = { kind = "openai", model = x.model, base_url = srv.url .. "/v1", api_key = "k" } }
end

-- Runs each function in a task of its own, all at once; returns their
-- results (the first of each), in order, once every one has ended.
local function together(fns)
  local tasks, out = {}, {}
  for i, fn in ipairs(fns) do tasks[i] = luagent.spawn(fn) end
  for i, t in ipairs(tasks) do out[i] = t:join() end
  return out
end

-- The requests the mock got for `model`.
local function requests_for(srv, model)
  local n = 0
  for _, r in ipairs(srv:requests()) do
    if type(r.body) == "table" and r.body.model == model then n = n + 1 end
  end
  return n
end

-- The events of `type` in a list.
local function of_type(evs, t)
  local out = {}
  for _, ev in ipairs(evs) do if ev.type == t then out[#out + 1] = ev end end
  return out
end

-- The lines whose message starts with `prefix`.
local function lines_starting(lines, prefix)
  local out = {}
  for _, l in ipairs(lines) do if l.msg:sub(1, #prefix) == prefix then out[#out + 1] = l end end
  return out
end

describe("two runtimes in one process, at the same time", function()
  before_each(function() luagent.clock.virtual() end)
  after_each(function() luagent.clock.real() end)

  it("retry as each one's default policy says, and log to each one's own sink", function()
    local srv = assert(mock.start { faults = "503" }) -- every request fails: only the policies differ
    local fixed = { strategy = "fixed", base = 0.5 }
    local alpha = runtime("alpha", "gpt-4o-mini", { policy = { max_retries = 1, backoff = fixed } })
    local beta = runtime("beta", "gpt-4.1-nano", { policy = { max_retries = 3, backoff = fixed } })
    local ends = together {
      function() return agent(alpha, srv, "alpha-1"):run("go") end,
      function() return agent(beta, srv, "beta-1"):run("go") end,
      function() return agent(alpha, srv, "alpha-2"):run("go") end,
      function() return agent(beta, srv, "beta-2"):run("go") end,
    }
    alpha.rt:close()
    beta.rt:close()
    srv:close()
    for _, last in ipairs(ends) do assert.equal("error", last.stop_reason) end
    -- alpha: 2 attempts per call; beta: 4
    assert.equal(2 * 2, requests_for(srv, alpha.model))
    assert.equal(2 * 4, requests_for(srv, beta.model))
    -- each subscriber saw its own runtime's agents and calls only
    for _, x in ipairs({ alpha, beta }) do
      for _, ev in ipairs(x.events) do
        if ev.agent then assert.equal(x.name, ev.agent:match("^(%a+)%-"), ev.type) end
        if ev.request_model then assert.equal(x.model, ev.request_model, ev.type) end
      end
      assert.equal(2, #of_type(x.events, "agent_end"))
    end
    assert.equal(2 * 1, #of_type(alpha.events, "provider_retry"))
    assert.equal(2 * 3, #of_type(beta.events, "provider_retry"))
    -- each sink got its own runtime's retry lines, with its own policy's counts
    local a_lines, b_lines = lines_starting(alpha.lines, "provider error"), lines_starting(beta.lines, "provider error")
    assert.equal(2, #a_lines, cjson.encode(alpha.lines))
    for _, l in ipairs(a_lines) do assert.matches("^provider error %(attempt 1/2%)", l.msg) end
    assert.equal(6, #b_lines, cjson.encode(beta.lines))
    for _, l in ipairs(b_lines) do assert.matches("^provider error %(attempt [123]/4%)", l.msg) end
  end)

  it("refuse a call past one runtime's cost cap, and only that runtime's", function()
    local srv = assert(mock.start { script = function() return { text = "done" } end })
    -- beta counts its cost, uncapped (its meter made first); alpha's cap is 0
    local beta = runtime("beta", "gpt-4.1-nano", {})
    beta.rt:meter("cost")
    local alpha = runtime("alpha", "gpt-4o-mini", { max_cost = 0 })
    local ends = together {
      function() return agent(alpha, srv, "alpha-1"):run("go") end,
      function() return agent(beta, srv, "beta-1"):run("go") end,
      function() return agent(alpha, srv, "alpha-2"):run("go") end,
      function() return agent(beta, srv, "beta-2"):run("go") end,
    }
    alpha.rt:close()
    beta.rt:close()
    srv:close()
    -- alpha's calls were refused before any request; beta's all answered
    assert.equal(0, requests_for(srv, alpha.model))
    assert.equal(2, requests_for(srv, beta.model))
    for i, last in ipairs(ends) do
      if i % 2 == 1 then
        assert.equal("error", last.stop_reason)
        assert.equal("cost_limit", last.error.kind)
        assert.matches("^max_cost of the run %(%$0%.0000%) reached", last.error.message)
      else
        assert.equal("stop", last.stop_reason, tostring(last.error))
      end
    end
    -- each meter priced its own runtime's calls: alpha spent nothing
    for _, ev in ipairs(of_type(alpha.events, "agent_end")) do assert.equal(0, ev.cost.total) end
    for _, ev in ipairs(of_type(beta.events, "agent_end")) do
      assert.is_true(ev.cost.total > 0)
      assert.equal(1, ev.cost.calls)
    end
    -- alpha's sink says what alpha's calls did, and never names beta's model
    for _, l in ipairs(alpha.lines) do assert.not_equal(beta.model, l.model) end
    for _, l in ipairs(beta.lines) do assert.not_equal(alpha.model, l.model) end
    -- closing stopped each meter; its table stays readable
    local meters = { alpha = alpha.rt.meters.cost, beta = beta.rt.meters.cost }
    assert.is_false(meters.alpha:started())
    assert.is_false(meters.beta:started())
    assert.equal(2, meters.beta:totals().calls)
    assert.equal(2, meters.beta:totals().attempts)
    assert.equal(0, meters.alpha:totals().attempts)
  end)

  it("trace apart, their lines with their own trace ids and redaction; closing flushes the export", function()
    local srv = assert(mock.start { script = function() return { text = "done" } end })
    -- alpha and beta send traceparent; alpha and gamma trace (beta's ids are
    -- fresh, kept by no span); alpha's policy redacts its lines' content
    local alpha = runtime("alpha", "gpt-4o-mini", { log_content = true,
      policy = { traceparent = true, redact = function(text) return (text:gsub("done", "[masked]")) end } })
    local beta = runtime("beta", "gpt-4.1-nano", { policy = { traceparent = true } })
    local gamma = runtime("gamma", "gpt-4.1-mini", { log_content = true })
    local files = { alpha = os.tmpname(), gamma = os.tmpname() }
    assert(alpha.rt:trace { file = files.alpha })
    assert(gamma.rt:trace { file = files.gamma })
    for _, x in ipairs({ alpha, beta, gamma }) do x.rt.log:start() end -- events become lines, as under `luagent run`
    local ends = together {
      function() return agent(alpha, srv):run("go") end,
      function() return agent(beta, srv):run("go") end,
      function() return agent(gamma, srv):run("go") end,
    }
    -- no tracer:stop: closing the runtime ends its spans' export and its log
    for _, x in ipairs({ alpha, beta, gamma }) do x.rt:close() end
    for _, last in ipairs(ends) do assert.equal("stop", last.stop_reason) end
    for _, x in ipairs({ alpha, beta, gamma }) do
      assert.is_false(x.rt.log:logging_events())
      assert.is_nil(x.rt.tracer)
    end
    -- each file holds its own runtime's trace, whole once the runtime closed
    local spans = {}
    for name, file in pairs(files) do
      local text = slurp(file)
      os.remove(file)
      assert.matches("\n$", text)
      spans[name] = {}
      for line in text:gmatch("[^\n]+") do
        for _, s in ipairs(cjson.decode(line).resourceSpans[1].scopeSpans[1].spans) do
          spans[name][#spans[name] + 1] = s
        end
      end
    end
    local function names(list)
      local out = {}
      for _, s in ipairs(list) do out[#out + 1] = s.name end
      table.sort(out)
      return table.concat(out, ",")
    end
    assert.equal("attempt 1,chat gpt-4o-mini,invoke_agent alpha", names(spans.alpha))
    assert.equal("attempt 1,chat gpt-4.1-mini,invoke_agent gamma", names(spans.gamma))
    -- log lines carry the ids of their own runtime's spans; beta traced nothing
    local function ids(list)
      local out = {}
      for _, s in ipairs(list) do out[s.traceId] = true end
      return out
    end
    for name, x in pairs({ alpha = alpha, gamma = gamma }) do
      local traces, n = ids(spans[name]), 0
      for _, l in ipairs(x.lines) do
        if l.event then
          assert.is_true(traces[l.trace_id] or false, name .. ": " .. cjson.encode(l))
          n = n + 1
        end
      end
      assert.is_true(n >= 2, name) -- agent_start, the call, agent_end
    end
    assert.is_true(#beta.lines > 0)
    for _, l in ipairs(beta.lines) do assert.is_nil(l.trace_id, cjson.encode(l)) end
    -- content as each runtime's settings and policy say: alpha's redacted,
    -- gamma's as it is, beta's left out
    local function contents(x)
      local out = {}
      for _, l in ipairs(x.lines) do if l.content then out[#out + 1] = l.content end end
      return table.concat(out, ",")
    end
    assert.equal("[masked],[masked]", contents(alpha)) -- the call's line and the agent's end
    assert.equal("done,done", contents(gamma))
    assert.equal("", contents(beta))
    -- the traceparent alpha sent names alpha's attempt; beta's names no span of any runtime
    local sent = {}
    for _, r in ipairs(srv:requests()) do sent[r.body.model] = r.headers.traceparent or false end
    srv:close()
    local attempt
    for _, s in ipairs(spans.alpha) do if s.name == "attempt 1" then attempt = s end end
    assert.equal("00-" .. attempt.traceId .. "-" .. attempt.spanId .. "-01", sent[alpha.model])
    assert.matches("^00%-%x+%-%x+%-01$", sent[beta.model])
    local beta_trace = sent[beta.model]:match("^00%-(%x+)")
    assert.is_nil(ids(spans.alpha)[beta_trace])
    assert.is_nil(ids(spans.gamma)[beta_trace])
    assert.is_false(sent[gamma.model]) -- gamma's policy asks for no header
  end)
end)
