-- Tool definitions, the JSON Schema subset for arguments, the result bound,
-- and the policy's `tool` section.
local tools = require "luagent.agent.tools"
local schema = require "luagent.agent.tools.schema"
local policy = require "luagent.model.policy"

describe("schema.check", function()
  local s = { type = "object", additionalProperties = false, required = { "path", "mode" }, properties = {
    path = { type = "string", minLength = 1, maxLength = 5 },
    mode = { type = "string", enum = { "r", "w" } },
    n = { type = "integer", minimum = 1, maximum = 10 },
    ratio = { type = "number" },
    tags = { type = "array", items = { type = "string" } },
    opts = { type = "object", properties = { deep = { type = "boolean" } } },
    any = { type = { "string", "null" } },
  } }

  local function check(v) return schema.check(s, v) end

  it("accepts what matches", function()
    assert.is_true(check { path = "a", mode = "r", n = 3, ratio = 0.5, tags = { "x" }, opts = { deep = true } })
    assert.is_true(check { path = "a", mode = "w", tags = {}, n = 3.0 })
  end)

  it("names the field that is wrong", function()
    local cases = {
      { { mode = "r" }, "arguments: missing required field 'path'" },
      { { path = 3, mode = "r" }, "arguments.path: expected string, got integer" },
      { { path = "", mode = "r" }, "arguments.path: must be at least 1 characters" },
      { { path = "toolong", mode = "r" }, "arguments.path: must be at most 5 characters" },
      { { path = "a", mode = "x" }, 'arguments.mode: must be one of "r", "w" (got "x")' },
      { { path = "a", mode = "r", n = 11 }, "arguments.n: must be <= 10 (got 11)" },
      { { path = "a", mode = "r", n = 0 }, "arguments.n: must be >= 1 (got 0)" },
      { { path = "a", mode = "r", n = 1.5 }, "arguments.n: expected integer, got number" },
      { { path = "a", mode = "r", tags = { "x", 2 } }, "arguments.tags[2]: expected string, got integer" },
      { { path = "a", mode = "r", opts = { deep = "yes" } }, "arguments.opts.deep: expected boolean, got string" },
      { { path = "a", mode = "r", other = 1 }, "arguments: unknown field 'other'" },
      { { path = "a", mode = "r", any = 1 }, "arguments.any: expected string or null, got integer" },
    }
    for _, c in ipairs(cases) do
      local ok, err = check(c[1])
      assert.is_nil(ok)
      assert.equal(c[2], err)
    end
  end)

  it("says which params are not a schema it understands", function()
    assert.is_true(schema.valid { type = "object", properties = { a = { type = "string" } } })
    assert.equal('params.properties.a.type: unknown type "text"',
      select(2, schema.valid { type = "object", properties = { a = { type = "text" } } }))
    assert.equal('params.type must be "object" (tool arguments are an object)', select(2, schema.valid { type = "array" }))
  end)
end)

describe("json.decode_strict (tool arguments)", function()
  local json = require "luagent.base.json"
  local function why(text) return select(2, json.decode_strict(text, "arguments")) end

  it("decodes what every JSON reader reads the same way", function()
    assert.same({ a = 1, b = { c = "x", d = { 1, 2 } } }, json.decode_strict('{"a": 1, "b": {"c": "x", "d": [1, 2]}}'))
    -- the same key in different objects, keys that only look alike, key-like text inside strings
    assert.same({ a = { a = 1 }, b = { { a = 1 }, { a = 2 } }, ["a\\"] = 3, ["a "] = 4, s = '"a": 1, "s": 2' },
      json.decode_strict('{"a": {"a": 1}, "b": [{"a": 1}, {"a": 2}], "a\\\\": 3, "a ": 4, "s": "\\"a\\": 1, \\"s\\": 2"}'))
    assert.same({}, json.decode_strict("{}"))
    assert.equal(-0.0, json.decode_strict('{"z": -0}').z)
    assert.equal(1e308, json.decode_strict('{"z": 1e308}').z)
  end)

  it("refuses a key given twice, however it is spelt, naming it and its object", function()
    assert.equal('arguments: key "path" is given twice', why('{"path": "a", "path": "/etc/passwd"}'))
    assert.equal('arguments: key "path" is given twice', why('{"path": "a", "p\\u0061th": "b"}'))
    assert.equal('arguments.opts: key "x" is given twice', why('{"x": 1, "opts": {"x": 1, "y": [], "x": 2}}'))
    assert.equal('arguments.list[2]: key "k" is given twice', why('{"list": [{"k": 1}, {"k": 1, "k": 2}]}'))
    assert.equal('arguments.a[1][2]: key "\\n" is given twice', why('{"a": [[{}, {"\\n": 1, "\\n": 2}]]}'))
  end)

  it("refuses numbers that are not finite and what is not JSON (NaN, Infinity, hex)", function()
    assert.matches("^arguments.i: not a finite number", why('{"i": 1e999}'))
    assert.matches("^arguments.i: not a finite number", why('{"i": -1e999}'))
    assert.matches("^arguments%.a%[3%]%.b: not a finite number", why('{"a": [1, 2, {"b": 1e400}]}'))
    for _, t in ipairs { '{"i": NaN}', '{"i": Infinity}', '{"i": -Infinity}', '{"i": 0x10}', '{"i": nan}' } do
      assert.is_nil(json.decode_strict(t), t)
      assert.matches("invalid", why(t), nil, true)
    end
    -- json.decode itself stays as lenient as it was
    assert.equal(16, json.decode('{"i": 0x10}').i)
  end)
end)

