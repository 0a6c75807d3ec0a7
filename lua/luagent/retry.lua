-- The retry loop: one model call, attempted until it succeeds, fails for
-- good, or runs out of attempts or time. Each step is an event, in an order
-- frozen by spec/retry_spec.lua and documented in EVENTS.md:
--
--   attempt events ... message_end{stop_reason="error", error_message=
--   "attempt N of M failed and will be retried: <error>"} (only if the attempt had
--   opened a message), provider_retry{attempt, max_attempts, error,
--   delay_ms}, stream_reset (before the next attempt's first event, if an
--   earlier attempt had streamed anything), attempt events ..., message_end.
--
-- Events of the shared endpoint (circuit_*, retry_budget_exhausted,
-- cooldown) come after the failed attempt's message_end, before its
-- provider_retry. The final failure is never followed by provider_retry; it
-- ends the stream with message_end{stop_reason="error", error=<record>,
-- final=true}. Cancellation ends the call at once with a final
-- message_end{stop_reason="aborted"} and then raises `cancelled`
-- (cancellation always raises); during a backoff, no further request is sent.
local luagent_core = require "luagent.core"
local errors = require "luagent.errors"
local classify = require "luagent.classify"
local policies = require "luagent.policy"
local provider_mod = require "luagent.provider"
local events = require "luagent.events"
local endpoint = require "luagent.endpoint"
local queue = require "luagent.queue"
local log = require "luagent.log"

local M = {}

-- The policy of calls that name none (`luagent run --policy FILE` sets it),
-- and the jitter seed of calls that give none (`--seed`).
M.default_policy = "default"
M.default_seed = nil

-- Where its diagnostic lines go; a function(line). A retry's line is written
-- only at log level info or below (luagent.log); the events carry it always.
M.log = function(line) io.stderr:write(line, "\n") end

------------------------------------------------------------------------------
-- Policies: a name, a file (watched and reloaded), a table, or the default
------------------------------------------------------------------------------

local loaders = {} -- path -> loader, shared by every call using that file

-- Starts a daemon task that reloads `loader` whenever its file changes and
-- reports a broken edit once per change, keeping the previous policy.
local function watch(loader)
  local w = luagent_core.watch(loader.path)
  if not w then return end
  local task = luagent_core.spawn(function()
    while true do
      w:wait()
      local _, err = loader:reload()
      if err then
        M.log("luagent: policy " .. tostring(err.message) .. " (the previous policy stays in force)")
      end
    end
  end)
  task:set_daemon(true)
  loader.watcher = task
end

-- A loader for the policy file `path` (loaded once per process, watched).
function M.policy_file(path)
  local l = loaders[path]
  if l then return l end
  local loader, err = policies.loader(path)
  if err then error(err, 0) end
  loaders[path] = loader
  watch(loader)
  return loader
end

-- Stops watching the policy file `path` and forgets its loader (specs; an
-- embedder that is done with a file).
function M.forget_policy(path)
  local l = loaders[path]
  if not l then return end
  if l.watcher then l.watcher:cancel("policy forgotten") end
  loaders[path] = nil
end

-- Resolves opts.policy into something with :get() returning a policy.
local function resolve_policy(spec)
  if spec == nil then spec = M.default_policy end
  if type(spec) == "table" and spec.get then return spec end
  if type(spec) == "table" then
    local p, err = policies.new(spec, "policy table")
    if not p then error(err, 0) end
    return { get = function() return p end }
  end
  if type(spec) ~= "string" then error("stream: policy must be a name, a file or a table", 3) end
  local path = policies.find(spec)
  if not path then error(errors.new("usage", "stream: no policy named '" .. spec .. "' (looked in " .. policies.path .. ")"), 0) end
  return M.policy_file(path)
end

------------------------------------------------------------------------------
-- Usage arithmetic
------------------------------------------------------------------------------

-- Classes of failure that say something about the provider: they count
-- against the endpoint's breaker and budget. Auth errors, context overflow,
-- bad requests and the caller's own cancellation do not.
local COUNTED = { rate_limited = true, overloaded = true, server = true, transport = true, timeout = true }

