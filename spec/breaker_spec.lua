-- The circuit breaker in C (host/breaker.c through host/guard_lua.c), as a
-- state machine driven by explicit times: every transition, the single
-- probe, fail-fast while open, the growing and capped open time, the probe
-- timeout, the ratio rule, and what is ignored.
local core = require "luagent.core"

-- A breaker that trips on consecutive failures only.
local function consecutive(n, extra)
  local cfg = { consecutive = n, window = 0 }
  for k, v in pairs(extra or {}) do cfg[k] = v end
  return core.breaker(cfg)
end

-- Records `n` counted failures at `now`; returns the last transition.
local function fail(b, now, n)
  local last
  for _ = 1, n do last = b:record(now, false) end
  return last
end

-- Brings a fresh breaker to the half-open state with the probe out, the
-- probe handed out at `t`; returns the breaker.
local function with_probe_out(cfg, t)
  local b = core.breaker(cfg)
  fail(b, 0, cfg.consecutive)
  assert.equal("probe", (b:allow(t)))
  return b
end

-- A refusal as {verdict, retry_at}, checking its shape: nil and a record of
-- kind circuit_open.
local function refused(verdict, err)
  if verdict then return { verdict } end
  assert.equal("circuit_open", err.kind)
  assert.matches("^circuit open: next probe due at ", err.message)
  return { nil, err.retry_at }
end