describe("tools.check", function()
  local ok = { name = "ok", description = "fine", run = function() end }

  it("fills defaults and keeps the definition", function()
    local t = assert(tools.check(ok))
    assert.is_false(t.read_only)
    assert.is_false(t.idempotent)
    assert.same({ type = "object", properties = {} }, t.params)
    assert.equal(t, tools.check(t))
  end)

  it("refuses bad definitions with the field", function()
    local function why(t) return select(2, tools.check(t)) end
    assert.matches("name must match", why { name = "a b", description = "x", run = print })
    assert.matches("name must match", why { name = string.rep("a", 65), description = "x", run = print })
    assert.matches("description must be a non%-empty string", why { name = "a", run = print })
    assert.matches("exactly one of run", why { name = "a", description = "x" })
    assert.matches("exactly one of run", why { name = "a", description = "x", run = print, command = { "ls" } })
    assert.matches("command must be a list of strings", why { name = "a", description = "x", command = "ls -l" })
    assert.matches("timeout must be a number of seconds > 0", why { name = "a", description = "x", run = print, timeout = 0 })
    assert.matches("read_only must be true or false", why { name = "a", description = "x", run = print, read_only = 1 })
    assert.matches("unknown field 'retries'", why { name = "a", description = "x", run = print, retries = 3 })
  end)

  it("takes env for a command tool (a copy), and refuses it otherwise", function()
    local function why(t) return select(2, tools.check(t)) end
    assert.matches("env is for a command tool", why { name = "a", description = "x", run = print, env = {} })
    assert.matches("env must be a table", why { name = "a", description = "x", command = { "ls" }, env = "A=1" })
    assert.matches("env.A must be a string", why { name = "a", description = "x", command = { "ls" }, env = { A = 1 } })
    assert.matches('bad variable name "A=B"', why { name = "a", description = "x", command = { "ls" },
      env = { ["A=B"] = "x" } })
    local env = { A = "1", HOME = false }
    local t = assert(tools.check { name = "a", description = "x", command = { "ls" }, env = env })
    env.A = "2"
    assert.same({ A = "1", HOME = false }, t.env)
  end)

  it("reads env raw: a looping __pairs or __tostring of a tool file's env is never run", function()
    local function loop() while true do end end
    local env = setmetatable({ A = "1" }, { __pairs = loop, __index = loop })
    local t = assert(tools.check { name = "a", description = "x", command = { "ls" }, env = env })
    assert.same({ A = "1" }, t.env)
    local key = setmetatable({}, { __tostring = loop })
    assert.equal("tool 'a': env: bad variable name (a table)",
      select(2, tools.check { name = "a", description = "x", command = { "ls" }, env = { [key] = "v" } }))
  end)
end)

describe("tools.bound", function()
  it("cuts on a UTF-8 boundary and says how much was left out", function()
    assert.equal("abc", tools.bound("abc", 5))
    assert.equal("ab\n[result cut: 3 of 5 bytes left out]", tools.bound("abcde", 2))
    assert.equal("a\n[result cut: 2 of 3 bytes left out]", tools.bound("aé", 2)) -- é is 2 bytes
    assert.equal("ab\n[result cut: 98 of 100 bytes left out]", tools.bound("abc", 2, 100))
  end)
end)

describe("the policy's tool section", function()
  it("defaults every field", function()
    local p = assert(policy.new {})
    assert.same({ max_retries = 2, timeout = 60, grace = 2, max_result_bytes = 65536,
      max_memory = 256 * 1024 * 1024, trust_hints = false, overrides = {},
      backoff = { strategy = "full_jitter", base = 0.5, max = 10, multiplier = 2, jitter = 0 } }, p.tool)
  end)

  it("reports a bad field with file and line", function()
    local path = os.tmpname() .. ".lua"
    local f = assert(io.open(path, "w"))
    f:write("return {\n  max_retries = 2,\n  tool = {\n    timeout = 30,\n    backoff = { strategy = \"exponential\",\n      base = -1 },\n  },\n}\n")
    f:close()
    local p, err = policy.load(path)
    os.remove(path)
    assert.is_nil(p)
    assert.equal(path .. ":6: tool.backoff.base must be a number of seconds from 0 to 1000000 (got -1)", err.message)
    local _, err2 = policy.new({ tool = { retries = 1 } })
    assert.matches("unknown field 'tool.retries'", err2.message)
    local _, err3 = policy.check_tool_section({ timeout = "long" })
    assert.matches("timeout must be a number > 0", err3.message)
  end)
end)

