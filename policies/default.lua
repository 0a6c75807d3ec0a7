-- The default policy: our recommendation for an agent a person is waiting
-- on, or a small batch. These values are also what any policy gets for a
-- field it leaves out (M.defaults in lua/luagent/model/policy.lua).
return {
  name = "default",
  description = "full jitter 1..30 s, 5 retries, Retry-After obeyed up to 60 s",

  -- Five retries, six attempts. Full jitter waits half its ceiling on
  -- average, so five retries span about 15 s (31 s at worst): enough for a
  -- dropped connection, an overload or a short rate-limit window, short
  -- enough that a person waiting sees a real outage as a failure.
  max_retries = 5,

  -- Full jitter (the book, after Marc Brooker's AWS measurements): a random
  -- wait between 0 and a ceiling that doubles from 1 s to 30 s. When many
  -- agents fail at the same moment their retries spread over the whole
  -- window instead of arriving in waves, so this sends the fewest requests
  -- and finishes soonest of the strategies measured.
  backoff = { strategy = "full_jitter", base = 1, max = 30 },

  -- The server knows when it will take us back: its Retry-After replaces the
  -- backoff, plus up to 1 s so clients told the same instant do not return
  -- together. Up to 60 s is worth waiting for. A server asking for more (a
  -- quota that resets in an hour) would leave the agent silent, so the call
  -- fails at once with an error that gives both numbers.
  retry_after = { honor = true, max_wait = 60, jitter = 1, over_max = "give_up" },

  -- One attempt may take 10 min, the SDKs' request timeout: a long answer
  -- streams for a long time.
  attempt_timeout = 600,

  -- But 2 min without a single byte is a stalled connection, not a slow
  -- model: providers send pings or progress events while they work. 120 s
  -- leaves room for a reasoning model that is silent before its first token.
  idle_timeout = 120,

  -- Every attempt and every wait of one call together.
  total_deadline = 1800,

  -- One answer's event data may not pass 64 MiB: a server that streams
  -- without end fails the attempt (kind too_large) before memory runs out.
  max_answer_bytes = 64 * 1024 * 1024,

  -- retry_statuses is left out: the built-in rules apply (429, 503, 529,
  -- 408, 409, 500, 502, 504, and OpenRouter's in-flight 402).

  -- x-should-retry is not obeyed: the built-in rules already agree with what
  -- OpenAI and Anthropic send, and a fixed list is easier to reason about
  -- than a header any proxy can add or strip.
  honor_x_should_retry = false,

  -- A reply with nothing usable in it is retried once (as axon does): a
  -- model that does it twice in a row will do it again.
  unusable_retries = 1,

  -- Protection shared by every call of the process to one endpoint. It is
  -- there for the fleet (many agents hammering a provider that is down),
  -- but it must never cut a single agent's call short: a lone call on a
  -- fresh endpoint gets all of its 6 attempts.
  -- * The breaker opens after 10 counted failures in a row: more than one
  --   call's 6 attempts, so one call failing for good does not open it for
  --   the next; two calls in a row that fail for good do. The ratio rule
  --   is sized by it (policies/README.md): 50 % of the last 20 calls once
  --   20 were made, so it too needs 10 failures.
  -- * The retry budget holds 20 tokens and refuses retries at 10 or less:
  --   each counted failure costs one, so retries stop for everyone after
  --   10 failures (a lone call's retries follow its first 5), and each
  --   success earns 0.1 back (gRPC's throttling: once the endpoint fails
  --   more than it answers, about one retry per ten successes).
  -- * A cooldown (a 429 or 503 with Retry-After) holds every agent on the
  --   endpoint until the server's time, released over a quarter of it.
  -- A key left out of `breaker` or `budget` in any policy takes these
  -- values; the rest are the endpoint's own defaults (policies/README.md).
  breaker = { consecutive = 10 },
  budget = { max = 20 },
  cooldown = {},
}
