-- The subset of JSON Schema that tool parameters and structured output use:
-- type, properties, required, additionalProperties, items, enum, const,
-- anyOf, oneOf, allOf, local $ref (into $defs, definitions or anywhere in
-- the schema: "#/$defs/city", "#"), number bounds (minimum, maximum,
-- exclusiveMinimum, exclusiveMaximum, multipleOf), string bounds
-- (minLength, maxLength, in characters) and array bounds (minItems,
-- maxItems). Other keywords (format, pattern, description, ...) are not
-- checked. check() validates a decoded value and names the first field
-- that is wrong; errors() lists every wrong field; neither raises for bad
-- data. valid() says whether a schema is one this subset understands.
-- Pure Lua. Its spec: spec/schema_spec.lua.
local json = require "luagent.base.json"

local M = {}

local TYPES = { object = true, array = true, string = true, number = true, integer = true,
  boolean = true, null = true }

-- $ref hops followed in a row without going into the value: more is a cycle
-- ({"$ref": "#"} at the root), reported, never a hang.
local MAX_HOPS = 32

-- True when t is a sequence 1..n (empty tables count as both kinds).
local function is_array(t)
  local n = 0
  for _ in pairs(t) do n = n + 1 end
  for i = 1, n do if t[i] == nil then return false end end
  return true
end

-- Whether decoded value v is of JSON type ty.
local function has_type(v, ty)
  local lt = type(v)
  if ty == "string" then return lt == "string" end
  if ty == "boolean" then return lt == "boolean" end
  if ty == "number" then return lt == "number" end
  if ty == "integer" then return math.type(v) == "integer" or (lt == "number" and v == math.floor(v) and v == v and v ~= math.huge and v ~= -math.huge) end
  if ty == "object" then return lt == "table" and (next(v) == nil or not is_array(v)) end
  if ty == "array" then return lt == "table" and is_array(v) end
  if ty == "null" then
    return v == nil or v == json.null
  end
  return false
end

local function describe(v)
  local lt = type(v)
  if v == json.null then return "null" end
  if lt == "table" then return is_array(v) and next(v) ~= nil and "array" or "object" end
  if lt == "number" then return math.type(v) == "integer" and "integer" or "number" end
  if lt == "nil" then return "nothing" end
  return lt
end

local function show(v)
  if type(v) == "string" then return string.format("%q", v) end
  if v == json.null then return "null" end
  if type(v) == "table" then
    local ok, text = pcall(json.encode, v)
    return ok and text or tostring(v)
  end
  return tostring(v)
end

-- Whether two decoded JSON values are equal (enum, const).
local function same(a, b)
  if a == b then return true end
  if type(a) ~= "table" or type(b) ~= "table" then
    return type(a) == "number" and type(b) == "number" and a == b
  end
  for k, v in pairs(a) do if not same(v, b[k]) then return false end end
  for k in pairs(b) do if a[k] == nil then return false end end
  return true
end

-- Path of a child: a.b, a[2].
local function child(path, k)
  if math.type(k) == "integer" then return path .. "[" .. k .. "]" end
  return path .. "." .. tostring(k)
end

-- The schema a local reference points to in `root`, or nil and why.
-- "#" is the root; "#/a/b" a JSON pointer (~1 is "/", ~0 is "~").
local function resolve(root, ref)
  if type(ref) ~= "string" or ref:sub(1, 1) ~= "#" then
    return nil, "only local references (\"#/...\") are supported, not " .. show(ref)
  end
  local node = root
  local pointer = ref:sub(2)
  if pointer ~= "" and pointer:sub(1, 1) ~= "/" then return nil, "not a JSON pointer: " .. show(ref) end
  for part in pointer:gmatch("/([^/]*)") do
    part = part:gsub("~1", "/"):gsub("~0", "~")
    if type(node) ~= "table" then node = nil break end
    local nxt = node[part]
    if nxt == nil and part:match("^%d+$") then nxt = node[tonumber(part) + 1] end
    node = nxt
  end
  if type(node) ~= "table" then return nil, "no schema at " .. ref end
  return node
end

local check

