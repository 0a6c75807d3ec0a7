-- Shared protection per provider endpoint: one circuit breaker, one retry
-- budget (both in C: host/breaker.c, host/budget.c) and one cooldown, shared
-- by every agent of a runtime that calls the same endpoint (a runtime's
-- registry, lua/luagent/model/endpoint/registry.lua, holds them; Redis
-- shares them between runtimes and hosts, lua/luagent/model/endpoint/redis.lua). Pure Lua with
-- time passed in (`now`, seconds on any clock), so specs drive it.
--
-- An attempt goes through an endpoint like this:
--
--   local wait = ep:cooldown_wait(now, u)     -- sleep `wait` first, if > 0
--   local ok, probe_or_err, events = ep:admit(is_retry, now)
--   if not ok then fail the call with probe_or_err (not retried) end
--   ... the attempt ...
--   events = ep:record(now, success, counted, probe_or_err)
--   -- before waiting to retry a failure (admit checks it again then):
--   local ok, err = ep:may_retry(cause)
--   -- on a 429 or 503 with a server-given wait:
--   events = ep:set_cooldown(now + wait)
--
-- Every method that can change state returns the list of events it caused
-- (possibly empty), for the caller to put on its event bus:
--   {type="circuit_open", endpoint=, open_until=, trips=}
--   {type="circuit_half_open", endpoint=}   (the first probe was handed out)
--   {type="circuit_close", endpoint=}
--   {type="retry_budget_exhausted", endpoint=, tokens=} (retries just stopped)
--   {type="cooldown", endpoint=, cooldown_until=}  (the cooldown was extended)
--
-- A call refused by the open breaker may wait for the probe instead of
-- failing (a policy's breaker.wait_for_probe, lua/luagent/model/call.lua):
--   local changed = ep:wait_change(seconds)   -- then admit again
-- returns early when a result recorded in this process changed the
-- breaker (it closed, it reopened, a probe's slot was freed).
--
-- The methods of an endpoint are its whole interface, so a second backend
-- (state shared between hosts through a store) can stand in for this one.
local core = require "luagent.core"
local errors = require "luagent.base.errors"

local M = {}

-- Default fraction of the remaining cooldown over which callers are released.
M.default_jitter = 0.25

local Endpoint = {}
Endpoint.__index = Endpoint
Endpoint.__name = "luagent.Endpoint"
M.Endpoint = Endpoint -- the in-process state's methods (a second backend builds on them)

-- Raises "endpoint.<fn>: <what>", blaming the code `depth` calls above the
-- function that called misuse (1: its caller).
local function misuse(fn, what, depth)
  error("endpoint." .. fn .. ": " .. what, 2 + depth)
end

-- Checks that `now` is a number (not NaN) and remembers the latest one, the
-- time health() reads the state at when given none.
function Endpoint:_see(fn, now)
  if type(now) ~= "number" or now ~= now then misuse(fn, "now must be a number", 2) end
  if not self.seen or now > self.seen then self.seen = now end
end

-- The key of a base URL, or of a base URL and a model ("base|model"), for
-- providers whose limits are per model.
function M.key(base_url, model)
  if model then return base_url .. "|" .. model end
  return base_url
end

-- Checks opts = {breaker=, budget=, cooldown={jitter=}} and returns the
-- cooldown jitter; the C constructors check their own tables.
function M.check_opts(opts)
  if opts == nil then return M.default_jitter end
  if type(opts) ~= "table" then misuse("get", "opts must be a table", 2) end
  for k in pairs(opts) do
    if k ~= "breaker" and k ~= "budget" and k ~= "cooldown" and k ~= "shared" then
      misuse("get", "unknown option '" .. tostring(k) .. "'", 2)
    end
  end
  local cd = opts.cooldown
  if cd == nil or cd == false then return M.default_jitter end
  if type(cd) ~= "table" then misuse("get", "cooldown must be a table", 2) end
  for k in pairs(cd) do
    if k ~= "jitter" then misuse("get", "unknown option 'cooldown." .. tostring(k) .. "'", 2) end
  end
  local j = cd.jitter
  if j == nil then return M.default_jitter end
  if type(j) ~= "number" or not (j >= 0) or j == math.huge then
    misuse("get", "cooldown.jitter must be a finite number >= 0", 2)
  end
  return j
end

-- The in-process state of `key`: a new endpoint, registered nowhere.
function M.new_local(key, opts, jitter)
  local b, bu = opts and opts.breaker, opts and opts.budget
  return setmetatable({
    key = key,
    breaker = b ~= false and core.breaker(b) or nil,
    budget = bu ~= false and core.retry_budget(bu) or nil,
    jitter = jitter,
    cooldown_until = nil, -- no cooldown yet
    seen = nil,           -- the latest `now` seen
    waiters = {},         -- the sleeping tasks of calls waiting for a change (wait_change)
  }, Endpoint)
end

------------------------------------------------------------------------------
-- Admission
------------------------------------------------------------------------------

-- May this attempt go now? A retry (is_retry) first needs the retry budget,
-- checked first so a refused retry never takes the breaker's probe slot;
-- then every attempt needs the breaker.
-- Returns true, probe (true for the breaker's one half-open probe: pass it
-- back to record), events; or nil, err, events with err of kind
-- "retry_budget_exhausted" (field tokens) or "circuit_open" (field
-- retry_at, when the next probe is due). Both errors are final for the
-- call (retryable = false).
function Endpoint:admit(is_retry, now)
  self:_see("admit", now)
  local key, events = self.key, {}
  local refusal = is_retry and self:_budget_refusal()
  if refusal then return nil, refusal, events end
  if not self.breaker then return true, false, events end
  local verdict, refused, moved = self.breaker:allow(now)
  if moved then events[1] = { type = "circuit_half_open", endpoint = key } end
  if not verdict then
    return nil, M.open_error(key, now, refused.retry_at, self.breaker:state(now) == "half_open"), events
  end
  return true, verdict == "probe", events
end

-- The retry budget's refusal (an error of kind "retry_budget_exhausted",
-- final for the call), or nil when a retry may go. `cause`, the failed
-- attempt's error, is named in the message and kept as err.cause.
function Endpoint:_budget_refusal(cause)
  if not self.budget or self.budget:allow_retry() then return nil end
  local tokens, max = self.budget:tokens()
  return M.budget_error(self.key, tokens, max, cause)
end

-- May a failed attempt be retried, as far as the retry budget goes? (Asked
-- before waiting to retry, so a refused retry does not wait for nothing.)
-- Returns true, or nil and the refusal, with the failed attempt's error
-- `cause` as its cause.
function Endpoint:may_retry(cause)
  local refusal = self:_budget_refusal(cause)
  if refusal then return nil, refusal end
  return true
end

-- The error of a retry the budget of `key` refused (final for the call);
-- `cause`, the failed attempt's error, is named in the message and kept as
-- err.cause. Both backends (this one and endpoint/redis.lua) make it here.
function M.budget_error(key, tokens, max, cause)
  local msg = string.format("retry budget of %s exhausted: %g of %g tokens, retries need more than %g",
    key, tokens, max, max / 2)
  if cause ~= nil then msg = msg .. "; the attempt failed with " .. tostring(cause) end
  return errors.new("retry_budget_exhausted", msg,
    { endpoint = key, tokens = tokens, retryable = false, cause = cause })
end

-- The error of a call the open breaker of `key` refused at `now`, the next
-- probe being due at `retry_at` (final for the call). `probe_out`: refused
-- because another caller's probe is out (half open; `retry_at` is when its
-- slot frees if it never reports), not because the open time runs.
function M.open_error(key, now, retry_at, probe_out)
  local msg = string.format("circuit open for %s: next probe due in %.3f s (at %.3f)",
    key, retry_at - now, retry_at)
  return errors.new("circuit_open", msg, { endpoint = key, retry_at = retry_at, retryable = false,
    probe_out = probe_out or nil })
