-- The subset of JSON Schema that tool parameters use: type, properties,
-- required, enum, items, minimum/maximum, minLength/maxLength,
-- additionalProperties. check() validates decoded arguments and names the
-- first field that is wrong; it never raises for bad data. Pure Lua.
local json = require "luagent.base.json"

local M = {}

local TYPES = { object = true, array = true, string = true, number = true, integer = true,
  boolean = true, null = true }

-- True when t is a sequence 1..n (empty tables count as both kinds).
local function is_array(t)
  local n = 0
  for _ in pairs(t) do n = n + 1 end
  for i = 1, n do if t[i] == nil then return false end end
  return true
end

-- The JSON type name of a decoded value, as precise as the schema asks.
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
  if lt == "table" then return is_array(v) and next(v) ~= nil and "array" or "object" end
  if lt == "number" then return math.type(v) == "integer" and "integer" or "number" end
  if lt == "nil" then return "nothing" end
  return lt
end

local function show(v)
  if type(v) == "string" then return string.format("%q", v) end
  return tostring(v)
end

-- Path of a child: a.b, a[2].
local function child(path, k)
  if math.type(k) == "integer" then return path .. "[" .. k .. "]" end
  return path .. "." .. tostring(k)
end

local check

-- check(schema, value, path) -> true, or nil and "path: what is wrong".
function check(s, v, path)
  if type(s) ~= "table" then return true end
  local ty = s.type
  if ty ~= nil then
    local list = type(ty) == "table" and ty or { ty }
    local ok = false
    for _, t in ipairs(list) do if has_type(v, t) then ok = true break end end
    if not ok then
      return nil, path .. ": expected " .. table.concat(list, " or ") .. ", got " .. describe(v)
    end
  end
  if type(s.enum) == "table" then
    local ok = false
    for _, e in ipairs(s.enum) do if e == v then ok = true break end end
    if not ok then
      local opts = {}
      for i, e in ipairs(s.enum) do opts[i] = show(e) end
      return nil, path .. ": must be one of " .. table.concat(opts, ", ") .. " (got " .. show(v) .. ")"
    end
  end
  if type(v) == "number" then
    if s.minimum and v < s.minimum then return nil, path .. ": must be >= " .. s.minimum .. " (got " .. v .. ")" end
    if s.maximum and v > s.maximum then return nil, path .. ": must be <= " .. s.maximum .. " (got " .. v .. ")" end
  elseif type(v) == "string" then
    local n = utf8.len(v) or #v
    if s.minLength and n < s.minLength then return nil, path .. ": must be at least " .. s.minLength .. " characters" end
    if s.maxLength and n > s.maxLength then return nil, path .. ": must be at most " .. s.maxLength .. " characters" end
  elseif type(v) == "table" then
    if type(s.items) == "table" and is_array(v) then
      for i, x in ipairs(v) do
        local ok, err = check(s.items, x, child(path, i))
        if not ok then return nil, err end
      end
    end
    local props = type(s.properties) == "table" and s.properties or {}
    if type(s.required) == "table" then
      for _, name in ipairs(s.required) do
        if v[name] == nil then return nil, path .. ": missing required field '" .. tostring(name) .. "'" end
      end
    end
    local keys = {}
    for k in pairs(v) do if type(k) == "string" then keys[#keys + 1] = k end end
    table.sort(keys)
    for _, k in ipairs(keys) do
      if props[k] ~= nil then
        local ok, err = check(props[k], v[k], child(path, k))
        if not ok then return nil, err end
      elseif s.additionalProperties == false then
        return nil, path .. ": unknown field '" .. k .. "'"
      elseif type(s.additionalProperties) == "table" then
        local ok, err = check(s.additionalProperties, v[k], child(path, k))
        if not ok then return nil, err end
      end
    end
  end
  return true
end

-- check(schema, value [, path]) -> true | nil, message naming the field
-- ("arguments.path: expected string, got integer").
function M.check(schema, value, path)
  return check(schema, value, path or "arguments")
end

-- valid(schema) -> true | nil, message: whether a tool's `params` is a
-- schema this subset understands (an object schema; known type names).
function M.valid(schema)
  if type(schema) ~= "table" then return nil, "params must be a table (a JSON Schema)" end
  if schema.type ~= nil and schema.type ~= "object" then
    return nil, "params.type must be \"object\" (tool arguments are an object)"
  end
  local function walk(s, path)
    if type(s) ~= "table" then return nil, path .. " must be a table" end
    local list = type(s.type) == "table" and s.type or { s.type }
    for _, t in ipairs(list) do
      if not TYPES[t] then return nil, path .. ".type: unknown type " .. show(t) end
    end
    if s.properties ~= nil then
      if type(s.properties) ~= "table" then return nil, path .. ".properties must be a table" end
      for k, sub in pairs(s.properties) do
        local ok, err = walk(sub, path .. ".properties." .. tostring(k))
        if not ok then return nil, err end
      end
    end
    if s.items ~= nil then
      local ok, err = walk(s.items, path .. ".items")
      if not ok then return nil, err end
    end
    if s.required ~= nil and type(s.required) ~= "table" then return nil, path .. ".required must be a list" end
    if s.enum ~= nil and type(s.enum) ~= "table" then return nil, path .. ".enum must be a list" end
    return true
  end
  return walk(schema, "params")
end

return M
