-- The official OpenAI and Anthropic SDKs (Python and TypeScript share the
-- logic): what a plain client.chat.completions.create / messages.create does.
--
-- * max_retries 2: 3 attempts.
-- * Before retry n: min(0.5 s * 2^(n-1), 8 s) * (1 - 0.25 U): 0.5, 1 s, then
--   2, 4, 8 s if max_retries is raised; the jitter only shortens the wait.
-- * A server's wait: retry-after-ms first, then retry-after (seconds or an
--   HTTP-date). Obeyed, without added jitter, when it is at most 60 s;
--   otherwise ignored in favour of the backoff. (The SDKs obey only values
--   strictly below 60 s; here exactly 60 s is obeyed too.)
-- * x-should-retry: "true" or "false" from the server decides.
-- * Retried: 408, 409, 429 and every 5xx, connection errors and timeouts.
-- * One request may take 10 min; no idle timeout, no deadline across
--   attempts. Unusable replies are the caller's problem.
return {
  name = "sdk",
  description = "OpenAI/Anthropic SDKs: 2 retries, min(0.5 * 2^n, 8) s, -25 % jitter",
  max_retries = 2,
  backoff = { strategy = "sdk", base = 0.5, max = 8, jitter = 0.25 },
  retry_after = { honor = true, max_wait = 60, jitter = 0, over_max = "backoff" },
  retry_statuses = { 408, 409, 429, "5xx" },
  honor_x_should_retry = true,
  attempt_timeout = 600,
  idle_timeout = false,
  total_deadline = false,
  unusable_retries = 0,

  -- The SDKs keep no state between requests: no circuit breaker, no retry
  -- budget, no cooldown shared between clients. Set these to tables to
  -- share luagent's protection per endpoint.
  breaker = false,
  budget = false,
  cooldown = false,
}