end

------------------------------------------------------------------------------
-- Waiting for the breaker
------------------------------------------------------------------------------

-- The cancellation reason that wakes a waiter (wait_change).
local CHANGED = setmetatable({}, { __tostring = function() return "the endpoint's breaker changed" end })

-- Suspends the caller until the breaker changes in this process (M.wakes:
-- it closed, reopened, or a probe's slot was freed) or `seconds` pass;
-- true when a change woke it. The caller's own cancellation raises, as any
-- wait's. The wait is a sleeping task the endpoint holds (self.waiters)
-- and cancels to wake it: a timer, so the virtual clock jumps over it.
function Endpoint:wait_change(seconds)
  if type(seconds) ~= "number" or not (seconds >= 0) then
    misuse("wait_change", "seconds must be a number >= 0", 1)
  end
  local sleeper = core.spawn(function() core.sleep(seconds) end)
  local waiters = self.waiters
  waiters[sleeper] = true
  local ok, err = pcall(sleeper.join, sleeper)
  waiters[sleeper] = nil
  if ok then return false end
  if type(err) == "table" and err.reason == CHANGED then return true end
  sleeper:cancel() -- the caller was cancelled: its sleeper goes with it
  error(err, 0)
end

-- Whether a result's events (and a probe's slot freed) may let a waiter
-- go, or change how long it waits.
function M.wakes(events, released)
  if released then return true end
  for _, e in ipairs(events) do
    local t = e.type
    if t == "circuit_close" or t == "circuit_open" or t == "circuit_half_open" then return true end
  end
  return false
