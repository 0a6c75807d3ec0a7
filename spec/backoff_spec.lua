-- The retry arithmetic in C (host/backoff.c through host/backoff_lua.c):
-- delays per strategy, the seeded generator, the server-wait rule and
-- Retry-After parsing.
local core = require "luagent.core"

local EPS = 1e-12

-- Exact delays with a fixed U: {strategy, params, retry n, U, expected, prev}.
local exact = {
  -- yoagent: min(1 * 2^(n-1), 30), then +-20 %.
  { "exponential", { base = 1, max = 30, multiplier = 2, jitter = 0.2 }, 1, 0, 0.8 },
  { "exponential", { base = 1, max = 30, multiplier = 2, jitter = 0.2 }, 1, 0.5, 1 },
  { "exponential", { base = 1, max = 30, multiplier = 2, jitter = 0.2 }, 1, 1, 1.2 },
  { "exponential", { base = 1, max = 30, multiplier = 2, jitter = 0.2 }, 3, 0.5, 4 },
  { "exponential", { base = 1, max = 30, multiplier = 2, jitter = 0.2 }, 6, 0.5, 30 },
  { "exponential", { base = 1, max = 30, multiplier = 2, jitter = 0.2 }, 6, 1, 36 },
  { "exponential", { base = 2, max = 100, multiplier = 3, jitter = 0 }, 3, 0.9, 18 },
  -- The book: U * min(1 * 2^(n-1), 30).
  { "full_jitter", { base = 1, max = 30 }, 1, 0.5, 0.5 },
  { "full_jitter", { base = 1, max = 30 }, 4, 0.5, 4 },
  { "full_jitter", { base = 1, max = 30 }, 5, 1, 16 },
  { "full_jitter", { base = 1, max = 30 }, 6, 1, 30 },
  { "full_jitter", { base = 1, max = 30 }, 100, 0.25, 7.5 },
  { "full_jitter", { base = 1, max = 30 }, math.maxinteger, 0.5, 15 },
  { "full_jitter", { base = 1, max = 30 }, 3, 0, 0 },
  -- c/2 + U * c/2.
  { "equal_jitter", { base = 1, max = 30 }, 1, 0, 0.5 },
  { "equal_jitter", { base = 1, max = 30 }, 1, 1, 1 },
  { "equal_jitter", { base = 1, max = 30 }, 3, 0.5, 3 },
  { "equal_jitter", { base = 1, max = 30 }, 10, 0, 15 },
  -- AWS: min(30, base + U * (3 * prev - base)), prev = base at first.
  { "decorrelated_jitter", { base = 1, max = 30 }, 1, 0, 1 },
  { "decorrelated_jitter", { base = 1, max = 30 }, 1, 1, 3 },
  { "decorrelated_jitter", { base = 1, max = 30 }, 2, 0.5, 8, 5 },
  { "decorrelated_jitter", { base = 1, max = 30 }, 3, 1, 30, 20 },
  -- axon: min(2^n, 60), no jitter: U does not matter.
  { "power_of_two", { base = 1, max = 60 }, 1, 0.7, 2 },
  { "power_of_two", { base = 1, max = 60 }, 2, 0.1, 4 },
  { "power_of_two", { base = 1, max = 60 }, 5, 0.9, 32 },
  { "power_of_two", { base = 1, max = 60 }, 6, 0, 60 },
  { "power_of_two", { base = 1, max = 60 }, 1000, 0, 60 },
  -- fixed.
  { "fixed", { base = 2.5 }, 1, 0.3, 2.5 },
  { "fixed", { base = 2.5 }, 40, 0.9, 2.5 },
  -- The SDKs: min(0.5 * 2^(n-1), 8) * (1 - 0.25 U).
  { "sdk", { base = 0.5, max = 8, jitter = 0.25 }, 1, 0, 0.5 },
  { "sdk", { base = 0.5, max = 8, jitter = 0.25 }, 1, 1, 0.375 },
  { "sdk", { base = 0.5, max = 8, jitter = 0.25 }, 2, 0, 1 },
  { "sdk", { base = 0.5, max = 8, jitter = 0.25 }, 5, 0, 8 },
  { "sdk", { base = 0.5, max = 8, jitter = 0.25 }, 6, 0.5, 7 },
}