-- The error list of v against the branches of a combinator (anyOf, oneOf):
-- how many matched, and the first branch's errors per branch.
local function branches(list, v, path, cx)
  local matched, whys = 0, {}
  for i, sub in ipairs(list) do
    local errs = {}
    check(sub, v, path, cx, errs, 0)
    if #errs == 0 then matched = matched + 1
    else whys[#whys + 1] = "(" .. i .. ") " .. errs[1]:gsub("^" .. path:gsub("%p", "%%%0") .. ":%s*", "") end
  end
  return matched, whys
end

-- check(s, v, path, cx, out, hops): appends to `out` what is wrong with v
-- under schema s ("path: what"), at most cx.max entries. cx.root is the
-- whole schema ($ref resolves there).
function check(s, v, path, cx, out, hops)
  if type(s) ~= "table" or #out >= cx.max then return end
  local function bad(msg) if #out < cx.max then out[#out + 1] = path .. ": " .. msg end end
  if s["$ref"] ~= nil then
    if hops >= MAX_HOPS then return bad("$ref " .. show(s["$ref"]) .. " refers to itself without end") end
    local target, why = resolve(cx.root, s["$ref"])
    if not target then return bad(why) end
    check(target, v, path, cx, out, hops + 1)
  end
  if type(s.allOf) == "table" then
    for _, sub in ipairs(s.allOf) do check(sub, v, path, cx, out, hops + 1) end
  end
  if type(s.anyOf) == "table" and s.anyOf[1] ~= nil then
    local matched, whys = branches(s.anyOf, v, path, cx)
    if matched == 0 then
      bad("matches none of the " .. #s.anyOf .. " choices (anyOf): " .. table.concat(whys, "; "))
    end
  end
  if type(s.oneOf) == "table" and s.oneOf[1] ~= nil then
    local matched, whys = branches(s.oneOf, v, path, cx)
    if matched == 0 then
      bad("matches none of the " .. #s.oneOf .. " choices (oneOf): " .. table.concat(whys, "; "))
    elseif matched > 1 then
      bad("matches " .. matched .. " of the choices, oneOf wants exactly one")
    end
  end
  local ty = s.type
  if ty ~= nil then
    local list = type(ty) == "table" and ty or { ty }
    local ok = false
    for _, t in ipairs(list) do if has_type(v, t) then ok = true break end end
    if not ok then
      return bad("expected " .. table.concat(list, " or ") .. ", got " .. describe(v))
    end
  end
  if s.const ~= nil and not same(s.const, v) then
    return bad("must be " .. show(s.const) .. " (got " .. show(v) .. ")")
  end
  if type(s.enum) == "table" then
    local ok = false
    for _, e in ipairs(s.enum) do if same(e, v) then ok = true break end end
    if not ok then
      local opts = {}
      for i, e in ipairs(s.enum) do opts[i] = show(e) end
      return bad("must be one of " .. table.concat(opts, ", ") .. " (got " .. show(v) .. ")")
    end
  end
  if type(v) == "number" then
    local function num(x) return type(x) == "number" and x end
    if num(s.minimum) and v < s.minimum then bad("must be >= " .. s.minimum .. " (got " .. v .. ")") end
    if num(s.maximum) and v > s.maximum then bad("must be <= " .. s.maximum .. " (got " .. v .. ")") end
    if num(s.exclusiveMinimum) and v <= s.exclusiveMinimum then
      bad("must be > " .. s.exclusiveMinimum .. " (got " .. v .. ")")
    end
    if num(s.exclusiveMaximum) and v >= s.exclusiveMaximum then
      bad("must be < " .. s.exclusiveMaximum .. " (got " .. v .. ")")
    end
    if num(s.multipleOf) and s.multipleOf > 0 then
      local q = v / s.multipleOf
      if math.abs(q - math.floor(q + 0.5)) > 1e-9 then
        bad("must be a multiple of " .. s.multipleOf .. " (got " .. v .. ")")
      end
    end
  elseif type(v) == "string" then
    local n = utf8.len(v) or #v
    if s.minLength and n < s.minLength then bad("must be at least " .. s.minLength .. " characters") end
    if s.maxLength and n > s.maxLength then bad("must be at most " .. s.maxLength .. " characters") end
  elseif type(v) == "table" then
    local array = is_array(v)
    if array and (next(v) ~= nil or s.type == "array" or s.items or s.minItems) then
      if s.minItems and #v < s.minItems then bad("must have at least " .. s.minItems .. " items (got " .. #v .. ")") end
      if s.maxItems and #v > s.maxItems then bad("must have at most " .. s.maxItems .. " items (got " .. #v .. ")") end
      if type(s.items) == "table" then
        for i, x in ipairs(v) do check(s.items, x, child(path, i), cx, out, 0) end
      end
    end
    local props = type(s.properties) == "table" and s.properties or {}
    if type(s.required) == "table" then
      for _, name in ipairs(s.required) do
        if v[name] == nil then bad("missing required field '" .. tostring(name) .. "'") end
      end
    end
    local keys = {}
    for k in pairs(v) do if type(k) == "string" then keys[#keys + 1] = k end end
    table.sort(keys)
    for _, k in ipairs(keys) do
      if props[k] ~= nil then
        check(props[k], v[k], child(path, k), cx, out, 0)
      elseif s.additionalProperties == false then
        bad("unknown field '" .. k .. "'")
      elseif type(s.additionalProperties) == "table" then
        check(s.additionalProperties, v[k], child(path, k), cx, out, 0)
      end
    end
  end
end

-- errors(schema, value [, path [, max]]) -> the list of what is wrong
-- ("output.city: expected string, got integer"), at most `max` (10)
-- entries; empty when value matches.
function M.errors(schema, value, path, max)
  local out = {}
  check(schema, value, path or "value", { root = schema, max = max or 10 }, out, 0)
  return out
end

-- check(schema, value [, path]) -> true, or nil and a message naming the
-- first field that is wrong ("arguments.path: expected string, got integer").
function M.check(schema, value, path)
  local out = {}
  check(schema, value, path or "arguments", { root = schema, max = 1 }, out, 0)
  if out[1] then return nil, out[1] end
  return true
end

local LISTS = { anyOf = true, oneOf = true, allOf = true }
local NUMBERS = { "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
  "minLength", "maxLength", "minItems", "maxItems" }

-- The checks of valid(): every subschema a table, known type names, lists
-- where lists belong, numbers for bounds, every $ref resolvable.
local function walk(root, s, path, seen)
  if type(s) ~= "table" then return nil, path .. " must be a table" end
  if seen[s] then return true end
  seen[s] = true
  local list = type(s.type) == "table" and s.type or { s.type }
  for _, t in ipairs(list) do
    if not TYPES[t] then return nil, path .. ".type: unknown type " .. show(t) end
  end
  if s["$ref"] ~= nil then
    local _, why = resolve(root, s["$ref"])
    if why then return nil, path .. ".$ref: " .. why end
  end
  for _, key in ipairs { "properties", "$defs", "definitions" } do
    if s[key] ~= nil then
      if type(s[key]) ~= "table" then return nil, path .. "." .. key .. " must be a table" end
      local names = {}
      for k in pairs(s[key]) do names[#names + 1] = tostring(k) end
      table.sort(names)
      for _, k in ipairs(names) do
        local ok, err = walk(root, s[key][k], path .. "." .. key .. "." .. k, seen)
        if not ok then return nil, err end
      end
    end
  end
  for _, key in ipairs { "items", "not" } do
    if s[key] ~= nil then
      local ok, err = walk(root, s[key], path .. "." .. key, seen)
      if not ok then return nil, err end
    end
  end
  if type(s.additionalProperties) == "table" then
    local ok, err = walk(root, s.additionalProperties, path .. ".additionalProperties", seen)
    if not ok then return nil, err end
  elseif s.additionalProperties ~= nil and type(s.additionalProperties) ~= "boolean" then
    return nil, path .. ".additionalProperties must be a boolean or a schema"
  end
  for key in pairs(LISTS) do
    if s[key] ~= nil then
      if type(s[key]) ~= "table" then return nil, path .. "." .. key .. " must be a list of schemas" end
      for i, sub in ipairs(s[key]) do
        local ok, err = walk(root, sub, path .. "." .. key .. "[" .. i .. "]", seen)
        if not ok then return nil, err end
      end
    end
  end
  for _, key in ipairs(NUMBERS) do
    if s[key] ~= nil and type(s[key]) ~= "number" then return nil, path .. "." .. key .. " must be a number" end
  end
  if s.required ~= nil and type(s.required) ~= "table" then return nil, path .. ".required must be a list" end
  if s.enum ~= nil and type(s.enum) ~= "table" then return nil, path .. ".enum must be a list" end
  return true
end

-- valid(schema [, what]) -> true | nil, message: whether a schema is one
-- this subset understands, with an object at its root (tool arguments are
-- an object; the providers' structured outputs take one too). `what` names
-- it in messages ("params", the default, or "output.schema").
function M.valid(schema, what)
  what = what or "params"
  if type(schema) ~= "table" then return nil, what .. " must be a table (a JSON Schema)" end
  if schema.type ~= nil and schema.type ~= "object" then
    return nil, what .. ".type must be \"object\" (" .. (what == "params" and "tool arguments are an object"
      or "structured output takes an object at the root") .. ")"
  end
  return walk(schema, schema, what, {})
end

return M
