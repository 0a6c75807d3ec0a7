-- The shared breaker in a small setup (issue 26, item 5, and call_waiting
-- of item 7): a few agents sharing one provider, on the virtual clock,
-- against the mock provider on loopback. The same through Redis is in
-- spec/shared_spec.lua ("waiting calls through Redis").
local luagent = require "luagent"
local mock = require "luagent.mock"
local core = require "luagent.core"
local policy = require "luagent.model.policy"
local helpers = require "helpers"

-- A model on the mock server `srv`.
local function model_of(srv)
  return { kind = "openai", model = "m", base_url = srv.url .. "/v1", api_key = "k" }
end

-- Runs `fn(i)` in `n` tasks at once and joins them all.
local function in_parallel(n, fn)
  local tasks = {}
  for i = 1, n do tasks[i] = luagent.spawn(function() return fn(i) end) end
  for _, t in ipairs(tasks) do t:join() end
end

describe("the shared breaker in a small setup", function()
  local rt
  before_each(function()
    luagent.clock.virtual()
    rt = luagent.runtime { log_sink = function() end }
  end)
  after_each(function()
    rt:close()
    luagent.clock.real()
  end)

  it("2 agents, half their requests 429, consecutive = 40: the ratio rule does not open, every prompt is answered", function()
    local srv = assert(mock.start { faults = "429:retry-after=1@every:2", seed = 1 })
    finally(function() srv:close() end)
    local model = model_of(srv)
    local answered, failures, opened = 0, {}, 0
    local stop = rt:subscribe(function(ev) if ev.type == "circuit_open" then opened = opened + 1 end end)
    in_parallel(2, function(i)
      local a = rt:agent { name = "agent" .. i, model = model, policy = { breaker = { consecutive = 40 } } }
      for p = 1, 5 do
        local last = a:run("prompt " .. p)
        if last.stop_reason == "stop" then
          answered = answered + 1
        else
          failures[#failures + 1] = tostring(last.error)
        end
      end
    end)
    stop()
    assert.same({}, failures)
    assert.equal(10, answered)
    assert.equal(0, opened, "the breaker never opened")
  end)

  -- Trips the endpoint of `model` in `rt`: `n` calls that fail at once
  -- (the mock's first `n` requests fail), under `pol`.
  local function trip(model, pol, n)
    for _ = 1, n do
      local _, err = rt:complete { model = model, messages = { { role = "user", content = "x" } }, policy = pol }
      assert.equal("overloaded", err.class)
    end
  end

  -- Streams one call; its events and its final message_end.
  local function call(model, pol, events)
    events = events or {}
    for ev in rt:stream { model = model, messages = { { role = "user", content = "hi" } }, policy = pol } do
      events[#events + 1] = ev
    end
    return events, events[#events]
  end

  local of_type = helpers.of_type

  describe("breaker.wait_for_probe", function()
    local function pol(extra)
      local p = { max_retries = 0, budget = false, cooldown = false,
                  breaker = { consecutive = 3, window = 0, open_for = 5, wait_for_probe = true } }
      for k, v in pairs(extra or {}) do p[k] = v end
      return p
    end

    it("makes a refused call wait for the probe and go once it closed the circuit", function()
      local srv = assert(mock.start { faults = "503@1-3", seed = 1 })
      finally(function() srv:close() end)
      local model = model_of(srv)
      trip(model, pol(), 3)
      local t0 = luagent.now()
      local open_until = rt:health()[srv.url .. "/v1"].open_until
      assert.is_near(t0 + 5, open_until, 0.01)
      local runs = {}
      in_parallel(3, function(i) runs[i] = { call(model, pol()) } end)
      local done = luagent.now()
      for i = 1, 3 do
        local evs, final = runs[i][1], runs[i][2]
        assert.equal("stop", final.stop_reason, tostring(final.error))
        local waits = of_type(evs, "call_waiting")
        assert.is_true(#waits >= 1, "call " .. i .. " announced its wait")
        assert.equal("circuit_open", waits[1].reason)
        assert.equal(open_until, waits[1]["until"])
        assert.equal(math.floor((open_until - t0) * 1000 + 0.5), waits[1].wait_ms)
        assert.equal(srv.url .. "/v1", waits[1].endpoint)
        assert.is_number(waits[1].call)
        -- the call_waiting comes before the attempt's first event
        assert.equal("call_waiting", evs[1].type)
      end
      -- the two that were not the probe went when it closed the circuit,
      -- not when its slot would have timed out (probe_timeout, 30 s)
      assert.is_true(done - open_until < 1, "answered " .. (done - open_until) .. " s after the open time")
      assert.equal(3 + 3, #srv:requests())
    end)

    it("keeps waiting when the probe fails, and goes after the next one", function()
      local srv = assert(mock.start { faults = "503@1-4", seed = 1 })
      finally(function() srv:close() end)
      local model = model_of(srv)
      trip(model, pol(), 3)
      local runs = {}
      in_parallel(2, function(i) runs[i] = { call(model, pol()) } end)
      local finals = { runs[1][2], runs[2][2] }
      table.sort(finals, function(a, b) return a.stop_reason < b.stop_reason end)
      -- the first probe's own call fails (max_retries = 0); the other waits
      -- through the reopening (5 s, then 10 s) and is the second probe
      assert.equal("error", finals[1].stop_reason)
      assert.equal("stop", finals[2].stop_reason)
      local waiter = runs[1][2].stop_reason == "stop" and runs[1][1] or runs[2][1]
      local untils = {}
      for _, w in ipairs(of_type(waiter, "call_waiting")) do untils[#untils + 1] = w["until"] end
      assert.is_true(#untils >= 2, "a new wait announced when the circuit reopened")
      assert.is_true(untils[#untils] > untils[1] + 9, "the last wait is the longer open time")
    end)

    it("fails at once when the open time ends past the total deadline", function()
      local srv = assert(mock.start { faults = "503@1-3", seed = 1 })
      finally(function() srv:close() end)
      local model = model_of(srv)
      trip(model, pol(), 3)
      local t0 = luagent.now()
      local evs, final = call(model, pol { total_deadline = 2 })
      assert.equal(t0, luagent.now())
      assert.equal("error", final.stop_reason)
      assert.equal("circuit_open", final.error.kind)
      assert.equal(0, final.attempts)
      assert.matches("past the total deadline", final.error.message)
      assert.same({}, of_type(evs, "call_waiting"))
    end)

    it("is off by default: a refused call fails at once", function()
      local srv = assert(mock.start { faults = "503@1-3", seed = 1 })
      finally(function() srv:close() end)
      local model = model_of(srv)
      local p = pol()
      p.breaker.wait_for_probe = nil
      trip(model, p, 3)
      local t0 = luagent.now()
      local evs, final = call(model, p)
      assert.equal(t0, luagent.now())
      assert.equal("circuit_open", final.error.kind)
      assert.same({}, of_type(evs, "call_waiting"))
    end)

    it("lets an agent be aborted while it waits", function()
      local srv = assert(mock.start { faults = "503@1-3", seed = 1 })
      finally(function() srv:close() end)
      local model = model_of(srv)
      trip(model, pol(), 3)
      local a = rt:agent { model = model, policy = pol() }
      local seen = {}
      local t0 = luagent.now()
      luagent.spawn(function() luagent.sleep(1) a:abort("enough") end)
      for ev in a:prompt("hi") do seen[#seen + 1] = ev end
      assert.equal("aborted", seen[#seen].stop_reason)
      assert.is_true(luagent.now() - t0 < 1.5)
      assert.equal(1, #of_type(seen, "call_waiting"))
      assert.equal(3, #srv:requests(), "no request after the abort")
      -- the endpoint is not left with a waiter: a probe later closes it
      luagent.sleep(5)
      local _, final = call(model, pol())
      assert.equal("stop", final.stop_reason)
    end)

    it("is checked when the policy loads, naming the file, line and field", function()
      local path = helpers.tempfile("return {\n  breaker = {\n    wait_for_probe = \"yes\",\n  },\n}\n", ".lua")
      finally(function() os.remove(path) end)
      local p, err = policy.load(path)
      assert.is_nil(p)
      assert.equal(path .. ":3: breaker.wait_for_probe must be true or false (got \"yes\")", err.message)
      -- the normalized policy keeps it apart from the endpoint's breaker settings
      assert.is_false(policy.new({}).wait_for_probe)
      local p2 = policy.new { breaker = { consecutive = 4, wait_for_probe = true } }
      assert.is_true(p2.wait_for_probe)
      assert.same({ consecutive = 4 }, p2.breaker)
      assert.is_false(policy.new({ breaker = false }).wait_for_probe)
    end)
  end)

  describe("call_waiting for a cooldown", function()
    it("shows in the waiting agent's stream when another agent's 429 holds it", function()
      local srv = assert(mock.start { faults = "429:retry-after=2@1", seed = 1 })
      finally(function() srv:close() end)
      local model = model_of(srv)
      local pol = { breaker = false, budget = false }
      local first = rt:agent { name = "first", model = model, policy = pol }
      local second = rt:agent { name = "second", model = model, policy = pol }
      local evs1, evs2 = {}, {}
      local t_wait
      in_parallel(2, function(i)
        if i == 1 then
          for ev in first:prompt("hi") do evs1[#evs1 + 1] = ev end
        else
          luagent.sleep(0.5) -- after the first's 429 set the cooldown
          t_wait = luagent.now()
          for ev in second:prompt("hi") do evs2[#evs2 + 1] = ev end
        end
      end)
      assert.equal("stop", evs1[#evs1].stop_reason)
      assert.equal("stop", evs2[#evs2].stop_reason)
      assert.equal(1, #of_type(evs1, "provider_retry"), "the first announces its own wait as a retry")
      assert.same({}, of_type(evs1, "call_waiting"))
      local waits = of_type(evs2, "call_waiting")
      assert.equal(1, #waits)
      local w = waits[1]
      assert.equal("cooldown", w.reason)
      assert.equal("second", w.agent)
      local cooldown = of_type(evs1, "cooldown")[1].cooldown_until
      assert.is_true(w["until"] >= cooldown and w["until"] <= cooldown + 0.25 * (cooldown - t_wait) + 1e-9,
        "released after the cooldown, with its jitter")
      assert.equal(math.floor((w["until"] - t_wait) * 1000 + 0.5), w.wait_ms)
      -- and the wait was made: the second's request went after the cooldown
      local requests = srv:requests()
      assert.equal(3, #requests)
    end)
  end)
end)
