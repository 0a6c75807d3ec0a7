-- The retry budget in C (host/budget.c through host/guard_lua.c), after
-- gRPC's retry throttling: exact token values after sequences (thousandths,
-- so ten successes of 0.1 make exactly 1), the half threshold, clamping.
local core = require "luagent.core"

-- Calls method `m` of `r` n times; returns the results as a list.
local function times(r, m, n)
  local out = {}
  for i = 1, n do out[i] = r[m](r) end
  return out
end

describe("retry_budget", function()
  it("starts full with the defaults max 10, ratio 0.1", function()
    local r = core.retry_budget()
    assert.same({ 10, 10 }, { r:tokens() })
    assert.is_true(r:allow_retry())
    r:failure()
    r:success()
    assert.equal(9.1, r:tokens())
  end)

  it("costs one token per failure and earns ratio per success, exactly", function()
    local r = core.retry_budget { max = 10, ratio = 0.1 }
    times(r, "failure", 3)
    assert.equal(7, r:tokens())
    times(r, "success", 7)
    assert.equal(7.7, r:tokens())
    r:failure()
    assert.equal(6.7, r:tokens())
    times(r, "success", 33)
    assert.equal(10, r:tokens())
  end)

  it("allows retries only while tokens > max / 2", function()
    local r = core.retry_budget { max = 10, ratio = 0.1 }
    -- The fifth failure leaves 5 = max / 2: retries stop, and it says so.
    assert.same({ false, false, false, false, true }, times(r, "failure", 5))
    assert.equal(5, r:tokens())
    assert.is_false(r:allow_retry())
    -- One success: 5.1 > 5, retries resume, and it says so.
    assert.is_true(r:success())
    assert.equal(5.1, r:tokens())
    assert.is_true(r:allow_retry())
    assert.is_false(r:success())
  end)

  it("needs exactly ten successes of 0.1 to earn one token back", function()
    local r = core.retry_budget { max = 10, ratio = 0.1 }
    times(r, "failure", 10)
    assert.equal(0, r:tokens())
    local crossed = times(r, "success", 51)
    assert.equal(5.1, r:tokens())
    for i = 1, 50 do assert.is_false(crossed[i], "success " .. i) end
    assert.is_true(crossed[51]) -- 5.0 -> 5.1
    local r2 = core.retry_budget { max = 10, ratio = 0.1 }
    times(r2, "failure", 10)
    times(r2, "success", 10)
    assert.equal(1, r2:tokens())
  end)

  it("clamps at 0 and at max", function()
    local r = core.retry_budget { max = 10, ratio = 0.1 }
    times(r, "failure", 25)
    assert.equal(0, r:tokens())
    r:success()
    assert.equal(0.1, r:tokens())
    local full = core.retry_budget { max = 10, ratio = 0.1 }
    times(full, "success", 5)
    assert.equal(10, full:tokens())
    local big = core.retry_budget { max = 3, ratio = 2.5 }
    big:failure()
    big:success()
    assert.equal(3, big:tokens())
  end)

  it("compares against an odd maximum's half without rounding", function()
    local r = core.retry_budget { max = 3, ratio = 0.5 }
    r:failure()
    assert.equal(2, r:tokens())
    assert.is_true(r:allow_retry())
    assert.is_true(r:failure()) -- 1 <= 1.5
    r:success()
    assert.equal(1.5, r:tokens())
    assert.is_false(r:allow_retry()) -- 1.5 is not > 1.5
    assert.is_true(r:success())
    assert.is_true(r:allow_retry())
  end)

  it("rounds max and ratio to thousandths, as gRPC keeps them", function()
    local r = core.retry_budget { max = 10, ratio = 0.1234 }
    r:failure()
    r:success()
    assert.equal(9.123, r:tokens())
    local s = core.retry_budget { max = 10, ratio = 0.0006 }
    s:failure()
    s:success()
    assert.equal(9.001, s:tokens())
  end)

  local bad = {
    { { max = 0 }, "retry_budget: config.max must be a number in (0, 1000000], at least 0.001" },
    { { max = -1 }, "retry_budget: config.max must be a number in (0, 1000000], at least 0.001" },
    { { max = 2e6 }, "retry_budget: config.max must be a number in (0, 1000000], at least 0.001" },
    { { max = 0.0001 }, "retry_budget: config.max must be a number in (0, 1000000], at least 0.001" },
    { { max = 0 / 0 }, "retry_budget: config.max must be a number in (0, 1000000], at least 0.001" },
    { { max = "ten" }, "retry_budget: config.max must be a number" },
    { { ratio = 0 }, "retry_budget: config.ratio must be a number in [0.001, max]" },
    { { ratio = 0.0004 }, "retry_budget: config.ratio must be a number in [0.001, max]" },
    { { max = 2, ratio = 3 }, "retry_budget: config.ratio must be a number in [0.001, max]" },
    { { tokens = 3 }, "retry_budget: unknown config field 'tokens'" },
  }
  for _, c in ipairs(bad) do
    it("rejects " .. c[2]:match("config[%.%s]?(.*)") .. " (" .. tostring(next(c[1])) .. ")", function()
      assert.has_error(function() core.retry_budget(c[1]) end, c[2])
    end)
  end

  it("raises on wrong arguments", function()
    assert.has_error(function() core.retry_budget(10) end)
    local r = core.retry_budget()
    assert.has_error(function() r.failure(core.breaker()) end)
  end)
end)
