-- The fault spec language of `--faults` (documented for users in
-- lua/luagent/mock/help.lua):
--
--   spec   = fault { ("," | ";") fault }
--   fault  = NAME { ":" ARG } [ "@" SCOPE ]
--   ARG    = KEY "=" VALUE | WORD
--   SCOPE  = N | N "-" M | "every:" K | "p:" X     (no scope: every request)
--
-- parse() turns a spec into a list of faults; pick() chooses the fault for
-- one request (first match wins). Probabilities use a counter-based
-- generator keyed by (seed, request number, fault position), so a run is
-- reproducible whatever order concurrent requests arrive in.
local errors = require "luagent.base.errors"

local M = {}

------------------------------------------------------------------------------
-- Argument types
------------------------------------------------------------------------------

-- Each returns the parsed value, or nil when the text is not of the type.
local types = {}

function types.seconds(s)
  local n = tonumber(s)
  if s:match("^%d+%.?%d*$") and n and n >= 0 then return n end
end

function types.count(s)
  if s:match("^%d+$") then return math.tointeger(tonumber(s)) end
end

function types.offset(s)
  local n = s:match("^%+?(%d+%.?%d*)$")
  return n and tonumber(n)
end

function types.bool(s)
  if s == "true" then return true elseif s == "false" then return false end
end

function types.word(s)
  if s:match("^[%a_][%w_]*$") then return s end
end

-- What each argument type looks like, for error messages.
local expected = {
  seconds = "seconds, like 2 or 0.5", count = "a whole number", bool = "true or false",
  offset = "seconds from now, like +5", word = "a name like overloaded_error",
}

------------------------------------------------------------------------------
-- The faults
------------------------------------------------------------------------------

-- Per fault kind: `args` maps KEY to its type, `flags` lists the bare words
-- it takes, `word` names the argument a bare word of type word fills.
-- Status faults (any 400-599 number) share the "status" entry.
M.kinds = {
  status = {
    args = { ["retry-after"] = "seconds", ["retry-after-ms"] = "count",
      ["retry-after-date"] = "offset", ["x-should-retry"] = "bool" },
    flags = { overflow = true, ["in-flight"] = true },
  },
  close = {},
  reset = { args = { bytes = "count" } },
  stall = { args = { secs = "seconds", after = "count" } },
  ["stream-error"] = { args = { type = "word", after = "count" }, word = "type" },
  cut = { flags = { finished = true } },
  ["bad-json"] = {},
  empty = {},
  leak = {},
}

-- Defaults filled in after parsing.
local defaults = {
  reset = { bytes = 0 },
  stall = { secs = 30 },
  ["stream-error"] = { type = "overloaded_error", after = 1 },
}

-- Which flags need which status.
local flag_status = { overflow = { [400] = true, [413] = true }, ["in-flight"] = { [402] = true } }

------------------------------------------------------------------------------
-- Parsing
------------------------------------------------------------------------------

-- A usage error: `message` followed by the spec it is about.
local function usage(spec, message, fields)
  return errors.new("usage", message .. " in --faults '" .. spec .. "'", fields)
end

-- Parses a scope (the text after "@"): a table {kind="one"|"range"|"every"|"p"}
-- or nil when malformed. Numbers too large for an integer are malformed.
local function parse_scope(s)
  local function int(d) return d and math.tointeger(tonumber(d)) end
  local n = int(s:match("^(%d+)$"))
  if n then
    if n >= 1 then return { kind = "range", from = n, to = n } end
    return nil
  end
  local a, b = s:match("^(%d+)%-(%d+)$")
  a, b = int(a), int(b)
  if a and b then
    if a >= 1 and b >= a then return { kind = "range", from = a, to = b } end
    return nil
  end
  local k = int(s:match("^every:(%d+)$"))
  if k then
    if k >= 1 then return { kind = "every", k = k } end
    return nil
  end
  local p = s:match("^p:(%d*%.?%d+)$")
  if p then
    p = tonumber(p)
    if p and p >= 0 and p <= 1 then return { kind = "p", p = p } end
  end
  return nil
end

