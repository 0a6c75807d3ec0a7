-- Retry policies: plain Lua files that return a table (policies/README.md
-- documents every field). This module loads a file safely (text only, a
-- fresh small environment, an instruction limit), checks every field, fills
-- in defaults, computes the wait before a retry, and keeps the last good
-- version of a file across reloads.
local core = require "luagent.core"
local errors = require "luagent.errors"
local compact = require "luagent.compact"

local M = {}

-- Instruction limits: running a policy file, and one call of one hook.
M.limits = { load = 1000000, hook = 100000 }

-- Where a bare name ("yoagent") is looked for, as in package.path: the
-- current folder, then the bundled policies wherever this library lives (a
-- checkout or `make install`: ROOT/policies beside ROOT/lua/luagent; a rock:
-- luagent/policies inside the Lua tree).
local here = (debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$")) or "."
M.path = "policies/?.lua;" .. here .. "/../../policies/?.lua;" .. here .. "/policies/?.lua"

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
  -- shared per endpoint by every call of the process (lua/luagent/endpoint.lua);
  -- a policy's table is laid over these, a key left out of both is the
  -- endpoint's own default, false turns the piece off
  breaker = { consecutive = 10 },
  budget = { max = 20 },
  cooldown = {},
  -- tool calls (lua/luagent/tools.lua): retries of read_only / idempotent
  -- tools, the default timeout, the bound on a result's size
  tool = {
    max_retries = 2,
    backoff = { strategy = "full_jitter", base = 0.5, max = 10 },
    timeout = 60,
    grace = 2,
    max_result_bytes = 64 * 1024,
  },
}

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
-- Running user code under a limit
------------------------------------------------------------------------------

-- "file:line: " of a stack level (from debug.getinfo with "Sl"), or "".
local function position(info)
  if not info or info.currentline < 0 then return "" end
  local src = info.source:sub(1, 1) == "@" and info.source:sub(2) or info.short_src
  return src .. ":" .. info.currentline .. ": "
end

-- True when an error message already starts with "file:line:".
local function has_position(msg)
  return msg:match("^[^\n]-:%d+:") ~= nil
end

-- The message of an error value, with the failing position added from the
-- dead coroutine's stack when the message has none (error("x", 0), tables).
local function error_message(co, e)
  local mt = getmetatable(e)
  local msg = type(e) == "string" and e
    or (mt and mt.__tostring and tostring(e))
    or ("error object is a " .. type(e) .. " value")
  if has_position(msg) then return msg end
  for level = 0, 50 do
    local info = debug.getinfo(co, level, "Sl")
    if not info then break end
    if info.currentline >= 0 then return position(info) .. msg end
  end
  return msg
end

-- Runs fn(...) as a coroutine under an instruction limit, so user code can
-- neither loop forever nor take the host down. Returns true and fn's
-- results, or false and a message starting with "file:line:" when the
-- position is known. Once the limit is hit, every further instruction raises
-- the same error, so a pcall inside the user's code cannot swallow it. A
-- function that yields (tries to wait) is stopped too.
function M.run_limited(fn, limit, ...)
  local co = coroutine.create(fn)
  local stopped
  local function stop()
    stopped = stopped or position(debug.getinfo(2, "Sl"))
      .. "instruction limit (" .. limit .. ") exceeded"
    debug.sethook(co, stop, "", 1)
    error(stopped, 0)
  end
  debug.sethook(co, stop, "", limit)
  local res = table.pack(coroutine.resume(co, ...))
  if not res[1] then return false, stopped or error_message(co, res[2]) end
  if coroutine.status(co) == "suspended" then
    local where = position(debug.getinfo(co, 1, "Sl"))
    coroutine.close(co)
    return false, where .. "policy code may not wait (it yielded)"
  end
  return true, table.unpack(res, 2, res.n)
end

------------------------------------------------------------------------------
-- The environment a policy file runs in
------------------------------------------------------------------------------

local function copy(t, except)
  local c = {}
  for k, v in pairs(t) do
    if not (except and except[k]) then c[k] = v end
  end
  return c
end

-- A fresh environment per load: pure functions and copies of the pure
-- libraries. Left out: io, os (but time/clock/date/difftime), require, load,
-- dofile, debug, coroutine, package, print (stdout may carry JSON events),
-- collectgarbage, getmetatable (it reaches the shared string metatable) and
-- math.randomseed (host state). It guards against accidents, not against a
-- hostile author: a policy is the user's own code.
local function sandbox()
  local env = {
    assert = assert, error = error, ipairs = ipairs, next = next,
    pairs = pairs, pcall = pcall, xpcall = xpcall, select = select,
    tonumber = tonumber, tostring = tostring, type = type,
    rawequal = rawequal, rawget = rawget, rawlen = rawlen, rawset = rawset,
    setmetatable = setmetatable,
    string = copy(string), table = copy(table), utf8 = copy(utf8),
    math = copy(math, { randomseed = true }),
    os = { time = os.time, clock = os.clock, date = os.date, difftime = os.difftime },
  }
  env._G = env
  return env
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
  for _ in pairs(v) do n = n + 1 end
  for i = 1, n do
    if type(v[i]) ~= "function" then return false end
  end
  return true
end

