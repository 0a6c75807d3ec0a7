-- yoagent 0.24's RetryConfig::default(), from its retry documentation and
-- src/retry.rs.
--
-- * 3 retries, 4 attempts.
-- * Before retry n: min(1 s * 2^(n-1), 30 s), then +-20 % jitter (the cap is
--   applied before the jitter): about 1, 2, 4 s.
-- * A server's Retry-After replaces the backoff, capped at max_delay (30 s)
--   "so a bad header cannot stall the loop"; it never gives up, adds no
--   jitter.
-- * Retried: RateLimited (429, 503, 529) and Network (connection failures,
--   timeouts, a stream cut before its end). 500, 502 and 504 are Api errors
--   in yoagent: not retried; neither are parse errors, auth, other 4xx or
--   unusable replies. In-stream errors follow the same structured codes as
--   our rule 4.
-- * No deadline across attempts; x-should-retry is not read.
return {
  name = "yoagent",
  description = "yoagent: 3 retries, 1 s doubling to 30 s, +-20 % jitter",
  max_retries = 3,
  backoff = { strategy = "exponential", base = 1, multiplier = 2, max = 30, jitter = 0.2 },
  retry_after = { honor = true, max_wait = 30, jitter = 0, over_max = "cap" },
  retry_statuses = { 429, 503, 529 },
  honor_x_should_retry = false,
  unusable_retries = 0,
  total_deadline = false,
  -- yoagent's retry config has no per-attempt or idle timeout; ours are kept
  -- (from the defaults) so that a stalled connection still ends.

  -- yoagent has no circuit breaker, no retry budget and no cooldown shared
  -- between agents: every call makes its own 4 requests, and a capped
  -- Retry-After is waited exactly (30 s, not the server's 100 s). Set these
  -- to tables to share luagent's protection per endpoint.
  breaker = false,
  budget = false,
  cooldown = false,
}
