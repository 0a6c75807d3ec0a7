-- Shared protection per endpoint (lua/luagent/model/endpoint/init.lua): one breaker,
-- one retry budget and one cooldown per key, shared by every caller; the
-- error records and events it produces; 100 callers against a provider that
-- always fails; cooldown release with jitter; health().
local endpoint = require "luagent.model.endpoint"
-- the endpoints of these specs: a registry of their own, as a runtime has
local registry = require("luagent.model.endpoint.registry").new(require("luagent.base.diagnostics").new(function() end))
local errors = require "luagent.base.errors"
local core = require "luagent.core"

-- The types of a list of events, in order.
local function types(events)
  local out = {}
  for i, e in ipairs(events) do out[i] = e.type end
  return out
end

-- Records `n` counted failures; returns all the events, in order.
local function fail(ep, now, n)
  local all = {}
  for _ = 1, n do
    for _, e in ipairs(ep:record(now, false, true)) do all[#all + 1] = e end
  end
  return all
end

describe("endpoint", function()
  before_each(function() registry:reset() end)

  describe("registry", function()
    it("gives every caller of one key the same endpoint, ignoring later opts", function()
      local a = registry:get("https://api.example.com/v1", { breaker = { consecutive = 2 } })
      local b = registry:get("https://api.example.com/v1", { breaker = { consecutive = 99 } })
      assert.equal(a, b)
      a:record(1, false, true)
      -- The second failure, through the other handle, trips (consecutive = 2).
      assert.same({ "circuit_open" }, types(b:record(1, false, true)))
      local ok, err = a:admit(false, 2)
      assert.is_nil(ok)
      assert.equal("circuit_open", err.kind)
    end)

    it("keeps different keys apart", function()
      local a = registry:get(endpoint.key("https://h/v1", "m1"), { breaker = { consecutive = 1 } })
      local b = registry:get(endpoint.key("https://h/v1", "m2"), { breaker = { consecutive = 1 } })
      assert.equal("https://h/v1|m1", a.key)
      assert.equal("https://h/v1", endpoint.key("https://h/v1"))
      a:record(0, false, true)
      assert.is_true((b:admit(false, 0)))
      assert.is_nil((a:admit(false, 0)))
    end)

    it("forgets everything on reset", function()
      local a = registry:get("k")
      registry:reset()
      assert.are_not.equal(a, registry:get("k"))
      registry:reset()
      assert.same({}, registry:health())
    end)

    it("raises on bad options, naming the field, and registers nothing", function()
      assert.has_error(function() registry:get("") end, "endpoint.get: key must be a non-empty string")
      assert.has_error(function() registry:get("k", { brekaer = {} }) end,
        "endpoint.get: unknown option 'brekaer'")
      assert.has_error(function() registry:get("k", { cooldown = { jitter = -1 } }) end,
        "endpoint.get: cooldown.jitter must be a finite number >= 0")
      assert.has_error(function() registry:get("k", { cooldown = { spread = 1 } }) end,
        "endpoint.get: unknown option 'cooldown.spread'")
      assert.has_error(function() registry:get("k", { breaker = { ratio = 2 } }) end,
        "breaker: config.ratio must be a number in (0, 1]")
      assert.has_error(function() registry:get("k", { budget = { max = 0 } }) end,
        "retry_budget: config.max must be a number in (0, 1000000], at least 0.001")
      assert.same({}, registry:health())
    end)
  end)

  describe("admit", function()
    it("lets first attempts and retries through while all is well", function()
      local ep = registry:get("k")
      assert.same({ true, false, {} }, { ep:admit(false, 0) })
      assert.same({ true, false, {} }, { ep:admit(true, 0) })
    end)

    it("refuses a retry once the budget is at half, but not a first attempt", function()
      local ep = registry:get("k", { breaker = { consecutive = 0, window = 0 } })
      local events = fail(ep, 0, 5)
      assert.same({ "retry_budget_exhausted" }, types(events))
      assert.same({ type = "retry_budget_exhausted", endpoint = "k", tokens = 5 }, events[1])
      local ok, err, ev = ep:admit(true, 1)
      assert.is_nil(ok)
      assert.same({}, ev)
      assert.is_true(errors.is(err))
      assert.equal("retry_budget_exhausted", err.kind)
      assert.same({ "k", 5, false }, { err.endpoint, err.tokens, err.retryable })
      assert.equal("retry_budget_exhausted: retry budget of k exhausted: 5 of 10 tokens, "
        .. "retries need more than 5", tostring(err))
      assert.is_true((ep:admit(false, 1)))
      -- may_retry asks the same before a retry's wait, naming the failure
      local cause = errors.new("http", "HTTP 503", { status = 503 })
      local may, refusal = ep:may_retry(cause)
      assert.is_nil(may)
      assert.equal("retry_budget_exhausted", refusal.kind)
      assert.equal(cause, refusal.cause)
      assert.is_false(refusal.retryable)
      assert.matches("exhausted: 5 of 10 tokens, retries need more than 5; the attempt failed with http: HTTP 503",
        tostring(refusal), 1, true)
      ep:record(1, true, true) -- 5.1 tokens
      assert.is_true((ep:admit(true, 1)))
      assert.is_true(ep:may_retry(cause))
      assert.is_true(registry:get("no-budget", { budget = false }):may_retry(cause))
    end)

    it("fails fast while the circuit is open, saying when the next probe is due", function()
      local ep = registry:get("k", { breaker = { consecutive = 3, open_for = 5 } })
      local events = fail(ep, 10, 3)
      assert.same({ type = "circuit_open", endpoint = "k", open_until = 15, trips = 1 }, events[1])
      local ok, err = ep:admit(false, 12.5)
      assert.is_nil(ok)
      assert.equal("circuit_open", err.kind)
      assert.same({ "k", 15, false }, { err.endpoint, err.retry_at, err.retryable })
      assert.equal("circuit open for k: next probe due in 2.500 s (at 15.000)", err.message)
    end)

    it("checks the budget before the breaker, so a refused retry never takes the probe", function()
      local ep = registry:get("k", { breaker = { consecutive = 5, open_for = 5 } })
      fail(ep, 0, 5) -- opens, and leaves 5 tokens: no retries
      local ok, err = ep:admit(true, 5)
      assert.is_nil(ok)
      assert.equal("retry_budget_exhausted", err.kind)
      local probe, events
      ok, probe, events = ep:admit(false, 5)
      assert.is_true(ok)
      assert.is_true(probe)
      assert.same({ { type = "circuit_half_open", endpoint = "k" } }, events)
    end)
  end)

  describe("record", function()
    local function opened(cfg)
      local ep = registry:get("k", { breaker = cfg or { consecutive = 2, open_for = 5 } })
      fail(ep, 0, 2)
      return ep
    end

    it("closes the circuit on the probe's success, and says so", function()
      local ep = opened()
      local ok, probe = ep:admit(false, 5)
      assert.is_true(ok and probe)
      assert.is_nil((ep:admit(false, 5)))
      assert.same({ { type = "circuit_close", endpoint = "k" } }, ep:record(6, true, true, probe))
      assert.same({ true, false, {} }, { ep:admit(false, 6) })
    end)

    it("reopens on the probe's failure, for longer", function()
      local ep = opened()
      local _, probe = ep:admit(false, 5)
      assert.same({ { type = "circuit_open", endpoint = "k", open_until = 16, trips = 2 } },
        ep:record(6, false, true, probe))
    end)

    it("changes nothing for failures that do not count", function()
      local ep = registry:get("k", { breaker = { consecutive = 2 } })
      for _ = 1, 20 do assert.same({}, ep:record(0, false, false)) end
      local h = registry:health(0).k
      assert.same({ "closed", 0, 0, 10 }, { h.state, h.consecutive, h.calls, h.tokens })
    end)

    it("frees the probe's slot when the probe's failure does not count", function()
      local ep = opened()
      local _, probe = ep:admit(false, 5)
      assert.same({}, ep:record(5.5, false, false, probe)) -- e.g. its caller was cancelled
      local ok, again = ep:admit(false, 5.5)
      assert.is_true(ok and again)
    end)

    it("takes a result recorded while the probe is out as the probe's when not told", function()
      local ep = opened()
      ep:admit(false, 5)
      assert.same({ "circuit_close" }, types(ep:record(6, true, true)))
      -- Told explicitly that it is not the probe: ignored.
      local ep2 = registry:get("k2", { breaker = { consecutive = 1 } })
      fail(ep2, 0, 1)
      ep2:admit(false, 5)
      assert.same({}, ep2:record(6, true, true, false))
      assert.equal("half_open", registry:health(6).k2.state)
    end)
  end)

  -- The issue's acceptance test: 100 callers in a loop against a provider
  -- that fails every call. Each call takes 0.5 s; a caller that is refused
  -- tries again 0.1 s later, one whose call ended tries again 0.2 s later.
  -- After the breaker opens, at most one call (the probe) reaches the
  -- provider per open interval.
  it("lets at most one probe per open interval reach a failing provider (100 callers)", function()
    local ep = registry:get("failing", {
      breaker = { consecutive = 5, window = 20, min_calls = 10, open_for = 5, open_max = 60,
                  growth = 2, probe_timeout = 30 },
    })
    local provider_calls = {} -- times at which the provider was called
    local function provider(t)
      provider_calls[#provider_calls + 1] = t
      return false
    end
    local opens, closes, half_opens = {}, 0, 0
    local function consume(events, t)
      for _, e in ipairs(events) do
        if e.type == "circuit_open" then opens[#opens + 1] = { at = t, open_until = e.open_until }
        elseif e.type == "circuit_close" then closes = closes + 1
        elseif e.type == "circuit_half_open" then half_opens = half_opens + 1 end
      end
    end
    local next_try, in_flight, refused = {}, {}, 0
    for i = 1, 100 do next_try[i] = i / 1000 end
    for step = 0, 2000 do -- 200 simulated seconds, 0.1 s apart
      local t = step / 10
      for i = 1, 100 do
        local call = in_flight[i]
        if call and call.done <= t then
          in_flight[i] = nil
          consume(ep:record(t, call.ok, true, call.probe), t)
          next_try[i] = t + 0.2
        end
      end
      for i = 1, 100 do
        if not in_flight[i] and next_try[i] <= t then
          local ok, probe, events = ep:admit(false, t)
          if ok then
            consume(events, t)
            in_flight[i] = { done = t + 0.5, ok = provider(t), probe = probe }
          else
            assert.equal("circuit_open", probe.kind)
            refused = refused + 1
            next_try[i] = t + 0.1
          end
        end
      end
    end
    assert.equal(0, closes)
    assert.is_true(#opens >= 6, #opens .. " opens")
    -- Before the first open: the first wave (one call per caller).
    local first = 0
    for _, at in ipairs(provider_calls) do
      if at < opens[1].at then first = first + 1 end
    end
    assert.equal(100, first)
    -- After it: exactly one call per interval between opens (the probe,
    -- whose failure caused the next open), at or after the open time's end.
    for k = 1, #opens do
      local hi = opens[k + 1] and opens[k + 1].at or math.huge
      local n = 0
      for _, at in ipairs(provider_calls) do
        if at >= opens[k].at and at < hi then
          n = n + 1
          assert.is_true(at >= opens[k].open_until, "a call during the open time at " .. at)
        end
      end
      assert.is_true(n <= 1, n .. " calls in open interval " .. k)
      if opens[k + 1] then assert.equal(1, n) end
    end
    local probes = #provider_calls - 100
    assert.is_true(probes == #opens - 1 or probes == #opens, probes .. " probes")
    assert.equal(probes, half_opens)
    assert.is_true(refused > 50000, refused .. " refused")
    -- Open times: 5, 10, 20, 40, then capped at 60.
    local lengths = {}
    for k = 1, 6 do -- rounded: the loop's times are tenths, inexact in binary
      lengths[k] = math.floor((opens[k].open_until - opens[k].at) * 1000 + 0.5) / 1000
    end
    assert.same({ 5, 10, 20, 40, 60, 60 }, lengths)
  end)

  describe("cooldown", function()
    it("holds callers until the server's time, released with jitter r * (1 + jitter * U)", function()
      local ep = registry:get("k", { cooldown = { jitter = 0.25 } })
      assert.equal(0, ep:cooldown_wait(100, 0.5))
      assert.same({ { type = "cooldown", endpoint = "k", cooldown_until = 110 } }, ep:set_cooldown(110))
      assert.equal(10, ep:cooldown_wait(100, 0))
      assert.equal(12.5, ep:cooldown_wait(100, 1))
      assert.equal(11.25, ep:cooldown_wait(100, 0.5))
      assert.equal(2.5, ep:cooldown_wait(108, 1))
      assert.equal(0, ep:cooldown_wait(110, 1))
      assert.equal(0, ep:cooldown_wait(111, 0.3))
    end)

    it("keeps the later of two cooldowns", function()
      local ep = registry:get("k")
      ep:set_cooldown(110)
      assert.same({}, ep:set_cooldown(105))
      assert.same({}, ep:set_cooldown(110))
      assert.same({ "cooldown" }, types(ep:set_cooldown(120)))
      assert.equal(120, registry:health(100).k.cooldown_until)
    end)

    it("spreads 100 held callers over the release window, none before the server's time", function()
      local ep = registry:get("k") -- default jitter 0.25
      ep:set_cooldown(30)
      local starts = {}
      for i = 1, 100 do starts[i] = ep:cooldown_wait(10, (i - 1) / 99) + 10 end
      local seen = {}
      for i = 1, 100 do
        assert.is_true(starts[i] >= 30)
        assert.is_nil(seen[starts[i]], "two callers start at " .. starts[i])
        seen[starts[i]] = true
      end
      assert.equal(30, starts[1])
      assert.equal(35, starts[100])
    end)

    it("takes U from a generator, deterministically under a seed", function()
      local ep = registry:get("k")
      ep:set_cooldown(20)
      local u = core.backoff_rng(9):next()
      assert.equal(10 * (1 + 0.25 * u), ep:cooldown_wait(10, core.backoff_rng(9)))
    end)

    it("with jitter 0 releases everyone at the server's time", function()
      local ep = registry:get("k", { cooldown = { jitter = 0 } })
      ep:set_cooldown(20)
      assert.equal(10, ep:cooldown_wait(10, 0.9))
    end)

    it("raises on misuse", function()
      local ep = registry:get("k")
      ep:set_cooldown(20)
      assert.has_error(function() ep:cooldown_wait(10, 2) end,
        "endpoint.cooldown_wait: u must be a number in [0, 1] or a random generator")
      assert.has_error(function() ep:cooldown_wait(nil, 0.5) end)
      assert.has_error(function() ep:set_cooldown("soon") end)
      assert.has_error(function() ep:admit(false, 0 / 0) end)
    end)
  end)

  describe("health", function()
    it("reports every endpoint's state, counts, tokens and times", function()
      local a = registry:get("a", { breaker = { consecutive = 2, open_for = 5 } })
      local b = registry:get("b")
      fail(a, 10, 2)
      b:record(10, false, true)
      b:record(11, true, true)
      b:set_cooldown(40)
      assert.same({
        a = { state = "open", failures = 2, consecutive = 2, calls = 2, trips = 1, probe_out = false,
              open_until = 15, tokens = 8, max_tokens = 10, backend = "local" },
        b = { state = "closed", failures = 1, consecutive = 0, calls = 2, trips = 0, probe_out = false,
              tokens = 9.1, max_tokens = 10, cooldown_until = 40, backend = "local" },
      }, registry:health(12))
      -- Read at a later time, a's open time is over.
      assert.equal("half_open", registry:health(15).a.state)
      -- Without a time: at the latest time each endpoint was given (11 for b, 10 for a).
      assert.equal("open", registry:health().a.state)
      a:admit(false, 16)
      local h = registry:health()
      assert.same({ "half_open", true }, { h.a.state, h.a.probe_out })
    end)
  end)
end)