-- The endpoint of a call, or nil when the policy turns protection off. The
-- endpoint is configured by the first policy that reaches it (its state is
-- shared; a later policy's breaker and budget settings do not rebuild it).
local function endpoint_for(provider, policy)
  if not (policy.breaker or policy.budget or policy.cooldown) then return nil end
  return endpoint.get(endpoint.key(provider.base_url), {
    breaker = policy.breaker, budget = policy.budget, cooldown = policy.cooldown,
    shared = policy.shared,
  })
end

local USAGE_FIELDS = { "input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens" }

local function add_usage(total, u)
  if type(u) ~= "table" then return total end
  total = total or { input_tokens = 0, output_tokens = 0, cache_read_tokens = 0, cache_write_tokens = 0 }
  for _, f in ipairs(USAGE_FIELDS) do total[f] = total[f] + (tonumber(u[f]) or 0) end
  return total
end

------------------------------------------------------------------------------
-- The loop
------------------------------------------------------------------------------

local function seconds(v) return v and v > 0 and v or nil end

local calls = 0 -- numbers the calls of this process: events carry `call`

-- stream{model=, messages=, system=, tools=, policy=, max_tokens=,
-- temperature=, seed=} -> iterator of events (and, as the generic for's
-- closing value, an object that aborts the attempt in flight when the loop
-- is left early). `model` is "kind/model" or a provider. The iterator
-- returns nil after the final message_end.
function M.stream(opts)
  if type(opts) ~= "table" then error("stream: expects a table", 2) end
  local provider = opts.model
  if provider == nil then error("stream: model is required", 2) end
  if getmetatable(provider) ~= provider_mod.Provider then provider = provider_mod.new(provider) end
  local policy_src = resolve_policy(opts.policy)
  calls = calls + 1
  local call_id = calls
  -- a run-wide seed still gives each call its own jitter sequence
  local seed = opts.seed or (M.default_seed and M.default_seed + call_id) or math.random(0, 2 ^ 31)
  local rng = luagent_core.backoff_rng(seed)
  local request = {
    system = opts.system, messages = opts.messages or {}, tools = opts.tools,
    max_tokens = opts.max_tokens, temperature = opts.temperature,
  }

  local started = luagent_core.now()
  local out = queue.new()
  local state = "start"       -- start | streaming | waiting | done | raise
  local attempt, it, resp = 0, nil, nil
  local opened, streamed_any = false, false
  local usage_total, attempt_usage = nil, nil
  local delay, prev_delay, pending_error = 0, nil, nil
  local policy = policy_src:get()
  local ep, was_probe = nil, false

  local function now() return luagent_core.now() end

  -- Seconds left before the policy's total deadline (nil: no deadline).
  local function time_left()
    local deadline = seconds(policy.total_deadline)
    return deadline and deadline - (now() - started)
  end

  -- Tells the endpoint how the attempt went (`counted` failures only);
  -- returns the events that caused.
  local function record(ok, counted)
    if not ep then return {} end
    local evs = ep:record(now(), ok, counted, was_probe)
    was_probe = false
    return evs
  end

  local function final_failure(err, reason)
    out:push { type = "message_end", stop_reason = "error", error = err, usage = attempt_usage,
               total_usage = usage_total, attempts = attempt, reason = reason, final = true }
    state = "done"
  end

  -- The task was cancelled: the call ends here. Its final event goes
  -- straight to the bus (nobody pulls the iterator again), then it raises.
  local function cancelled(err)
    record(false, false) -- frees the breaker's probe slot if this was the probe
    if resp then resp:close() end
    state = "done"
    events.publish { type = "message_end", stop_reason = "aborted", error = err, final = true,
                     total_usage = usage_total, attempts = attempt, call = call_id }
    error(err, 0)
  end

  -- Decides what a failed attempt leads to: a retry after a wait, or the end.
  local function failed(err)
    if errors.is(err) and err.kind == "cancelled" then cancelled(err) end
    if not errors.is(err) then
      record(false, false)
      error(err, 0) -- a programming error (an adapter's bug) raises
    end
    if resp then resp:close() resp = nil end
    if err.kind == "timeout" and err.which == "total" then err.which = "attempt" end
    if type(err.usage) == "table" then attempt_usage = err.usage end -- what the cut stream had reported
    usage_total = add_usage(usage_total, attempt_usage)
    local max_attempts = policy.max_retries + 1
    local left = time_left()
    local d = classify.classify(err, {
      attempt = attempt,
      deadline_expired = left ~= nil and left <= 0,
      report = function(msg) M.log("luagent: " .. msg) end,
    }, policy)
    err.class = err.class or d.class
    local side = record(false, COUNTED[d.class] or false)
    if ep and policy.cooldown and d.retry_after and (d.class == "rate_limited" or d.class == "overloaded") then
      for _, e in ipairs(ep:set_cooldown(now() + d.retry_after)) do side[#side + 1] = e end
    end
    if d.class == "context_overflow" and policy.on_context_overflow then
      local ok, herr = policies.run_limited(policy.on_context_overflow, policies.limits.hook,
        { error = err, request = request, attempt = attempt })
      if not ok then M.log("luagent: " .. tostring(herr) .. " (on_context_overflow hook failed)") end
    end
    -- decide; the endpoint's events follow the attempt's own message_end
    local wait, why, final_reason
    if not d.retryable then
      final_reason = d.reason
    elseif attempt >= max_attempts then
      final_reason = "no attempts left (" .. max_attempts .. ")"
    elseif ep and policy.budget and not ep:retry_allowed() then
      err = errors.new("retry_budget_exhausted", "retry budget of " .. ep:name()
        .. " exhausted; the attempt failed with " .. tostring(err), { endpoint = ep:name(), cause = err })
      final_reason = "retry budget exhausted"
    else
      wait, why = policies.delay(policy, attempt, d.retry_after, rng, prev_delay)
      if not wait then
        err = errors.new(err.kind, err.message .. " (" .. why .. ")", err)
        final_reason = why
      elseif left and wait >= left then
        final_reason = string.format("the wait of %.3g s would pass the total deadline of %g s",
          wait, policy.total_deadline)
      end
    end
    if final_reason then
      out:push_all(side)
      return final_failure(err, final_reason)
    end
    local text = tostring(err)
    if opened then
      out:push { type = "message_end", stop_reason = "error", error = err, usage = attempt_usage,
                 error_message = string.format("attempt %d of %d failed and will be retried: %s",
                   attempt, max_attempts, text) }
    end
    out:push_all(side)
    out:push { type = "provider_retry", attempt = attempt, max_attempts = max_attempts, error = text,
               delay_ms = math.floor(wait * 1000 + 0.5), class = d.class, source = why }
    if log.enabled("info") then
      M.log(string.format("INFO provider error (attempt %d/%d), retrying in %.2fs: %s", attempt, max_attempts, wait, text))
    end
    if policy.on_retry then
      local ok, herr = policies.run_limited(policy.on_retry, policies.limits.hook,
        { attempt = attempt, max_attempts = max_attempts, error = err, decision = d, delay = wait })
      if not ok then M.log("luagent: " .. tostring(herr) .. " (on_retry hook failed; retrying anyway)") end
    end
    delay, prev_delay = wait, wait
    state = "waiting"
  end

  local function start_attempt()
    policy = policy_src:get() -- an edited policy applies from the next attempt
    local left = time_left()
    if left and left <= 0 then
      return final_failure(errors.new("timeout", string.format("total deadline of %g s passed",
        policy.total_deadline), { which = "total_deadline" }), "the total deadline passed")
    end
    ep = endpoint_for(provider, policy)
    if ep then
      -- a server-given wait holds every agent on this endpoint, released
      -- with jitter; then the breaker and the retry budget must agree
      local hold = policy.cooldown and ep:cooldown_wait(now(), rng) or 0
      if hold > 0 then
        if left and hold >= left then
          return final_failure(errors.new("timeout", string.format(
            "the endpoint's cooldown (%.3g s) would pass the total deadline", hold),
            { which = "total_deadline" }), "cooldown past the total deadline")
        end
        delay, state = hold, "waiting"
        return
      end
      local ok, probe_or_err, evs = ep:admit(attempt > 0, now())
      out:push_all(evs)
      if not ok then return final_failure(probe_or_err, probe_or_err.message) end
      was_probe = probe_or_err or false
    end
    attempt = attempt + 1
    opened, attempt_usage = false, nil
    local limit = seconds(policy.attempt_timeout)
    if left then limit = limit and math.min(limit, left) or left end
    -- provider:stream -> iterator, nil, nil, response | nil, err
    local ok, stream, perr, _, r = pcall(provider.stream, provider, request, {
      timeout = { total = limit, idle = seconds(policy.idle_timeout) },
    })
    if not ok then return failed(stream) end -- cancelled while connecting, or a bug
    if not stream then return failed(perr) end
    it, resp = stream, r
    state = "streaming"
  end

  local function next_event()
    local ok, ev = pcall(it)
    if not ok then return failed(ev) end
    if ev == nil then -- adapters end with message_end; a bare end is a cut
      return failed(errors.new("truncated", "stream ended without message_end"))
    end
    if attempt > 1 and streamed_any and not opened and ev.type ~= "usage" then
      out:push { type = "stream_reset", attempt = attempt }
      streamed_any = false
    end
    if ev.type == "message_start" then opened = true end
    if ev.type == "text_delta" or ev.type == "thinking_delta" or ev.type == "tool_call_start" then
      streamed_any = true
    end
    if ev.type == "usage" then attempt_usage = ev end
    if ev.type == "message_end" then
      local bad, why = classify.unusable(ev.message)
      if bad then
        return failed(errors.new("unusable", "unusable reply: " .. why, { unusable = true }))
      end
      resp = nil -- the provider closed it at its message_end
      local side = record(true, true)
      usage_total = add_usage(usage_total, attempt_usage)
      ev.total_usage = usage_total
      ev.attempts = attempt
      ev.final = true
      state = "done"
      out:push_all(side)
    end
    out:push(ev)
  end

  local iter = function()
    while true do
      local ev = out:pop()
      if ev then
        ev.call = call_id
        events.publish(ev)
        return ev
      end
      if state == "done" then return nil end
      if state == "raise" then
        state = "done"
        error(pending_error, 0)
      end
      if state == "start" then
        start_attempt()
      elseif state == "streaming" then
        next_event()
      elseif state == "waiting" then
        local ok, err = pcall(luagent_core.sleep, delay)
        if ok then
          state = "start"
        elseif errors.is(err) and err.kind == "cancelled" then
          -- cancelled during the backoff: end at once, no further request
          out:push { type = "message_end", stop_reason = "aborted", error = err,
                     total_usage = usage_total, attempts = attempt, final = true }
          pending_error, state = err, "raise"
        else
          error(err, 0)
        end
      end
    end
  end
  -- Leaving the for loop early aborts the attempt in flight at once.
  local closer = setmetatable({}, { __close = function()
    if resp then resp:close() resp = nil end
  end })
  return iter, nil, nil, closer
end

-- complete{...} -> the final assistant message (with .usage, .total_usage
-- and .attempts), or nil and the error record of the final failure.
function M.complete(opts)
  local final -- the last message_end is the call's outcome
  for ev in M.stream(opts) do
    if ev.type == "message_end" then final = ev end
  end
  if not final then return nil, errors.new("truncated", "the call ended without an answer") end
  if final.stop_reason == "error" then return nil, final.error end
  local msg = final.message or {}
  msg.stop_reason, msg.usage, msg.total_usage, msg.attempts = final.stop_reason, final.usage, final.total_usage, final.attempts
  return msg
end

return M