-- Parses one fault item; the fault table, or nil, err.
local function parse_item(item, spec)
  local head, scope_text = item:match("^([^@]*)@(.*)$")
  head = head or item
  local parts = {}
  for part in (head .. ":"):gmatch("([^:]*):") do parts[#parts + 1] = part end
  local name = parts[1]
  local fault = { name = name, text = item, args = {} }
  local status = name:match("^%d%d%d$") and math.tointeger(tonumber(name))
  if status and status >= 400 and status <= 599 then
    fault.kind, fault.status = "status", status
  elseif M.kinds[name] and name ~= "status" then
    fault.kind = name
  else
    return nil, usage(spec, "unknown fault '" .. name .. "'", { fault = name })
  end
  local def = M.kinds[fault.kind]
  for i = 2, #parts do
    local arg = parts[i]
    local key, value = arg:match("^([%w%-_]+)=(.*)$")
    if key then
      local ty = def.args and def.args[key]
      if not ty then
        return nil, usage(spec, "unknown argument '" .. key .. "' for fault '" .. name .. "'",
          { fault = name, argument = key })
      end
      local v = types[ty](value)
      if v == nil then
        return nil, usage(spec, "bad argument '" .. arg .. "' for fault '" .. name
          .. "' (expected " .. key .. "=<" .. expected[ty] .. ">)", { fault = name, argument = key })
      end
      fault.args[key] = v
    elseif def.flags and def.flags[arg] then
      local needs = flag_status[arg]
      if needs and not needs[fault.status] then
        return nil, usage(spec, "argument '" .. arg .. "' does not apply to fault '" .. name .. "'",
          { fault = name, argument = arg })
      end
      fault.args[arg] = true
    elseif def.word and types.word(arg) then
      fault.args[def.word] = arg
    else
      return nil, usage(spec, "unknown argument '" .. arg .. "' for fault '" .. name .. "'",
        { fault = name, argument = arg })
    end
  end
  for k, v in pairs(defaults[fault.kind] or {}) do
    if fault.args[k] == nil then fault.args[k] = v end
  end
  if scope_text then
    fault.scope = parse_scope(scope_text)
    if not fault.scope then
      return nil, usage(spec, "bad scope '@" .. scope_text .. "' for fault '" .. name
        .. "' (expected @N, @N-M, @every:K or @p:X with X in 0..1)",
        { fault = name, scope = scope_text })
    end
  else
    fault.scope = { kind = "all" }
  end
  return fault
end

-- Parses a fault spec. Returns the list of faults (empty for an empty or
-- nil spec), or nil, err (kind "usage") naming the bad fault, argument or
-- scope. Each fault is {kind=, name=, text=, status=<for status faults>,
-- args={...}, scope={kind="all"|"range"|"every"|"p", ...}}.
function M.parse(spec)
  local list = {}
  if spec == nil then return list end
  if type(spec) ~= "string" then error("faults.parse: spec must be a string", 2) end
  for item in (spec .. ","):gmatch("([^,;]*)[,;]") do
    item = item:match("^%s*(.-)%s*$")
    if item ~= "" then
      local fault, err = parse_item(item, spec)
      if not fault then return nil, err end
      list[#list + 1] = fault
    end
  end
  return list
end

------------------------------------------------------------------------------
-- Selection
------------------------------------------------------------------------------

-- splitmix64 finalizer: a well-mixed 64-bit integer from any integer.
local function mix(x)
  x = x + 0x9e3779b97f4a7c15
  x = (x ~ (x >> 30)) * 0xbf58476d1ce4e5b9
  x = (x ~ (x >> 27)) * 0x94d049bb133111eb
  return x ~ (x >> 31)
end

local Rng = {}
Rng.__index = Rng

-- A seeded generator. rng:float(a, b) is a number in [0, 1) that depends
-- only on the seed and the integers a and b; rng:next() draws the next one
-- of a plain sequence.
function M.rng(seed)
  seed = math.tointeger(seed or 0) or error("faults.rng: seed must be an integer", 2)
  return setmetatable({ seed = seed, counter = 0 }, Rng)
end

function Rng:float(a, b)
  local x = mix(mix(mix(self.seed) ~ (a or 0)) ~ (b or 0))
  return (x >> 11) * (1.0 / 9007199254740992.0)
end

function Rng:next()
  self.counter = self.counter + 1
  return self:float(-1, self.counter)
end

-- True when `fault`, at position i in its list, applies to request n.
local function applies(fault, i, n, rng)
  local s = fault.scope
  if s.kind == "all" then return true
  elseif s.kind == "range" then return n >= s.from and n <= s.to
  elseif s.kind == "every" then return n % s.k == 0
  end
  return rng:float(n, i) < s.p
end

-- The fault that applies to request n (1-based), or nil. The first match in
-- list order wins. `rng` (from M.rng) decides @p: scopes; default seed 0.
function M.pick(list, n, rng)
  rng = rng or M.rng(0)
  for i, fault in ipairs(list or {}) do
    if applies(fault, i, n, rng) then return fault end
  end
  return nil
end

return M