-- Bands with a seeded generator: {strategy, params, n, low, high}.
local bands = {
  { "exponential", { base = 1, max = 30, multiplier = 2, jitter = 0.2 }, 3, 3.2, 4.8 },
  { "full_jitter", { base = 1, max = 30 }, 4, 0, 8 },
  { "equal_jitter", { base = 1, max = 30 }, 4, 4, 8 },
  { "decorrelated_jitter", { base = 1, max = 30 }, 1, 1, 3 },
  { "sdk", { base = 0.5, max = 8, jitter = 0.25 }, 2, 0.75, 1 },
}

describe("backoff_delay", function()
  for _, c in ipairs(exact) do
    local strategy, params, n, u, want, prev = table.unpack(c)
    it(("%s retry %d, U=%g -> %g s"):format(strategy, n, u, want), function()
      local got = core.backoff_delay(strategy, n, params, u, prev)
      assert.is_true(math.abs(got - want) < EPS, ("got %.17g, want %g"):format(got, want))
    end)
  end

  for _, c in ipairs(bands) do
    local strategy, params, n, low, high = table.unpack(c)
    it(("%s retry %d stays in [%g, %g] and spreads over it"):format(strategy, n, low, high), function()
      local rng = core.backoff_rng(42)
      local min, max = math.huge, -math.huge
      for _ = 1, 2000 do
        local d = core.backoff_delay(strategy, n, params, rng)
        min, max = math.min(min, d), math.max(max, d)
      end
      local width = high - low
      assert.is_true(min >= low and max <= high, ("range [%g, %g]"):format(min, max))
      assert.is_true(min < low + width / 10 and max > high - width / 10,
        ("range [%g, %g] does not spread"):format(min, max))
    end)
  end

  it("uses the documented parameter defaults (base 1, max 30, multiplier 2)", function()
    assert.equal(4, core.backoff_delay("exponential", 3, nil, 0.5))
    assert.equal(30, core.backoff_delay("full_jitter", 99, {}, 1))
  end)

  it("raises on misuse, naming the argument", function()
    assert.has_error(function() core.backoff_delay("fibonacci", 1, {}, 0.5) end)
    assert.has_error(function() core.backoff_delay("fixed", 0, {}, 0.5) end)
    assert.has_error(function() core.backoff_delay("fixed", 1, {}, 1.5) end)
    assert.has_error(function() core.backoff_delay("fixed", 1, {}, "x") end)
    assert.has_error(function() core.backoff_delay("fixed", 1, { base = -1 }, 0.5) end,
      "backoff_delay: params.base must be a finite number >= 0")
    assert.has_error(function() core.backoff_delay("fixed", 1, { max = 0 / 0 }, 0.5) end)
    assert.has_error(function() core.backoff_delay("fixed", 1, { max = math.huge }, 0.5) end)
  end)
end)

describe("backoff_rng", function()
  it("gives the same sequence for the same seed, another for another", function()
    local a, b, c = core.backoff_rng(7), core.backoff_rng(7), core.backoff_rng(8)
    local differs = false
    for _ = 1, 100 do
      local x, y, z = a:next(), b:next(), c:next()
      assert.equal(x, y)
      differs = differs or x ~= z
    end
    assert.is_true(differs)
  end)

  it("draws from [0, 1) with a mean near 1/2, seed 0 included", function()
    local r = core.backoff_rng(0)
    local sum, n = 0, 10000
    for _ = 1, n do
      local x = r:next()
      assert.is_true(x >= 0 and x < 1)
      sum = sum + x
    end
    assert.is_true(math.abs(sum / n - 0.5) < 0.02, "mean " .. sum / n)
  end)

  it("is accepted wherever U is", function()
    local r1, r2 = core.backoff_rng(3), core.backoff_rng(3)
    local u = r2:next()
    assert.equal(8 * u, core.backoff_delay("full_jitter", 4, { base = 1, max = 30 }, r1))
  end)

  it("needs an integer seed", function()
    assert.has_error(function() core.backoff_rng("seed") end)
    assert.has_error(function() core.backoff_rng(1.5) end)
  end)
end)

