-- Tool definitions, the JSON Schema subset for arguments, the result bound,
-- and the policy's `tool` section.
local tools = require "luagent.tools"
local schema = require "luagent.tools.schema"
local policy = require "luagent.policy"

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
  local json = require "luagent.json"
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
      trust_hints = false, overrides = {},
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