-- A Lua tool runs in the sandbox of policy hooks (lua/luagent/base/sandbox.lua,
-- host/sandbox.c): the bounded matcher, a wall-time bound its count hook
-- checks on the wall clock at an interval bounded in time, a memory bound,
-- and a cancellation at its timeout that a pcall loop cannot outlive. What
-- it returns or raises is read inside those bounds.
describe("a Lua tool's progress", function()
  it("is sent as a plain copy, scrubbed: the tool's own table, its token in it, stays as it was", function()
    local secrets = require "luagent.base.secrets"
    local token = "tok-" .. string.rep("q", 24)
    secrets.register(token)
    local state = setmetatable({ token = token, n = 1 }, { __index = function() return "from a metatable" end })
    local seen
    local tool = tools.new { name = "p", description = "P", read_only = true, run = function(_, ctx)
      ctx:progress(state)
      state.n = 2 -- after it was sent
      return state.token == token and "token intact" or "token changed"
    end }
    local p = assert(policy.check_tool_section {})
    local o = tools.execute(tool, { id = "1", name = "p", arguments = {} },
      { policy = p, emit = function(ev) if ev.type == "tool_execution_update" then seen = ev.data end end })
    assert.equal("token intact", o.content)
    assert.same({ token = "***", n = 1 }, seen)
    assert.is_nil(getmetatable(seen))
  end)
end)

