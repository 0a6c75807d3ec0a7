-- The retry loop end to end against the mock provider on loopback (real
-- libcurl, real sockets), on the virtual clock: which faults are retried,
-- how many requests each costs, the exact event sequences, usage carried
-- over, abort during backoff, retry-safe mode and policy hot reload.
local luagent = require "luagent"
local mock = require "luagent.mock"
local events = require("luagent").events

local logs, saved_log
before_each(function()
  logs = {}
  -- `make test` runs with --log off: these specs read the library's lines
  saved_log = luagent.configure { log_sink = function(_, line) logs[#logs + 1] = line end, log_level = "warn" }
  luagent.clock.virtual()
  -- every spec starts on fresh endpoints: a mock's port may be one an
  -- earlier spec's endpoint (breaker, budget, cooldown) is keyed by
  luagent.default_runtime().endpoints:reset()
end)
after_each(function()
  luagent.configure(saved_log)
  luagent.clock.real()
end)

-- One call against a fresh mock with `faults`; returns the events, the
-- number of model requests the mock received, and the elapsed virtual time.
local function call(faults, opts)
  opts = opts or {}
  local srv = assert(mock.start { faults = faults, seed = 7 })
  local kind = opts.kind or "openai"
  local base = srv.url .. "/v1"
  local evs = {}
  local t0 = luagent.now()
  local ok, err = pcall(function()
    for ev in luagent.stream {
      model = { kind = kind, model = "test-model", base_url = base, api_key = "k" },
      messages = { { role = "user", content = "hello there" } },
      policy = opts.policy, seed = 3,
    } do evs[#evs + 1] = ev end
  end)
  local n = #srv:requests()
  srv:close()
  if not ok then error(err, 0) end
  return evs, n, luagent.now() - t0
end

local function types(evs)
  local out = {}
  for _, e in ipairs(evs) do out[#out + 1] = e.type end
  return table.concat(out, " ")
end

local function count(evs, t)
  local n = 0
  for _, e in ipairs(evs) do if e.type == t then n = n + 1 end end
  return n
end

local function final(evs) return evs[#evs] end

describe("each fault of the mock, under the default policy", function()
  -- fault -> requests the call costs -> how it ends. The table of the issue.
  local cases = {
    { "503@1", 2, "stop" },
    { "500@1", 2, "stop" },
    { "502@1", 2, "stop" },
    { "504@1", 2, "stop" },
    { "529@1", 2, "stop" },
    { "429:retry-after=2@1", 2, "stop" },
    { "429:retry-after-ms=1500@1", 2, "stop" },
    { "429:retry-after-date=+5@1", 2, "stop" },
    { "402:in-flight@1", 2, "stop" },
    { "close@1", 2, "stop" },
    { "reset:bytes=200@1", 2, "stop" },
    { "stall:secs=1000@1", 2, "stop" },               -- attempt timeout (600 s)
    { "stall:secs=1000:after=100@1", 2, "stop" },     -- idle timeout (120 s)
    { "stream-error:overloaded_error@1", 2, "stop" },
    { "stream-error:rate_limit_error@1", 2, "stop" },
    { "stream-error:no_capacity:after=0@1", 2, "stop" },
    { "cut@1", 2, "stop" },
    { "empty@1", 2, "stop" },
    { "leak@1", 2, "stop" },
    { "cut:finished@1", 1, "stop" },                  -- finished answers are never paid twice
    { "500:x-should-retry=false@1", 2, "stop" },      -- the default policy does not obey it
    { "401@1", 1, "error", "auth" },
    { "400:overflow@1", 1, "error", "context_overflow" },
    { "402@1", 1, "error", "payment" },
    { "bad-json@1", 1, "error", "permanent" },
    { "404@1", 1, "error", "client" },
  }
  for _, c in ipairs(cases) do
    local fault, requests, outcome, class = c[1], c[2], c[3], c[4]
    it(fault .. " -> " .. requests .. " request(s), " .. outcome, function()
      local evs, n = call(fault)
      assert.equal(requests, n, types(evs))
      local last = final(evs)
      assert.equal("message_end", last.type)
      assert.equal(outcome, last.stop_reason, tostring(last.error))
      assert.is_true(last.final)
      assert.equal(requests - 1, count(evs, "provider_retry"))
      if class then assert.equal(class, last.error.class, tostring(last.error)) end
      if outcome == "stop" then assert.equal("hello there", last.message.content) end
    end)
  end

  it("stops at once when the server asks for longer than the policy waits", function()
    local evs, n = call("429:retry-after=600@1")
    assert.equal(1, n)
    assert.equal("error", final(evs).stop_reason)
    assert.matches("server asked for 600 s; policy waits at most 60 s", final(evs).error.message)
  end)

  it("waits what the server asked (plus a little jitter), not the backoff", function()
    local evs, n, elapsed = call("429:retry-after=7@1")
    assert.equal(2, n)
    assert.equal("cooldown", evs[1].type) -- every agent on the endpoint holds too
    local r = evs[2]
    assert.equal("provider_retry", r.type)
    assert.is_true(r.delay_ms >= 7000 and r.delay_ms <= 8000, r.delay_ms)
    assert.is_true(elapsed >= 7 and elapsed < 8.5)
  end)
end)

describe("the event contract", function()
  it("closes a failed attempt that opened a message, then provider_retry, then stream_reset", function()
    local evs = call("stream-error:overloaded_error@1")
    assert.equal("message_start text_delta message_end provider_retry stream_reset "
      .. "message_start text_delta text_delta usage message_end", types(evs))
    local failed_end, r = evs[3], evs[4]
    assert.equal("error", failed_end.stop_reason)
    assert.matches("^attempt 1 of 6 failed and will be retried: ", failed_end.error_message)
    assert.is_nil(failed_end.final)
    assert.equal(1, r.attempt)
    assert.equal(6, r.max_attempts)
    assert.is_number(r.delay_ms)
    assert.equal(r.delay_ms, math.floor(r.delay * 1000 + 0.5)) -- the same wait, in seconds
    assert.equal(failed_end.error, r.error) -- the record, as in the attempt's message_end
    assert.equal(tostring(r.error), r.error_message)
    assert.matches("overloaded", r.error_message:lower())
    for _, e in ipairs(evs) do assert.equal(evs[1].call, e.call) end
  end)

  it("sends only provider_retry for an attempt that failed before streaming", function()
    local evs = call("503@1")
    assert.equal("provider_retry message_start text_delta text_delta usage message_end", types(evs))
  end)

  it("never follows the final failure with provider_retry", function()
    local evs, n = call("503", { policy = { max_retries = 2 } })
    assert.equal(3, n)
    assert.equal("provider_retry provider_retry message_end", types(evs))
    assert.equal(2, evs[2].attempt)
    assert.equal(3, evs[2].max_attempts)
    assert.equal("error", final(evs).stop_reason)
    assert.matches("no attempts left", final(evs).reason)
  end)

  it("logs one INFO line per retry at log level info, none at the default warn", function()
    call("503@1-2")
    assert.equal(0, #logs)
    local before = luagent.configure { log_level = "info" }
    local ok, err = pcall(call, "503@1-2")
    luagent.configure(before)
    assert(ok, err)
    assert.equal(2, #logs)
    local line = require("cjson").decode(logs[1]) -- a structured line (JSON off a terminal)
    assert.equal("info", line.level)
    assert.matches("^provider error %(attempt 1/6%), retrying in %d+%.%d%ds: http: HTTP 503 from POST http://127%.0%.0%.1:%d+/v1/chat/completions: server_error: The engine is currently overloaded, please try again later%.$", line.msg)
    assert.matches("attempt 2/6", logs[2])
  end)

  it("carries the usage of failed attempts into the call's total", function()
    local evs = call("stream-error:overloaded_error@1", { kind = "anthropic" })
    local last = final(evs)
    assert.equal("stop", last.stop_reason)
    local one = last.usage.input_tokens
    assert.is_true(one > 0)
    assert.equal(2 * one, last.total_usage.input_tokens) -- the failed attempt read the prompt too
    assert.equal(2, last.attempts)
  end)

  it("ends at once when cancelled during the backoff: aborted, no further request", function()
    local srv = assert(mock.start { faults = "503", seed = 1 })
    local seen = {}
    local t = luagent.spawn(function()
      for ev in luagent.stream { model = { kind = "openai", model = "m", base_url = srv.url .. "/v1", api_key = "k" },
                                  messages = { { role = "user", content = "hi" } } } do
        seen[#seen + 1] = ev
      end
    end)
    while #seen == 0 do luagent.sleep(0) end
    assert.equal("provider_retry", seen[1].type)
    t:cancel("user")
    local ok, err = pcall(t.join, t)
    assert.is_false(ok)
    assert.equal("cancelled", err.kind)
    assert.equal("provider_retry message_end", types(seen))
    assert.equal("aborted", seen[2].stop_reason)
    assert.equal(1, #srv:requests())
    srv:close()
  end)

  it("complete() returns the final message, or nil and the final error", function()
    local srv = assert(mock.start { faults = "503@1,401@3", seed = 1 })
    local model = { kind = "openai", model = "m", base_url = srv.url .. "/v1", api_key = "k" }
    local msg = assert(luagent.complete { model = model, messages = { { role = "user", content = "a b" } } })
    assert.equal("a b", msg.content)
    assert.equal(2, msg.attempts)
    local none, err = luagent.complete { model = model, messages = { { role = "user", content = "x" } } }
    assert.is_nil(none)
    assert.equal("http", err.kind)
    assert.equal(401, err.status)
    srv:close()
  end)
end)

describe("retry-safe mode", function()
  it("holds each attempt until it succeeds; a retried one leaves only provider_retry", function()
    local evs = call("stream-error:overloaded_error@1")
    local i = 0
    local filtered = {}
    for ev in events.retry_safe(function() i = i + 1 return evs[i] end) do filtered[#filtered + 1] = ev end
    assert.equal("provider_retry message_start text_delta text_delta usage message_end", types(filtered))
  end)

  it("lets a final failure through as message_start and its error end, without deltas", function()
    local evs = call("stream-error:overloaded_error", { policy = { max_retries = 1 } })
    local i = 0
    local filtered = {}
    for ev in events.retry_safe(function() i = i + 1 return evs[i] end) do filtered[#filtered + 1] = ev end
    assert.equal("provider_retry message_start message_end", types(filtered))
    assert.equal("error", filtered[3].stop_reason)
    assert.is_true(filtered[3].final)
  end)

  it("works on the bus, one filter per call", function()
    local got = {}
    local stop = events.subscribe(events.retry_safe_consumer(function(ev) got[#got + 1] = ev end))
    call("stream-error:overloaded_error@1")
    stop()
    assert.equal("provider_retry message_start text_delta text_delta usage message_end", types(got))
  end)
end)

describe("policy files", function()
  local dir, path
  before_each(function()
    dir = os.tmpname()
    os.remove(dir)
    assert(os.execute("mkdir -p " .. dir))
    path = dir .. "/mine.lua"
  end)
  after_each(function()
    luagent.default_runtime().policies:forget(path)
    os.execute("rm -rf " .. dir)
  end)

  local function write(text)
    local f = assert(io.open(path, "w"))
    f:write(text)
    f:close()
  end

  -- Waits (bounded) until the watcher has seen the edit.
  local function settle(loader, version)
    luagent.clock.real()
    for _ = 1, 200 do
      if loader.version > version or loader.error then break end
      luagent.sleep(0.01)
    end
    luagent.clock.virtual()
  end

  it("applies an edit to the next call; a broken edit keeps the old policy and says file:line", function()
    write("return { max_retries = 0 }\n")
    local _, n = call("503@1-5", { policy = path })
    assert.equal(1, n)
    local loader = luagent.default_runtime().policies:watched(path)
    local v = loader.version
    write("return { max_retries = 3,\n  backoff = { strategy = 'fixed', base = 1 } }\n")
    settle(loader, v)
    assert.equal(v + 1, loader.version)
    local evs
    evs, n = call("503@1-5", { policy = path })
    assert.equal(4, n)
    assert.equal(1000, evs[1].delay_ms)
    v = loader.version
    write("return { max_retries = 1,\n  backoff = { strategy = = 'fixed' } }\n")
    settle(loader, v)
    assert.equal(v, loader.version)
    local reported = table.concat(logs, "\n")
    assert.matches(path:gsub("%p", "%%%0") .. ":2:", reported)
    assert.matches("previous policy stays", reported)
    _, n = call("503@1-5", { policy = path })
    assert.equal(4, n) -- the old policy (3 retries) is still in force
  end)

  it("names a missing policy", function()
    local ok, err = pcall(luagent.stream, { model = "openai/x", policy = "no-such-policy" })
    assert.is_false(ok)
    assert.equal("usage", err.kind)
    assert.matches("no policy named 'no%-such%-policy'", err.message)
  end)
end)

describe("cancellation, breakage and protection settings", function()
  local function model(srv) return { kind = "openai", model = "m", base_url = srv.url .. "/v1", api_key = "k" } end

  it("ends with a final aborted event on the bus when cancelled mid-stream", function()
    local srv = assert(mock.start { seed = 1, tps = 0.1 }) -- a slow stream
    local seen = {}
    local stop = events.subscribe(function(ev) seen[#seen + 1] = ev end)
    local t = luagent.spawn(function()
      for _ in luagent.stream { model = model(srv), messages = { { role = "user", content = "a b c d e f" } } } do end
    end)
    while #seen < 2 do luagent.sleep(0.001) end
    t:cancel()
    local ok, err = pcall(t.join, t)
    stop()
    assert.is_false(ok)
    assert.equal("cancelled", err.kind)
    local last = seen[#seen]
    assert.equal("message_end", last.type)
    assert.equal("aborted", last.stop_reason)
    assert.is_true(last.final)
    assert.equal(0, luagent.stats().busy)
    srv:close()
  end)

  it("has one exit for cancellation: the caller gets the final event too, and leaving the loop raises", function()
    local srv = assert(mock.start { seed = 1, tps = 0.1 }) -- a slow stream
    local seen, bus = {}, {}
    local stop = events.subscribe(function(ev) bus[#bus + 1] = ev end)
    local t = luagent.spawn(function()
      for ev in luagent.stream { model = model(srv), messages = { { role = "user", content = "a b c d e f" } } } do
        seen[#seen + 1] = ev
        if ev.final then break end -- leaving at the final event must not swallow the cancellation
      end
      return "went on"
    end)
    while #seen < 2 do luagent.sleep(0.001) end
    t:cancel()
    local ok, err = pcall(t.join, t)
    stop()
    srv:close()
    assert.is_false(ok)
    assert.equal("cancelled", err.kind)
    assert.equal(types(bus), types(seen))
    assert.equal("message_end", seen[#seen].type)
    assert.equal("aborted", seen[#seen].stop_reason)
  end)

  it("does not swallow a cancellation that lands while an error body is read", function()
    local srv = assert(mock.start { faults = "503", seed = 1 })
    local t = luagent.spawn(function()
      luagent.complete { model = model(srv), messages = { { role = "user", content = "x" } } }
      return "went on"
    end)
    luagent.sleep(0) luagent.sleep(0)
    t:cancel()
    local ok, err = pcall(t.join, t)
    assert.is_false(ok)
    assert.equal("cancelled", err.kind)
    srv:close()
  end)

  it("frees the breaker's probe when the probe is cancelled before its headers", function()
    local srv = assert(mock.start { faults = "503@1-5,stall:secs=100@6", seed = 1 })
    local policy = { max_retries = 0, breaker = { consecutive = 5, open_for = 1 }, budget = false, cooldown = false }
    for _ = 1, 5 do luagent.complete { model = model(srv), messages = { { role = "user", content = "x" } }, policy = policy } end
    luagent.sleep(1.5) -- the open time is over: the next call is the probe
    local probe = luagent.spawn(function()
      luagent.complete { model = model(srv), messages = { { role = "user", content = "x" } }, policy = policy }
    end)
    luagent.sleep(1) -- the probe waits on its stalled headers
    probe:cancel()
    pcall(probe.join, probe)
    local msg, err = luagent.complete { model = model(srv), messages = { { role = "user", content = "y" } }, policy = policy }
    assert.is_nil(err, err and tostring(err))
    assert.equal("y", msg.content) -- the next caller could probe at once
    srv:close()
  end)

  it("turns the breaker and the budget off with false", function()
    local srv = assert(mock.start { faults = "503", seed = 1 })
    local policy = { max_retries = 0, breaker = false, budget = false, cooldown = false }
    for _ = 1, 12 do
      local _, err = luagent.complete { model = model(srv), messages = { { role = "user", content = "x" } }, policy = policy }
      assert.equal("http", err.kind) -- never circuit_open
    end
    assert.equal(12, #srv:requests())
    srv:close()
  end)

  it("keeps the endpoint's events in retry-safe mode", function()
    local srv = assert(mock.start { faults = "stream-error:overloaded_error@1-3", seed = 1 })
    local policy = { max_retries = 3, backoff = { strategy = "fixed", base = 1 },
                     breaker = { consecutive = 2, open_for = 1 }, budget = false, cooldown = false }
    local got = {}
    for ev in events.retry_safe(luagent.stream { model = model(srv), policy = policy,
                                                  messages = { { role = "user", content = "x" } } }) do
      got[#got + 1] = ev.type
    end
    got = table.concat(got, " ")
    assert.matches("circuit_open", got)
    -- the retried attempts leave their provider_retry and the endpoint's events
    assert.matches("^provider_retry circuit_open provider_retry circuit_half_open", got)
    srv:close()
  end)

  it("raises an adapter's programming error instead of retrying it", function()
    local srv = assert(mock.start { seed = 1 })
    local p = luagent.provider { kind = "openai", model = "m", base_url = srv.url .. "/v1", api_key = "k" }
    p.adapter = setmetatable({ decoder = function() return { feed = function() local x = nil; return x.oops end } end },
                             { __index = p.adapter })
    local ok, err = pcall(luagent.complete, { model = p, messages = { { role = "user", content = "x" } } })
    assert.is_false(ok)
    assert.is_string(err)
    assert.matches("attempt to index a nil value", err)
    assert.equal(1, #srv:requests())
    srv:close()
  end)

  it("reports an on_context_overflow hook that fails", function()
    local srv = assert(mock.start { faults = "400:overflow", seed = 1 })
    local policy = { on_context_overflow = function() error("cannot shorten") end }
    local _, err = luagent.complete { model = model(srv), policy = policy, messages = { { role = "user", content = "x" } } }
    assert.equal("context_overflow", err.class)
    assert.matches("cannot shorten", table.concat(logs, "\n"))
    srv:close()
  end)

  it("aborts the attempt in flight when the caller leaves the loop early", function()
    local srv = assert(mock.start { seed = 1, tps = 10 })
    for ev in luagent.stream { model = model(srv), messages = { { role = "user", content = "one two three four five" } } } do
      if ev.type == "text_delta" then break end
    end
    assert.equal(0, luagent.stats().busy)
    srv:close()
  end)
end)

describe("a call that failed for good", function()
  local classify = require "luagent.model.classify"

  it("returns an error marked final: not retryable, the reason, the attempts, the last attempt's error as cause", function()
    local evs, n = call("503", { policy = { max_retries = 2 } })
    assert.equal(3, n)
    local err = final(evs).error
    assert.equal("http", err.kind)
    assert.equal(503, err.status)
    assert.is_false(err.retryable)
    assert.is_true(err.final)
    assert.equal(3, err.attempts)
    assert.matches("no attempts left", err.reason)
    assert.matches("final after 3 attempts", tostring(err))
    assert.equal("http", err.cause.kind)
    assert.equal(503, err.cause.status)
    assert.is_nil(err.cause.retryable)
    -- classified again (by an agent loop, a script's own retry, a resume): permanent
    local d = classify.classify(err, { attempt = 1 })
    assert.equal("permanent", d.class)
    assert.is_false(d.retryable)
    assert.equal("overloaded", classify.classify(err.cause, { attempt = 1 }).class)
  end)

  it("is what complete() returns, also when the budget refused the retry", function()
    local srv = assert(mock.start { faults = "503", seed = 1 })
    local model = { kind = "openai", model = "m", base_url = srv.url .. "/v1", api_key = "k" }
    local policy = { max_retries = 5, backoff = { strategy = "fixed", base = 1 }, breaker = false,
                     cooldown = false, budget = { max = 4 } }
    local none, err = luagent.complete { model = model, policy = policy, messages = { { role = "user", content = "x" } } }
    srv:close()
    assert.is_nil(none)
    assert.equal("retry_budget_exhausted", err.kind)
    assert.is_false(err.retryable)
    assert.equal("http", err.cause.kind) -- the last attempt's error
    assert.equal(2, err.attempts)
    assert.equal("permanent", classify.classify(err).class)
  end)
end)

describe("a bundled policy named after a system behaves like that system", function()
  local function model(srv) return { kind = "openai", model = "m", base_url = srv.url .. "/v1", api_key = "k" } end

  it("axon makes exactly 10 requests against a provider that always answers 503", function()
    local evs, n, elapsed = call("503", { policy = "axon" })
    assert.equal(10, n)
    assert.equal(9, count(evs, "provider_retry"))
    assert.equal("http", final(evs).error.kind)
    assert.equal(2 + 4 + 8 + 16 + 32 + 60 * 4, elapsed) -- min(2^n, 60) s, no jitter
  end)

  it("yoagent makes 4 requests on every call, the third in a row included", function()
    local srv = assert(mock.start { faults = "503", seed = 1 })
    local before = 0
    for i = 1, 3 do
      local none, err = luagent.complete { model = model(srv), policy = "yoagent", messages = { { role = "user", content = "x" } } }
      assert.is_nil(none)
      assert.equal("http", err.kind, "call " .. i .. ": " .. tostring(err))
      local now = #srv:requests()
      assert.equal(4, now - before, "call " .. i)
      before = now
    end
    srv:close()
  end)

  it("yoagent waits 30 s for Retry-After: 100, and announces 30000 ms", function()
    local evs, n, elapsed = call("429:retry-after=100@1", { policy = "yoagent" })
    assert.equal(2, n)
    assert.equal("provider_retry", evs[1].type)
    assert.equal(30000, evs[1].delay_ms)
    assert.equal("server", evs[1].source)
    assert.equal("stop", final(evs).stop_reason)
    assert.is_true(elapsed >= 30 and elapsed < 30.01, elapsed)
  end)

  it("sdk makes 3 requests on every call", function()
    local srv = assert(mock.start { faults = "503", seed = 1 })
    for _ = 1, 3 do
      luagent.complete { model = model(srv), policy = "sdk", messages = { { role = "user", content = "x" } } }
    end
    assert.equal(9, #srv:requests())
    srv:close()
  end)

  it("the default policy gives a lone call on a fresh endpoint all of its 6 attempts", function()
    local evs, n = call("503")
    assert.equal(6, n)
    assert.matches("no attempts left", final(evs).error.reason)
  end)
end)

describe("a capped Retry-After and the endpoint's cooldown", function()
  it("agree: the wait announced is the wait made", function()
    local policy = { retry_after = { max_wait = 30, over_max = "cap", jitter = 0 } } -- shared protection on
    local evs, n, elapsed = call("429:retry-after=100@1", { policy = policy })
    assert.equal(2, n)
    assert.equal("cooldown", evs[1].type)
    assert.equal("provider_retry", evs[2].type)
    assert.equal(30000, evs[2].delay_ms)
    assert.is_true(elapsed >= 30 and elapsed < 30.01, elapsed)
  end)
end)

describe("a cooldown another call set", function()
  it("is part of the wait announced, and no hold follows it", function()
    local endpoint = require "luagent.model.endpoint"
    local srv = assert(mock.start { faults = "503@1", seed = 7 })
    local base = srv.url .. "/v1"
    -- another agent's 429 lands while this attempt fails: a classify hook
    -- (which defers) stands in for it
    local policy = { classify = function()
      luagent.default_runtime().endpoints:get(endpoint.key(base)):set_cooldown(luagent.now() + 20)
    end }
    local evs = {}
    local t0 = luagent.now()
    for ev in luagent.stream { model = { kind = "openai", model = "m", base_url = base, api_key = "k" },
                               messages = { { role = "user", content = "x" } }, policy = policy, seed = 3 } do
      evs[#evs + 1] = ev
    end
    local elapsed = luagent.now() - t0
    srv:close()
    local r = evs[1]
    assert.equal("provider_retry", r.type)
    assert.equal("cooldown", r.source)
    assert.is_true(r.delay_ms >= 20000 and r.delay_ms <= 25000, r.delay_ms)
    assert.equal("stop", final(evs).stop_reason)
    assert.is_true(math.abs(elapsed - r.delay_ms / 1000) < 0.01, elapsed .. " vs " .. r.delay_ms)
  end)
end)

describe("which deadline fired", function()
  it("names the attempt timeout, with its length", function()
    local evs = call("stall:secs=1000@1", { policy = { attempt_timeout = 10 } })
    assert.equal("provider_retry", evs[1].type)
    assert.equal("timeout: attempt 1 took longer than the attempt timeout (10 s)", evs[1].error_message)
    assert.equal("attempt", evs[1].error.which)
  end)

  it("names the call's total deadline when it cut the attempt short: not retried", function()
    local evs, n, elapsed = call("stall:secs=1000@1", { policy = { attempt_timeout = 600, total_deadline = 50 } })
    assert.equal(1, n)
    assert.equal(50, elapsed)
    local err = final(evs).error
    assert.equal("timeout", err.kind)
    assert.equal("total_deadline", err.which)
    assert.matches("^the call's total deadline %(50 s%) passed during attempt 1", err.message)
    assert.equal("deadline", err.class)
  end)

  it("names the idle timeout", function()
    local evs = call("stall:secs=1000:after=100@1", { policy = { idle_timeout = 7 } })
    local r
    for _, e in ipairs(evs) do if e.type == "provider_retry" then r = e break end end
    assert.matches("idle timeout %(7 s%)", r.error)
  end)
end)

describe("a context overflow", function()
  local compact = require "luagent.model.compact"

  -- A conversation long enough to shorten: a task, two tool rounds, a question.
  local function history()
    return {
      { role = "user", content = "first task" },
      { role = "assistant", content = "", tool_calls = { { id = "c1", name = "read", arguments = { path = "a" }, raw_arguments = '{"path":"a"}' } } },
      { role = "tool", tool_call_id = "c1", name = "read", content = "lots of text" },
      { role = "assistant", content = "read a" },
      { role = "user", content = "second" },
      { role = "assistant", content = "", tool_calls = { { id = "c2", name = "read", arguments = { path = "b" }, raw_arguments = '{"path":"b"}' } } },
      { role = "tool", tool_call_id = "c2", name = "read", content = "more text" },
      { role = "user", content = "hello there" },
    }
  end

  local function overflow_call(faults, policy)
    local srv = assert(mock.start { faults = faults, seed = 7 })
    local evs = {}
    for ev in luagent.stream { model = { kind = "openai", model = "m", base_url = srv.url .. "/v1", api_key = "k" },
                               system = "be brief", messages = history(), policy = policy, seed = 3 } do
      evs[#evs + 1] = ev
    end
    local reqs = srv:requests()
    srv:close()
    return evs, reqs
  end

  it("is resent once, compacted by the shipped strategy, and succeeds", function()
    local evs, reqs = overflow_call("400:overflow@1", { on_context_overflow = "drop_oldest" })
    assert.equal(2, #reqs)
    local sent1, sent2 = #reqs[1].body.messages, #reqs[2].body.messages
    assert.is_true(sent2 < sent1, sent1 .. " then " .. sent2)
    assert.equal("system", reqs[2].body.messages[1].role) -- the system prompt stays
    assert.equal("context_compacted provider_retry message_start", types(evs):match("^%S+ %S+ %S+"))
    assert.equal(8, evs[1].before)
    assert.equal(#compact.drop_oldest(history()), evs[1].after)
    assert.equal(0, evs[2].delay_ms)
    assert.equal("context_overflow", evs[2].class)
    local last = final(evs)
    assert.equal("stop", last.stop_reason)
    assert.equal("hello there", last.message.content)
    assert.equal(2, last.attempts) -- the resend counts as an attempt
  end)

  it("is resent only once", function()
    local evs, reqs = overflow_call("400:overflow@1-2", { on_context_overflow = "drop_oldest" })
    assert.equal(2, #reqs)
    assert.equal("context_overflow", final(evs).error.class)
    assert.equal(1, count(evs, "context_compacted"))
  end)

  it("fails as before when the hook returns nothing", function()
    local evs, reqs = overflow_call("400:overflow@1", { on_context_overflow = function() end })
    assert.equal(1, #reqs)
    assert.equal(0, count(evs, "context_compacted"))
    assert.equal("context_overflow", final(evs).error.class)
  end)

  it("is not resent when the policy allows no retry", function()
    local _, reqs = overflow_call("400:overflow@1", { on_context_overflow = "drop_oldest", max_retries = 0 })
    assert.equal(1, #reqs)
  end)

  it("reports a hook that returns something that is not a message list, and fails", function()
    local evs, reqs = overflow_call("400:overflow@1", { on_context_overflow = function() return { "x" } end })
    assert.equal(1, #reqs)
    assert.equal("error", final(evs).stop_reason)
    assert.matches("item 1 is not a message", table.concat(logs, "\n"))
  end)
end)

describe("an abort during a retry's backoff", function()
  it("ends the call with exactly one final event and no second message_end", function()
    local srv = assert(mock.start { faults = "stream-error:overloaded_error", seed = 1 })
    local seen, bus = {}, {}
    local stop = events.subscribe(function(ev) bus[#bus + 1] = ev end)
    local t = luagent.spawn(function()
      for ev in luagent.stream { model = { kind = "openai", model = "m", base_url = srv.url .. "/v1", api_key = "k" },
                                  messages = { { role = "user", content = "hi" } } } do
        seen[#seen + 1] = ev
        if ev.type == "provider_retry" then luagent.current():cancel("user") end
      end
    end)
    local ok, err = pcall(t.join, t)
    stop()
    assert.is_false(ok)
    assert.equal("cancelled", err.kind)
    assert.equal(1, #srv:requests())
    srv:close()
    assert.equal("message_start text_delta message_end provider_retry call_aborted", types(seen))
    assert.equal(types(seen), types(bus))
    assert.equal(1, count(seen, "message_end"))
    local finals = 0
    for _, e in ipairs(seen) do if e.final then finals = finals + 1 end end
    assert.equal(1, finals)
    assert.equal("aborted", final(seen).stop_reason)
    assert.equal("cancelled", final(seen).error.kind)
  end)
end)
