-- The retry loop: one model call, attempted until it succeeds, fails for
-- good, or runs out of attempts or time. Each step is an event, in an order
-- frozen by spec/retry_spec.lua and documented in EVENTS.md:
--
--   attempt events ... message_end{stop_reason="error", error_message=
--   "attempt N of M failed and will be retried: <error>", message=<what it
--   had streamed>} (only if the attempt had opened a message), provider_retry{attempt, max_attempts, error,
--   error_message, delay, delay_ms}, stream_reset (before the next attempt's first event, if an
--   earlier attempt had streamed anything), attempt events ..., message_end.
--
-- Events of the shared endpoint (circuit_*, retry_budget_exhausted,
-- cooldown) come after the failed attempt's message_end, before its
-- provider_retry. A call the endpoint holds before an attempt, with no
-- provider_retry announcing it (another call's cooldown; the open breaker,
-- when the policy says breaker.wait_for_probe), says so first:
-- call_waiting{reason, until, wait_ms, endpoint}. The final failure is never followed by provider_retry; it
-- ends the stream with message_end{stop_reason="error", error=<record>,
-- final=true}, the record marked final (retryable = false, reason,
-- attempts, cause = the last attempt's error). A context overflow whose
-- on_context_overflow hook returns a shorter message list is resent once:
-- context_compacted{before, after, messages}, then provider_retry with no
-- wait.
-- A call given fallback models (`fallback`) that fails for good on one
-- model with a failure the next may not share (a transient class after
-- its retries, an endpoint's refusal: M.falls_back) goes on with the next
-- model instead of ending: the failed attempt's own message_end (if it had
-- opened a message, never final), the endpoint's events, then
-- model_fallback{from, to, reason, error, class, attempt?, usage?}, and the
-- next model's attempts, with its own endpoint (breaker, budget,
-- cooldown), its own wire format (the request is provider-neutral), its
-- own attempts (max_retries + 1 more) and its own total deadline.
-- Attempts are numbered through the call (provider_retry's attempt and
-- max_attempts continue); the final event names the model that answered
-- (or the last one tried) and lists those given up on (fallback_from).
-- Cancellation (connecting, streaming or backing off) ends the call at once
-- with one final event and then raises `cancelled` (cancellation always
-- raises): message_end{stop_reason="aborted"} when no message of the call
-- is left without its end, else (cancelled during a backoff after the
-- failed attempt's message_end) call_aborted. The final event is delivered
-- like any other (to the caller and the bus); the next pull raises, and so
-- does leaving the loop after it. During a backoff, no further request is
-- sent.
-- Every call belongs to a runtime (lua/luagent/runtime.lua), whose state
-- it uses and never a module's: its settings (the policy of calls that name
-- none, the jitter seed of calls that give none), its policy cache, its
-- endpoints, its bus (every event is published there as it is delivered,
-- after the caller's before_publish has seen it: an agent's journal
-- commits a step there before anyone is told of it),
-- its diagnostics (a retry's line at info, what needs a look at warn; the
-- events carry them always), and its two control points, which observers
-- register in and the call layer owns:
--   rt.admission   function(opts) -> nil, or an error record that ends the
--                  call at once (final, not retried), asked before every
--                  attempt, before any request (the cost cap)
--   rt.decorators  function(call) -> headers to add to the attempt's
--                  request, or nil (tracing's traceparent); `call` has id,
--                  attempt, opts and policy
local luagent_core = require "luagent.core"
local errors = require "luagent.base.errors"
local classify = require "luagent.model.classify"
local policies = require "luagent.model.policy"
local provider_mod = require "luagent.model.provider"
local endpoint = require "luagent.model.endpoint"
local queue = require "luagent.base.queue"
local add_usage = require("luagent.base.usage").add
local options = require "luagent.base.options"

local M = {}

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
local function endpoint_for(rt, provider, policy)
  if not (policy.breaker or policy.budget or policy.cooldown) then return nil end
  return rt.endpoints:get(endpoint.key(provider.base_url), {
    breaker = policy.breaker, budget = policy.budget, cooldown = policy.cooldown,
    shared = policy.shared,
  })
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

-- "kind/model" of a provider: how fallback events name a model.
local function model_name(p) return p.kind .. "/" .. p.model end
M.model_name = model_name

-- Classes that fall back to the next model although they are not retried
-- on the same one: an empty reply after its retries, and the model's own
-- total deadline (each model of a call has one).
local FALLS_BACK = { unusable = true, deadline = true }

-- Error kinds of an endpoint's refusal, which fall back.
local REFUSALS = { circuit_open = true, retry_budget_exhausted = true }

-- falls_back(err, policy [, admitted]) -> whether a call that failed for
-- good with `err` goes on with its next model: the endpoint refused it
-- (breaker open, retry budget spent, a cooldown past the deadline), its
-- class is a transient one (after its retries: rate_limited, overloaded,
-- server, transport, timeout, transient) or unusable or deadline, or the
-- policy's fallback_on_permanent names its class. `admitted` false: an
-- admission check (the cost cap) refused it, which no model changes.
function M.falls_back(err, policy, admitted)
  if admitted == false or errors.is_cancel(err) then return false end
  if REFUSALS[err.kind] then return true end
  if err.kind == "timeout" and err.which == "total_deadline" then return true end
  local class = err.class
  if class == nil or class == "cancelled" then return false end
  if classify.classes[class] or FALLS_BACK[class] then return true end
  local permanent = policy.fallback_on_permanent
  return permanent and permanent[class] or false
end

------------------------------------------------------------------------------
-- The loop: one Call object per call, one method per state
------------------------------------------------------------------------------
--
--   start      -> begin_attempt: the deadline, the endpoint's cooldown and
--                 admission, then the request (-> streaming, waiting, done)
--   streaming  -> next_event: one event of the attempt (-> done on its
--                 message_end; a failure goes to `failed`)
--   waiting    -> backoff: the wait before the next attempt (-> start)
--   raise      -> raise: the call was cancelled; its final event was
--                 delivered, now the cancellation is raised (-> done)
--   done       -> the iterator returns nil
--
-- Every event goes through the call's queue and is published as the caller
-- pulls it; `failed` decides what a failed attempt leads to, `abort` is the
-- one exit for cancellation.

local function seconds(v) return v and v > 0 and v or nil end

local Call = {}
Call.__index = Call

-- A call of runtime rt from stream's options (checked by M.stream).
function Call.new(rt, opts, provider, policy_src, fallback)
  rt.calls = rt.calls + 1 -- the runtime numbers its calls: events carry `call`
  local call_id = rt.calls
  local chain = { provider }
  for i, p in ipairs(fallback or {}) do chain[i + 1] = p end
  local t0 = luagent_core.now()
  -- a run-wide seed still gives each call its own jitter sequence
  local run_seed = rt.settings:get("seed")
  local seed = opts.seed or (run_seed and run_seed + call_id) or math.random(0, 2 ^ 31)
  return setmetatable({
    rt = rt,
    bus = rt.bus,           -- where every event is published as it is delivered
    before_publish = opts.before_publish, -- the caller's hook, before the bus (the journal)
    id = call_id, provider = provider, policy_src = policy_src, policy = policy_src:get(),
    chain = chain, link = 1, -- the models to try, and which of them this is
    base = 0,               -- the attempts made on the models before this one
    model_started = t0,     -- when this model's first attempt began (its total deadline)
    fallback_from = nil,    -- "kind/model" of each model given up on, in order
    admit_opts = opts,      -- what the admission checks see (the model in use)
    opts = opts,            -- the caller's (agent, agent_id; the gates see them)
    rng = luagent_core.backoff_rng(seed),
    request = {
      system = opts.system, messages = opts.messages or {}, tools = opts.tools,
      max_tokens = opts.max_tokens, temperature = opts.temperature,
      cache = opts.cache, thinking = opts.thinking, reasoning = opts.reasoning, extra_body = opts.extra_body,
      -- structured output, in each adapter's native shape
      output = opts.output and { name = opts.output.name or "output", schema = opts.output.schema,
        strict = opts.output.strict },
    },
    started = t0,
    out = queue.new(),
    state = "start",        -- start | streaming | waiting | raise | done
    attempt = 0,
    it = nil, resp = nil,   -- the attempt's event iterator and response
    opened = false,         -- the attempt opened a message (message_start)
    text = {}, thinking = {}, -- what the attempt streamed: a failed one's message_end keeps it
    response_ids = {},      -- the id each attempt's message had (OpenRouter's generation ids)
    streamed_any = false,   -- an attempt streamed content a retry takes back
    usage_total = nil, attempt_usage = nil,
    delay = 0,              -- the wait of the waiting state
    prev_delay = nil,       -- the last backoff (decorrelated jitter)
    pending_error = nil,    -- what the raise state raises
    ep = nil, was_probe = false,
    probe_wait = false,     -- the waiting state waits for the breaker's probe (wait_for_probe)
    announced = nil,        -- the last call_waiting: {reason, until}
    last_err = nil,         -- the last attempt's own error
    cut_by_deadline = nil,  -- the attempt's time limit is the total deadline's
    compacted = false,      -- a context overflow was resent once already
    open_end = false,       -- a message_end of the call closed no final message yet
    attempt_started = nil,  -- the attempt's start (loop clock)
    status = nil,           -- its HTTP status
  }, Call)
