-- The classifier (lua/luagent/model/classify.lua): every rule, and the order
-- between them, as a table of error -> decision.
local classify = require "luagent.model.classify"
local errors = require "luagent.base.errors"
local policies = require "luagent.model.policy"

local E = errors.new

local function http(status, body, headers)
  return E("http", "HTTP " .. status, { status = status, body = body, headers = headers or {} })
end

local function stream(fields)
  return E("stream_error", fields.message or "stream error", fields)
end

-- A policy from a table, raising if invalid.
local function P(t)
  return assert(policies.new(t, "spec policy"))
end

local axon = assert(policies.load("policies/axon.lua"))
local sdk = assert(policies.load("policies/sdk.lua"))
local yoagent = assert(policies.load("policies/yoagent.lua"))

local function hook_says(answer)
  return P { classify = function() return answer end }
end

-- {what, err, class, retryable, rule, ctx, policy}
local cases = {
  -- Rule 1: the caller's cancellation and deadline, before everything.
  { "cancelled", E("cancelled", "stop"), "cancelled", false, 1 },
  { "the caller's deadline", E("timeout", "t", { which = "deadline" }), "deadline", false, 1 },
  { "the total deadline", E("timeout", "t", { which = "total_deadline" }), "deadline", false, 1 },
  { "ctx.cancelled beats a transport error", E("reset", "r"), "cancelled", false, 1, { cancelled = true } },
  { "ctx.deadline_expired beats a 503", http(503), "deadline", false, 1, { deadline_expired = true } },
  { "cancellation beats a hook", E("cancelled", "c"), "cancelled", false, 1, nil, hook_says("server") },

  -- Rule 2: hooks, before the built-in rules.
  { "a hook's class name", http(400, "bad"), "server", true, 2, nil, hook_says("server") },
  { "a hook's table beats 429", http(429), "client", false, 2, nil,
    hook_says({ class = "client", retryable = false }) },
  { "a hook's unknown class is not retryable", http(500), "mine", false, 2, nil, hook_says("mine") },
  { "a hook's explicit retryable", http(401), "mine", true, 2, nil,
    hook_says({ class = "mine", retryable = true }) },
  { "a hook deferring with nil", http(429), "rate_limited", true, 3, nil, hook_says(nil) },
  { "the second hook decides when the first defers", http(404), "overloaded", true, 2, nil,
    P { classify = { function() return nil end, function() return "overloaded" end } } },
  { "the first deciding hook wins", http(404), "server", true, 2, nil,
    P { classify = { function() return "server" end, function() return "auth" end } } },

  -- Rule 2, first: the error answers for itself, before the hooks and the
  -- built-in rules (the book's classifier asks the error).
  { "an error saying retryable = true (a tool's, a custom adapter's)",
    { message = "try again", retryable = true }, "transient", true, 2 },
  { "an error saying retryable = true keeps its known class",
    E("usage", "x", { retryable = true, class = "server" }), "server", true, 2 },
  { "an error saying retryable = false beats a 503", E("http", "HTTP 503", { status = 503, retryable = false }),
    "permanent", false, 2 },
  { "a final error is permanent, whatever a hook says",
    E("http", "HTTP 503", { status = 503, retryable = false, final = true, reason = "no attempts left (6)" }),
    "permanent", false, 2, nil, hook_says("overloaded") },
  { "the caller's cancellation beats the error's own answer", E("cancelled", "c", { retryable = true }),
    "cancelled", false, 1 },

  -- Rule 3: HTTP statuses.
  { "429", http(429, "slow down"), "rate_limited", true, 3 },
  { "429 with an overflow phrase", http(429, "prompt is too long for current capacity"), "rate_limited", true, 3 },
  { "503", http(503), "overloaded", true, 3 },
  { "529", http(529, '{"type":"error","error":{"type":"overloaded_error"}}'), "overloaded", true, 3 },
  { "402 in-flight budget in error.metadata",
    http(402, '{"error":{"code":402,"message":"x","metadata":{"limit_source":"openrouter_in_flight_budget"}}}'),
    "payment", true, 3 },
  { "402 in-flight budget at the top level",
    http(402, '{"limit_source":"openrouter_in_flight_budget"}'), "payment", true, 3 },
  { "402 in-flight budget in a decoded body",
    http(402, { error = { metadata = { limit_source = "openrouter_in_flight_budget" } } }), "payment", true, 3 },
  { "402 out of credit", http(402, '{"error":{"code":402,"metadata":{"limit_source":"account"}}}'),
    "payment", false, 3 },
  { "402 with a body that is not JSON", http(402, "openrouter_in_flight_budget"), "payment", false, 3 },
  { "401", http(401, "invalid api key"), "auth", false, 3 },
  { "403", http(403), "auth", false, 3 },
  { "400 context_length_exceeded",
    http(400, '{"error":{"code":"context_length_exceeded","message":"This model\'s maximum context length is 128000 tokens"}}'),
    "context_overflow", false, 3 },
  { "400 prompt is too long", http(400, "prompt is too long: 213462 tokens > 200000 maximum"), "context_overflow", false, 3 },
  { "413 too many tokens", http(413, "Too Many Tokens"), "context_overflow", false, 3 },
  { "400 exceeds the context window", http(400, "Your input exceeds the context window of this model"),
    "context_overflow", false, 3 },
  { "400 without an overflow phrase", http(400, "invalid request"), "client", false, 3 },
  { "413 without an overflow phrase", http(413, ""), "client", false, 3 },
  { "408", http(408), "server", true, 3 },
  { "409", http(409), "server", true, 3 },
  { "500", http(500), "server", true, 3 },
  { "502", http(502), "server", true, 3 },
  { "504", http(504), "server", true, 3 },
  { "501", http(501), "server", false, 3 },
  { "404", http(404), "client", false, 3 },
  { "422", http(422), "client", false, 3 },
  { "an http error without a status", E("http", "?"), "permanent", false, 7 },

  -- Rule 3: x-should-retry, only when the policy says so.
  { "x-should-retry true on 400", http(400, "bad", { ["x-should-retry"] = "true" }), "client", true, 3, nil,
    P { honor_x_should_retry = true } },
  { "x-should-retry false on 500", http(500, "", { ["x-should-retry"] = "false" }), "server", false, 3, nil,
    P { honor_x_should_retry = true } },
  { "x-should-retry false on 429", http(429, "", { ["x-should-retry"] = "false" }), "rate_limited", false, 3, nil,
    P { honor_x_should_retry = true } },
  { "x-should-retry ignored by default", http(500, "", { ["x-should-retry"] = "false" }), "server", true, 3 },
  { "x-should-retry garbage", http(500, "", { ["x-should-retry"] = "maybe" }), "server", true, 3, nil,
    P { honor_x_should_retry = true } },
  { "x-should-retry cannot resend an overflow",
    http(400, "prompt is too long", { ["x-should-retry"] = "true" }), "context_overflow", false, 3, nil,
    P { honor_x_should_retry = true } },

  -- Rule 3: retry_statuses narrows and extends.
  { "axon does not retry 408", http(408), "server", false, 3, nil, axon },
  { "axon does not retry 529", http(529), "overloaded", false, 3, nil, axon },
  { "axon retries 503", http(503), "overloaded", true, 3, nil, axon },
  { "axon retries 500", http(500), "server", true, 3, nil, axon },
  { "axon does not retry the in-flight 402",
    http(402, '{"limit_source":"openrouter_in_flight_budget"}'), "payment", false, 3, nil, axon },
  { "yoagent does not retry 500", http(500), "server", false, 3, nil, yoagent },
  { "a listed 418", http(418), "client", true, 3, nil, P { retry_statuses = { 418 } } },
  { "5xx lists 501", http(501), "server", true, 3, nil, sdk },
  { "the sdk retries 409", http(409), "server", true, 3, nil, sdk },
  { "the sdk obeys x-should-retry", http(409, "", { ["x-should-retry"] = "false" }), "server", false, 3, nil, sdk },
  { "retry_statuses cannot resend an overflow", http(400, "prompt is too long"), "context_overflow", false, 3, nil,
    P { retry_statuses = { 400 } } },

  -- Rule 4: in-stream errors by structured fields, before overflow phrases.
  { "type too_many_requests", stream { type = "too_many_requests" }, "rate_limited", true, 4 },
  { "code no_capacity", stream { type = "error", code = "no_capacity" }, "rate_limited", true, 4 },
  { "code rate_limit_exceeded", stream { code = "rate_limit_exceeded" }, "rate_limited", true, 4 },
  { "type rate_limit_error", stream { type = "rate_limit_error" }, "rate_limited", true, 4 },
  { "status rate_limit", stream { status = "rate_limit" }, "rate_limited", true, 4 },
  { "uppercase RATE_LIMIT_ERROR", stream { type = "RATE_LIMIT_ERROR" }, "rate_limited", true, 4 },
  { "type overloaded_error", stream { type = "overloaded_error" }, "overloaded", true, 4 },
  { "status UNAVAILABLE", stream { status = "UNAVAILABLE" }, "overloaded", true, 4 },
  { "numeric code 503", stream { code = 503 }, "overloaded", true, 4 },
  { "numeric status 529", stream { status = 529 }, "overloaded", true, 4 },
  { "string code 529", stream { code = "529" }, "overloaded", true, 4 },
  { "numeric 429 is not read", stream { code = 429, status = "RESOURCE_EXHAUSTED" }, "permanent", false, 7 },
  { "no_capacity beats an overflow phrase",
    stream { type = "too_many_requests", code = "no_capacity",
             message = "The request exceeds the context window during peak load" },
    "rate_limited", true, 4 },
  { "an overflow message", stream { type = "invalid_request_error", message = "prompt is too long: 5 > 4" },
    "context_overflow", false, 4 },
  { "an overflow code", stream { code = "context_length_exceeded", message = "too long" },
    "context_overflow", false, 4 },
  { "free text never reads as a rate limit",
    stream { type = "api_error", message = "rate limit reached, too_many_requests" }, "permanent", false, 7 },

  -- Rule 5: transport failures and attempt timeouts.
  { "refused", E("refused", "x"), "transport", true, 5 },
  { "reset", E("reset", "x"), "transport", true, 5 },
  { "dns", E("dns", "x"), "transport", true, 5 },
  { "tls", E("tls", "bad record MAC"), "transport", true, 5 },
  { "eof", E("eof", "x"), "transport", true, 5 },
  { "truncated", E("truncated", "x"), "transport", true, 5 },
  { "attempt timeout", E("timeout", "t", { which = "attempt" }), "timeout", true, 5 },
  { "idle timeout", E("timeout", "t", { which = "idle" }), "timeout", true, 5 },
  { "first byte timeout", E("timeout", "t", { which = "first_byte" }), "timeout", true, 5 },
  { "connect timeout", E("timeout", "t", { which = "connect" }), "timeout", true, 5 },
  { "curl couldn't connect, host unreachable", E("transport", "x", { curl_code = 7, errno = "EHOSTUNREACH" }),
    "transport", true, 5 },
  { "HTTP/2 stream error (curl 92, kind protocol)", E("protocol", "HTTP/2 stream 1 was not closed cleanly",
    { curl_code = 92, phase = "headers" }), "transport", true, 5 },
  { "HTTP/2 framing error (curl 16, kind protocol)", E("protocol", "x", { curl_code = 16, phase = "body" }),
    "transport", true, 5 },
  { "malformed chunked framing (curl 56, kind protocol) is permanent",
    E("protocol", "Illegal or missing hexadecimal sequence in chunked-encoding", { curl_code = 56 }),
    "permanent", false, 7 },
  { "curl malformed URL", E("transport", "x", { curl_code = 3 }), "permanent", false, 7 },
  { "protocol (malformed framing) is permanent", E("protocol", "x"), "permanent", false, 7 },
  { "axon stops on TLS (its hook)", E("tls", "x"), "transport", false, 2, nil, axon },
  { "axon retries a reset", E("reset", "x"), "transport", true, 5, nil, axon },

  -- Rule 6: unusable replies, once.
  { "unusable on attempt 1", { kind = "unusable" }, "unusable", true, 6, { attempt = 1 } },
  { "unusable on attempt 2", { kind = "unusable" }, "unusable", false, 6, { attempt = 2 } },
  { "unusable without ctx.attempt", { kind = "unusable" }, "unusable", true, 6 },
  { "unusable by class", { class = "unusable" }, "unusable", true, 6 },
  { "unusable flag on a protocol record", E("protocol", "empty reply", { unusable = true }), "unusable", true, 6 },
  { "unusable_retries 0", { kind = "unusable" }, "unusable", false, 6, { attempt = 1 }, P { unusable_retries = 0 } },
  { "unusable_retries 2, attempt 2", { kind = "unusable" }, "unusable", true, 6, { attempt = 2 },
    P { unusable_retries = 2 } },

  -- Rule 7: anything else.
  { "a usage error", E("usage", "bad flag"), "permanent", false, 7 },
  { "a string", "something broke", "permanent", false, 7 },
  { "an unknown kind", { kind = "weird" }, "permanent", false, 7 },
}

describe("classify", function()
  for _, c in ipairs(cases) do
    local what, err, class, retryable, rule, ctx, policy = table.unpack(c, 1, 7)
    it(("%s -> %s, %s (rule %d)"):format(what, class, retryable and "retried" or "not retried", rule), function()
      local reports = {}
      ctx = ctx or {}
      ctx.report = function(msg) reports[#reports + 1] = msg end
      local d = classify.classify(err, ctx, policy)
      assert.equal(class, d.class)
      assert.equal(retryable, d.retryable)
      assert.equal("rule " .. rule .. ":", d.reason:match("^rule %d:"), d.reason)
      assert.same({}, reports)
    end)
  end

  it("accepts a plain policy table, and raises on an invalid one", function()
    local d = classify.classify(http(500, "", { ["x-should-retry"] = "false" }), {}, { honor_x_should_retry = true })
    assert.is_false(d.retryable)
    assert.has_error(function() classify.classify(http(500), {}, { honour = true }) end,
      "classify: policy table: unknown field 'honour' (policies/README.md lists the fields)")
  end)

  it("has a case for every overflow phrase", function()
    for _, phrase in ipairs(classify.overflow_phrases) do
      local d = classify.classify(http(400, "Error: " .. phrase:upper() .. "!"), {})
      assert.equal("context_overflow", d.class, phrase)
    end
  end)
end)

describe("classify retry_after", function()
  it("comes from retry-after on a retried status", function()
    local d = classify.classify(http(429, "", { ["retry-after"] = "3" }), {})
    assert.equal(3, d.retry_after)
  end)

  it("prefers retry-after-ms", function()
    local d = classify.classify(http(503, "", { ["retry-after-ms"] = "1500", ["retry-after"] = "9" }), {})
    assert.equal(1.5, d.retry_after)
  end)

  it("reads an HTTP-date against ctx.now_epoch", function()
    local d = classify.classify(http(500, "", { ["retry-after"] = "Sun, 06 Nov 1994 08:49:37 GMT" }),
      { now_epoch = 784111777 - 12 })
    assert.equal(12, d.retry_after)
  end)

  it("ignores garbage and negative values", function()
    assert.is_nil(classify.classify(http(429, "", { ["retry-after"] = "-5" }), {}).retry_after)
    assert.is_nil(classify.classify(http(429, "", { ["retry-after"] = "later" }), {}).retry_after)
  end)

  it("falls back to the record's own retry_after", function()
    local d = classify.classify(E("http", "x", { status = 429, retry_after = 2 }), {})
    assert.equal(2, d.retry_after)
  end)

  it("is absent when the decision is not to retry", function()
    local d = classify.classify(http(401, "", { ["retry-after"] = "3" }), {})
    assert.is_false(d.retryable)
    assert.is_nil(d.retry_after)
  end)

  it("can be set by a hook", function()
    local d = classify.classify(http(400), {}, hook_says({ class = "server", retry_after = 7 }))
    assert.equal(7, d.retry_after)
  end)
end)

describe("classify hooks that fail", function()
  local policy = assert(policies.load("spec/fixtures/policies/hooks.lua"))
  local file = "spec/fixtures/policies/hooks.lua"

  -- Classifies a 503 whose message selects the misbehaving hook; returns the
  -- decision and the reports.
  local function run(message)
    local reports = {}
    local err = E("http", message, { status = 503 })
    local d = classify.classify(err, { report = function(m) reports[#reports + 1] = m end }, policy)
    return d, reports
  end

  it("a hook that raises is reported with file:line and the default rules apply", function()
    local d, reports = run("hook raises")
    assert.equal("overloaded", d.class)
    assert.equal(1, #reports)
    assert.matches("^" .. file .. ":5: boom", reports[1])
  end)

  it("a hook that runs away is stopped, reported and deferred", function()
    local d, reports = run("hook loops")
    assert.equal("overloaded", d.class)
    assert.equal(1, #reports)
    assert.matches("^" .. file .. ":8: instruction limit %(%d+%) exceeded", reports[1])
  end)

  it("a hook cannot swallow the instruction limit with pcall", function()
    local d, reports = run("hook swallows the limit")
    assert.equal("overloaded", d.class)
    assert.equal(1, #reports)
    assert.matches("^" .. file .. ":12: instruction limit", reports[1])
  end)

  it("a hook answering nonsense is reported and deferred", function()
    local d, reports = run("hook returns a number")
    assert.equal("overloaded", d.class)
    assert.equal(1, #reports)
    assert.matches("^" .. file .. ":15: classify hook returned a number", reports[1])
  end)

  it("the later hooks still run after one failed", function()
    local d, reports = run("hook decides")
    assert.same({}, reports)
    assert.equal("server", d.class)
    assert.equal("rule 2: classify hook at " .. file .. ":18", d.reason)
  end)

  it("a hook's retry_after of math.huge (or past the sane range) is reported and ignored", function()
    for _, ra in ipairs({ math.huge, 0 / 0, 1e7, -1 }) do
      local reports = {}
      local d = classify.classify(http(503), { report = function(m) reports[#reports + 1] = m end },
        hook_says({ class = "overloaded", retry_after = ra }))
      assert.equal("overloaded", d.class)
      assert.matches("^rule 3", d.reason)
      assert.is_nil(d.retry_after)
      assert.equal(1, #reports)
      assert.matches("classify hook returned a retry_after that is not a number of seconds from 0 to 1000000 %(got "
        .. tostring(ra):gsub("%p", "%%%0") .. "%)", reports[1])
    end
  end)

  it("a hook's answer is read raw: a looping __index or __pairs never runs", function()
    local loop = function() while true do end end
    local answer = setmetatable({ retryable = true }, { __index = loop, __pairs = loop, __len = loop })
    local reports = {}
    local d = classify.classify(http(503), { report = function(m) reports[#reports + 1] = m end }, hook_says(answer))
    assert.equal("overloaded", d.class)
    assert.equal(1, #reports)
    assert.matches("classify hook returned a table %(expected nil, a class name", reports[1])
  end)

  it("the hook gets the error and the context", function()
    local seen
    local p = P { classify = function(err, ctx) seen = { err.status, ctx.attempt } end }
    classify.classify(http(500), { attempt = 3 }, p)
    assert.same({ 500, 3 }, seen)
  end)
end)

describe("classify.unusable", function()
  -- {what, message, unusable}
  local cases = {
    { "empty text", { role = "assistant", content = "" }, true },
    { "whitespace", { role = "assistant", content = " \n\t" }, true },
    { "no content", { role = "assistant" }, true },
    { "not a message", nil, true },
    { "thinking only", { role = "assistant", content = "", thinking = "hmm" }, true },
    { "text", { role = "assistant", content = "Hello." }, false },
    { "tool calls without text", { role = "assistant", content = "", tool_calls = { { id = "1", name = "ls", arguments = {} } } }, false },
    { "a leaked <tool_call>", { content = '<tool_call>{"name":"ls","arguments":{}}</tool_call>\n' }, true },
    { "two leaked <tool_call>s", { content = "<tool_call>{}</tool_call>\n<tool_call>{}</tool_call>" }, true },
    { "an unterminated <tool_call>", { content = '<tool_call>{"name": "ls", "argu' }, true },
    { "text around leaked markup", { content = "I will list files.\n<tool_call>{}</tool_call>" }, false },
    { "Anthropic function_calls XML", { content = '<function_calls><invoke name="ls"></invoke></function_calls>' }, true },
    { "Llama <function=...>", { content = '<function=ls>{"path": "."}</function>' }, true },
    { "Mistral [TOOL_CALLS]", { content = '[TOOL_CALLS][{"name": "ls", "arguments": {}}]' }, true },
    { "Kimi sections", { content = "<|tool_calls_section_begin|><|tool_call_begin|>functions.ls:0<|tool_call_end|><|tool_calls_section_end|>" }, true },
    { "DeepSeek markers", { content = "<｜tool▁calls▁begin｜>ls<｜tool▁calls▁end｜>" }, true },
    { "a mention of tool_call in prose", { content = "Use the tool_call API." }, false },
  }
  for _, c in ipairs(cases) do
    local what, message, want = table.unpack(c, 1, 3)
    it(what .. " -> " .. tostring(want), function()
      local got, why = classify.unusable(message)
      assert.equal(want, got)
      if want then assert.is_string(why) end
    end)
  end
end)

describe("classify.unusable on a long reply", function()
  -- 80,000 leaked blocks (2 MB): cutting them out one by one copied the
  -- text once per block (quadratic, seconds with the loop frozen); one
  -- linear pass takes milliseconds. The bound is 20 times that, not a race.
  it("strips 80,000 markup blocks in one linear pass", function()
    local block = '<tool_call>{"a":1}</tool_call>  '
    local text = block:rep(80000)
    assert.is_true(#text >= 2000000)
    local t0 = os.clock()
    local bad, why = classify.unusable({ content = text })
    local spent = os.clock() - t0
    assert.is_true(bad)
    assert.equal("only leaked tool-call markup", why)
    assert.is_true(spent < 0.5, ("took %.2f s of CPU"):format(spent))
    t0 = os.clock()
    assert.is_false(classify.unusable({ content = text .. "a word" }))
    assert.is_true(os.clock() - t0 < 0.5)
  end)
end)
