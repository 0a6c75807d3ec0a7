-- The JSON Schema checker (lua/luagent/agent/tools/schema.lua): what tool
-- arguments and structured output are checked with. Each keyword it knows,
-- and the message naming the field that is wrong.
local schema = require "luagent.agent.tools.schema"
local json = require "luagent.base.json"

local function why(s, v) return select(2, schema.check(s, v, "output")) end

describe("schema.check: the keywords of real schemas", function()
  it("follows local $ref into $defs, definitions and the root", function()
    local s = { type = "object", required = { "home" },
      properties = { home = { ["$ref"] = "#/$defs/place" }, work = { ["$ref"] = "#/definitions/place" },
                     parent = { ["$ref"] = "#" } },
      ["$defs"] = { place = { type = "object", required = { "city" }, properties = { city = { type = "string" } } } },
      definitions = { place = { type = "object", properties = { city = { type = "string", minLength = 2 } } } } }
    assert.is_true(schema.check(s, { home = { city = "Paris" } }, "output"))
    assert.equal("output.home.city: expected string, got integer", why(s, { home = { city = 1 } }))
    assert.equal("output.work.city: must be at least 2 characters", why(s, { home = { city = "P" }, work = { city = "P" } }))
    assert.equal("output.parent: missing required field 'home'", why(s, { home = { city = "P" }, parent = {} }))
    assert.equal("output: $ref \"#\" refers to itself without end", why({ ["$ref"] = "#" }, 1))
  end)

  it("checks const and enum (any JSON value)", function()
    assert.equal('output.kind: must be "city" (got "town")',
      why({ properties = { kind = { const = "city" } } }, { kind = "town" }))
    assert.is_true(schema.check({ enum = { { 1, 2 }, "a" } }, { 1, 2 }))
    assert.equal('output: must be one of "a", "b" (got "c")', why({ enum = { "a", "b" } }, "c"))
  end)

  it("checks anyOf, oneOf and allOf, saying what each choice wanted", function()
    local any = { anyOf = { { type = "string" }, { type = "integer", minimum = 0 } } }
    assert.is_true(schema.check(any, "x"))
    assert.is_true(schema.check(any, 3))
    assert.equal("output: matches none of the 2 choices (anyOf): (1) expected string, got integer; (2) must be >= 0 (got -1)",
      why(any, -1))
    local one = { oneOf = { { type = "integer" }, { type = "number" } } }
    assert.is_true(schema.check(one, 1.5))
    assert.equal("output: matches 2 of the choices, oneOf wants exactly one", why(one, 2))
    assert.equal("output: must be <= 5 (got 6)", why({ allOf = { { type = "integer" }, { maximum = 5 } } }, 6))
    assert.equal("output: expected null, got integer", select(2, schema.check({ type = "null" }, 1, "output")))
    assert.is_true(schema.check({ type = { "string", "null" } }, json.null))
  end)

  it("checks additionalProperties: false, or a schema for the other fields", function()
    assert.equal("output: unknown field 'x'", why({ properties = {}, additionalProperties = false }, { x = 1 }))
    assert.equal("output.x: expected string, got integer",
      why({ additionalProperties = { type = "string" } }, { x = 1 }))
  end)

  it("checks number, string and array bounds", function()
    assert.equal("output: must be > 0 (got 0)", why({ exclusiveMinimum = 0 }, 0))
    assert.equal("output: must be < 10 (got 10)", why({ exclusiveMaximum = 10 }, 10))
    assert.equal("output: must be a multiple of 5 (got 7)", why({ multipleOf = 5 }, 7))
    assert.is_true(schema.check({ multipleOf = 0.1 }, 0.3))
    assert.equal("output: must be at most 2 characters", why({ maxLength = 2 }, "été"))
    assert.is_true(schema.check({ maxLength = 3 }, "été"))
    assert.equal("output: must have at least 1 items (got 0)", why({ type = "array", minItems = 1 }, {}))
    assert.equal("output: must have at most 1 items (got 2)", why({ type = "array", maxItems = 1 }, { 1, 2 }))
  end)

  it("lists every wrong field with errors()", function()
    local s = { type = "object", required = { "a", "b" },
      properties = { a = { type = "string" }, b = { type = "integer" }, c = { type = "boolean" } } }
    assert.same({ "output.a: expected string, got integer", "output.b: expected integer, got string",
      "output.c: expected boolean, got integer" }, schema.errors(s, { a = 1, b = "x", c = 0 }, "output"))
    assert.same({}, schema.errors(s, { a = "x", b = 1 }, "output"))
  end)
end)

describe("schema.valid: what the checker understands", function()
  it("names a reference that goes nowhere, or outside the schema", function()
    assert.equal('output.schema.properties.a.$ref: no schema at #/$defs/nope',
      select(2, schema.valid({ type = "object", properties = { a = { ["$ref"] = "#/$defs/nope" } } }, "output.schema")))
    assert.equal('params.properties.a.$ref: only local references ("#/...") are supported, not "http://x/s.json"',
      select(2, schema.valid({ type = "object", properties = { a = { ["$ref"] = "http://x/s.json" } } })))
  end)

  it("names a bound that is not a number and a combinator that is not a list", function()
    assert.equal("params.properties.n.minimum must be a number",
      select(2, schema.valid({ type = "object", properties = { n = { minimum = "1" } } })))
    assert.equal("params.anyOf must be a list of schemas", select(2, schema.valid({ anyOf = "x" })))
    assert.equal("params.anyOf[2].type: unknown type \"text\"",
      select(2, schema.valid({ anyOf = { { type = "string" }, { type = "text" } } })))
    assert.equal('output.schema.type must be "object" (structured output takes an object at the root)',
      select(2, schema.valid({ type = "array" }, "output.schema")))
  end)
end)