end

-- What observers need on the call's final event and its provider_retry
-- (EVENTS.md, "Call events"): when the call and its last attempt started,
-- the last status, and what was asked of whom; the final event also the id
-- of every attempt's message (a failed attempt's cost is looked up by it,
-- lua/luagent/observe/generations.lua). Returns `ev`.
function Call:describe(ev)
  ev.started, ev.attempt_started, ev.status = self.started, self.attempt_started, self.status
  local provider = self.provider
  ev.request_model, ev.provider_kind, ev.endpoint = provider.model, provider.kind, provider.base_url
  ev.provider_name = provider_mod.otel_name(provider.kind)
  if self.request.output then ev.output_type = "json" end -- structured output was asked for
  if ev.final and self.response_ids[1] then ev.response_ids = self.response_ids end
  if ev.final then ev.fallback_from = self.fallback_from end
  return ev
end

local function now() return luagent_core.now() end

-- Seconds left before the policy's total deadline of the model in use
-- (nil: no deadline).
function Call:time_left()
  local deadline = seconds(self.policy.total_deadline)
  return deadline and deadline - (now() - self.model_started)
end

-- The number of the last attempt the model in use may make: attempts are
-- numbered through the call, each model gets max_retries + 1.
function Call:max_attempts()
  return self.base + self.policy.max_retries + 1