local function is_status_list(v)
  if type(v) ~= "table" then return false end
  local n = 0
  for _ in pairs(v) do n = n + 1 end
  for i = 1, n do
    local s = v[i]
    local ok = (math.type(s) == "integer" and s >= 100 and s <= 599)
      or (type(s) == "string" and s:match("^[1-5]xx$"))
    if not ok then return false end
  end
  return true
end

-- Each check returns whether v is acceptable, and what was expected.
local check = {
  string = function(v) return type(v) == "string", "a string" end,
  boolean = function(v) return type(v) == "boolean", "true or false" end,
  fn = function(v) return type(v) == "function", "a function" end,
  count = function(v)
    return finite(v) and v >= 0 and v % 1 == 0, "a whole number >= 0"
  end,
  seconds = function(v) return finite(v) and v >= 0, "a number of seconds >= 0" end,
  positive = function(v) return finite(v) and v > 0, "a number > 0" end,
  fraction = function(v) return finite(v) and v >= 0 and v <= 1, "a number from 0 to 1" end,
  timeout = function(v)
    return v == false or (finite(v) and v > 0), "a number of seconds > 0, or false for none"
  end,
  limit = function(v)
    return v == false or (finite(v) and v >= 0), "a number of seconds >= 0, or false for none"
  end,
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
  redact = check.fn, traceparent = check.boolean,
}
local TOOL_FIELDS = {
  max_retries = check.count, backoff = check.table, timeout = check.positive,
  grace = check.seconds, max_result_bytes = check.count,
}
local BACKOFF_FIELDS = {
  strategy = check.strategy, base = check.seconds, max = check.seconds,
  multiplier = check.positive, jitter = check.fraction,
}
local RETRY_AFTER_FIELDS = {
  honor = check.boolean, max_wait = check.limit, jitter = check.seconds,
  over_max = check.over_max,
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
  for k in pairs(t) do keys[#keys + 1] = k end
  table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
  for _, k in ipairs(keys) do
    local name = prefix .. tostring(k)
    local check_field = fields[k]
    if not check_field then
      return nil, invalid(source, text, path(k), "unknown field '" .. name
        .. "' (policies/README.md lists the fields)")
    end
    local ok, want = check_field(t[k])
    if not ok then
      local got = type(t[k]) == "string" and ("%q"):format(t[k]) or tostring(t[k])
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
-- takes the default, a table is laid over the default (a fresh copy).
local function fill_protection(v, default)
  if v == false then return false end
  local out = {}
  if type(default) == "table" then for k, x in pairs(default) do out[k] = x end end
  if type(v) == "table" then for k, x in pairs(v) do out[k] = x end end
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
  local ok, err = check_fields(t, FIELDS, nil, source, text)
  if ok and t.backoff then
    ok, err = check_fields(t.backoff, BACKOFF_FIELDS, "backoff", source, text)
  end
  if ok and t.retry_after then
    ok, err = check_fields(t.retry_after, RETRY_AFTER_FIELDS, "retry_after", source, text)
  end
  if ok and t.tool then
    ok, err = check_fields(t.tool, TOOL_FIELDS, "tool", source, text)
    if ok and t.tool.backoff then
      ok, err = check_fields(t.tool.backoff, BACKOFF_FIELDS, "tool.backoff", source, text)
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
    classify = hooks and table.move(hooks, 1, #hooks, 1, {}) or {},
    on_retry = t.on_retry,
    on_context_overflow = type(t.on_context_overflow) == "string"
      and compact.hook(t.on_context_overflow) or t.on_context_overflow,
    breaker = fill_protection(t.breaker, D.breaker),
    budget = fill_protection(t.budget, D.budget),
    cooldown = fill_protection(t.cooldown, D.cooldown),
    tool = M.tool_section(t.tool),
    redact = t.redact,
    traceparent = t.traceparent or false,
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
  local f, oerr = io.open(path, "rb")
  if not f then return fail(oerr) end
  local text = f:read("a")
  f:close()
  local chunk, perr = load(text, "@" .. path, "t", sandbox())
  if not chunk then return fail(perr) end
  local ok, result = M.run_limited(chunk, M.limits.load)
  if not ok then return fail(result) end
  if type(result) ~= "table" then
    return fail("a policy file must return a table (it returned " .. type(result) .. ")")
  end
  return M.new(result, path, text)
end

-- The file for a policy name: a path (with a slash or ending in ".lua") as
-- is, a bare name ("yoagent") through M.path. Returns nil, message if absent.
function M.find(name)
  if name:find("[/\\]") or name:find("%.lua$") then return name end
  return package.searchpath(name, M.path)
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
-- text fails. loader.error is the last failure (nil after a good load) and
-- loader.version counts good loads. Returns the loader, and the error when
-- the first load failed. Watching the file is the caller's job.
function M.loader(path, fallback)
  if fallback ~= nil then
    fallback = assert(M.new(fallback, "fallback policy"))
  end
  local self = setmetatable({ path = path, policy = fallback, version = 0 }, Loader)
  local _, err = self:reload()
  return self, err
end

function Loader:get()
  return self.policy
end

-- Returns the new policy, or nil and the error (the old policy stays).
function Loader:reload()
  local p, err = M.load(self.path)
  if not p then
    self.error = err
    return nil, err
  end
  self.policy, self.error, self.version = p, nil, self.version + 1
  return p
end

return M
