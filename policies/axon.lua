-- axon's retry loop, from its "Retry Logic" documentation.
--
-- * max_attempts 10, counting the first: 9 retries.
-- * Before attempt n (counting from 0): min(2^n s, backoff_cap 60 s), no
--   jitter: 2, 4, 8, 16, 32, 60, 60, 60, 60 s.
-- * on_status [429, 500, 502, 503, 504]: only these statuses are retried
--   (so 408, 409, 529 and the in-flight 402 are not).
-- * Transport failures are always retried: io.EOF and ErrUnexpectedEOF
--   (eof, truncated), net.Error timeouts, ECONNREFUSED, ECONNRESET, DNS
--   errors. Anything else stops, TLS errors included (see the hook below).
-- * An unusable reply (empty, or leaked tool-call markup) is retried on the
--   first attempt only.
-- * Retry-After is not read; x-should-retry neither.
return {
  name = "axon",
  description = "axon: 10 attempts, min(2^n s, 60 s), no jitter",
  max_retries = 9,
  backoff = { strategy = "power_of_two", base = 1, max = 60 },
  retry_after = { honor = false },
  retry_statuses = { 429, 500, 502, 503, 504 },
  honor_x_should_retry = false,
  unusable_retries = 1,

  -- axon has no circuit breaker, no retry budget and no shared cooldown:
  -- a call that keeps failing makes all 10 requests. Set these to tables to
  -- share luagent's protection per endpoint.
  breaker = false,
  budget = false,
  cooldown = false,

  -- axon's list of transport errors has no TLS failure: it stops there.
  classify = function(err)
    if err.kind == "tls" then
      return { class = "transport", retryable = false, reason = "axon does not retry TLS errors" }
    end
  end,
}
