-- Policies (lua/luagent/model/policy.lua and policies/*.lua): loading, checking,
-- defaults, each bundled policy's delays, broken files, and reloading.
local policies = require "luagent.model.policy"
local luagent = require "luagent"
local core = require "luagent.core"

local FIX = "spec/fixtures/policies/"

local function load(name)
  return assert(policies.load("policies/" .. name .. ".lua"))
end

-- Delays for retries 1..max_retries with a fixed U and no server wait.
local function delays(p, u)
  local out = {}
  for n = 1, p.max_retries do out[n] = (policies.delay(p, n, nil, u)) end
  return out
end

local function near(want, got)
  assert.equal(#want, #got)
  for i = 1, #want do
    assert.is_true(math.abs(want[i] - got[i]) < 1e-9, ("retry %d: got %.17g, want %g"):format(i, got[i], want[i]))
  end
end

local function write(path, text)
  local f = assert(io.open(path, "wb"))
  f:write(text)
  f:close()
end

describe("bundled policies", function()
  -- {name, max_retries, delays at U=0, U=0.5, U=1}
  local bundled = {
    { "default", 5, { 0, 0, 0, 0, 0 }, { 0.5, 1, 2, 4, 8 }, { 1, 2, 4, 8, 16 } },
    { "full_jitter", 5, { 0, 0, 0, 0, 0 }, { 0.5, 1, 2, 4, 8 }, { 1, 2, 4, 8, 16 } },
    { "yoagent", 3, { 0.8, 1.6, 3.2 }, { 1, 2, 4 }, { 1.2, 2.4, 4.8 } },
    { "axon", 9, { 2, 4, 8, 16, 32, 60, 60, 60, 60 }, { 2, 4, 8, 16, 32, 60, 60, 60, 60 },
      { 2, 4, 8, 16, 32, 60, 60, 60, 60 } },
    { "sdk", 2, { 0.5, 1 }, { 0.4375, 0.875 }, { 0.375, 0.75 } },
    { "patient", 12, { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0 },
      { 1, 2, 4, 8, 16, 32, 64, 128, 150, 150, 150, 150 },
      { 2, 4, 8, 16, 32, 64, 128, 256, 300, 300, 300, 300 } },
  }
  for _, b in ipairs(bundled) do
    local name, retries, d0, dhalf, d1 = table.unpack(b)
    it(name .. ": " .. retries .. " retries with the documented delays", function()
      local p = load(name)
      assert.equal(name, p.name)
      assert.equal(retries, p.max_retries)
      near(d0, delays(p, 0))
      near(dhalf, delays(p, 0.5))
      near(d1, delays(p, 1))
    end)
  end

  it("the same seed gives the same delays, and they stay in band", function()
    local p = load("default")
    local a, b = core.backoff_rng(11), core.backoff_rng(11)
    for n = 1, p.max_retries do
      local x, y = policies.delay(p, n, nil, a), policies.delay(p, n, nil, b)
      assert.equal(x, y)
      assert.is_true(x >= 0 and x <= 2 ^ (n - 1), tostring(x))
    end
  end)

  it("default.lua spells out the built-in defaults", function()
    local file = load("default")
    local builtin = assert(policies.new({}))
    for _, k in ipairs { "max_retries", "backoff", "retry_after", "attempt_timeout", "idle_timeout",
                         "total_deadline", "retry_statuses", "honor_x_should_retry", "unusable_retries",
                         "breaker", "budget", "cooldown" } do
      assert.same(builtin[k], file[k], k)
    end
  end)

  it("yoagent, axon and sdk share no protection: those systems have none", function()
    for _, name in ipairs { "yoagent", "axon", "sdk" } do
      local p = load(name)
      assert.is_false(p.breaker, name)
      assert.is_false(p.budget, name)
      assert.is_false(p.cooldown, name)
    end
  end)

  it("default and patient size their breaker and budget for all of a lone call's attempts", function()
    for _, name in ipairs { "default", "patient" } do
      local p = load(name)
      local attempts = p.max_retries + 1
      local b = core.breaker(p.breaker)
      for i = 1, attempts do
        assert.is_truthy(b:allow(i), name .. ": the breaker refused attempt " .. i)
        if i < attempts then b:record(i, false) end
      end
      local budget = core.retry_budget(p.budget)
      for i = 1, attempts - 1 do
        budget:failure()
        assert.is_true(budget:allow_retry(), name .. ": the budget refused retry " .. i)
      end
    end
  end)

  it("each says what it is", function()
    for _, name in ipairs { "default", "yoagent", "axon", "sdk", "full_jitter", "patient" } do
      assert.is_string(load(name).description, name)
    end
  end)
end)

describe("policy.delay and the server's wait", function()
  it("gives up with both numbers when the server asks too much (default)", function()
    local wait, msg = policies.delay(load("default"), 1, 600, 0.5)
    assert.is_nil(wait)
    assert.equal("server asked for 600 s; policy waits at most 60 s", msg)
  end)

  it("uses the server's wait plus jitter when it is short enough", function()
    assert.same({ 5.5, "server" }, { policies.delay(load("default"), 1, 5, 0.5) })
  end)

  it("yoagent caps the server's wait at 30 s, without jitter", function()
    assert.same({ 30, "server" }, { policies.delay(load("yoagent"), 1, 600, 0.5) })
    assert.same({ 5, "server" }, { policies.delay(load("yoagent"), 1, 5, 0.9) })
  end)

  it("the sdk ignores a wait over 60 s and backs off instead", function()
    assert.same({ 0.5, "backoff" }, { policies.delay(load("sdk"), 1, 600, 0) })
    assert.same({ 20, "server" }, { policies.delay(load("sdk"), 1, 20, 0.7) })
  end)

  it("axon does not read Retry-After", function()
    assert.same({ 2, "backoff" }, { policies.delay(load("axon"), 1, 5, 0.5) })
  end)

  it("patient waits out an hour", function()
    assert.same({ 3005, "server" }, { policies.delay(load("patient"), 1, 3000, 0.5) })
    assert.same({ 3600, "server" }, { policies.delay(load("patient"), 1, 3600, 0.5) })
  end)

  it("accepts a plain policy table, and raises on an invalid one", function()
    assert.same({ 4, "backoff" }, { policies.delay({ backoff = { strategy = "fixed", base = 4 } }, 1, nil, 0.5) })
    assert.has_error(function() policies.delay({ retries = 1 }, 1, nil, 0.5) end)
  end)

  it("passes prev to decorrelated jitter", function()
    local p = assert(policies.new { backoff = { strategy = "decorrelated_jitter", base = 1, max = 30 } })
    assert.equal(8, policies.delay(p, 2, nil, 0.5, 5))
  end)
end)

describe("policy.new", function()
  it("fills every default", function()
    local p = assert(policies.new({ max_retries = 2 }, "mine"))
    assert.equal(2, p.max_retries)
    assert.equal("mine", p.name)
    assert.same({ strategy = "full_jitter", base = 1, max = 30, multiplier = 2, jitter = 0 }, p.backoff)
    assert.same({ honor = true, max_wait = 60, jitter = 1, over_max = "give_up" }, p.retry_after)
    assert.same({}, p.classify)
    assert.is_nil(p.retry_statuses)
  end)

  it("fills a strategy's own defaults", function()
    assert.same({ strategy = "sdk", base = 0.5, max = 8, multiplier = 2, jitter = 0.25 },
      assert(policies.new { backoff = { strategy = "sdk" } }).backoff)
    assert.same({ strategy = "exponential", base = 1, max = 30, multiplier = 2, jitter = 0.2 },
      assert(policies.new { backoff = { strategy = "exponential" } }).backoff)
    assert.same({ strategy = "full_jitter", base = 3, max = 30, multiplier = 2, jitter = 0 },
      assert(policies.new { backoff = { base = 3 } }).backoff)
  end)

  it("keeps false for 'none'", function()
    local p = assert(policies.new { total_deadline = false, retry_after = { max_wait = false } })
    assert.is_false(p.total_deadline)
    assert.is_false(p.retry_after.max_wait)
    assert.equal(600, policies.delay(p, 1, 600, 0))
  end)

  it("lays a protection table over default.lua's, and keeps false", function()
    local p = assert(policies.new { breaker = { open_for = 9 }, budget = false })
    assert.same({ consecutive = 10, open_for = 9 }, p.breaker)
    assert.is_false(p.budget)
    assert.same({ max = 20 }, assert(policies.new {}).budget)
  end)

  it("takes a shipped compaction strategy by name for on_context_overflow", function()
    local p = assert(policies.new { on_context_overflow = "drop_oldest" })
    assert.is_function(p.on_context_overflow)
    local shorter = p.on_context_overflow { messages = {
      { role = "user", content = "a" }, { role = "assistant", content = "b" },
      { role = "user", content = "c" }, { role = "assistant", content = "d" },
      { role = "user", content = "e" }, { role = "assistant", content = "f" } } }
    assert.equal(4, #shorter)
    assert.equal("c", shorter[1].content)
  end)

  it("turns one classify function into a list", function()
    local f = function() end
    assert.same({ f }, assert(policies.new { classify = f }).classify)
  end)

  it("returns a policy as is, and does not keep the caller's tables", function()
    local statuses = { 429 }
    local p = assert(policies.new { retry_statuses = statuses })
    assert.equal(p, policies.new(p))
    statuses[2] = 500
    assert.same({ 429 }, p.retry_statuses)
  end)

  -- {what, table, message}
  local bad = {
    { "unknown field", { max_retry = 1 }, "policy table: unknown field 'max_retry'" },
    { "unknown nested field", { retry_after = { wait = 1 } }, "policy table: unknown field 'retry_after.wait'" },
    { "negative retries", { max_retries = -1 }, "max_retries must be a whole number from 0 to 1000 (got -1)" },
    { "fractional retries", { max_retries = 1.5 }, "max_retries must be a whole number from 0 to 1000" },
    { "zero timeout", { attempt_timeout = 0 }, "attempt_timeout must be a number of seconds > 0 (at most 1000000), or false" },
    { "infinite base", { backoff = { base = math.huge } }, "backoff.base must be a number of seconds from 0 to 1000000 (got inf)" },
    { "NaN max", { backoff = { max = 0 / 0 } }, "backoff.max must be a number of seconds from 0 to 1000000" },
    { "jitter over 1", { backoff = { jitter = 2 } }, "backoff.jitter must be a number from 0 to 1" },
    { "unknown strategy", { backoff = { strategy = "linear" } }, "backoff.strategy must be one of" },
    { "over_max", { retry_after = { over_max = "wait" } }, 'retry_after.over_max must be "give_up", "cap" or "backoff"' },
    { "status 600", { retry_statuses = { 600 } }, "retry_statuses must be a list of HTTP statuses" },
    { "status '5x'", { retry_statuses = { "5x" } }, "retry_statuses must be a list" },
    { "hook not a function", { classify = { "x" } }, "classify must be a function or a list of functions" },
    { "on_retry not a function", { on_retry = true }, "on_retry must be a function" },
    { "an unknown compaction strategy", { on_context_overflow = "summarise" },
      'on_context_overflow must be a function or the name of a shipped strategy ("drop_oldest") (got "summarise")' },
    { "boolean as string", { honor_x_should_retry = "yes" }, 'honor_x_should_retry must be true or false (got "yes")' },
    -- every number is bounded to a sane range (issue 11)
    { "1e300 retries", { max_retries = 1e300 }, "max_retries must be a whole number from 0 to 1000 (got 1e+300)" },
    { "math.maxinteger retries", { max_retries = math.maxinteger }, "max_retries must be a whole number from 0 to 1000" },
    { "a total deadline of 1e300 s", { total_deadline = 1e300 }, "total_deadline must be a number of seconds > 0 (at most 1000000)" },
    { "a huge multiplier", { backoff = { multiplier = 1e308 } }, "backoff.multiplier must be a number > 0, at most 1000" },
    { "an infinite max_wait", { retry_after = { max_wait = math.huge } }, "retry_after.max_wait must be a number of seconds from 0 to 1000000, or false" },
    { "breaker ratio 2", { breaker = { ratio = 2 } }, "breaker.ratio must be a number > 0, at most 1 (got 2)" },
    { "breaker window as a string", { breaker = { window = "20" } }, 'breaker.window must be a whole number from 0 to 1024 (got "20")' },
    { "an unknown breaker field", { breaker = { open = 5 } }, "unknown field 'breaker.open'" },
    { "breaker open_for inf", { breaker = { open_for = math.huge } }, "breaker.open_for must be a number of seconds > 0" },
    { "breaker min_calls over window", { breaker = { window = 4, min_calls = 8 } }, "breaker.min_calls must be an integer in [1, window]" },
    { "budget max 0", { budget = { max = 0 } }, "budget.max must be a number from 0.001 to 1000000 (got 0)" },
    { "budget ratio over max", { budget = { max = 2, ratio = 3 } }, "budget.ratio must be a number in [0.001, max]" },
    { "cooldown jitter NaN", { cooldown = { jitter = 0 / 0 } }, "cooldown.jitter must be a number from 0 to 10" },
    { "an unknown cooldown field", { cooldown = { wait = 1 } }, "unknown field 'cooldown.wait'" },
  }
  for _, b in ipairs(bad) do
    local what, t, msg = table.unpack(b)
    it("refuses " .. what, function()
      local p, err = policies.new(t)
      assert.is_nil(p)
      assert.equal("usage", err.kind)
      assert.truthy(err.message:find(msg, 1, true), err.message)
    end)
  end

  it("raises when given no table", function()
    assert.has_error(function() policies.new("default") end, "policy.new: expected a table, got string")
  end)
end)

describe("policy.load of a broken file", function()
  -- {file, message pattern, line}
  local broken = {
    { "syntax_error.lua", "^" .. FIX .. "syntax_error%.lua:3: unexpected symbol near '='", 3 },
    { "runtime_error.lua", "^" .. FIX .. "runtime_error%.lua:3: attempt to index a nil value", 3 },
    { "unknown_field.lua", "^" .. FIX .. "unknown_field%.lua:4: unknown field 'max_retry'", 4 },
    { "unknown_nested_field.lua", "^" .. FIX .. "unknown_nested_field%.lua:5: unknown field 'backoff%.ceiling'", 5 },
    { "bad_value.lua", "^" .. FIX .. 'bad_value%.lua:3: backoff%.base must be a number of seconds from 0 to 1000000 %(got "one second"%)', 3 },
    { "bad_strategy.lua", "^" .. FIX .. "bad_strategy%.lua:3: backoff%.strategy must be one of", 3 },
    { "nested_line.lua", "^" .. FIX .. "nested_line%.lua:6: retry_after%.jitter must be a number of seconds from 0 to 1000000 %(got %-1%)", 6 },
    { "runaway.lua", "^" .. FIX .. "runaway%.lua:3: instruction limit %(%d+%) exceeded", 3 },
    { "runaway_pcall.lua", "^" .. FIX .. "runaway_pcall%.lua:4: instruction limit %(%d+%) exceeded", 4 },
    { "runaway_match.lua", "^" .. FIX .. "runaway_match%.lua:4: time limit %(0%.5 s%) exceeded", 4 },
    { "not_a_table.lua", "^" .. FIX .. "not_a_table%.lua: a policy file must return a table %(it returned string%)", nil },
    { "missing.lua", "^" .. FIX .. "missing%.lua: No such file", nil },
  }
  for _, b in ipairs(broken) do
    local file, pattern, line = table.unpack(b, 1, 3)
    it(file .. " gives file:line and a usage error", function()
      local p, err = policies.load(FIX .. file)
      assert.is_nil(p)
      assert.equal("usage", err.kind)
      assert.matches(pattern, err.message)
      assert.equal(FIX .. file, err.file)
      assert.equal(line, err.line)
    end)
  end

  it("names a folder given as the file", function()
    local p, err = policies.load("spec/fixtures")
    assert.is_nil(p)
    assert.equal("usage", err.kind)
    assert.equal("spec/fixtures: not a regular file (a folder)", err.message)
  end)

  it("refuses a file over 1 MiB before running it", function()
    local path = os.tmpname()
    write(path, "return {}\n" .. ("-- padding\n"):rep(100000))
    local p, err = policies.load(path)
    os.remove(path)
    assert.is_nil(p)
    assert.matches("^" .. path:gsub("%p", "%%%0") .. ": the file is 1100010 bytes; at most 1048576 are read$", err.message)
  end)

  it("refuses a FIFO or a device named like a policy file without waiting for it or reading it", function()
    local dir = os.tmpname()
    os.remove(dir)
    assert(os.execute("mkdir " .. dir .. " && mkfifo " .. dir .. "/fifo.lua && ln -s /dev/zero " .. dir .. "/zero.lua"))
    local p, err = policies.load(dir .. "/fifo.lua")
    assert.is_nil(p)
    assert.equal(dir .. "/fifo.lua: not a regular file (a FIFO)", err.message)
    p, err = policies.load(dir .. "/zero.lua")
    assert.is_nil(p)
    assert.equal(dir .. "/zero.lua: not a regular file (a character device)", err.message)
    os.execute("rm -rf " .. dir)
  end)

  it("refuses a precompiled (binary) chunk", function()
    local path = os.tmpname()
    write(path, string.dump(function() return {} end))
    local p, err = policies.load(path)
    os.remove(path)
    assert.is_nil(p)
    assert.matches("^" .. path:gsub("%p", "%%%0") .. ": attempt to load a binary chunk", err.message)
  end)

  it("names the whole path of a file deep in directories", function()
    local dir = os.tmpname()
    os.remove(dir)
    local deep = dir .. "_" .. ("d"):rep(70) .. ".lua"
    write(deep, "return {\n  oops = 1,\n}\n")
    local _, err = policies.load(deep)
    local _, err2 = (function()
      write(deep, "return {\n  x = = 1 }\n")
      return policies.load(deep)
    end)()
    os.remove(deep)
    assert.equal(deep .. ":2: unknown field 'oops' (policies/README.md lists the fields)", err.message)
    assert.equal(deep .. ":2:", err2.message:sub(1, #deep + 3))
  end)
end)

describe("the policy environment", function()
  it("has only the safe parts of the standard library", function()
    local p = assert(policies.load(FIX .. "sandbox.lua"))
    assert.equal("nil,nil,nil,nil,nil,nil,nil,nil,nil,nil,function,function,function", p.description)
  end)

  it("is fresh for every load, and leaks nothing into the host", function()
    assert(policies.load(FIX .. "fresh_env.lua"))
    assert(policies.load(FIX .. "fresh_env.lua"))
    assert(policies.load(FIX .. "sandbox.lua"))
    assert.is_nil(rawget(_G, "counter"))
    assert.is_nil(rawget(_G, "leaked_global"))
  end)
end)

describe("policy.run_limited", function()
  it("returns the function's results", function()
    assert.same({ true, 1, nil, 3 }, { policies.run_limited(function(a, b) return a, nil, b end, 1000, 1, 3) })
  end)

  it("adds the position to an error without one", function()
    local ok, msg = policies.run_limited(function() error({}) end, 1000)
    assert.is_false(ok)
    assert.matches("^spec/policy_spec%.lua:%d+: error object is a table value$", msg)
    local _, msg2 = policies.run_limited(function() error("plain", 0) end, 1000)
    assert.matches("^spec/policy_spec%.lua:%d+: plain$", msg2)
  end)

  it("stops a function that yields", function()
    local ok, msg = policies.run_limited(function() coroutine.yield(1) end, 1000)
    assert.is_false(ok)
    assert.matches("^spec/policy_spec%.lua:%d+: policy code may not wait", msg)
  end)

  it("does not leave its hook on the caller", function()
    local before = table.pack(debug.gethook())
    policies.run_limited(function() while true do end end, 1000)
    assert.same(before, table.pack(debug.gethook()))
  end)
end)

describe("policy.find", function()
  it("finds a bundled name through policy.path, and keeps paths as they are", function()
    assert.equal("policies/yoagent.lua", policies.find("yoagent"))
    assert.equal("my/own.lua", policies.find("my/own.lua"))
    assert.equal("own.lua", policies.find("own.lua"))
    local none, msg = policies.find("no_such_policy")
    assert.is_nil(none)
    assert.matches("no_such_policy", msg)
  end)
end)

describe("policy.resolve", function()
  local config = require "luagent.config"
  after_each(function() luagent.configure { policy = false } end)

  it("gives a name's watched loader, looking the name up once per search path", function()
    local a = luagent.default_runtime().policies:resolve("yoagent")
    assert.equal(luagent.default_runtime().policies:watched("policies/yoagent.lua"), a)
    assert.equal(a, luagent.default_runtime().policies:resolve("yoagent"))
    -- found once: the lookup is not repeated for the next call
    local find = policies.find
    policies.find = function() error("looked up again") end
    local ok, again = pcall(luagent.default_runtime().policies.resolve, luagent.default_runtime().policies, "yoagent")
    policies.find = find
    assert.is_true(ok, again)
    assert.equal(a, again)
  end)

  it("takes a table, an object with :get(), or nil for the configured policy", function()
    assert.equal(3, luagent.default_runtime().policies:resolve({ max_retries = 3 }):get().max_retries)
    local holder = { get = function() return "mine" end }
    assert.equal(holder, luagent.default_runtime().policies:resolve(holder))
    luagent.configure { policy = { max_retries = 2 } }
    assert.equal(2, luagent.default_runtime().policies:resolve():get().max_retries)
  end)

  it("raises a usage record for an unknown name and a message for a wrong type", function()
    local ok, err = pcall(luagent.default_runtime().policies.resolve, luagent.default_runtime().policies, "no_such_policy")
    assert.is_false(ok)
    assert.equal("usage", err.kind)
    assert.matches("no policy named 'no_such_policy' %(looked in ", err.message)
    local ok2, err2 = pcall(luagent.default_runtime().policies.resolve, luagent.default_runtime().policies, 42)
    assert.is_false(ok2)
    assert.matches("policy must be a name, a file or a table", err2)
  end)

  it("names the API function the user called and the bad name", function()
    local luagent = require "luagent"
    local ok, err = pcall(luagent.stream, { model = "openai/x", policy = "no_such_policy" })
    assert.is_false(ok)
    assert.equal("usage", err.kind)
    assert.equal("stream: no policy named 'no_such_policy' (looked in " .. luagent.default_runtime().policies:search_path()
      .. "); policies there: axon, default, full_jitter, patient, sdk, yoagent", err.message)
    -- a wrong type is placed at the line that called stream
    local line
    local ok2, err2 = pcall(function()
      line = debug.getinfo(1, "l").currentline + 1
      luagent.stream { model = "openai/x", policy = 42 }
    end)
    assert.is_false(ok2)
    assert.equal("spec/policy_spec.lua:" .. line .. ": stream: policy must be a name, a file or a table", err2)
    -- called directly, resolve is the API
    local _, err3 = pcall(luagent.default_runtime().policies.resolve, luagent.default_runtime().policies, "no_such_policy")
    assert.matches("^resolve: no policy named 'no_such_policy'", err3.message)
  end)
end)

describe("policy.loader", function()
  local path
  before_each(function() path = os.tmpname() end)
  after_each(function() os.remove(path) end)

  it("keeps the previous policy when an edit breaks the file", function()
    write(path, "return { max_retries = 3 }\n")
    local loader, err = policies.loader(path)
    assert.is_nil(err)
    assert.equal(3, loader:get().max_retries)
    assert.equal(1, loader.version)

    write(path, "return {\n  max_retries = 4,\n  max_retry = 5,\n}\n")
    local p, err2 = loader:reload()
    assert.is_nil(p)
    assert.equal(path .. ":3: unknown field 'max_retry' (did you mean 'max_retries'?)", err2.message)
    assert.equal(err2, loader.error)
    assert.equal(3, loader:get().max_retries)
    assert.equal(1, loader.version)

    write(path, "return {\n  max_retries = \n")
    assert.is_nil(loader:reload())
    assert.matches("^" .. path:gsub("%p", "%%%0") .. ":3:", loader.error.message)
    assert.equal(3, loader:get().max_retries)

    write(path, "while true do end\n")
    assert.is_nil(loader:reload())
    assert.matches(":1: instruction limit", loader.error.message)
    assert.equal(3, loader:get().max_retries)

    write(path, "return { max_retries = 7 }\n")
    assert.equal(7, loader:reload().max_retries)
    assert.equal(7, loader:get().max_retries)
    assert.is_nil(loader.error)
    assert.equal(2, loader.version)
  end)

  it("rejects an edit with bad breaker, budget or cooldown values, or metatables, and keeps the previous", function()
    write(path, "return { max_retries = 3, breaker = { consecutive = 2 } }\n")
    local loader = policies.loader(path)
    assert.equal(3, loader:get().max_retries)
    local edits = {
      { "return {\n  max_retries = 4,\n  breaker = {\n    window = 8,\n    min_calls = 20,\n  },\n}\n",
        ":5: breaker.min_calls must be an integer in %[1, window%]" },
      { "return {\n  budget = { max = 1e300 },\n}\n", ":2: budget.max must be a number from 0.001 to 1000000" },
      { "return {\n  cooldown = {\n    jitter = -1 },\n}\n", ":3: cooldown.jitter must be a number from 0 to 10" },
      { "return {\n  max_retries = math.maxinteger,\n}\n", ":2: max_retries must be a whole number from 0 to 1000" },
      -- a looping __index or __pairs would run when the loader reads the
      -- table, after every bound: policy code has no setmetatable
      { "return setmetatable({}, {\n  __index = function() while true do end end })\n",
        ":1: attempt to call a nil value %(global 'setmetatable'%)" },
      { "return {\n  backoff = setmetatable({}, { __pairs = function() while true do end end }),\n}\n",
        ":2: attempt to call a nil value %(global 'setmetatable'%)" },
      { "local t = {}\nsetmetatable(t, { __gc = function() while true do end end })\nreturn t\n",
        ":2: attempt to call a nil value %(global 'setmetatable'%)" },
    }
    for _, e in ipairs(edits) do
      write(path, e[1])
      assert.is_nil(loader:reload())
      assert.matches("^" .. path:gsub("%p", "%%%0") .. e[2], loader.error.message)
      assert.equal(3, loader:get().max_retries)
      assert.equal(2, loader:get().breaker.consecutive)
    end
    assert.equal(1, loader.version)
  end)

  it("starts on the fallback when the first load fails", function()
    write(path, "return { nope = 1 }\n")
    local fallback = assert(policies.new({ max_retries = 1 }, "fallback"))
    local loader, err = policies.loader(path, fallback)
    assert.matches(":1: unknown field 'nope'", err.message)
    assert.equal(fallback, loader:get())
    local bare = policies.loader(path)
    assert.is_nil(bare:get())
  end)
end)