describe("backoff_server_wait", function()
  local give_up = { max_wait = 60, jitter = 1, over_max = "give_up" }

  it("waits what the server asked plus up to `jitter` seconds", function()
    assert.equal(5, core.backoff_server_wait(5, give_up, 0))
    assert.equal(5.5, core.backoff_server_wait(5, give_up, 0.5))
    assert.equal(6, core.backoff_server_wait(5, give_up, 1))
    assert.equal(0, core.backoff_server_wait(0, { jitter = 0 }, 0.9))
  end)

  it("never waits longer than max_wait", function()
    assert.equal(60, core.backoff_server_wait(59.8, give_up, 1))
    assert.equal(60, core.backoff_server_wait(60, give_up, 0.5))
  end)

  it("gives up, caps or falls back to the backoff when asked for more", function()
    assert.same({ nil, "give_up" }, { core.backoff_server_wait(600, give_up, 0.5) })
    assert.equal(60, core.backoff_server_wait(600, { max_wait = 60, over_max = "cap" }, 0.5))
    assert.same({ nil, "backoff" },
      { core.backoff_server_wait(600, { max_wait = 60, over_max = "backoff" }, 0.5) })
  end)

  it("has no limit when max_wait is nil, false or math.huge", function()
    assert.equal(600, core.backoff_server_wait(600, nil, 0))
    assert.equal(600, core.backoff_server_wait(600, { max_wait = false }, 0))
    assert.equal(600, core.backoff_server_wait(600, { max_wait = math.huge }, 0))
  end)

  it("ignores a negative or NaN request", function()
    assert.same({ nil, "backoff" }, { core.backoff_server_wait(-1, give_up, 0) })
    assert.same({ nil, "backoff" }, { core.backoff_server_wait(0 / 0, give_up, 0) })
  end)

  it("raises on a bad over_max", function()
    assert.has_error(function() core.backoff_server_wait(1, { over_max = "wait" }, 0) end,
      "backoff_server_wait: params.over_max: invalid value 'wait'")
  end)
end)

