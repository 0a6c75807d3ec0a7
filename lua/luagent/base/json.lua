-- JSON for everything luagent writes: request bodies, mock replies,
-- cassettes, event lines. Debian's lua-cjson 2.1.0 cannot encode an empty
-- array, prints numbers with 14 digits and orders keys at random, so
-- encoding is done here; cjson only decodes (a private instance, so nobody
-- else's settings leak in).
--
-- Output is deterministic byte for byte: objects made with json.object keep
-- the order given, other tables sort their keys; tables marked with
-- json.array are arrays even when empty; json.raw splices encoded text.
local cjson = require "cjson"
local core = require "luagent.core"

local M = {}

local decoder = cjson.new()

M.null = cjson.null
-- The array marker; cjson's own when it has one, so both encode alike.
M.array_mt = cjson.array_mt or { __name = "luagent.json.array" }
local RAW_MT = { __name = "luagent.json.raw" }
local key_order = setmetatable({}, { __mode = "k" })

-- Marks `t` (or a new table) as a JSON array and returns it.
function M.array(t)
  return setmetatable(t or {}, M.array_mt)
end

-- Wraps already-encoded JSON text so the encoder splices it verbatim (tool
-- arguments replayed byte for byte).
function M.raw(text)
  return setmetatable({ text }, RAW_MT)
end

-- An object whose keys encode in the order given: object(k1, v1, k2, v2, ...).
-- A nil value drops its key; use json.null for an explicit null.
function M.object(...)
  local t, keys = {}, {}
  for i = 1, select("#", ...), 2 do
    local k, v = select(i, ...)
    if v ~= nil then
      keys[#keys + 1] = k
      t[k] = v
    end
  end
  key_order[t] = keys
  return t
end

-- The replacement character, U+FFFD, as UTF-8.
M.REPLACEMENT = "\u{FFFD}"

-- clean_utf8(s) -> s with every byte that does not start a valid UTF-8
-- sequence (stray bytes, overlong forms, encoded surrogates) replaced by
-- U+FFFD. Valid text is returned as is.
function M.clean_utf8(s)
  if utf8.len(s) then return s end
  local out, i = {}, 1
  while i <= #s do
    local n, bad = utf8.len(s, i)
    if n then
      out[#out + 1] = s:sub(i)
      break
    end
    out[#out + 1] = s:sub(i, bad - 1)
    out[#out + 1] = M.REPLACEMENT
    i = bad + 1
  end
  return table.concat(out)
end

-- fix_surrogates(text) -> JSON text in which every lone UTF-16 surrogate
-- escape (`\ud800` without its pair, or a stray low half) is replaced by
-- `\ufffd`, so the text decodes. Pairs and escaped backslashes are kept.
function M.fix_surrogates(text)
  if not text:find("\\u[dD][89a-fA-F]") then return text end
  local out, pos, i = {}, 1, 1
  while true do
    local s, e = text:find("\\+u[dD][89a-fA-F]%x%x", i)
    if not s then break end
    local u = e - 4 -- the 'u'
    i = e + 1
    if (u - s) % 2 == 1 then -- an odd run of backslashes: a real escape
      local code = tonumber(text:sub(u + 1, e), 16)
      if code < 0xDC00 and text:find("^\\u[dD][c-fC-F]%x%x", e + 1) then
        i = e + 7 -- a high half followed by its low half: a pair
      else
        out[#out + 1] = text:sub(pos, u - 2)
        out[#out + 1] = "\\ufffd"
        pos = e + 1
      end
    end
  end
  out[#out + 1] = text:sub(pos)
  return table.concat(out)
end

-- quote(s) -> the JSON string literal of `s` (as encode writes it):
-- '"', '\\' and control bytes escaped (\n, \t, ... where JSON has a short
-- form, else \u00XX), and every byte that does not start a valid UTF-8
-- sequence written as U+FFFD, so every line luagent writes is valid UTF-8.
-- In C (host/jsonw.c): one pass, one string.
local quote = core.json_quote
M.quote = quote

-- How non-finite numbers encode: nil raises (request bodies must not
-- change meaning silently); "null" writes null (event lines).
local nonfinite = nil

-- Integers exactly; floats as the shortest text that reads back equal.
local function number(x)
  if math.type(x) == "integer" then return string.format("%d", x) end
  if x ~= x or x == math.huge or x == -math.huge then
    if nonfinite == "null" then return "null" end
    error("json.encode: cannot encode a non-finite number", 0)
  end
  for digits = 15, 17 do
    local s = string.format("%." .. digits .. "g", x)
    if tonumber(s) == x then return s end
  end
end

-- "array" and its length, or "object", for a table.
local function kind_of(t)
  if getmetatable(t) == M.array_mt or t == cjson.empty_array then return "array", #t end
  if key_order[t] then return "object" end
  local n = 0
  for k in pairs(t) do
    if math.type(k) ~= "integer" or k < 1 then return "object" end
    n = n + 1
  end
  if n > 0 and n == #t then return "array", n end
  return "object"
end

local encode

-- Appends the JSON of table `t` to `buf`.
local function encode_table(t, buf, depth)
  if getmetatable(t) == RAW_MT then
    buf[#buf + 1] = t[1]
    return
  end
  if depth > 200 then error("json.encode: nesting too deep (cycle?)", 0) end
  local kind, n = kind_of(t)
  if kind == "array" then
    buf[#buf + 1] = "["
    for i = 1, n do
      if i > 1 then buf[#buf + 1] = "," end
      encode(t[i], buf, depth + 1)
    end
    buf[#buf + 1] = "]"
    return
  end
  local keys = key_order[t]
  if not keys then
    keys = {}
    for k in pairs(t) do
      local tk = type(k)
      if tk ~= "string" and tk ~= "number" then
        error("json.encode: cannot encode a " .. tk .. " key", 0)
      end
      keys[#keys + 1] = tostring(k)
    end
    table.sort(keys)
  end
  buf[#buf + 1] = "{"
  for i, k in ipairs(keys) do
    local v = t[k]
    if v == nil then v = t[tonumber(k)] end
    if i > 1 then buf[#buf + 1] = "," end
    buf[#buf + 1] = quote(k)
    buf[#buf + 1] = ":"
    encode(v, buf, depth + 1)
  end
  buf[#buf + 1] = "}"
end

-- Appends the JSON of any encodable value to `buf`.
function encode(v, buf, depth)
  local tv = type(v)
  if tv == "string" then buf[#buf + 1] = quote(v)
  elseif tv == "number" then buf[#buf + 1] = number(v)
  elseif tv == "boolean" then buf[#buf + 1] = v and "true" or "false"
  elseif v == nil or v == M.null then buf[#buf + 1] = "null"
  elseif tv == "table" then encode_table(v, buf, depth)
  else error("json.encode: cannot encode a " .. tv, 0)
  end
end

-- Encodes `v` as compact JSON text; functions raise, and so do non-finite
-- numbers unless opts.nonfinite = "null" (then they are written as null).
function M.encode(v, opts)
  local buf = {}
  nonfinite = opts and opts.nonfinite
  local ok, err = pcall(encode, v, buf, 0)
  nonfinite = nil
  if not ok then error(err, 0) end
  return table.concat(buf)
end

-- Decodes `text` with cjson decoder `d`: the value, or nil and cjson's
-- message. Lone surrogate escapes decode as U+FFFD (M.fix_surrogates).
local function decode_with(d, text)
  local ok, v = pcall(d.decode, text)
  if ok then return v end
  local fixed = M.fix_surrogates(text)
  if fixed ~= text then
    ok, v = pcall(d.decode, fixed)
    if ok then return v end
  end
  return nil, tostring(v)
end

-- Decodes JSON text: the value, or nil and cjson's message. Lone surrogate
-- escapes decode as U+FFFD (M.fix_surrogates); other bytes pass as sent.
function M.decode(text)
  return decode_with(decoder, text)
end

-- The decoder of decode_strict: NaN, Infinity and hex numbers, which cjson
-- takes by default, are not JSON.
local strict_decoder = cjson.new()
strict_decoder.decode_invalid_numbers(false)

-- Path of a child: a.b, a[2] (as the schema checker names fields).
local function child(path, k)
  if math.type(k) == "integer" then return path .. "[" .. k .. "]" end
  return path .. "." .. tostring(k)
end

-- Where the first number of decoded value `v` that is not finite (1e999
-- decodes as inf) is, as a path suffix (".a[2]"; "" for `v` itself), or
-- nil. Paths are made only for the number found.
local function nonfinite_at(v)
  if type(v) == "number" then
    if v ~= v or v == math.huge or v == -math.huge then return "" end
  elseif type(v) == "table" then
    for k, x in pairs(v) do
      local at = nonfinite_at(x)
      if at then return child("", k) .. at end
    end
  end
  return nil
end

-- The path of an open object or array of duplicate_key.
local function path_of(frame, root)
  if not frame.up then return root end
  return child(path_of(frame.up, root), frame.name)
end

-- The first object key that valid JSON `text` gives twice, and the path of
-- its object, or nil. One pass over the structure, strings skipped whole.
local function duplicate_key(text, root)
  -- escapes blanked (same length): every '"' left delimits a string
  local bare = text:gsub("\\.", "__")
  local top -- the innermost open object or array: {seen=<keys, objects only>, key=, index=, name=, up=}
  local pos = 1
  while true do
    local s, _, c = bare:find('([{}%[%]",])', pos)
    if not s then return nil end
    pos = s + 1
    if c == '"' then
      local e = bare:find('"', s + 1, true)
      pos = e + 1
      if top and top.seen and bare:find("^%s*:", pos) then
        local key = text:sub(s + 1, e - 1)
        if key:find("\\", 1, true) then key = decode_with(strict_decoder, text:sub(s, e)) or key end
        if top.seen[key] then return key, path_of(top, root) end
        top.seen[key], top.key = true, key
      end
    elseif c == "{" or c == "[" then
      local name = top and (top.seen and top.key or top.index)
      top = { seen = c == "{" and {} or nil, index = 1, name = name, up = top }
    elseif c == "," then
      top.index = top.index + 1
    else
      top = top.up
    end
  end
end

-- decode_strict(text [, root]) -> value | nil, message: decodes JSON text
-- whose value is checked and then passed on as text (tool arguments), so
-- that every reader of the text gets the value that was checked. Refused,
-- beyond what decode refuses: NaN, Infinity and hex numbers (not JSON), a
-- number out of range (1e999: "root.i: not a finite number ...") and an
-- object key given twice (cjson keeps the last value, other readers the
-- first or both: 'root.opts: key "path" is given twice'). `root` names the
-- value in messages ("value" when absent).
function M.decode_strict(text, root)
  root = root or "value"
  local v, err = decode_with(strict_decoder, text)
  if v == nil and err then return nil, err end
  local at = nonfinite_at(v)
  if at then return nil, root .. at .. ": not a finite number (JSON numbers must fit a double)" end
  local key, path = duplicate_key(text, root)
  if key then return nil, string.format("%s: key %s is given twice", path, quote(key)) end
  return v
end

-- integerize(v) -> v: cjson decodes every number as a float; tools, token
-- counts and replayed values want 3, not 3.0. Turns integral floats into
-- integers throughout `v` (in place).
function M.integerize(v)
  if type(v) == "number" then return math.tointeger(v) or v end
  if type(v) == "table" then
    for k, x in next, v do v[k] = M.integerize(x) end
  end
  return v
end

return M
