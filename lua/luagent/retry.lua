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
-- final=true}, the record marked final (retryable = false, reason,
-- attempts, cause = the last attempt's error). A context overflow whose
-- on_context_overflow hook returns a shorter message list is resent once:
-- context_compacted{before, after}, then provider_retry with no wait.
-- Cancellation ends the call at once with one final event and then raises
-- `cancelled` (cancellation always raises): message_end{stop_reason=
-- "aborted"} when no message of the call is left without its end, else
-- (cancelled during a backoff after the failed attempt's message_end)
-- call_aborted; during a backoff, no further request is sent.
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
M.log = function(line) log.library(line) end

-- Gates asked before every attempt, before any request: function(opts)
-- -> nil, or an error record that ends the call at once (final, not
-- retried). lua/luagent/cost.lua adds the max_cost cap here.
M.gates = {}

-- Set by lua/luagent/trace.lua: function(call, attempt, opts) -> headers
-- for the attempt's request ({traceparent = ...}), asked only when the
-- policy's `traceparent` is true.
M.trace_headers = nil

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
  })
end

local USAGE_FIELDS = { "input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens" }

local function add_usage(total, u)
  if type(u) ~= "table" then return total end
  total = total or { input_tokens = 0, output_tokens = 0, cache_read_tokens = 0, cache_write_tokens = 0 }
  for _, f in ipairs(USAGE_FIELDS) do total[f] = total[f] + (tonumber(u[f]) or 0) end
  return total
end

-- The error a call that failed for good returns and its final message_end
-- carries: the fields of `err` (the last attempt's error, or the refusal or
-- deadline that ended the call), marked final so that no layer above starts
-- the cycle again (classify answers "permanent" for it): retryable = false,
-- final = true, `reason`, `attempts`, and `cause`, the last attempt's own
-- error (nil when no attempt was made).
local function final_error(err, reason, attempts, last)
  local f = {}
  for k, v in pairs(err) do f[k] = v end
  f.retryable, f.final, f.reason, f.attempts = false, true, reason, attempts
  f.cause = last or err.cause
  f.message = string.format("%s (final after %d attempt%s: %s)", tostring(err.message),
    attempts, attempts == 1 and "" or "s", reason)
  return setmetatable(f, getmetatable(err) or errors.metatable)
end

