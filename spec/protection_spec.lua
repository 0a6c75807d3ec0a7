-- Shared protection end to end: many tasks calling one failing endpoint
-- through the mock on loopback, on the virtual clock.
local luagent = require "luagent"
local mock = require "luagent.mock"
local events = require("luagent").events

describe("one endpoint shared by 100 tasks", function()
  before_each(function()
    luagent.configure { log_sink = function() end }
    luagent.clock.virtual()
  end)
  after_each(function()
    luagent.configure { log_sink = false }
    luagent.clock.real()
  end)

  it("lets at most one probe per open interval reach a provider that fails every call", function()
    local srv = assert(mock.start { faults = "503", seed = 1 })
    local model = { kind = "openai", model = "m", base_url = srv.url .. "/v1", api_key = "k" }
    local policy = {
      max_retries = 2, backoff = { strategy = "fixed", base = 1 },
      breaker = { consecutive = 5, open_for = 5, growth = 2, open_max = 20 },
      budget = false, cooldown = false,
    }
    local opened, probes, kinds = {}, {}, {}
    local stop = events.subscribe(function(ev)
      if ev.type == "circuit_open" then opened[#opened + 1] = luagent.now() end
      if ev.type == "circuit_half_open" then probes[#probes + 1] = luagent.now() end
    end)
    local tasks = {}
    for i = 1, 100 do
      tasks[i] = luagent.spawn(function()
        local started = luagent.now()
        while luagent.now() - started < 120 do
          local _, err = luagent.complete { model = model, messages = { { role = "user", content = "hi" } },
                                            policy = policy, seed = i }
          kinds[err.kind] = (kinds[err.kind] or 0) + 1
          luagent.sleep(1)
        end
      end)
    end
    for _, t in ipairs(tasks) do t:join() end
    stop()
    local requests = #srv:requests()
    srv:close()
    assert.is_true(#opened >= 2, "the breaker opened and reopened")
    assert.is_true(kinds.circuit_open > 1000, "callers failed fast while it was open")
    -- the first wave (admitted while closed) plus one request per probe
    assert.equal(100 + #probes, requests)
    assert.is_true(#probes >= 1)
    for i = 2, #probes do
      assert.is_true(probes[i] - probes[i - 1] >= 5, "probes at least one open interval apart")
    end
    assert.is_true(#probes <= #opened, "at most one probe per open interval")
    local h = luagent.health()[srv.url .. "/v1"]
    assert.equal("open", h.state)
  end)

  it("stops retries when the shared budget runs dry, and says so", function()
    local srv = assert(mock.start { faults = "503", seed = 1 })
    local model = { kind = "openai", model = "m", base_url = srv.url .. "/v1", api_key = "k" }
    local policy = { max_retries = 5, backoff = { strategy = "fixed", base = 1 },
                     breaker = false, cooldown = false, budget = { max = 10, ratio = 0.1 } }
    local seen, errs = {}, {}
    local tasks = {}
    for i = 1, 20 do
      tasks[i] = luagent.spawn(function()
        for ev in luagent.stream { model = model, messages = { { role = "user", content = "hi" } }, policy = policy, seed = i } do
          seen[ev.type] = (seen[ev.type] or 0) + 1
          if ev.final then errs[#errs + 1] = ev.error.kind end
        end
      end)
    end
    for _, t in ipairs(tasks) do t:join() end
    local requests = #srv:requests()
    srv:close()
    assert.equal(1, seen.retry_budget_exhausted)
    assert.equal(20, #errs)
    local exhausted = 0
    for _, k in ipairs(errs) do if k == "retry_budget_exhausted" then exhausted = exhausted + 1 end end
    assert.is_true(exhausted > 0)
    -- without the budget 20 calls x 6 attempts = 120 requests
    assert.is_true(requests < 40, "requests: " .. requests)
  end)
end)