describe("a Lua tool's bounds", function()
  local core = require "luagent.core"
  local luagent = require "luagent"
  local errors = require "luagent.base.errors"

  local was_virtual
  before_each(function()
    was_virtual = core.clock_is_virtual()
    if was_virtual then core.clock_real() end
  end)
  after_each(function()
    if core.clock_is_virtual() then core.clock_real() end
    if was_virtual then core.clock_virtual() end
  end)

  -- One call of a read_only tool made of `t` (name and description added)
  -- under the tool section `section` (no retries unless it says), with
  -- `args`: the outcome and the seconds it took on the loop's clock.
  local function call(t, section, args)
    t.name, t.description = t.name or "t", "a tool under test"
    if t.read_only == nil then t.read_only = true end
    section = section or {}
    section.max_retries = section.max_retries or 0
    local tool = tools.new(t)
    local p = assert(policy.check_tool_section(section))
    local t0 = core.now()
    local o = tools.execute(tool, { id = "1", name = tool.name, arguments = args or {} }, { policy = p })
    return o, core.now() - t0
  end

  -- Spins for `s` seconds of CPU time, then returns: bounded, so that code
  -- that runs it outside every limit ends (and is seen to take that long).
  local function spin(s)
    local t0 = os.clock()
    while os.clock() - t0 < s do end
  end

  it("stops a backtracking pattern the model chose at the timeout; other tasks are late by no more", function()
    local late = 0
    local ticker = core.spawn(function()
      while true do
        local t0 = core.now()
        core.sleep(0.02)
        late = math.max(late, core.now() - t0 - 0.02)
      end
    end)
    local o, took = call({ timeout = 0.2,
      params = { type = "object", properties = { pattern = { type = "string" } } },
      run = function(args) return ("a"):rep(34):find(args.pattern) and "found" or "no match" end },
      nil, { pattern = ("a*"):rep(8) .. "b" }) -- about 3 s in Lua's own matcher
    ticker:cancel()
    pcall(ticker.join, ticker)
    assert.equal("tool_timeout", o.error and o.error.kind)
    assert.equal("t timed out after 0.2 s", o.content)
    assert.is_true(took < 1, "took " .. took)
    assert.is_true(late < 1, "the ticker was late by " .. late)
  end)

  it("stops a tool whose instructions are slow within twice its timeout (the hook's interval is bounded in time)", function()
    -- each turn of the loop is a few instructions of some milliseconds each
    -- (a 4 MiB string upper-cased): an interval of thousands of
    -- instructions would come seconds late
    local o, took = call({ timeout = 0.3, run = function()
      local big = ("x"):rep(4 * 1024 * 1024)
      while true do local _ = big:upper() end
    end })
    assert.equal("tool_timeout", o.error and o.error.kind)
    assert.is_true(took < 1.5, "took " .. took) -- the old pacing: 12.7 s; margin for a loaded machine
  end)

  it("stops a tool that catches its cancellation in a pcall loop once the grace has passed", function()
    core.clock_virtual()
    local o, took = call({ timeout = 1, run = function()
      for _ = 1, 1000 do pcall(luagent.sleep, 10) end
      return "survived"
    end }, { grace = 0.5 })
    assert.equal("tool_timeout", o.error and o.error.kind)
    assert.equal("t timed out after 1 s", o.content)
    assert.is_true(took >= 1.5 and took < 2, "took " .. took) -- the timeout, then the grace
  end)

  it("bounds the tasks a tool spawns with it, and lets it call a policy hook (a sandbox in its sandbox)", function()
    local helper
    local o = call({ timeout = 0.2, run = function()
      helper = luagent.spawn(function() while true do end end)
      local ok, v = policy.run_limited(function(x) return x .. "!" end, 1000, "hook")
      return tostring(ok) .. " " .. v
    end })
    assert.equal("true hook!", o.content)
    pcall(helper.join, helper)
    assert.equal("failed", helper:status()) -- stopped at the tool's timeout
  end)

  it("ends the tasks a tool leaves running when it returns: cancelled (their handlers run), stopped past the grace", function()
    core.clock_virtual()
    local polite, stubborn, cleaned
    local o, took = call({ timeout = 30, run = function()
      polite = luagent.spawn(function()
        local ok, err = pcall(luagent.sleep, 5)
        cleaned = not ok and errors.is_cancel(err)
      end)
      stubborn = luagent.spawn(function()
        for _ = 1, 3 do pcall(luagent.sleep, 5) end -- swallows its cancellations
      end)
      luagent.sleep(0.1)
      return "done"
    end }, { grace = 0.5 })
    assert.equal("done", o.content)
    assert.equal("done", polite:status())
    assert.is_true(cleaned)
    assert.equal("failed", stubborn:status()) -- stopped once the grace passed
    assert.is_true(took >= 0.6 and took < 1, "took " .. took) -- its work, then the grace
    -- and those their handlers start
    local late
    o = call({ run = function()
      luagent.spawn(function()
        pcall(luagent.sleep, 5)
        late = luagent.spawn(luagent.sleep, 5)
      end)
      luagent.sleep(0.1)
      return "done"
    end })
    assert.equal("done", o.content)
    assert.equal("failed", late:status()) -- cancelled
  end)

  it("answers a result that cannot be sent (NaN, a table that refers to itself) with an error result", function()
    local looped = {}
    looped.self = looped
    for _, v in ipairs { 0 / 0, { x = 0 / 0 }, looped, print } do
      local o = call({ run = function() return v end })
      assert.is_true(o.is_error)
      assert.equal("tool_error", o.error.kind)
      assert.matches("^t returned a result that cannot be sent to the model: ", o.content)
    end
  end)

  it("reads what a tool returns or raises within its bounds: a metamethod that runs on is stopped", function()
    local hostile = {
      function() return setmetatable({}, { __pairs = function(t) spin(3) return next, t end }) end,
      function() return setmetatable({ 1, 2 }, { __len = function() spin(3) return 2 end }) end,
      function() error(setmetatable({}, { __index = function() spin(3) end })) end,
      function() return nil, setmetatable({}, { __tostring = function() spin(3) return "x" end }) end,
    }
    for i, run in ipairs(hostile) do
      local o, took = call({ timeout = 0.2, run = run })
      assert.is_true(o.is_error, "case " .. i)
      assert.equal("tool_timeout", o.error.kind, "case " .. i)
      assert.is_true(took < 1.5, "case " .. i .. " took " .. took)
    end
  end)

  it("keeps the fields of an error record a tool returns, as a plain copy", function()
    local errors = require "luagent.base.errors"
    local o = call({ run = function()
      return nil, errors.new("http", "upstream said 503", { status = 503, retryable = false, body = "busy" })
    end })
    assert.equal("http", o.error.kind)
    assert.equal("upstream said 503", o.error.message)
    assert.equal(503, o.error.status)
    assert.equal("busy", o.error.body)
    assert.equal("http: upstream said 503", tostring(o.error))
  end)

  it("runs a durable call's check under the same bounds: a result it cannot send is an error", function()
    local looped = {}
    looped.self = looped
    local tool = tools.new { name = "c", description = "checked", run = print,
      check = function() return looped end }
    local text, err = tools.check_outcome(tool, { id = "1", arguments = {} }, { policy = policy.new({}).tool })
    assert.is_nil(text)
    assert.equal("tool_error", err.kind)
    assert.matches("^c check returned a result that cannot be sent to the model: ", err.message)
  end)
end)