describe("parse_retry_after", function()
  local IMF_EPOCH = 784111777 -- Sun, 06 Nov 1994 08:49:37 GMT

  -- {headers, now, expected seconds or nil, what}
  local cases = {
    { { ["retry-after"] = "5" }, nil, 5, "whole seconds" },
    { { ["retry-after"] = "1.5" }, nil, 1.5, "fractional seconds" },
    { { ["retry-after"] = "0.3" }, nil, 0.3, "exact decimal" },
    { { ["retry-after"] = " 2\t" }, nil, 2, "surrounding whitespace" },
    { { ["retry-after"] = "0" }, nil, 0, "zero" },
    { { ["retry-after"] = "007" }, nil, 7, "leading zeros" },
    { { ["retry-after"] = "-1" }, nil, nil, "negative" },
    { { ["retry-after"] = "+5" }, nil, nil, "a sign" },
    { { ["retry-after"] = "" }, nil, nil, "empty" },
    { { ["retry-after"] = "." }, nil, nil, "a lone dot" },
    { { ["retry-after"] = "soon" }, nil, nil, "garbage" },
    { { ["retry-after"] = "5s" }, nil, nil, "a unit" },
    { { ["retry-after"] = "1 2" }, nil, nil, "two numbers" },
    { { ["retry-after"] = "1e3" }, nil, nil, "an exponent" },
    { { ["retry-after"] = "0x10" }, nil, nil, "hex" },
    { { ["retry-after"] = "inf" }, nil, nil, "inf" },
    { { ["retry-after"] = "nan" }, nil, nil, "nan" },
    { { ["retry-after"] = "1" .. ("0"):rep(400) }, nil, nil, "overflow" },
    { { ["retry-after"] = "1000000001" }, nil, nil, "over the 1e9 s limit" },
    { { ["retry-after"] = 5 }, nil, nil, "not a string" },
    { {}, nil, nil, "no header" },
    { { ["retry-after-ms"] = "1500" }, nil, 1.5, "milliseconds" },
    { { ["retry-after-ms"] = "250.5" }, nil, 0.2505, "fractional milliseconds" },
    { { ["retry-after-ms"] = "100", ["retry-after"] = "5" }, nil, 0.1, "ms before seconds" },
    { { ["retry-after-ms"] = "x", ["retry-after"] = "5" }, nil, 5, "garbage ms falls back" },
    { { ["retry-after-ms"] = "-3", ["retry-after"] = "5" }, nil, 5, "negative ms falls back" },
    { { ["retry-after"] = "Sun, 06 Nov 1994 08:49:37 GMT" }, IMF_EPOCH - 30, 30, "IMF-fixdate" },
    { { ["retry-after"] = "Sunday, 06-Nov-94 08:49:37 GMT" }, IMF_EPOCH - 30, 30, "RFC 850" },
    { { ["retry-after"] = "Sun Nov  6 08:49:37 1994" }, IMF_EPOCH - 30, 30, "asctime" },
    { { ["retry-after"] = "Sun, 06 Nov 1994 08:49:37 GMT" }, IMF_EPOCH, 0, "a date now" },
    { { ["retry-after"] = "Sun, 06 Nov 1994 08:49:37 GMT" }, IMF_EPOCH + 1, nil, "a past date" },
    { { ["retry-after"] = "Thu, 29 Feb 2024 00:00:00 GMT" }, 1709164800 - 10, 10, "a leap day" },
    { { ["retry-after"] = "Wed, 29 Feb 2023 00:00:00 GMT" }, 0, nil, "no leap day in 2023" },
    { { ["retry-after"] = "Sun, 31 Nov 1994 08:49:37 GMT" }, 0, nil, "31 November" },
    { { ["retry-after"] = "Sun, 06 Nov 1994 24:00:00 GMT" }, 0, nil, "hour 24" },
    { { ["retry-after"] = "Sun, 06 Nov 1994 08:49:37 UTC" }, 0, nil, "not GMT" },
    { { ["retry-after"] = "Sun, 06 Nov 1994 08:49:37 GMT x" }, 0, nil, "trailing text" },
    { { ["retry-after"] = "Sun, 06 Nov 94 08:49:37 GMT" }, 0, nil, "two-digit IMF year" },
    { { ["retry-after"] = "Fri, 01 Jan 2100 00:00:00 GMT" }, 4102444800 - 1, 1, "after 2038" },
    { { ["retry-after"] = "Sun, 06 Nov 1994 08:49:37 GMT" }, 0 / 0, nil, "now is NaN" },
  }

  for _, c in ipairs(cases) do
    local headers, now, want, what = table.unpack(c, 1, 4)
    it(what .. " -> " .. tostring(want), function()
      local got = core.parse_retry_after(headers, now)
      if want == nil then
        assert.is_nil(got)
      else
        assert.equal(want, got)
      end
    end)
  end

  it("reads HTTP-dates against the wall clock by default", function()
    local date = os.date("!%a, %d %b %Y %H:%M:%S GMT", os.time() + 3600)
    local got = core.parse_retry_after({ ["retry-after"] = date })
    assert.is_true(got > 3590 and got <= 3600, tostring(got))
  end)

  it("needs a headers table", function()
    assert.has_error(function() core.parse_retry_after("5") end)
  end)
end)
