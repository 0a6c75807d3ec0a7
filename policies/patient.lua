-- For batch runs nobody is watching, where a long rate limit is better
-- waited out than failed: a run that dies at turn 41 loses all its work
-- (the book's first failure: 1.7 million tokens read, then one immediate
-- retry of a TLS error, then nothing).
return {
  name = "patient",
  description = "batch runs: 12 retries, full jitter 2 s..5 min, Retry-After up to 1 h",

  -- 12 retries with ceilings 2, 4, ... 256, then 300 s: about 15 min of
  -- waiting on average, 28 min at worst, before counting server waits.
  max_retries = 12,
  backoff = { strategy = "full_jitter", base = 2, max = 300 },

  -- An hourly quota reset is waited out; up to 10 s of jitter spreads the
  -- many workers of a batch that were all told the same instant.
  retry_after = { honor = true, max_wait = 3600, jitter = 10, over_max = "give_up" },

  -- Long answers, slow queues: generous per-attempt limits, and 4 h for
  -- the whole call.
  attempt_timeout = 1200,
  idle_timeout = 300,
  total_deadline = 4 * 3600,

  -- Sampling can produce an empty reply twice by chance over a long run.
  unusable_retries = 2,

  -- The shared protection sized for 13 attempts, so that a lone call on a
  -- fresh endpoint gets all of them (default.lua says why): the breaker
  -- opens after 20 counted failures in a row, or at half of its last 20
  -- calls once 20 were made; retries stop for everyone after 15 failures.
  breaker = { consecutive = 20, window = 20, min_calls = 20 },
  budget = { max = 30 },
}