end

-- Tells the endpoint how the attempt went (`counted` failures only);
-- returns the events that caused.
function Call:record(ok, counted)
  if not self.ep then return {} end
  local evs = self.ep:record(now(), ok, counted, self.was_probe)
  self.was_probe = false
  return evs
end

-- What the attempt produced before it failed or was aborted, as the
-- assistant message its message_end carries (yoagent: the MessageEnd's
-- content still holds it), or nil when the attempt opened no message or
-- that message was closed already. Text and thinking only: a tool call of
-- a failed attempt never runs. `stop_reason` says why it is incomplete.
function Call:partial_message(stop_reason)
  if not self.opened or self.open_end then return nil end
  local msg = { role = "assistant", content = table.concat(self.text), incomplete = true, stop_reason = stop_reason }
  if self.thinking[1] then msg.thinking = table.concat(self.thinking) end
  return msg
end

-- Ends the call with its final failure, or goes on with the next model
-- when the call has one and the failure falls back (M.falls_back). `own`:
-- the failure is the last attempt's own (not a refusal before an
-- attempt); `admitted` false: an admission check refused the call.
function Call:final_failure(err, reason, own, admitted)
  local nxt = self.chain[self.link + 1]
  if nxt and M.falls_back(err, self.policy, admitted) then return self:fall_back(err, reason, own, nxt) end
  err = final_error(err, reason, self.attempt, self.last_err)
  self.out:push(self:describe { type = "message_end", stop_reason = "error", error = err,
    message = self:partial_message("error"),
    usage = self.attempt_usage, total_usage = self.usage_total, attempts = self.attempt, reason = reason,
    final = true })
  self.state = "done"
end