end

-- Wakes every waiter of wait_change (each admits again).
function Endpoint:_wake()
  local waiters = self.waiters
  if not next(waiters) then return end
  self.waiters = {}
  for sleeper in pairs(waiters) do sleeper:cancel(CHANGED) end
end

------------------------------------------------------------------------------
-- Results
------------------------------------------------------------------------------

-- The event for a breaker transition name ("open", "half_open", "close").
function Endpoint:_transition(now, name)
  if name == "open" then
    local _, c = self.breaker:state(now)
    return { type = "circuit_open", endpoint = self.key, open_until = c.open_until, trips = c.trips }
  elseif name == "half_open" then
    return { type = "circuit_half_open", endpoint = self.key }
  end
  return { type = "circuit_close", endpoint = self.key }
end

-- Records an admitted attempt's result: ok, or a failure that `counted`
-- (it says something about the provider: not an auth error, not the
-- caller's cancellation, not a context overflow). Successes earn budget
-- tokens and feed the breaker; counted failures cost a token and feed the
-- breaker; other failures change nothing, except that a probe's slot is
-- freed so the next caller may probe at once. `was_probe` is the second
-- value admit returned; when nil, a result recorded while the half-open
-- probe is out is taken to be the probe's. Returns the events it caused.
function Endpoint:record(now, ok, counted, was_probe)
  self:_see("record", now)
  local events = {}
  if not self.breaker then was_probe = false end
  if was_probe == nil then
    local state, c = self.breaker:state(now)
    was_probe = state == "half_open" and c.probe_out
  end
  if not ok and not counted then
    if was_probe then
      self.breaker:release()
      self:_wake() -- a waiter may probe now
    end
    return events
  end
  if not self.budget then -- nothing to spend or earn
  elseif ok then
    self.budget:success()
  elseif self.budget:failure() then
    events[#events + 1] = { type = "retry_budget_exhausted", endpoint = self.key,
                            tokens = (self.budget:tokens()) }
  end
  local moved = self.breaker and self.breaker:record(now, ok, was_probe)
  if moved then
    events[#events + 1] = self:_transition(now, moved)
    self:_wake()
  end
  return events
end

------------------------------------------------------------------------------
-- Cooldown
------------------------------------------------------------------------------

-- A server-given wait (429 or 503 with Retry-After): every caller of this
-- endpoint holds new attempts until `until_time`. The later of two
-- cooldowns wins. Returns {cooldown event} when it extended the cooldown,
-- else an empty list.
function Endpoint:set_cooldown(until_time)
  if type(until_time) ~= "number" or until_time ~= until_time then
    misuse("set_cooldown", "until must be a number", 1)
  end
  if self.cooldown_until and until_time <= self.cooldown_until then return {} end
  self.cooldown_until = until_time
  return { { type = "cooldown", endpoint = self.key, cooldown_until = until_time } }
end

-- Seconds this caller should hold before its attempt: 0 without a cooldown
-- (none set, or over at `now`); otherwise, with r = cooldown_until - now,
--   r * (1 + jitter * U)
-- so the callers held by one cooldown are released over [until, until +
-- jitter * r] instead of all in the same instant, and never before the
-- server's time. U is a number in [0, 1] or anything with :next() (a
-- core.backoff_rng). After the sleep, ask again: it is 0 unless the cooldown
-- was extended meanwhile.
function Endpoint:cooldown_wait(now, u)
  self:_see("cooldown_wait", now)
  local r = self.cooldown_until and self.cooldown_until - now or 0
  if not (r > 0) then return 0 end
  if type(u) ~= "number" and (type(u) == "userdata" or type(u) == "table") and u.next then
    u = u:next()
  end
  if type(u) ~= "number" or not (u >= 0 and u <= 1) then
    misuse("cooldown_wait", "u must be a number in [0, 1] or a random generator", 1)
  end
  return r * (1 + self.jitter * u)
end

------------------------------------------------------------------------------
-- Inspection
------------------------------------------------------------------------------

-- This endpoint's row of health(): see M.health. The breaker's state is read
-- at `now`, or at the latest time the endpoint was given.
function Endpoint:snapshot(now)
  local state, c = "none", {}
  if self.breaker then state, c = self.breaker:state(now or self.seen or -math.huge) end
  local tokens, max
  if self.budget then tokens, max = self.budget:tokens() end
  return {
    state = state, failures = c.failures, consecutive = c.consecutive,
    calls = c.calls, trips = c.trips, probe_out = c.probe_out,
    open_until = c.open_until, tokens = tokens, max_tokens = max,
    cooldown_until = self.cooldown_until, backend = "local",
  }
end

return M
