-- Retry policies: plain Lua files that return a table (policies/README.md
-- documents every field). This module loads a file safely (text only, a
-- fresh small environment, an instruction limit), checks every field, fills
-- in defaults, computes the wait before a retry, and keeps the last good
-- version of a file across reloads.
local core = require "luagent.core"
local errors = require "luagent.base.errors"
local compact = require "luagent.model.compact"
local redis = require "luagent.model.endpoint.redis"
local sandbox = require "luagent.base.sandbox"
local options = require "luagent.base.options"

local M = {}

-- Bounds of user code (policies/README.md, "What a hook may do"): the
-- instructions, wall-clock seconds and net bytes of running a policy file,
-- and of one call of one hook. The file itself may be at most max_bytes.
M.limits = { load = 1000000, hook = 100000, load_wall = 0.5, hook_wall = 0.1,
             memory = 32 * 1024 * 1024, max_bytes = 1024 * 1024 }

-- Where a bare name ("yoagent") is looked for, as in package.path: the
-- current folder, then the bundled policies wherever this library lives (a
-- checkout or `make install`: ROOT/policies beside ROOT/lua/luagent; a rock:
-- luagent/policies inside the Lua tree). This is the default:
-- luagent.configure{policy_path=} (lua/luagent/config.lua) replaces it.
local here = (debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$")) or "."
local lib = here:match("^(.*)/[^/]*$") or "." -- lua/luagent, above model/
M.path = "policies/?.lua;" .. lib .. "/../../policies/?.lua;" .. lib .. "/policies/?.lua"

---A retry policy: what a policy file returns, or a table given as
---`policy`. Every field is optional (policies/README.md documents each);
---an unknown field is an error naming it.
---@class luagent.Policy
---@field name string? shown in logs and errors (default: the file's base name)
---@field description string? one line saying what the policy is for
---@field max_retries integer? retries after the first attempt (default 5)
---@field backoff {strategy: string?, base: number?, max: number?, multiplier: number?, jitter: number?}? the wait between attempts ("full_jitter", "equal_jitter", "decorrelated_jitter", "exponential", "power_of_two", "fixed", "sdk")
---@field retry_after {honor: boolean?, max_wait: number|false?, jitter: number?, over_max: "give_up"|"cap"|"backoff"?}? when the server names its wait
---@field attempt_timeout number|false? seconds for one attempt (600)
---@field idle_timeout number|false? the longest silence inside one attempt (120)
---@field total_deadline number|false? seconds for every attempt and wait of one call (1800)
---@field max_answer_bytes integer|false? the event data one answer may stream (64 MiB)
---@field unusable_retries integer? retries of an empty or unusable reply (1)
---@field retry_statuses (integer|string)[]? when present, exactly the HTTP statuses retried (`{429, "5xx"}`)
---@field honor_x_should_retry boolean? let a response's `x-should-retry` decide
---@field traceparent boolean? send each attempt's W3C traceparent header
---@field breaker table|false? the endpoint's circuit breaker: `consecutive`, `ratio`, `window`, `min_calls`, `open_for`, `growth`, `open_max`, `probe_timeout`
---@field budget table|false? the endpoint's retry budget: `max`, `ratio`
---@field cooldown table|false? the endpoint's cooldown after a server-given wait: `jitter`
---@field shared {redis: string, prefix: string?, timeout: number?}? share the endpoint's state between hosts through Redis
---@field tool table? how agents run tools: `max_retries`, `backoff`, `timeout`, `grace`, `max_memory`, `max_result_bytes`, `trust_hints`, `overrides`
---@field classify (fun(err: table, ctx: table): string|table|nil)|function[]? a class for a failure the rules do not know
---@field on_retry fun(info: table)? called before each wait (metrics)
---@field redact fun(text: string): string? what the log may show of message content
---@field on_context_overflow string|fun(ctx: table): luagent.Message[]? shorten the conversation after a context overflow ("drop_oldest" ships)
---@field fallback_on_permanent boolean|string[]? a call with fallback models falls back after these permanent classes too ("auth", "client", "context_overflow", "payment", "permanent"), or every one (true); default false

-- What a field is when a policy leaves it out. These are the values of
-- policies/default.lua, which says why each was chosen.
M.defaults = {
  max_retries = 5,
  backoff = { strategy = "full_jitter", base = 1, max = 30 },
  retry_after = { honor = true, max_wait = 60, jitter = 1, over_max = "give_up" },
  attempt_timeout = 600,
  idle_timeout = 120,
  total_deadline = 1800,
  max_answer_bytes = 64 * 1024 * 1024,
  honor_x_should_retry = false,
  unusable_retries = 1,
  -- shared per endpoint by every call of the runtime (lua/luagent/model/endpoint/init.lua);
  -- a policy's table is laid over these, a key left out of both is the
  -- endpoint's own default, false turns the piece off
  breaker = { consecutive = 10 },
  budget = { max = 20 },
  cooldown = {},
  -- tool calls (lua/luagent/agent/tools/init.lua): retries of read_only / idempotent
  -- tools, the default timeout, the bound on a result's size, and on what a
  -- Lua tool may add to the heap over its call
  tool = {
    max_retries = 2,
    backoff = { strategy = "full_jitter", base = 0.5, max = 10 },
    timeout = 60,
    grace = 2,
    max_result_bytes = 64 * 1024,
    max_memory = 256 * 1024 * 1024,
    -- MCP tool annotations (lua/luagent/mcp/): whose hints become flags
    trust_hints = false,
  },
}

-- The permanent classes of the classifier (lua/luagent/model/classify.lua,
-- M.classes: those not retried, but cancelled, which never falls back, and
-- unusable and deadline, which do) that the policy's fallback_on_permanent
-- may name: a call with fallback models then goes on with the next one
-- after such a failure too (lua/luagent/model/call.lua, falls_back).
M.permanent_classes = { "auth", "client", "context_overflow", "payment", "permanent" }
local PERMANENT = {}
for _, c in ipairs(M.permanent_classes) do PERMANENT[c] = true end

-- Per-strategy parameters used when a policy names a strategy but leaves a
-- parameter out; each is the reading of the system the strategy comes from.
M.strategy_defaults = {
  exponential = { base = 1, max = 30, multiplier = 2, jitter = 0.2 }, -- yoagent
  full_jitter = { base = 1, max = 30 },                               -- the book
  equal_jitter = { base = 1, max = 30 },
  decorrelated_jitter = { base = 1, max = 30 },                       -- AWS
  power_of_two = { base = 1, max = 60 },                              -- axon
  fixed = { base = 1 },
  sdk = { base = 0.5, max = 8, jitter = 0.25 },                       -- the SDKs
}

-- Normalized policies carry this metatable, so M.new can pass them through.
local Policy = { __name = "luagent.Policy" }

------------------------------------------------------------------------------
-- Running user code within bounds (lua/luagent/base/sandbox.lua)
------------------------------------------------------------------------------

-- Runs fn(...) in the sandbox: `limit` is a number of instructions (a hook:
-- M.limits.hook_wall, M.limits.memory) or a table {instructions=, wall=,
-- memory=}. The arguments are handed over as plain, bounded copies
-- (sandbox.plain). Returns true and fn's results, or false and a message
-- starting with "file:line:" when the position is known: fn raised, passed
-- a bound (pcall inside fn cannot swallow that) or tried to wait.
function M.run_limited(fn, limit, ...)
  local limits = type(limit) == "table" and limit
    or { instructions = limit, wall = M.limits.hook_wall, memory = M.limits.memory }
  local args = table.pack(...)
  for i = 1, args.n do args[i] = sandbox.plain(args[i]) end
  limits.who = "policy code"
  return sandbox.call(fn, args, limits)
end

------------------------------------------------------------------------------
-- Checking fields
------------------------------------------------------------------------------

local function finite(v)
  return type(v) == "number" and v == v and v ~= math.huge and v ~= -math.huge
end

local function is_function_list(v)
  if type(v) == "function" then return true end
  if type(v) ~= "table" then return false end
  local n = 0
  for _ in next, v do n = n + 1 end
  for i = 1, n do
    if type(rawget(v, i)) ~= "function" then return false end
  end
  return true
end

local function is_status_list(v)
  if type(v) ~= "table" then return false end
  local n = 0
  for _ in next, v do n = n + 1 end
  for i = 1, n do
    local s = rawget(v, i)
    local ok = (math.type(s) == "integer" and s >= 100 and s <= 599)
      or (type(s) == "string" and s:match("^[1-5]xx$"))
    if not ok then return false end
  end
  return true
end

-- The sane range of numbers in a policy: every duration is at most
-- MAX_SECONDS (about 11.6 days), every count at most MAX_COUNT, so no value
-- overflows a format, a timer or the attempt arithmetic.
M.MAX_SECONDS = 1000000
M.MAX_COUNT = 1000

-- A check that v is a number in [lo, hi] (lo excluded when `above`), whole
-- when `whole`; `what` says what was expected.
local function number_in(lo, hi, what, above, whole)
  return function(v)
    local ok = finite(v) and (above and v > lo or not above and v >= lo) and v <= hi
      and (not whole or v % 1 == 0)
    return ok, what
  end
end

-- The same check, also accepting false (for "none").
local function or_false(number_check, what)
  return function(v) return v == false or (number_check(v)), what end
end

local S = M.MAX_SECONDS

-- Each check returns whether v is acceptable, and what was expected.
local check = {
  string = function(v) return type(v) == "string", "a string" end,
  boolean = function(v) return type(v) == "boolean", "true or false" end,
  fn = function(v) return type(v) == "function", "a function" end,
  count = number_in(0, M.MAX_COUNT, "a whole number from 0 to " .. M.MAX_COUNT, false, true),
  seconds = number_in(0, S, "a number of seconds from 0 to " .. S),
  positive = number_in(0, 1000, "a number > 0, at most 1000", true),
  fraction = number_in(0, 1, "a number from 0 to 1"),
  timeout = or_false(number_in(0, S, "", true), "a number of seconds > 0 (at most " .. S .. "), or false for none"),
  limit = or_false(number_in(0, S, ""), "a number of seconds from 0 to " .. S .. ", or false for none"),
  bytes = function(v)
    return v == false or (math.type(v) == "integer" and v >= 1024 and v <= 1 << 40),
      "a whole number of bytes from 1024 to 2^40, or false for no limit"
  end,
  table = function(v) return type(v) == "table", "a table" end,
  table_or_false = function(v) return v == false or type(v) == "table", "a table, or false for none" end,
  hooks = function(v) return is_function_list(v), "a function or a list of functions" end,
  statuses = function(v)
    return is_status_list(v), 'a list of HTTP statuses (100..599) or classes like "5xx"'
  end,
  strategy = function(v)
    return M.strategy_defaults[v] ~= nil,
      'one of "exponential", "full_jitter", "equal_jitter", "decorrelated_jitter", '
      .. '"power_of_two", "fixed", "sdk"'
  end,
  overflow = function(v)
    local names = {}
    for k in pairs(compact.strategies) do names[#names + 1] = ("%q"):format(k) end
    table.sort(names)
    return type(v) == "function" or compact.strategies[v] ~= nil,
      "a function or the name of a shipped strategy (" .. table.concat(names, ", ") .. ")"
  end,
  trust = function(v)
    local ok = type(v) == "boolean"
    if type(v) == "table" then
      ok = #v > 0
      for k, name in pairs(v) do
        if math.type(k) ~= "integer" or type(name) ~= "string" then ok = false end
      end
    end
    return ok, "true, false, or a list of MCP server names"
  end,
  overrides = function(v)
    local ok = type(v) == "table"
    for name, f in pairs(ok and v or {}) do
      if type(name) ~= "string" or type(f) ~= "table" then ok = false break end
      for k, x in pairs(f) do
        if (k ~= "read_only" and k ~= "idempotent") or type(x) ~= "boolean" then ok = false end
      end
    end
    return ok, "a table {tool_name = {read_only = true|false, idempotent = true|false}}"
  end,
  fallback_classes = function(v)
    local ok = type(v) == "boolean"
    if type(v) == "table" then
      local n = 0
      for _ in next, v do n = n + 1 end
      ok = n > 0
      for i = 1, n do
        if not PERMANENT[rawget(v, i)] then ok = false end
      end
    end
    return ok, "true, false, or a list of permanent classes (" .. table.concat(M.permanent_classes, ", ") .. ")"
  end,
  over_max = function(v)
    return v == "give_up" or v == "cap" or v == "backoff", '"give_up", "cap" or "backoff"'
  end,
}

-- The fields a policy may have, by level, with their checks.
local FIELDS = {
  name = check.string, description = check.string,
  max_retries = check.count, unusable_retries = check.count,
  attempt_timeout = check.timeout, idle_timeout = check.timeout,
  total_deadline = check.timeout, max_answer_bytes = check.bytes,
  honor_x_should_retry = check.boolean,
  retry_statuses = check.statuses,
  backoff = check.table, retry_after = check.table,
  classify = check.hooks, on_retry = check.fn, on_context_overflow = check.overflow,
  breaker = check.table_or_false, budget = check.table_or_false, cooldown = check.table_or_false,
  tool = check.table,
  shared = check.table_or_false,
  redact = check.fn, traceparent = check.boolean,
  fallback_on_permanent = check.fallback_classes,
}
-- shared = {redis = "redis://HOST:PORT/DB", prefix = "luagent:", timeout = 0.25}
local SHARED_FIELDS = {
  redis = function(v)
    local ok, why = redis.parse_url(v)
    return ok ~= nil, why
  end,
  prefix = check.string, timeout = check.positive,
}
local TOOL_FIELDS = {
  max_retries = check.count, backoff = check.table, timeout = check.positive,
  grace = check.seconds, max_result_bytes = check.count, max_memory = check.bytes,
  trust_hints = check.trust, overrides = check.overrides,
}
local BACKOFF_FIELDS = {
  strategy = check.strategy, base = check.seconds, max = check.seconds,
  multiplier = check.positive, jitter = check.fraction,
}
local RETRY_AFTER_FIELDS = {
  honor = check.boolean, max_wait = check.limit, jitter = check.seconds,
  over_max = check.over_max,
}
-- The shared protection (lua/luagent/model/endpoint/init.lua); the C constructors
-- then check how the fields fit together (min_calls <= window, ...).
local BREAKER_FIELDS = {
  consecutive = number_in(0, 1000000, "a whole number from 0 to 1000000", false, true),
  ratio = number_in(0, 1, "a number > 0, at most 1", true),
  window = number_in(0, 1024, "a whole number from 0 to 1024", false, true),
  min_calls = number_in(1, 1024, "a whole number from 1 to 1024", false, true),
  open_for = number_in(0, S, "a number of seconds > 0 (at most " .. S .. ")", true),
  open_max = number_in(0, S, "a number of seconds > 0 (at most " .. S .. ")", true),
  growth = number_in(1, 1000, "a number from 1 to 1000"),
  probe_timeout = number_in(0, S, "a number of seconds > 0 (at most " .. S .. ")", true),
  -- not the endpoint's: each call's own (M.new keeps it apart, as wait_for_probe)
  wait_for_probe = check.boolean,
}
-- The keys of a policy's breaker table that are each call's own, not the
-- endpoint's: left out of what configures the endpoint's breaker.
local CALL_BREAKER_KEYS = { wait_for_probe = true }
local BUDGET_FIELDS = {
  max = number_in(0.001, 1000000, "a number from 0.001 to 1000000"),
  ratio = number_in(0.001, 1000000, "a number from 0.001 to 1000000 (and at most max)"),
}
local COOLDOWN_FIELDS = {
  jitter = number_in(0, 10, "a number from 0 to 10"),
}

-- The line of `text` that assigns the field at `path` ({"retry_after",
-- "jitter"}): each key is looked for ("key =") after the line of the one
-- before, so a nested field is found inside its own table. nil if not found.
local function line_of(text, path)
  if not text then return nil end
  local lines = {}
  for line in (text .. "\n"):gmatch("([^\n]*)\n") do lines[#lines + 1] = line .. " " end
  local n = 1
  for _, key in ipairs(path) do
    if type(key) ~= "string" then return nil end
    local pattern = "%f[%w_]" .. key:gsub("%p", "%%%0") .. "%s*=[^=]"
    while lines[n] and not lines[n]:find(pattern) do n = n + 1 end
    if not lines[n] then return nil end
  end
  return n
end

-- A "usage" error record whose message is "file:line: msg" (line when found).
local function invalid(source, text, path, msg)
  local line = line_of(text, path)
  local where = line and (source .. ":" .. line) or source
  return errors.new("usage", where .. ": " .. msg, { file = source, line = line })
end

-- Checks every field of t against `fields`; keys are visited in sorted order
-- so the first error reported does not depend on hashing. `parent` is the
-- key of the table t sits in, or nil at the top.
local function check_fields(t, fields, parent, source, text)
  local prefix = parent and (parent .. ".") or ""
  local function path(k)
    local p = {}
    for part in (parent or ""):gmatch("[^.]+") do p[#p + 1] = part end
    p[#p + 1] = k
    return p
  end
  local keys = {}
  for k in next, t do keys[#keys + 1] = k end
  table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
  for _, k in ipairs(keys) do
    local name = prefix .. tostring(k)
    local check_field = fields[k]
    if not check_field then
      local known = {}
      for f in pairs(fields) do known[#known + 1] = f end
      table.sort(known)
      local near = options.nearest(k, known)
      return nil, invalid(source, text, path(k), "unknown field '" .. name .. "' "
        .. (near and "(did you mean '" .. prefix .. near .. "'?)" or "(policies/README.md lists the fields)"))
    end
    local v = rawget(t, k)
    local ok, want = check_field(v)
    if not ok then
      local got = type(v) == "string" and ("%q"):format(v) or tostring(v)
      return nil, invalid(source, text, path(k), name .. " must be " .. want .. " (got " .. got .. ")")
    end
  end
  return true
end

------------------------------------------------------------------------------
-- Building a policy
------------------------------------------------------------------------------

local function pick(v, default)
  if v == nil then return default end
  return v
end

-- The backoff table with every parameter the C side reads filled in.
local function fill_backoff(b)
  b = b or M.defaults.backoff
  local strategy = b.strategy or M.defaults.backoff.strategy
  local d = M.strategy_defaults[strategy]
  return {
    strategy = strategy,
    base = pick(b.base, d.base),
    max = pick(b.max, pick(d.max, 30)),
    multiplier = pick(b.multiplier, pick(d.multiplier, 2)),
    jitter = pick(b.jitter, pick(d.jitter, 0)),
  }
end

local function fill_retry_after(r)
  local d = M.defaults.retry_after
  r = r or d
  return {
    honor = pick(r.honor, d.honor),
    max_wait = pick(r.max_wait, d.max_wait),
    jitter = pick(r.jitter, d.jitter),
    over_max = pick(r.over_max, d.over_max),
  }
end

-- A protection table (breaker, budget, cooldown): false stays false, nil
-- takes the default, a table is laid over the default (a fresh copy). The
-- keys in `leave` (a call's own, not the endpoint's) are left out.
local function fill_protection(v, default, leave)
  if v == false then return false end
  local out = {}
  if type(default) == "table" then for k, x in pairs(default) do out[k] = x end end
  if type(v) == "table" then for k, x in pairs(v) do out[k] = x end end
  for k in pairs(leave or {}) do out[k] = nil end
  return out
end

-- The tool section with every field filled in (policy defaults first).
function M.tool_section(t)
  local d = M.defaults.tool
  t = t or d
  return {
    max_retries = pick(t.max_retries, d.max_retries),
    backoff = fill_backoff(t.backoff or d.backoff),
    timeout = pick(t.timeout, d.timeout),
    grace = pick(t.grace, d.grace),
    max_result_bytes = pick(t.max_result_bytes, d.max_result_bytes),
    max_memory = pick(t.max_memory, d.max_memory),
    trust_hints = pick(t.trust_hints, d.trust_hints),
    overrides = t.overrides or {},
  }
end

-- Checks a tool section given on its own (an agent's tool_policy): returns
-- the filled section, or nil and a "usage" error record.
function M.check_tool_section(t, source)
  source = source or "tool_policy"
  if type(t) ~= "table" then return nil, errors.new("usage", source .. " must be a table") end
  local ok, err = check_fields(t, TOOL_FIELDS, nil, source)
  if ok and t.backoff then ok, err = check_fields(t.backoff, BACKOFF_FIELDS, "backoff", source) end
  if not ok then return nil, err end
  return M.tool_section(t)
end

local function basename(source)
  return (source:match("([^/\\]+)%.lua$") or source)
end

-- A copy of t read with next/rawget only, `depth` levels deep (tables
-- below are copied too), so checking and using it runs no metamethod.
local function raw_copy(t, depth)
  local c = {}
  for k, v in next, t do
    if depth > 1 and type(v) == "table" then v = raw_copy(v, depth - 1) end
    c[k] = v
  end
  return c
end

-- The nested tables of a policy and their fields.
local PARTS = {
  { "backoff", BACKOFF_FIELDS }, { "retry_after", RETRY_AFTER_FIELDS },
  { "breaker", BREAKER_FIELDS }, { "budget", BUDGET_FIELDS }, { "cooldown", COOLDOWN_FIELDS },
}

-- Builds the breaker and the budget once, as the endpoint will, so how
-- their fields fit together (min_calls <= window, ratio <= max) is checked
-- at load, with the file's line.
local function check_protection(t, source, text)
  for _, part in ipairs({ { "breaker", core.breaker }, { "budget", core.retry_budget } }) do
    local name, make = part[1], part[2]
    if type(t[name]) == "table" then
      local cfg = {}
      for k, v in pairs(t[name]) do
        if not (name == "breaker" and CALL_BREAKER_KEYS[k]) then cfg[k] = v end
      end
      local ok, msg = pcall(make, cfg)
      if not ok then
        local field = tostring(msg):match("config%.([%w_]+)")
        local what = tostring(msg):match("config%.(.*)$") or tostring(msg)
        return nil, invalid(source, text, { name, field }, name .. "." .. what)
      end
    end
  end
  return true
end

-- The set of classes fallback_on_permanent names (true: every one), or
-- false when it names none.
local function fallback_set(v)
  if not v then return false end
  local set = {}
  for _, c in ipairs(v == true and M.permanent_classes or v) do set[c] = true end
  return set
end

-- Checks a policy table and returns a new, complete one (every field set;
-- `classify` always a list). `source` names it in errors (a file path, or
-- "policy table"); `text` is the file's text, used to find line numbers.
-- A table that is already a policy is returned as is. Returns nil, err (a
-- "usage" record, message "source[:line]: what is wrong") when invalid.
function M.new(t, source, text)
  if type(t) ~= "table" then
    error("policy.new: expected a table, got " .. type(t), 2)
  end
  if getmetatable(t) == Policy then return t end
  source = source or "policy table"
  t = raw_copy(t, 2) -- read once, raw: no metamethod of the caller's tables runs later
  local ok, err = check_fields(t, FIELDS, nil, source, text)
  for _, part in ipairs(PARTS) do
    local name, fields = part[1], part[2]
    if ok and type(t[name]) == "table" then
      ok, err = check_fields(t[name], fields, name, source, text)
    end
  end
  if ok and t.tool then
    ok, err = check_fields(t.tool, TOOL_FIELDS, "tool", source, text)
    if ok and t.tool.backoff then
      ok, err = check_fields(t.tool.backoff, BACKOFF_FIELDS, "tool.backoff", source, text)
    end
  end
  if ok then ok, err = check_protection(t, source, text) end
  if ok and t.shared then
    ok, err = check_fields(t.shared, SHARED_FIELDS, "shared", source, text)
    if ok and t.shared.redis == nil then
      ok, err = nil, invalid(source, text, { "shared" }, "shared.redis is required (a redis://HOST:PORT/DB URL)")
    end
  end
  if not ok then return nil, err end
  local D = M.defaults
  local hooks = t.classify
  if type(hooks) == "function" then hooks = { hooks } end
  return setmetatable({
    name = t.name or basename(source),
    description = t.description,
    source = source,
    max_retries = pick(t.max_retries, D.max_retries),
    backoff = fill_backoff(t.backoff),
    retry_after = fill_retry_after(t.retry_after),
    attempt_timeout = pick(t.attempt_timeout, D.attempt_timeout),
    idle_timeout = pick(t.idle_timeout, D.idle_timeout),
    total_deadline = pick(t.total_deadline, D.total_deadline),
    max_answer_bytes = pick(t.max_answer_bytes, D.max_answer_bytes),
    retry_statuses = t.retry_statuses and table.move(t.retry_statuses, 1, #t.retry_statuses, 1, {}),
    honor_x_should_retry = pick(t.honor_x_should_retry, D.honor_x_should_retry),
    unusable_retries = pick(t.unusable_retries, D.unusable_retries),
    classify = hooks or {},
    on_retry = t.on_retry,
    on_context_overflow = type(t.on_context_overflow) == "string"
      and compact.hook(t.on_context_overflow) or t.on_context_overflow,
    breaker = fill_protection(t.breaker, D.breaker, CALL_BREAKER_KEYS),
    -- a call the open breaker refuses waits for the probe (call.lua)
    wait_for_probe = type(t.breaker) == "table" and t.breaker.wait_for_probe or false,
    budget = fill_protection(t.budget, D.budget),
    cooldown = fill_protection(t.cooldown, D.cooldown),
    tool = M.tool_section(t.tool),
    shared = t.shared and { redis = t.shared.redis, prefix = t.shared.prefix, timeout = t.shared.timeout }
      or t.shared, -- nil: LUAGENT_REDIS_URL decides; false: local state only
    redact = t.redact,
    traceparent = t.traceparent or false,
    -- the permanent classes that fall back (a set), or false for none
    fallback_on_permanent = fallback_set(t.fallback_on_permanent),
  }, Policy)
end

-- Lua shortens long chunk names to "...tail" in messages; put the full path
-- back so the report names the file the user edits.
local function full_path(msg, path)
  local tail, rest = msg:match("^%.%.%.(.-)(:%d+:.*)$")
  if tail and path:sub(-#tail) == tail then return path .. rest end
  return msg
end

-- Loads the policy file at `path`: read as text, run in a fresh sandbox
-- under M.limits.load instructions, checked and completed by M.new. Returns
-- the policy, or nil and a "usage" error record whose message is
-- "path:line: message" (path alone when no line applies).
function M.load(path)
  local function fail(msg)
    msg = full_path(msg, path)
    if msg:sub(1, #path + 1) ~= path .. ":" then msg = path .. ": " .. msg end
    return nil, errors.new("usage", msg, { file = path, line = tonumber(msg:match(":(%d+):")) })
  end
  -- bounded as tool files are: a regular file of at most max_bytes, opened
  -- without waiting (a FIFO or a device named like a policy cannot hold
  -- the loop, nor a huge file its memory)
  local text, rerr = sandbox.read_file(path, M.limits.max_bytes)
  if not text then return fail(rerr) end
  local chunk, perr = load(text, "@" .. path, "t", sandbox.env())
  if not chunk then return fail(perr) end
  local ok, result = M.run_limited(chunk, { instructions = M.limits.load,
    wall = M.limits.load_wall, memory = M.limits.memory })
  if not ok then return fail(result) end
  if type(result) ~= "table" then
    return fail("a policy file must return a table (it returned " .. type(result) .. ")")
  end
  return M.new(result, path, text)
end

-- The file for a policy name: a path (with a slash or ending in ".lua") as
-- is, a bare name ("yoagent") through `path` (a search path as
-- package.path; default M.path). Returns nil, message if absent.
function M.find(name, path)
  if name:find("[/\\]") or name:find("%.lua$") then return name end
  return package.searchpath(name, path or M.path)
end

-- names(path) -> the sorted names a bare name can take along search path
-- `path` (default M.path): the files each template's folder holds that
-- fit it ("policies/?.lua" -> the NAME of every policies/NAME.lua).
function M.names(path)
  local seen, out = {}, {}
  for template in (path or M.path):gmatch("[^;]+") do
    local dir, head, tail = template:match("^(.-)([^/]*)%?([^/]*)$")
    if dir and not dir:find("?", 1, true) then
      for _, file in ipairs(core.list_dir(dir == "" and "." or dir) or {}) do
        local name = #file > #head + #tail and file:sub(1, #head) == head and file:sub(-#tail) == tail
          and file:sub(#head + 1, #file - #tail)
        if name and not seen[name] and not name:find("[/\\]") then
          seen[name] = true
          out[#out + 1] = name
        end
      end
    end
  end
  table.sort(out)
  return out
end

-- unknown_name(name, path) -> the message for a bare name found nowhere
-- along `path`: where it was looked for and the names there are.
function M.unknown_name(name, path)
  path = path or M.path
  local names = M.names(path)
  return "no policy named '" .. name .. "' (looked in " .. path .. "); "
    .. (#names > 0 and "policies there: " .. table.concat(names, ", ") or "no policy is there")
end

------------------------------------------------------------------------------
-- The wait before a retry
------------------------------------------------------------------------------

-- The wait in seconds before retry number `retry` (1-based) under policy p,
-- and where it came from: "server" or "backoff". `retry_after` is the
-- server's requested wait (the classifier's decision.retry_after) or nil;
-- `random` is U in [0, 1] or a luagent.Rng; `prev` is the previous delay
-- (decorrelated jitter only). When the server asks for longer than the policy
-- will wait and over_max is "give_up", returns nil and a message saying both
-- numbers ("server asked for 600 s; policy waits at most 60 s").
function M.delay(p, retry, retry_after, random, prev)
  local perr
  p, perr = M.new(p)
  if not p then error("policy.delay: " .. perr.message, 2) end
  local ra = p.retry_after
  if retry_after and ra.honor then
    local wait, verdict = core.backoff_server_wait(retry_after, ra, random)
    if wait then return wait, "server" end
    if verdict == "give_up" then
      return nil, ("server asked for %g s; policy waits at most %g s"):format(retry_after, ra.max_wait)
    end
  end
  local b = p.backoff
  return core.backoff_delay(b.strategy, retry, b, random, prev), "backoff"
end

------------------------------------------------------------------------------
-- A policy file that reloads
------------------------------------------------------------------------------

local Loader = {}
Loader.__index = Loader

-- A loader for the file at `path`. It loads the file now; :get() returns
-- the last good policy (or `fallback`, a policy, until one loaded), and
-- :reload() reads the file again, keeping the previous policy when the new
-- text fails. loader.error is the last failure (nil after a good load),
-- loader.version counts good loads and loader.reads every reading of the
-- file, good or not. Returns the loader, and the error when the first load
-- failed. M.watched(path) is a loader that also watches.
function M.loader(path, fallback)
  if fallback ~= nil then
    fallback = assert(M.new(fallback, "fallback policy"))
  end
  local self = setmetatable({ path = path, policy = fallback, version = 0, reads = 0 }, Loader)
  local _, err = self:reload()
  return self, err
end

function Loader:get()
  return self.policy
end

-- Reads and checks the file: the policy, or nil and the error; the loader's
-- policy does not change (:apply does).
function Loader:read()
  self.reads = self.reads + 1
  return M.load(self.path)
end

-- Makes what :read() gave the loader's state: a policy becomes the one in
-- force; an error is kept as loader.error (the old policy stays). Returns
-- its arguments.
function Loader:apply(p, err)
  if not p then
    self.error = err
    return nil, err
  end
  self.policy, self.error, self.version = p, nil, self.version + 1
  return p
end

-- Returns the new policy, or nil and the error (the old policy stays).
function Loader:reload()
  return self:apply(self:read())
end

------------------------------------------------------------------------------
-- A runtime's policies: watched files, names found, the configured policy
------------------------------------------------------------------------------

local Cache = {}
Cache.__index = Cache

-- cache(settings, diag) -> the policy cache of a runtime: the loaders of the
-- files its calls use (each loaded once and watched), the file each name
-- was found as, the default policy (settings' `policy`) and search path
-- (`policy_path`); a broken edit of a watched file is reported to diag.
function M.cache(settings, diag)
  return setmetatable({ settings = settings, diag = diag, loaders = {}, found = {} }, Cache)
end

-- Where bare names are looked for: the configured policy_path, else M.path.
function Cache:search_path()
  return self.settings:get("policy_path") or M.path
end

-- How a watched policy file is read after a change, in seconds: once it
-- has been quiet for `debounce` (a save is a burst of changes); and a text
-- that fails is taken for a write under way for `settle` more, while
-- another change may still come. Writing a file in place (`cat > f`, an
-- editor that keeps the file's inode) first truncates it, then writes it:
-- read between the two, it is empty, which is no policy, yet nothing is
-- wrong. A failure that no change follows within `settle` is reported.
M.watch_timing = { debounce = 0.05, settle = 1, poll = 0.05 }

-- Waits until watcher `w` has seen no change for `quiet` seconds.
local function quiet_for(w, quiet)
  repeat
    core.sleep(quiet)
    local more = w:pending() > 0
    if more then w:wait() end
  until not more
end

-- Whether watcher `w` sees a change within `seconds` (polled every `step`).
local function changes_within(w, seconds, step)
  local waited = 0
  while waited < seconds do
    if w:pending() > 0 then return true end
    core.sleep(step)
    waited = waited + step
  end
  return w:pending() > 0
end

-- Starts a daemon task that reloads `loader` whenever its file changes and
-- reports a broken edit once per change (level warn), keeping the previous
-- policy; a text that fails while the file is still being written (more
-- changes follow within M.watch_timing.settle) is not reported: the next
-- reading is.
function Cache:watch(loader)
  local w = core.watch(loader.path)
  if not w then return end
  local diag = self.diag
  local timing = M.watch_timing
  local task = core.spawn(function()
    while true do
      w:wait()
      quiet_for(w, timing.debounce)
      local p, err = loader:read()
      while not p and changes_within(w, timing.settle, timing.poll) do
        w:wait()
        quiet_for(w, timing.debounce)
        p, err = loader:read()
      end
      loader:apply(p, err)
      if err then
        diag:write("warn", "policy " .. tostring(err.message) .. " (the previous policy stays in force)")
      end
    end
  end)
  task:set_daemon(true)
  loader.watcher = task
end

-- cache:watched(path) -> the loader of the policy file `path`, loaded once
-- per runtime and watched: an edit applies to the next attempt of every
-- call using it. A first load that fails raises its error record.
function Cache:watched(path)
  local l = self.loaders[path]
  if l then return l end
  local loader, err = M.loader(path)
  if err then error(err, 0) end
  self.loaders[path] = loader
  self:watch(loader)
  return loader
end

-- cache:resolve(spec [, level [, api]]) -> something whose :get() is the
-- policy in force for `spec`: a name or a file (its watched loader), a
-- table (checked now), an object with :get() (as is), or nil (the
-- configured policy, else the default). Raises a "usage" record for a name
-- found nowhere, or the table's error. `api` is the name of the function
-- the user called ("stream"; default "resolve"), which prefixes the error;
-- `level` says whose line a wrong type's error names: 1 (default)
-- resolve's caller, 2 that caller's caller. A name's file is found once per
-- search path: package.searchpath opens every candidate, which is not to
-- be done for every call.
function Cache:resolve(spec, level, api)
  level = level or 1
  local prefix = api and api .. ": " or "resolve: "
  if spec == nil then spec = self.settings:get("policy") end
  if type(spec) == "table" and spec.get then return spec end
  if type(spec) == "table" then
    local p, err = M.new(spec, "policy table")
    if not p then error(err, 0) end
    return { get = function() return p end }
  end
  if type(spec) ~= "string" then
    error(prefix .. "policy must be a name, a file or a table", level + 1)
  end
  local where = self:search_path()
  local names = self.found[where]
  if not names then
    names = {}
    self.found[where] = names
  end
  local path = names[spec] or M.find(spec, where)
  if not path then
    error(errors.new("usage", prefix .. M.unknown_name(spec, where)), 0)
  end
  names[spec] = path
  return self:watched(path)
end

-- cache:redact(text) -> `text` passed through the redact hook of the
-- configured policy (a log line's content), under the hook limits; `text`
-- as is when that policy has no hook. Raises what the hook raised.
function Cache:redact(text)
  local ok, holder = pcall(self.resolve, self)
  local p = ok and holder:get()
  if not (type(p) == "table" and p.redact) then return text end
  local good, out = M.run_limited(p.redact, M.limits.hook, text)
  if not good then error(out, 0) end
  return out
end

-- cache:forget(path): stops watching the policy file `path` and forgets its
-- loader (specs; an embedder that is done with a file).
function Cache:forget(path)
  self.found = {} -- a name may now be found elsewhere
  local l = self.loaders[path]
  if not l then return end
  if l.watcher then l.watcher:cancel("policy forgotten") end
  self.loaders[path] = nil
end

-- cache:close(): stops every watcher; the runtime closes.
function Cache:close()
  for path in pairs(self.loaders) do self:forget(path) end
end

return M