-- The model in use failed for good (`err`, `reason`) and the call goes on
-- with `nxt`: the attempt's own message_end (if it had opened a message),
-- model_fallback, then the next model's first attempt, from a fresh start
-- (its endpoint, its attempts, its deadline, its backoff).
function Call:fall_back(err, reason, own, nxt)
  local from, out = self.provider, self.out
  err = final_error(err, reason, self.attempt, self.last_err)
  local text = tostring(err)
  if own and self.opened and not self.open_end then
    out:push { type = "message_end", stop_reason = "error", error = err, usage = self.attempt_usage,
               message = self:partial_message("error"), error_message = string.format(
                 "attempt %d failed for good on %s, which falls back to %s: %s",
                 self.attempt, model_name(from), model_name(nxt), text) }
    self.open_end = true
  end
  local ev = self:describe { type = "model_fallback", from = model_name(from), to = model_name(nxt),
    reason = reason, error = err, error_message = text, class = err.class,
    attempt = own and self.attempt or nil, attempts = self.attempt - self.base,
    usage = own and self.attempt_usage or nil,
    response_ids = self.response_ids[1] and self.response_ids or nil }
  out:push(ev)
  self.rt.diag:write("warn", string.format("model %s failed for good (%s), falling back to %s: %s",
    model_name(from), tostring(reason), model_name(nxt), tostring(err.cause or err)), nil, "model_fallback")
  local given_up = self.fallback_from or {}
  given_up[#given_up + 1] = model_name(from)
  self.fallback_from = given_up
  self.link, self.provider, self.base, self.model_started = self.link + 1, nxt, self.attempt, now()
  self.prev_delay, self.compacted, self.last_err, self.status = nil, false, nil, nil
  self.ep, self.was_probe, self.probe_wait, self.announced = nil, false, false, nil
  self.response_ids = {}
  if self.opts.model ~= nxt then
    local o = {}
    for k, v in pairs(self.opts) do o[k] = v end
    o.model = nxt
    self.admit_opts = o
  end
  self.state = "start"
end

-- The one exit for cancellation, wherever it lands (connecting, streaming,
-- backing off): the attempt in flight is released, the call's final event
-- is queued (a message_end, unless the failed attempt's message_end was the
-- last message event: then call_aborted, and no second message_end), and
-- the cancellation is raised right after it is delivered: by the next
-- pull, or by the loop's closing value when the caller leaves the loop.
function Call:abort(err)
  self:record(false, false) -- frees the breaker's probe slot if this was the probe
  if self.resp then self.resp:close() self.resp = nil end
  self.out:push(self:describe { type = self.open_end and "call_aborted" or "message_end",
    stop_reason = "aborted", error = err, message = self:partial_message("aborted"), final = true,
    total_usage = self.usage_total, attempts = self.attempt })
  self.pending_error, self.state = err, "raise"
end

-- Runs the policy's on_context_overflow hook; returns the shorter message
-- list it gave, or nil (the call then fails as it would without a hook).
function Call:compact_request(err)
  local request = self.request
  local ok, res = policies.run_limited(self.policy.on_context_overflow, policies.limits.hook,
    { error = err, request = request, attempt = self.attempt, messages = request.messages })
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
  if what then self.rt.diag:write("warn", what) return nil end
  return res
end

-- Says which deadline a timeout error hit: the attempt's own, or the call's.
function Call:name_timeout(err)
  local policy, attempt = self.policy, self.attempt
  if err.which == "total" and self.cut_by_deadline then
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

-- What a classified failure leads to: the wait and its source ("backoff",
-- "retry_after", "cooldown", "compaction"), or nil, the final reason and
-- the error to end with.
function Call:decide(err, d, shorter, left)
  local policy, ep, attempt = self.policy, self.ep, self.attempt
  local max_attempts = self:max_attempts()
  if shorter and attempt < max_attempts and not (left and left <= 0) then return 0, "compaction" end
  if not d.retryable then return nil, d.reason, err end
  if attempt >= max_attempts then return nil, "no attempts left (" .. (policy.max_retries + 1) .. ")", err end
  local may, refusal = true, nil
  if ep then may, refusal = ep:may_retry(err) end
  if not may then return nil, "retry budget exhausted", refusal end
  local wait, why = policies.delay(policy, attempt - self.base, d.retry_after, self.rng, self.prev_delay)
  -- a cooldown another call set may hold this one longer: announce it
  local held = wait and ep and policy.cooldown and ep:cooldown_wait(now() + wait, self.rng) or 0
  if held > 0 then wait, why = wait + held, "cooldown" end
  if not wait then return nil, why, err end -- the final error's message says it
  if left and wait >= left then
    return nil, string.format("the wait of %.3g s would pass the total deadline of %g s",
      wait, policy.total_deadline), err
  end
  return wait, why
end

-- Announces a retry after `wait`: the attempt's own message_end (if it
-- opened a message), the endpoint's events, context_compacted, then
-- provider_retry; the log line and the on_retry hook.
function Call:announce_retry(err, d, side, shorter, wait, why)
  local out, policy, attempt = self.out, self.policy, self.attempt
  local max_attempts = self:max_attempts()
  local text = tostring(err)
  if self.opened then
    out:push { type = "message_end", stop_reason = "error", error = err, usage = self.attempt_usage,
               message = self:partial_message("error"), error_message = string.format("attempt %d of %d failed and will be retried: %s",
                 attempt, max_attempts, text) }
    self.open_end = true
  end
  out:push_all(side)
  if shorter then
    -- the list itself, for callers that keep the history (an agent adopts it)
    out:push { type = "context_compacted", attempt = attempt, before = #self.request.messages, after = #shorter,
               messages = shorter }
    self.request.messages, self.compacted = shorter, true
  end
  out:push(self:describe { type = "provider_retry", attempt = attempt, max_attempts = max_attempts,
    error = err, error_message = text, delay = wait, delay_ms = math.floor(wait * 1000 + 0.5),
    class = d.class, source = why, usage = self.attempt_usage })
  -- the retry's own line; the log leaves it out when it logs the
  -- provider_retry event itself (the line is "about" that event)
  self.rt.diag:write("info", string.format("provider error (attempt %d/%d), retrying in %.2fs: %s",
    attempt, max_attempts, wait, text), nil, "provider_retry")
  if policy.on_retry then
    local ok, herr = policies.run_limited(policy.on_retry, policies.limits.hook,
      { attempt = attempt, max_attempts = max_attempts, error = err, decision = d, delay = wait })
    if not ok then self.rt.diag:write("warn", tostring(herr) .. " (on_retry hook failed; retrying anyway)") end
  end
  self.delay = wait
  if why ~= "compaction" then self.prev_delay = wait end
  self.announced = nil -- this wait is the retry's; a hold after it is announced anew
  self.state = "waiting"
end

