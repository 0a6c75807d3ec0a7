-- The fault spec language of the mock provider: parsing, errors, selection
-- per request, seeded probabilities, and the help text that documents it.
local faults = require "luagent.mock.faults"
local help = require "luagent.mock.help"
local errors = require "luagent.base.errors"

-- Parses a spec that must be valid and returns its single fault.
local function one(spec)
  local list, err = faults.parse(spec)
  assert(list, err and err.message)
  assert.equal(1, #list)
  return list[1]
end

-- The error a spec that must be invalid gives.
local function failure(spec)
  local list, err = faults.parse(spec)
  assert.is_nil(list)
  assert.is_true(errors.is(err))
  assert.equal("usage", err.kind)
  return err
end

describe("faults.parse", function()
  it("reads a status fault with its scope", function()
    local f = one("503@1")
    assert.equal("status", f.kind)
    assert.equal(503, f.status)
    assert.same({ kind = "range", from = 1, to = 1 }, f.scope)
  end)

  it("reads header arguments of status faults", function()
    assert.same({ ["retry-after"] = 2 }, one("429:retry-after=2@1-2").args)
    assert.same({ ["retry-after"] = 0.5 }, one("429:retry-after=0.5").args)
    assert.same({ ["retry-after-ms"] = 1500 }, one("429:retry-after-ms=1500").args)
    assert.same({ ["retry-after-date"] = 5 }, one("429:retry-after-date=+5").args)
    assert.same({ ["x-should-retry"] = false }, one("500:x-should-retry=false").args)
    assert.same({ ["x-should-retry"] = true, ["retry-after"] = 1 },
      one("503:x-should-retry=true:retry-after=1").args)
  end)

  it("reads the overflow and in-flight flags on the statuses they fit", function()
    assert.same({ overflow = true }, one("400:overflow").args)
    assert.same({ overflow = true }, one("413:overflow").args)
    assert.same({ ["in-flight"] = true }, one("402:in-flight@1").args)
    assert.same({}, one("402").args)
  end)

  it("takes any status from 400 to 599", function()
    assert.equal(418, one("418").status)
    assert.equal(599, one("599").status)
    assert.equal("unknown fault '399' in --faults '399'", failure("399").message)
    assert.equal("unknown fault '600' in --faults '600'", failure("600").message)
  end)

  it("reads connection faults with their defaults", function()
    assert.equal("close", one("close@1").kind)
    assert.same({ bytes = 200 }, one("reset:bytes=200@2").args)
    assert.same({ bytes = 0 }, one("reset").args)
    assert.same({ secs = 30 }, one("stall").args)
    assert.same({ secs = 2.5, after = 200 }, one("stall:secs=2.5:after=200").args)
  end)

  it("reads stream faults", function()
    assert.same({ type = "overloaded_error", after = 1 }, one("stream-error").args)
    assert.same({ type = "no_capacity", after = 0 }, one("stream-error:no_capacity:after=0").args)
    assert.same({ type = "rate_limit_error", after = 1 },
      one("stream-error:type=rate_limit_error").args)
    assert.same({}, one("cut").args)
    assert.same({ finished = true }, one("cut:finished").args)
    assert.equal("bad-json", one("bad-json").kind)
    assert.equal("empty", one("empty").kind)
    assert.equal("leak", one("leak").kind)
  end)

  it("reads every scope form, and no scope as every request", function()
    assert.same({ kind = "all" }, one("503").scope)
    assert.same({ kind = "range", from = 2, to = 5 }, one("503@2-5").scope)
    assert.same({ kind = "every", k = 3 }, one("503@every:3").scope)
    assert.same({ kind = "p", p = 0.3 }, one("503@p:0.3").scope)
    assert.same({ kind = "p", p = 1 }, one("503@p:1").scope)
  end)

  it("splits on commas and semicolons and ignores blanks", function()
    local list = assert(faults.parse(" 503@1 ; 429@2,, cut@3 ,"))
    assert.equal(3, #list)
    assert.equal(503, list[1].status)
    assert.equal(429, list[2].status)
    assert.equal("cut", list[3].kind)
    assert.equal("cut@3", list[3].text)
    assert.same({}, faults.parse(""))
    assert.same({}, faults.parse(nil))
  end)

  it("names an unknown fault and the whole spec", function()
    local err = failure("503@1,frob")
    assert.equal("unknown fault 'frob' in --faults '503@1,frob'", err.message)
    assert.equal("frob", err.fault)
  end)

  it("names an unknown or malformed argument", function()
    assert.equal("unknown argument 'bytes' for fault '503' in --faults '503:bytes=3'",
      failure("503:bytes=3").message)
    assert.equal("unknown argument 'finshed' for fault 'cut' in --faults 'cut:finshed'",
      failure("cut:finshed").message)
    assert.equal("bad argument 'bytes=ten' for fault 'reset' (expected bytes=<a whole number>)"
      .. " in --faults 'reset:bytes=ten'", failure("reset:bytes=ten").message)
    assert.matches("bad argument 'x%-should%-retry=maybe'", failure("500:x-should-retry=maybe").message)
    assert.matches("bad argument 'retry%-after=%-1'", failure("429:retry-after=-1").message)
    assert.equal("argument 'overflow' does not apply to fault '503' in --faults '503:overflow'",
      failure("503:overflow").message)
    assert.matches("argument 'in%-flight' does not apply", failure("429:in-flight").message)
  end)

  it("names a bad scope", function()
    for _, scope in ipairs({ "0", "3-1", "p:1.5", "every:0", "x", "", "1@2", "-2" }) do
      local err = failure("503@" .. scope)
      assert.equal("bad scope '@" .. scope .. "' for fault '503' (expected @N, @N-M, "
        .. "@every:K or @p:X with X in 0..1) in --faults '503@" .. scope .. "'", err.message)
    end
  end)
end)

describe("faults.pick", function()
  it("applies each scope to the right requests", function()
    local list = assert(faults.parse("503@2-3,429@every:4"))
    local got = {}
    for n = 1, 9 do
      local f = faults.pick(list, n)
      got[n] = f and f.status or 0
    end
    assert.same({ 0, 503, 503, 429, 0, 0, 0, 429, 0 }, got)
  end)

  it("takes the first matching fault in spec order", function()
    local list = assert(faults.parse("close@1,503,429@1"))
    assert.equal("close", faults.pick(list, 1).kind)
    assert.equal(503, faults.pick(list, 2).status)
    assert.is_nil(faults.pick({}, 1))
  end)

  it("makes @p: deterministic per seed and close to its probability", function()
    local list = assert(faults.parse("503@p:0.3"))
    local function run(seed)
      local rng, hits = faults.rng(seed), {}
      for n = 1, 10000 do hits[n] = faults.pick(list, n, rng) ~= nil end
      return hits
    end
    local a, b, c = run(7), run(7), run(8)
    assert.same(a, b)
    assert.are_not.same(a, c)
    local count = 0
    for _, hit in ipairs(a) do if hit then count = count + 1 end end
    assert.is_true(count > 2800 and count < 3200, "hits: " .. count)
  end)

  it("decides @p: by request number, not by call order", function()
    local list = assert(faults.parse("503@p:0.5"))
    local rng = faults.rng(3)
    local forward = {}
    for n = 1, 50 do forward[n] = faults.pick(list, n, rng) ~= nil end
    for n = 50, 1, -1 do assert.equal(forward[n], faults.pick(list, n, rng) ~= nil) end
  end)

  it("never picks @p:0 and always picks @p:1", function()
    local never, always = assert(faults.parse("503@p:0")), assert(faults.parse("503@p:1"))
    local rng = faults.rng(1)
    for n = 1, 1000 do
      assert.is_nil(faults.pick(never, n, rng))
      assert.is_not_nil(faults.pick(always, n, rng))
    end
  end)
end)

describe("faults.rng", function()
  it("draws a seeded sequence in [0, 1)", function()
    local a, b = faults.rng(42), faults.rng(42)
    local seen = {}
    for _ = 1, 1000 do
      local x = a:next()
      assert.equal(x, b:next())
      assert.is_true(x >= 0 and x < 1)
      seen[x] = true
    end
    local distinct = 0
    for _ in pairs(seen) do distinct = distinct + 1 end
    assert.equal(1000, distinct)
  end)
end)

describe("luagent help faults", function()
  -- Every example in the help, parsed.
  local examples = {}
  for _, section in ipairs(help.sections) do
    for _, entry in ipairs(section.entries) do examples[#examples + 1] = entry[1] end
  end

  it("has examples that all parse, and shows each of them", function()
    assert.is_true(#examples > 10)
    for _, ex in ipairs(examples) do
      local list, err = faults.parse(ex)
      assert(list, ex .. ": " .. tostring(err))
      assert.truthy(help.faults:find("  " .. ex, 1, true), ex)
    end
  end)

  it("gives every fault, argument and flag an example", function()
    local kinds, statuses, words = {}, {}, {}
    for _, ex in ipairs(examples) do
      local f = faults.parse(ex)[1]
      kinds[f.kind] = true
      if f.status then statuses[f.status] = true end
      for part in ex:gmatch("[^:@]+") do words[part:match("^([^=]+)")] = true end
    end
    for kind, def in pairs(faults.kinds) do
      assert.is_true(kinds[kind] == true, "no example for " .. kind)
      for key in pairs(def.args or {}) do
        if key ~= def.word then assert.is_true(words[key] == true, "no example for " .. key) end
      end
      for flag in pairs(def.flags or {}) do
        assert.is_true(words[flag] == true, "no example for " .. flag)
      end
    end
    for _, status in ipairs({ 400, 401, 402, 429, 500, 502, 503, 504, 529 }) do
      assert.is_true(statuses[status] == true, "no example for " .. status)
    end
    for _, scope in ipairs({ "@1", "@1-2", "@every:3", "@p:0.3" }) do
      assert.truthy(help.faults:find(scope, 1, true), scope)
    end
  end)

  it("fits in 80 columns", function()
    for _, text in ipairs({ help.faults, help.mock }) do
      for line in text:gmatch("[^\n]*") do assert.is_true(#line <= 80, line) end
    end
  end)
end)
