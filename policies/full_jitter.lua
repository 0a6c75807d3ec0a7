-- The book's retry middleware (chapter 12: "Retries, traces, and cost").
--
-- * Full jitter: before retry n, a random wait in [0, ceiling), the ceiling
--   doubling from Backoff.Base (zero value: 1 s) up to Backoff.Max (zero
--   value: 30 s).
-- * A server's Retry-After is used in place of the backoff, with a small
--   jitter added, and capped; when the server asks for longer than we will
--   wait, the retries stop at once with an error that says what it asked.
-- * The classifier's order is ours (caller first, then retryable errors,
--   timeouts, dropped connections; anything else permanent), including the
--   retried OpenRouter in-flight 402.
--
-- default.lua currently agrees with this file on every retry setting. It is
-- kept apart because default.lua is our recommendation and may change,
-- while this one stays the book's strategy for comparisons.
return {
  name = "full_jitter",
  description = "the book: full jitter, base 1 s, ceiling doubling to 30 s",
  max_retries = 5,
  backoff = { strategy = "full_jitter", base = 1, max = 30 },
  retry_after = { honor = true, max_wait = 60, jitter = 1, over_max = "give_up" },
}