-- Decides what a failed attempt leads to: a retry after a wait, or the end.
function Call:failed(err)
  if errors.is_cancel(err) then return self:abort(err) end
  if not errors.is(err) then
    self:record(false, false)
    error(err, 0) -- a programming error (an adapter's bug) raises
  end
  if self.resp then self.resp:close() self.resp = nil end
  if err.kind == "timeout" then self:name_timeout(err) end
  local policy, ep = self.policy, self.ep
  self.last_err = err
  self.status = math.tointeger(err.status) or self.status
  if type(err.usage) == "table" then self.attempt_usage = err.usage end -- what the cut stream had reported
  self.usage_total = add_usage(self.usage_total, self.attempt_usage)
  local left = self:time_left()
  local d = classify.classify(err, {
    attempt = self.attempt - self.base, -- this model's (unusable_retries counts them)
    deadline_expired = left ~= nil and left <= 0,
    diag = self.rt.diag,
  }, policy)
  err.class = err.class or d.class
  local side = self:record(false, COUNTED[d.class] or false)
  -- the endpoint holds everyone for as long as this policy obeys the
  -- server (a capped Retry-After holds for the cap), so the wait this
  -- call announces is the wait it makes
  local hold = obeyed_server_wait(policy, d.retry_after)
  if ep and policy.cooldown and hold and (d.class == "rate_limited" or d.class == "overloaded") then
    for _, e in ipairs(ep:set_cooldown(now() + hold)) do side[#side + 1] = e end
  end
  local shorter
  if d.class == "context_overflow" and policy.on_context_overflow and not self.compacted then
    shorter = self:compact_request(err)
  end
  -- the endpoint's events follow the attempt's own message_end
  local wait, why, final_err = self:decide(err, d, shorter, left)
  if not wait then
    self.out:push_all(side)
    return self:final_failure(final_err, why, true)
  end
  self:announce_retry(err, d, side, shorter, wait, why)
end

-- Says that the call is held before its next attempt (no provider_retry
-- announced this wait): call_waiting, once per wait; another one when the
-- wait changed (another reason, or an end moved by more than 0.1 s: the
-- circuit reopened, the probe's slot freed).
function Call:announce_wait(reason, until_time)
  local last, t = self.announced, now()
  if last and last[1] == reason and math.abs(last[2] - until_time) <= 0.1 then return end
  self.announced = { reason, until_time }
  self.out:push { type = "call_waiting", reason = reason, ["until"] = until_time,
                  wait_ms = math.floor((until_time - t) * 1000 + 0.5), endpoint = self.ep.key }
end

-- The open breaker refused the attempt (`err`, kind circuit_open) and the
-- policy says wait_for_probe: wait until the open time ends (then this
-- call may be the probe) or, while another caller's probe is out, until
-- the probe reports (the endpoint wakes its waiters) or its slot frees;
-- never past the total deadline (`left` seconds): an open time that ends
-- after it fails the call at once, as without the option.
function Call:wait_for_probe(err, left)
  local wait = err.retry_at - now()
  if left and not err.probe_out and wait >= left then
    return self:final_failure(err, string.format(
      "the endpoint's circuit stays open past the total deadline (%.3g s left)", left))
  end
  if left and wait > left then wait = left end
  if wait < 0.001 then wait = 0.001 end -- the end is due: ask again at once, not in a busy loop
  self:announce_wait("circuit_open", now() + wait)
  self.delay, self.probe_wait, self.state = wait, true, "waiting"
end

-- The endpoint's cooldown holds the next attempt for `hold` seconds (it
-- was set by another call: this one announced no retry for it), unless
-- that passes the total deadline (`left` seconds).
function Call:hold_for_cooldown(hold, left)
  if left and hold >= left then
    return self:final_failure(errors.new("timeout", string.format(
      "the endpoint's cooldown (%.3g s) would pass the total deadline", hold),
      { which = "total_deadline" }), "cooldown past the total deadline")
  end
  self:announce_wait("cooldown", now() + hold)
  self.delay, self.state = hold, "waiting"
end

-- State start: the next attempt, once the deadline, the endpoint's cooldown
-- and its admission allow it.
function Call:begin_attempt()
  self.policy = self.policy_src:get() -- an edited policy applies from the next attempt
  local policy = self.policy
  local left = self:time_left()
  local waited_for_probe = self.probe_wait
  self.probe_wait = false
  if left and left <= 0 then
    return self:final_failure(errors.new("timeout", string.format("total deadline of %g s passed%s",
      policy.total_deadline, waited_for_probe and " while the call waited for the endpoint's half-open probe" or ""),
      { which = "total_deadline" }), "the total deadline passed")
  end
  local ep = endpoint_for(self.rt, self.provider, policy)
  self.ep = ep
  if ep then
    -- a server-given wait holds every agent on this endpoint, released
    -- with jitter; then the breaker and the retry budget must agree
    local hold = policy.cooldown and ep:cooldown_wait(now(), self.rng) or 0
    if hold > 0 then return self:hold_for_cooldown(hold, left) end
    local ok, probe_or_err, evs = ep:admit(self.attempt > self.base, now())
    self.out:push_all(evs)
    if not ok and probe_or_err.kind == "circuit_open" and policy.wait_for_probe then
      return self:wait_for_probe(probe_or_err, left)
    end
    if not ok then
      return self:final_failure(probe_or_err, probe_or_err.kind == "circuit_open"
        and "the endpoint's circuit is open" or "the endpoint's retry budget is exhausted")
    end
    self.was_probe = probe_or_err or false
    -- a shared endpoint's admission may have brought news of a cooldown
    -- another host set (in process, nothing changed since the check above)
    hold = policy.cooldown and ep:cooldown_wait(now(), self.rng) or 0
    if hold > 0 then
      self:record(false, false) -- frees the breaker's probe slot if this was the probe
      return self:hold_for_cooldown(hold, left)
    end
  end
  for _, admit in ipairs(self.rt.admission) do
    local refusal = admit(self.admit_opts)
    if refusal then
      self:record(false, false) -- frees the breaker's probe slot if this was the probe
      return self:final_failure(refusal, refusal.reason or refusal.message, false, false)
    end
  end
  self.attempt = self.attempt + 1
  self.opened, self.attempt_usage, self.attempt_started, self.status = false, nil, now(), nil
  self.text, self.thinking = {}, {}
  local limit = seconds(policy.attempt_timeout)
  self.cut_by_deadline = left ~= nil and (limit == nil or left < limit)
  if left then limit = limit and math.min(limit, left) or left end
  -- the request decorators' headers (a trace's traceparent)
  local headers
  for _, decorate in ipairs(self.rt.decorators) do
    local h = decorate(self)
    if h then
      headers = headers or {}
      for k, v in pairs(h) do headers[k] = v end
    end
  end
  -- provider:stream -> iterator, nil, nil, response | nil, err
  local provider = self.provider
  local ok, stream, perr, _, r = pcall(provider.stream, provider, self.request, {
    timeout = { total = limit, idle = seconds(policy.idle_timeout) },
    max_bytes = policy.max_answer_bytes or nil,
    headers = headers,
  })
  if not ok then return self:failed(stream) end -- cancelled while connecting, or a bug
  if not stream then return self:failed(perr) end
  self.it, self.resp = stream, r
  self.status = r and r.status
  self.state = "streaming"
end

-- State streaming: one event of the attempt.
function Call:next_event()
  local ok, ev = pcall(self.it)
  if not ok then return self:failed(ev) end
  if ev == nil then -- adapters end with message_end; a bare end is a cut
    return self:failed(errors.new("truncated", "stream ended without message_end"))
  end
  local out, t = self.out, ev.type
  if self.attempt > 1 and self.streamed_any and not self.opened and t ~= "usage" then
    out:push { type = "stream_reset", attempt = self.attempt }
    self.streamed_any = false
  end
  if t == "message_start" then
    self.opened, self.open_end = true, false
    if ev.id then self.response_ids[#self.response_ids + 1] = ev.id end
  elseif t == "text_delta" then
    self.streamed_any = true
    self.text[#self.text + 1] = ev.text
  elseif t == "thinking_delta" then
    self.streamed_any = true
    self.thinking[#self.thinking + 1] = ev.text
  elseif t == "tool_call_start" then
    self.streamed_any = true
  elseif t == "usage" then
    self.attempt_usage = ev
  elseif t == "message_end" then
    local bad, why = classify.unusable(ev.message)
    if bad then
      return self:failed(errors.new("unusable", "unusable reply: " .. why, { unusable = true }))
    end
    self.resp = nil -- the provider closed it at its message_end
    local side = self:record(true, true)
    self.usage_total = add_usage(self.usage_total, self.attempt_usage)
    ev.total_usage = self.usage_total
    ev.attempts = self.attempt
    ev.final = true
    self:describe(ev)
    self.state = "done"
    out:push_all(side)
  end
  out:push(ev)
end

-- State waiting: the wait before the next attempt; no further request is
-- sent when the call is cancelled here.
function Call:backoff()
  local ok, err
  if self.probe_wait then -- woken early when the breaker changes
    ok, err = pcall(self.ep.wait_change, self.ep, self.delay)
  else
    ok, err = pcall(luagent_core.sleep, self.delay)
  end
  if ok then
    self.state = "start"
  elseif errors.is_cancel(err) then
    self:abort(err)
  else
    error(err, 0)
  end
end

-- State raise: the final event of a cancelled call was delivered.
function Call:raise()
  self.state = "done"
  error(self.pending_error, 0)
end

local STEP = { start = Call.begin_attempt, streaming = Call.next_event, waiting = Call.backoff, raise = Call.raise }

-- The next queued event, or nil. One order for every event: the caller's
-- before_publish (a durable agent's journal), then the bus, then the
-- caller's iterator.
function Call:deliver()
  local ev = self.out:pop()
  if ev then
    local opts = self.opts
    ev.call, ev.agent, ev.agent_id = self.id, opts.agent, opts.agent_id
    local before = self.before_publish
    if before then before(ev) end
    self.bus:publish(ev)
  end
  return ev
end

-- The next event of the call, or nil after the final one.
function Call:pull()
  while true do
    local ev = self:deliver()
    if ev then return ev end
    if self.state == "done" then return nil end
    STEP[self.state](self)
  end
end

-- The closing value of the generic for: leaving the loop early aborts the
-- attempt in flight at once; when the call was cancelled, what is left of
-- it (its final event) goes to the bus and the cancellation is raised.
function Call:close()
  if self.resp then self.resp:close() self.resp = nil end
  if self.state == "raise" then
    while self:deliver() do end
    self:raise()
  end
end

-- The options `luagent.stream{...}` and `luagent.complete{...}` take (Call.new
-- and the gates read them; luagent.StreamOptions below documents them): any
-- other key raises, naming the nearest. A new option is added here. The
-- last four are the agent layer's (agent/loop.lua): its journal's hook,
-- its name and id on every event, and its cost cap (observe/cost.lua).
M.OPTIONS = options.known { "model", "messages", "system", "tools", "policy", "max_tokens", "temperature",
  "seed", "cache", "thinking", "reasoning", "extra_body", "fallback", "output", "before_publish", "agent", "agent_id", "max_cost" }

---What `luagent.stream{...}` and `luagent.complete{...}` take.
---@class luagent.StreamOptions
---@field model string|luagent.Provider "kind/model" (`"openai/gpt-4o-mini"`) or a provider
---@field messages luagent.Message[] the conversation (lua/luagent/EVENTS.md, "Conversation history")
---@field system string? the system prompt
---@field tools {name: string, description: string, parameters: table}[]? tool definitions offered to the model
---@field policy string|table? the retry policy: a name in policies/, a file, or a table (default: the runtime's)
---@field max_tokens integer? the answer's token limit
---@field temperature number? the sampling temperature
---@field seed integer? the seed of this call's retry jitter
---@field cache boolean|{ttl: string}? Anthropic: cache_control on the system prompt, the tool list and the last user turn (`ttl = "1h"`: the hour-long cache)
---@field thinking {budget_tokens: integer?, type: string?}? Anthropic: extended thinking with this budget (or `type = "adaptive"`); OpenRouter: reasoning.max_tokens
---@field reasoning {effort: string, summary: string?}? OpenAI: reasoning_effort (chat), reasoning.effort and .summary (responses); OpenRouter: reasoning.effort
---@field extra_body table? merged into the request body, over what luagent built (objects deep, anything else replaced; `luagent.json.null` removes a key)
---@field fallback (string|luagent.ProviderSpec|luagent.Provider)[]? models tried in order when the call fails for good on the one before (docs/guide/agent.md, "Fallback models")
---@field output luagent.OutputOptions? structured output: sent the provider's native way; `complete` decodes and checks the answer (`message.output`), asking again at most `retries` times

---A message of a conversation, provider-neutral: any adapter sends it.
---@class luagent.Message
---@field role "user"|"assistant"|"tool"|"system" who says it
---@field content string|luagent.Part[] the text ("" when there was none); a user message may hold content parts (`agent:prompt`)
---@field thinking string? an assistant's reasoning, when the model showed it
---@field tool_calls {id: string, name: string, arguments: table?, raw_arguments: string, error: string?}[]? an assistant's tool calls
---@field tool_call_id string? a tool result's call
---@field name string? a tool result's tool
---@field is_error boolean? a tool result that is an error
---@field incomplete boolean? the partial answer of a turn that failed or was aborted
---@field stop_reason string? (`complete`'s message) "stop", "length" or "tool_use"
---@field usage table? (`complete`'s message) the final attempt's tokens
---@field total_usage table? (`complete`'s message) every attempt's tokens, failed ones included
---@field attempts integer? (`complete`'s message) attempts made
---@field model string? (`complete`'s message) the model that answered, "kind/model" (a fallback's, when the call fell back)
---@field output any? (`complete`'s message, with an `output` option) the decoded value, matching the schema

-- fallback_models(rt, list, api [, level]) -> the providers of a
-- `fallback` option (nil: none): a list of "kind/model", provider specs
-- or providers, each made now (a model without its key raises here, not
-- when the call falls back to it). `api` prefixes the error of a list
-- that is not one.
function M.fallback_models(rt, list, api, level)
  if list == nil then return nil end
  level = (level or 1) + 1
  local bad = api .. ': fallback must be a list of models ("kind/model" or providers)'
  if type(list) ~= "table" or getmetatable(list) == provider_mod.Provider or list.kind ~= nil then
    error(bad, level)
  end
  local n = 0
  for _ in pairs(list) do n = n + 1 end
  if n ~= #list then error(bad, level) end
  local out = {}
  for i, spec in ipairs(list) do
    if getmetatable(spec) == provider_mod.Provider then
      out[i] = spec
    elseif type(spec) == "string" or type(spec) == "table" then
      out[i] = provider_mod.new(rt, spec)
    else
      error(bad .. "; item " .. i .. " is a " .. type(spec), level)
    end
  end
  return out
end

-- Checks the provider knobs of `opts` (an agent's or a call's options;
-- `who` names it in messages, `level` is error's): cache, thinking,
-- reasoning, extra_body. Raises on misuse. What each wire format makes of
-- them is its adapter's (EVENTS.md, "Conversation history and request").
function M.check_knobs(opts, who, level)
  level = (level or 1) + 1
  local function bad(msg) error(who .. ": " .. msg, level + 1) end
  local cache = opts.cache
  if cache ~= nil and type(cache) ~= "boolean" then
    if type(cache) ~= "table" then bad("cache must be true, false or {ttl = \"5m\" | \"1h\"}") end
    for k in pairs(cache) do if k ~= "ttl" then bad("cache has no field '" .. tostring(k) .. "' (known: ttl)") end end
    if cache.ttl ~= nil and type(cache.ttl) ~= "string" then bad("cache.ttl must be a string (\"5m\" or \"1h\")") end
  end
  local th = opts.thinking
  if th ~= nil then
    if type(th) ~= "table" then bad("thinking must be a table {budget_tokens = N}") end
    for k in pairs(th) do
      if k ~= "budget_tokens" and k ~= "type" then
        bad("thinking has no field '" .. tostring(k) .. "' (known: budget_tokens, type)")
      end
    end
    local b = th.budget_tokens
    if b ~= nil and (math.type(b) ~= "integer" or b < 1) then bad("thinking.budget_tokens must be an integer >= 1") end
    if th.type ~= nil and type(th.type) ~= "string" then bad("thinking.type must be a string (\"enabled\", \"adaptive\")") end
    if b == nil and th.type == nil then bad("thinking needs budget_tokens (or type = \"adaptive\")") end
    local max = opts.max_tokens
    if b and math.type(max) == "integer" and max <= b then
      bad(string.format("thinking.budget_tokens (%d) must be less than max_tokens (%d)", b, max))
    end
  end
  local r = opts.reasoning
  if r ~= nil then
    if type(r) ~= "table" then bad("reasoning must be a table {effort = \"low\" | \"medium\" | \"high\" | ...}") end
    for k in pairs(r) do
      if k ~= "effort" and k ~= "summary" then bad("reasoning has no field '" .. tostring(k) .. "' (known: effort, summary)") end
    end
    if r.effort ~= nil and (type(r.effort) ~= "string" or r.effort == "") then bad("reasoning.effort must be a string") end
    if r.summary ~= nil and type(r.summary) ~= "string" then bad("reasoning.summary must be a string") end
  end
  if opts.extra_body ~= nil and type(opts.extra_body) ~= "table" then bad("extra_body must be a table") end
end

-- stream(rt, {model=, messages=, system=, tools=, policy=, max_tokens=,
-- temperature=, seed=, fallback=, before_publish=}) -> iterator of events of a call of runtime rt (and, as the generic for's
-- closing value, an object that aborts the attempt in flight when the loop
-- is left early). `model` is "kind/model" or a provider; `fallback`, the
-- models tried after it (M.fallback_models). The iterator
-- returns nil after the final message_end. before_publish(ev) sees each
-- event before the bus does (an agent's journal writes its steps there).
-- `filters`, a list of function(iter) -> iter (rt.event_filters, for
-- rt:stream), are laid over the iterator the caller gets; `api` names the
-- function the user called in misuse errors ("stream", "complete"), and
-- `level` (error's, default 2: stream's caller) the user's line.
function M.stream(rt, opts, filters, api, level)
  api, level = api or "stream", level or 2
  if type(opts) ~= "table" then error(api .. ": expects a table", level) end
  options.check(opts, M.OPTIONS, api, level)
  if opts.before_publish ~= nil and type(opts.before_publish) ~= "function" then
    error(api .. ": before_publish must be a function", level)
  end
  local output = opts.output
  if output ~= nil and not (type(output) == "table" and type(output.schema) == "table"
      and (output.name == nil or type(output.name) == "string")
      and (output.strict == nil or type(output.strict) == "boolean")) then
    error(api .. ": output must be a table {schema = <JSON Schema table>, name = string?, strict = boolean?}", level)
  end
  local provider = opts.model
  if provider == nil then error(api .. ": model is required", level) end
  M.check_knobs(opts, api, level)
  local policy = rt.policies:resolve(opts.policy, level, api) -- a bad one raises before a missing key
  if getmetatable(provider) ~= provider_mod.Provider then provider = provider_mod.new(rt, provider) end
  local fallback = M.fallback_models(rt, opts.fallback, api, level)
  local call = Call.new(rt, opts, provider, policy, fallback)
  local closer = setmetatable({}, { __close = function() call:close() end })
  local iter = function() return call:pull() end
  for _, f in ipairs(filters or {}) do iter = f(iter) end
  return iter, nil, nil, closer
end

-- complete(rt, {...}) -> the final assistant message (with .usage, .total_usage,
-- .attempts and .model, the "kind/model" that answered), or nil and the
-- error record of the final failure.
function M.complete(rt, opts, level)
  -- misuse names the caller's line (stream's own checks get the level of it)
  level = level or 2
  if type(opts) ~= "table" then error("complete: expects a table", level) end
  options.check(opts, M.OPTIONS, "complete", level)
  if opts.model == nil then error("complete: model is required", level) end
  local final -- the last message_end is the call's outcome
  for ev in M.stream(rt, opts, nil, "complete", level + 1) do
    if ev.type == "message_end" then final = ev end
  end
  if not final then return nil, errors.new("truncated", "the call ended without an answer") end
  if final.stop_reason == "error" then return nil, final.error end
  local msg = final.message or {}
  msg.stop_reason, msg.usage, msg.total_usage, msg.attempts = final.stop_reason, final.usage, final.total_usage, final.attempts
  msg.model = final.provider_kind .. "/" .. final.request_model
  return msg
end

return M