describe("breaker", function()
  it("starts closed with empty counts and lets calls through", function()
    local b = core.breaker()
    assert.equal("allow", b:allow(0))
    local state, c = b:state(0)
    assert.equal("closed", state)
    assert.same({ failures = 0, consecutive = 0, calls = 0, trips = 0, probe_out = false }, c)
  end)

  describe("closed -> open", function()
    it("opens on the Nth consecutive counted failure, not before", function()
      local b = consecutive(3)
      assert.is_nil(b:record(1, false))
      assert.is_nil(b:record(1, false))
      assert.equal("allow", b:allow(1))
      assert.equal("open", b:record(1, false))
      local state, c = b:state(1)
      assert.equal("open", state)
      assert.same({ failures = 0, consecutive = 3, calls = 0, trips = 1, open_until = 6,
                    probe_out = false }, c)
    end)

    it("starts the count again after a success", function()
      local b = consecutive(3)
      fail(b, 0, 2)
      assert.is_nil(b:record(0, true))
      assert.is_nil(fail(b, 0, 2))
      assert.equal("closed", (b:state(0)))
      assert.equal("open", b:record(0, false))
    end)

    it("opens when the failure ratio over the window reaches R with at least M calls", function()
      local b = core.breaker { consecutive = 0, ratio = 0.5, window = 10, min_calls = 6 }
      -- F S F S F: 3 of 5 failed, but fewer than 6 calls.
      for i = 1, 5 do assert.is_nil(b:record(0, i % 2 == 0)) end
      -- 6 calls, 3 failed: the ratio is reached, but only a failure trips.
      assert.is_nil(b:record(0, true))
      local _, c = b:state(0)
      assert.same({ 3, 6 }, { c.failures, c.calls })
      -- 4 of 7 failed.
      assert.equal("open", b:record(0, false))
    end)

    it("stays closed while the ratio stays below R", function()
      local b = core.breaker { consecutive = 0, ratio = 0.5, window = 10, min_calls = 6 }
      for i = 1, 60 do assert.is_nil(b:record(0, i % 3 ~= 0)) end -- 1 in 3 fails
      assert.equal("closed", (b:state(0)))
    end)

    it("forgets calls that slid out of the window", function()
      local b = core.breaker { consecutive = 0, ratio = 0.75, window = 4, min_calls = 4 }
      for _ = 1, 6 do b:record(0, true) end
      assert.is_nil(b:record(0, false)) -- window S S S F
      assert.is_nil(b:record(0, false)) -- S S F F
      local _, c = b:state(0)
      assert.same({ 2, 4 }, { c.failures, c.calls })
      -- S F F F: 3 of 4 in the window (3 of 9 overall).
      assert.equal("open", b:record(0, false))
    end)

    it("with consecutive alone, never opens on the ratio rule before that many failures are in its window", function()
      -- the ratio rule needs 80 calls in its window, so at least 40 failures
      local function first_trip(fails)
        local b = core.breaker { consecutive = 40 }
        for n = 1, 1000 do
          if b:record(0, not fails(n)) then
            local _, c = b:state(0)
            return n, c.failures
          end
        end
      end
      -- one in three fails: it never opens
      assert.is_nil(first_trip(function(n) return n % 3 == 0 end))
      -- half fail (F S F S ...): not after 10 calls, as the default window
      -- would, but at the first failure with 80 calls in the window
      assert.same({ 81, 40 }, { first_trip(function(n) return n % 2 == 1 end) })
      -- two in three fail
      assert.same({ 80, 54 }, { first_trip(function(n) return n % 3 ~= 0 end) })
      local b = core.breaker { consecutive = 40 }
      assert.same({ consecutive = 40, ratio = 0.5, window = 80, min_calls = 80, open_for = 5, open_max = 60,
                    growth = 2, probe_timeout = 30 }, b:config())
    end)

    it("sizes the ratio rule by consecutive only when no ratio, window or min_calls is given", function()
      local function sizes(cfg)
        local c = core.breaker(cfg):config()
        return { c.window, c.min_calls }
      end
      assert.same({ 20, 10 }, sizes {})                          -- the defaults
      assert.same({ 20, 10 }, sizes { consecutive = 3 })         -- 10 calls hold 5 failures already
      assert.same({ 20, 20 }, sizes { consecutive = 10 })        -- default.lua's
      assert.same({ 20, 10 }, sizes { consecutive = 0 })         -- that rule off
      assert.same({ 20, 10 }, sizes { consecutive = 40, ratio = 0.5 })
      assert.same({ 30, 10 }, sizes { consecutive = 40, window = 30 })
      assert.same({ 20, 15 }, sizes { consecutive = 40, min_calls = 15 })
      assert.same({ 1024, 1024 }, sizes { consecutive = 512 })
      -- past the largest window no size would hold: the ratio rule is off
      assert.same({ 0, 10 }, sizes { consecutive = 513 })
    end)

    it("never opens with both rules off", function()
      local b = core.breaker { consecutive = 0, window = 0 }
      assert.is_nil(fail(b, 0, 1000))
      assert.equal("allow", b:allow(0))
    end)
  end)

  describe("open", function()
    it("fails fast until the open time is over, saying when the probe is due", function()
      local b = consecutive(2, { open_for = 5 })
      fail(b, 10, 2)
      for _, t in ipairs { 10, 12.5, 14.999 } do
        assert.same({ nil, 15 }, refused(b:allow(t)))
      end
      assert.equal("open", (b:state(14.999)))
    end)

    it("ignores results of calls admitted before the trip", function()
      local b = consecutive(2, { open_for = 5 })
      fail(b, 10, 2)
      assert.is_nil(b:record(11, true))
      assert.is_nil(b:record(11, false))
      local state, c = b:state(11)
      assert.equal("open", state)
      assert.same({ 2, 1, 15 }, { c.consecutive, c.trips, c.open_until })
    end)

    it("reads half_open once the open time is over, before anyone asks", function()
      local b = consecutive(1, { open_for = 5 })
      b:record(10, false)
      assert.equal("open", (b:state(14.5)))
      assert.equal("half_open", (b:state(15)))
      -- A read changes nothing: earlier times still read open.
      assert.equal("open", (b:state(14.5)))
    end)

    it("moves to half_open when a result arrives after the open time", function()
      local b = consecutive(1, { open_for = 5 })
      b:record(10, false)
      assert.equal("half_open", b:record(16, false)) -- a straggler, not the probe
      assert.equal("half_open", (b:state(16)))
      assert.same({ "probe", nil, nil }, { b:allow(16) })
    end)
  end)

  describe("half_open", function()
    local cfg = { consecutive = 2, window = 0, open_for = 5, probe_timeout = 30 }

    it("lets exactly one probe through and refuses every other caller", function()
      local b = consecutive(2, { open_for = 5, probe_timeout = 30 })
      fail(b, 0, 2)
      assert.same({ "probe", nil, "half_open" }, { b:allow(5) })
      for i = 1, 50 do
        assert.same({ nil, 35 }, refused(b:allow(5 + i / 10)))
      end
      local state, c = b:state(10)
      assert.equal("half_open", state)
      assert.is_true(c.probe_out)
    end)

    it("closes on the probe's success, resetting trips, counts and window", function()
      local b = with_probe_out(cfg, 5)
      assert.equal("close", b:record(6, true, true))
      local state, c = b:state(6)
      assert.equal("closed", state)
      assert.same({ failures = 0, consecutive = 0, calls = 0, trips = 0, probe_out = false }, c)
      assert.equal("allow", b:allow(6))
      -- The next trip opens for the base time again.
      fail(b, 7, 2)
      assert.same({ nil, 12 }, refused(b:allow(7)))
    end)

    it("reopens, for longer, on the probe's failure", function()
      local b = with_probe_out(cfg, 5)
      assert.equal("open", b:record(6, false, true))
      local state, c = b:state(6)
      assert.equal("open", state)
      assert.same({ 2, 16 }, { c.trips, c.open_until }) -- 5 * 2
      assert.same({ nil, 16 }, refused(b:allow(6)))
    end)

    it("ignores results that are not the probe's", function()
      local b = with_probe_out(cfg, 5)
      assert.is_nil(b:record(6, true))
      assert.is_nil(b:record(6, false))
      assert.equal("half_open", (b:state(6)))
      assert.same({ nil, 35 }, refused(b:allow(6)))
    end)

    it("hands out another probe once the probe is older than probe_timeout", function()
      local b = with_probe_out(cfg, 5) -- its caller was cancelled: no report
      assert.same({ nil, 35 }, refused(b:allow(34.999)))
      assert.same({ "probe", nil, nil }, { b:allow(35) }) -- no new transition
      assert.same({ nil, 65 }, refused(b:allow(36)))
      -- The late first probe still counts as a probe.
      assert.equal("close", b:record(40, true, true))
    end)

    it("frees the slot at once when the probe is released", function()
      local b = with_probe_out(cfg, 5)
      b:release()
      assert.equal("probe", (b:allow(6)))
      assert.same({ nil, 36 }, refused(b:allow(6)))
    end)
  end)

  describe("open time", function()
    it("grows by `growth` on each repeated trip and stops at open_max", function()
      local b = core.breaker { consecutive = 1, window = 0, open_for = 5, growth = 2, open_max = 60 }
      local now, lengths = 0, {}
      assert.equal("open", b:record(now, false))
      for _ = 1, 7 do
        local _, c = b:state(now)
        lengths[#lengths + 1] = c.open_until - now
        now = c.open_until
        assert.equal("probe", (b:allow(now)))
        assert.equal("open", b:record(now, false, true))
      end
      assert.same({ 5, 10, 20, 40, 60, 60, 60 }, lengths)
    end)

    it("is constant with growth 1 and survives huge trip counts", function()
      local b = core.breaker { consecutive = 1, window = 0, open_for = 3, growth = 1, open_max = 9 }
      b:record(0, false)
      local now = 0
      for _ = 1, 200 do
        local _, c = b:state(now)
        assert.equal(3, c.open_until - now)
        now = c.open_until
        b:allow(now)
        b:record(now, false, true)
      end
      local big = core.breaker { consecutive = 1, window = 0, open_for = 1, growth = 10, open_max = 30 }
      now = 0
      big:record(now, false)
      for _ = 1, 400 do -- 10^399 overflows to infinity: still the cap
        local _, c = big:state(now)
        now = c.open_until
        big:allow(now)
        big:record(now, false, true)
      end
      local _, c = big:state(now)
      assert.equal(30, c.open_until - now)
    end)
  end)

  describe("config", function()
    it("accepts partial tables, adjusting the dependent defaults", function()
      assert.equal("allow", core.breaker({ window = 5 }):allow(0))    -- min_calls 5
      assert.equal("allow", core.breaker({ open_for = 100 }):allow(0)) -- open_max 100
      assert.equal("allow", core.breaker({}):allow(0))
    end)

    local bad = {
      { { consecutive = -1 }, "breaker: config.consecutive must be an integer >= 0" },
      { { consecutive = 1.5 }, "breaker: config.consecutive must be an integer" },
      { { ratio = 0 }, "breaker: config.ratio must be a number in (0, 1]" },
      { { ratio = 1.5 }, "breaker: config.ratio must be a number in (0, 1]" },
      { { ratio = 0 / 0 }, "breaker: config.ratio must be a number in (0, 1]" },
      { { ratio = "half" }, "breaker: config.ratio must be a number" },
      { { window = 2000 }, "breaker: config.window must be an integer in [0, 1024]" },
      { { window = -1 }, "breaker: config.window must be an integer in [0, 1024]" },
      { { min_calls = 0 }, "breaker: config.min_calls must be an integer in [1, window]" },
      { { window = 5, min_calls = 6 }, "breaker: config.min_calls must be an integer in [1, window]" },
      { { open_for = 0 }, "breaker: config.open_for must be a finite number > 0" },
      { { open_for = math.huge }, "breaker: config.open_for must be a finite number > 0" },
      { { open_for = 10, open_max = 5 }, "breaker: config.open_max must be a finite number >= open_for" },
      { { growth = 0.5 }, "breaker: config.growth must be a finite number >= 1" },
      { { probe_timeout = 0 }, "breaker: config.probe_timeout must be a finite number > 0" },
      { { consecutve = 3 }, "breaker: unknown config field 'consecutve'" },
    }
    for _, c in ipairs(bad) do
      it("rejects " .. c[2]:match("config[%.%s]?(.*)"), function()
        assert.has_error(function() core.breaker(c[1]) end, c[2])
      end)
    end

    it("raises on wrong arguments", function()
      assert.has_error(function() core.breaker("x") end)
      local b = core.breaker()
      assert.has_error(function() b:allow() end)
      assert.has_error(function() b:allow(0 / 0) end)
      assert.has_error(function() b:record(0) end)
      assert.has_error(function() b.allow(core.retry_budget(), 0) end)
    end)
  end)
end)