-- The wait the server's Retry-After imposes under policy p, for the
-- endpoint's cooldown: what the policy obeys (capped at max_wait when it
-- caps), or nil when the policy does not obey this one (honor = false, or
-- more than max_wait and over_max is "give_up" or "backoff").
local function obeyed_server_wait(p, retry_after)
  local ra = p.retry_after
  if not (retry_after and ra.honor) then return nil end
  if not ra.max_wait or retry_after <= ra.max_wait then return retry_after end
  if ra.over_max == "cap" then return ra.max_wait end
  return nil
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
  local last_err = nil         -- the last attempt's own error
  local cut_by_deadline = nil  -- the attempt's time limit is the total deadline's
  local compacted = false      -- a context overflow was resent once already
  local open_end = false       -- a message_end of the call closed no final message yet
  local attempt_started, status = nil, nil -- the attempt's start (loop clock), its HTTP status

  -- What observers need on the call's final event (EVENTS.md, "Call
  -- events"): when the call and its last attempt started, the last status,
  -- and what was asked of whom.
  local function describe(ev)
    ev.started, ev.attempt_started, ev.status = started, attempt_started, status
    ev.request_model, ev.provider_kind, ev.endpoint = provider.model, provider.kind, provider.base_url
    return ev
  end

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
    err = final_error(err, reason, attempt, last_err)
    out:push(describe { type = "message_end", stop_reason = "error", error = err, usage = attempt_usage,
               total_usage = usage_total, attempts = attempt, reason = reason, final = true })
    state = "done"
  end

  -- The final event of a call cancelled outside an attempt's message: a
  -- message_end, unless the failed attempt's message_end was the last
  -- message event (then no second message_end: call_aborted ends the call).
  local function aborted_event(err)
    return describe { type = open_end and "call_aborted" or "message_end", stop_reason = "aborted", error = err,
             final = true, total_usage = usage_total, attempts = attempt }
  end

  -- The task was cancelled: the call ends here. Its final event goes
  -- straight to the bus (nobody pulls the iterator again), then it raises.
  local function cancelled(err)
    record(false, false) -- frees the breaker's probe slot if this was the probe
    if resp then resp:close() end
    state = "done"
    local ev = aborted_event(err)
    ev.call, ev.agent, ev.agent_id = call_id, opts.agent, opts.agent_id
    events.publish(ev)
    error(err, 0)
  end

  -- Runs the policy's on_context_overflow hook; returns the shorter message
  -- list it gave, or nil (the call then fails as it would without a hook).
  local function compact_request(err)
    local ok, res = policies.run_limited(policy.on_context_overflow, policies.limits.hook,
      { error = err, request = request, attempt = attempt, messages = request.messages })
    local what
    if not ok then
      what = tostring(res) .. " (on_context_overflow hook failed)"
    elseif res == nil then
      return nil
    elseif type(res) ~= "table" or #res == 0 then
      what = "on_context_overflow hook returned " .. (type(res) == "table" and "an empty list" or "a " .. type(res))
        .. " (expected a list of messages, or nil)"
    else
      for i, m in ipairs(res) do
        if type(m) ~= "table" or type(m.role) ~= "string" then
          what = "on_context_overflow hook returned a list whose item " .. i .. " is not a message"
          break
        end
      end
    end
    if what then M.log("luagent: " .. what) return nil end
    return res
  end

  -- Decides what a failed attempt leads to: a retry after a wait, or the end.
  local function failed(err)
    if errors.is(err) and err.kind == "cancelled" then cancelled(err) end
    if not errors.is(err) then
      record(false, false)
      error(err, 0) -- a programming error (an adapter's bug) raises
    end
    if resp then resp:close() resp = nil end
    if err.kind == "timeout" then
      -- say which deadline fired: the attempt's own, or the call's
      if err.which == "total" and cut_by_deadline then
        err.which = "total_deadline"
        err.message = string.format("the call's total deadline (%g s) passed during attempt %d",
          policy.total_deadline, attempt)
      elseif err.which == "total" then
        err.which = "attempt"
        err.message = string.format("attempt %d took longer than the attempt timeout (%g s)",
          attempt, policy.attempt_timeout)
      elseif err.which == "idle" and seconds(policy.idle_timeout) then
        err.message = string.format("attempt %d: the stream was silent longer than the idle timeout (%g s)",
          attempt, policy.idle_timeout)
      end
    end
    last_err = err
    status = math.tointeger(err.status) or status
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
    -- the endpoint holds everyone for as long as this policy obeys the
    -- server (a capped Retry-After holds for the cap), so the wait this
    -- call announces is the wait it makes
    local hold = obeyed_server_wait(policy, d.retry_after)
    if ep and policy.cooldown and hold and (d.class == "rate_limited" or d.class == "overloaded") then
      for _, e in ipairs(ep:set_cooldown(now() + hold)) do side[#side + 1] = e end
    end
    local shorter
    if d.class == "context_overflow" and policy.on_context_overflow and not compacted then
      shorter = compact_request(err)
    end
    -- decide; the endpoint's events follow the attempt's own message_end
    local wait, why, final_reason
    if shorter and attempt < max_attempts and not (left and left <= 0) then
      wait, why = 0, "compaction"
    elseif not d.retryable then
      final_reason = d.reason
    elseif attempt >= max_attempts then
      final_reason = "no attempts left (" .. max_attempts .. ")"
    elseif ep and ep.budget and policy.budget and not ep.budget:allow_retry() then
      err = errors.new("retry_budget_exhausted", "retry budget of " .. ep.key
        .. " exhausted; the attempt failed with " .. tostring(err), { endpoint = ep.key, cause = err })
      final_reason = "retry budget exhausted"
    else
      wait, why = policies.delay(policy, attempt, d.retry_after, rng, prev_delay)
      -- a cooldown another call set may hold this one longer: announce it
      local held = wait and ep and policy.cooldown and ep:cooldown_wait(now() + wait, rng) or 0
      if held > 0 then wait, why = wait + held, "cooldown" end
      if not wait then
        final_reason = why -- the final error's message says it
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
      open_end = true
    end
    out:push_all(side)
    if shorter then
      out:push { type = "context_compacted", attempt = attempt, before = #request.messages, after = #shorter }
      request.messages, compacted = shorter, true
    end
    out:push(describe { type = "provider_retry", attempt = attempt, max_attempts = max_attempts, error = text,
               delay_ms = math.floor(wait * 1000 + 0.5), class = d.class, source = why, usage = attempt_usage })
    if log.enabled("info") then
      M.log(string.format("INFO provider error (attempt %d/%d), retrying in %.2fs: %s", attempt, max_attempts, wait, text))
    end
    if policy.on_retry then
      local ok, herr = policies.run_limited(policy.on_retry, policies.limits.hook,
        { attempt = attempt, max_attempts = max_attempts, error = err, decision = d, delay = wait })
      if not ok then M.log("luagent: " .. tostring(herr) .. " (on_retry hook failed; retrying anyway)") end
    end
    delay = wait
    if why ~= "compaction" then prev_delay = wait end
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
      if not ok then
        return final_failure(probe_or_err, probe_or_err.kind == "circuit_open"
          and "the endpoint's circuit is open" or "the endpoint's retry budget is exhausted")
      end
      was_probe = probe_or_err or false
    end
    for _, gate in ipairs(M.gates) do
      local refusal = gate(opts)
      if refusal then
        record(false, false) -- frees the breaker's probe slot if this was the probe
        return final_failure(refusal, refusal.reason or refusal.message)
      end
    end
    attempt = attempt + 1
    opened, attempt_usage, attempt_started, status = false, nil, now(), nil
    local limit = seconds(policy.attempt_timeout)
    cut_by_deadline = left ~= nil and (limit == nil or left < limit)
    if left then limit = limit and math.min(limit, left) or left end
    -- provider:stream -> iterator, nil, nil, response | nil, err
    local ok, stream, perr, _, r = pcall(provider.stream, provider, request, {
      timeout = { total = limit, idle = seconds(policy.idle_timeout) },
      max_bytes = policy.max_answer_bytes or nil,
      headers = policy.traceparent and M.trace_headers and M.trace_headers(call_id, attempt, opts) or nil,
    })
    if not ok then return failed(stream) end -- cancelled while connecting, or a bug
    if not stream then return failed(perr) end
    it, resp = stream, r
    status = r and r.status
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
    if ev.type == "message_start" then opened, open_end = true, false end
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
      describe(ev)
      state = "done"
      out:push_all(side)
    end
    out:push(ev)
  end

  local iter = function()
    while true do
      local ev = out:pop()
      if ev then
        ev.call, ev.agent, ev.agent_id = call_id, opts.agent, opts.agent_id
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
          out:push(aborted_event(err))
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
