-- Fallback models (`fallback = {...}` on a call or an agent) against two
-- mock providers on loopback, one per model, so the requests each model
-- got are counted apart; on the virtual clock. A call that fails for good
-- with a transient kind, or that its endpoint refuses, goes on with the
-- next model (its own endpoint, its own wire format) after a
-- model_fallback event; a permanent failure does not, unless the policy's
-- fallback_on_permanent names its class. Spans and cost name the model
-- that answered.
local luagent = require "luagent"
local mock = require "luagent.mock"
local events = require("luagent").events
local cjson = require "cjson"
local slurp = require("spec.support.helpers").slurp

local saved_log, servers, tracer_left -- (a tracer a failed spec left running)
-- a mock server closed after the spec, whatever happened in it
local function serve(opts)
  local srv = assert(mock.start(opts))
  servers[#servers + 1] = srv
  return srv
end
before_each(function()
  servers = {}
  saved_log = luagent.configure { log_sink = function() end, log_level = "warn" }
  luagent.clock.virtual()
  -- every spec starts on fresh endpoints (a mock's port may be reused)
  luagent.default_runtime().endpoints:reset()
end)
after_each(function()
  for _, srv in ipairs(servers) do srv:close() end
  if tracer_left then tracer_left:stop() tracer_left = nil end
  luagent.configure(saved_log)
  luagent.clock.real()
end)

-- A quick policy: fixed 1 s waits, two retries (three attempts per model).
local function policy(extra)
  local p = { max_retries = 2, backoff = { strategy = "fixed", base = 1 }, budget = false, cooldown = false,
              breaker = false }
  for k, v in pairs(extra or {}) do p[k] = v end
  return p
end

-- The first model (OpenAI's wire) on server a, the second (Anthropic's) on b.
local function models(a, b)
  return { kind = "openai", model = "model-a", base_url = a.base_urls.openai, api_key = "ka" },
         { kind = "anthropic", model = "model-b", base_url = b.base_urls.anthropic, api_key = "kb" }
end

local function collect(opts)
  local evs = {}
  for ev in luagent.stream(opts) do evs[#evs + 1] = ev end
  return evs
end

local function of_type(evs, t)
  local out = {}
  for _, e in ipairs(evs) do if e.type == t then out[#out + 1] = e end end
  return out
end

local function types(evs)
  local out = {}
  for _, e in ipairs(evs) do
    if e.type ~= "text_delta" and e.type ~= "usage" then out[#out + 1] = e.type end
  end
  return table.concat(out, " ")
end

local hi = { { role = "user", content = "hello there" } }

describe("fallback models of a call", function()
  it("falls back after the first model's retries: its server always 503, the second answers", function()
    local a = serve { faults = "503", seed = 1 }
    local b = serve { seed = 2 }
    local ma, mb = models(a, b)
    local evs = collect { model = ma, fallback = { mb }, messages = hi, policy = policy() }
    local na, nb = #a:requests(), #b:requests()
    local b_path = b:requests()[1] and b:requests()[1].path
    a:close() b:close()
    assert.equal(3, na) -- its own attempts: 1 + max_retries
    assert.equal(1, nb)
    assert.equal("/v1/messages", b_path) -- the second model's own wire format
    assert.equal("provider_retry provider_retry model_fallback message_start message_end", types(evs))
    local fb = of_type(evs, "model_fallback")[1]
    assert.equal("openai/model-a", fb.from)
    assert.equal("anthropic/model-b", fb.to)
    assert.matches("no attempts left", fb.reason)
    assert.equal("http", fb.error.kind)
    assert.equal(503, fb.error.status)
    assert.equal(3, fb.attempt)
    local final = evs[#evs]
    assert.is_true(final.final)
    assert.equal("stop", final.stop_reason)
    -- the final message_end names the model that answered
    assert.equal("model-b", final.request_model)
    assert.equal("anthropic", final.provider_kind)
    assert.equal(b.base_urls.anthropic, final.endpoint)
    assert.same({ "openai/model-a" }, final.fallback_from)
    assert.equal(4, final.attempts) -- every model's attempts
  end)

  it("luagent.complete's message says which model answered", function()
    local a = serve { faults = "503", seed = 1 }
    local b = serve { seed = 2 }
    local ma, mb = models(a, b)
    local msg, err = luagent.complete { model = ma, fallback = { mb }, messages = hi, policy = policy() }
    a:close() b:close()
    assert.is_nil(err)
    assert.equal("anthropic/model-b", msg.model)
  end)

  it("tries the second model with no request to the first when the first's breaker is open", function()
    local a = serve { faults = "503", seed = 1 }
    local b = serve { seed = 2 }
    local ma, mb = models(a, b)
    local p = policy { breaker = { consecutive = 3, open_for = 60 } }
    -- the first call's three failures open the first model's breaker; it falls back
    local first = collect { model = ma, fallback = { mb }, messages = hi, policy = p }
    assert.equal(1, #of_type(first, "circuit_open"))
    assert.equal(3, #a:requests())
    assert.equal("stop", first[#first].stop_reason)
    -- the next call: refused by the open breaker, no request to the first model
    local evs = collect { model = ma, fallback = { mb }, messages = hi, policy = p }
    local na, nb = #a:requests(), #b:requests()
    a:close() b:close()
    assert.equal(3, na)
    assert.equal(2, nb)
    assert.equal("model_fallback message_start message_end", types(evs))
    local fb = evs[1]
    assert.equal("circuit_open", fb.error.kind)
    assert.matches("circuit is open", fb.reason)
    assert.is_nil(fb.attempt) -- no attempt of the first model was made
    assert.equal("stop", evs[#evs].stop_reason)
    assert.equal(1, evs[#evs].attempts)
  end)

  it("does not fall back after a 401", function()
    local a = serve { faults = "401", seed = 1 }
    local b = serve { seed = 2 }
    local ma, mb = models(a, b)
    local evs = collect { model = ma, fallback = { mb }, messages = hi, policy = policy() }
    local na, nb = #a:requests(), #b:requests()
    a:close() b:close()
    assert.equal(1, na)
    assert.equal(0, nb)
    assert.equal(0, #of_type(evs, "model_fallback"))
    local final = evs[#evs]
    assert.equal("error", final.stop_reason)
    assert.equal(401, final.error.status)
    assert.equal("model-a", final.request_model)
    assert.is_nil(final.fallback_from)
  end)

  it("falls back after a 401 when the policy's fallback_on_permanent names auth", function()
    local a = serve { faults = "401", seed = 1 }
    local b = serve { seed = 2 }
    local ma, mb = models(a, b)
    local evs = collect { model = ma, fallback = { mb }, messages = hi,
                          policy = policy { fallback_on_permanent = { "auth" } } }
    local na, nb = #a:requests(), #b:requests()
    a:close() b:close()
    assert.equal(1, na)
    assert.equal(1, nb)
    local fb = of_type(evs, "model_fallback")[1]
    assert.equal("auth", fb.class)
    assert.equal("stop", evs[#evs].stop_reason)
  end)

  it("ends with the last model's failure when every model fails", function()
    local a = serve { faults = "503", seed = 1 }
    local b = serve { faults = "529", seed = 2 }
    local ma, mb = models(a, b)
    local evs = collect { model = ma, fallback = { mb }, messages = hi, policy = policy() }
    local na, nb = #a:requests(), #b:requests()
    a:close() b:close()
    assert.equal(3, na)
    assert.equal(3, nb)
    assert.equal(1, #of_type(evs, "model_fallback"))
    assert.equal(1, #of_type(evs, "message_end")) -- exactly one final event
    local final = evs[#evs]
    assert.equal("error", final.stop_reason)
    assert.equal("model-b", final.request_model)
    assert.equal(6, final.attempts)
    assert.same({ "openai/model-a" }, final.fallback_from)
  end)

  it("falls back when the server asks for a longer wait than the policy makes", function()
    local a = serve { faults = "429:retry-after=600", seed = 1 }
    local b = serve { seed = 2 }
    local ma, mb = models(a, b)
    local evs = collect { model = ma, fallback = { mb }, messages = hi, policy = policy() }
    assert.equal(1, #a:requests())
    assert.equal(1, #b:requests())
    local fb = of_type(evs, "model_fallback")[1]
    assert.equal("rate_limited", fb.class)
    assert.equal("server asked for 600 s; policy waits at most 60 s", fb.reason)
    assert.equal("stop", evs[#evs].stop_reason)
  end)

  it("does not fall back when the cost cap refuses the call", function()
    local a = serve { seed = 1 }
    local b = serve { seed = 2 }
    local ma, mb = models(a, b)
    local meter = luagent.default_runtime():meter("cost")
    assert(meter:set_prices { ["model-a"] = { input = 1, output = 2 }, ["model-b"] = { input = 1, output = 2 } })
    local agent = luagent.agent { model = ma, fallback = { mb }, max_cost = 0, policy = policy() }
    local last = agent:run("hi")
    assert.equal("error", last.stop_reason)
    assert.equal("cost_limit", last.error.kind)
    assert.equal(0, #a:requests())
    assert.equal(0, #b:requests())
  end)

  it("says so in the log, once, at warn", function()
    local lines = {}
    luagent.configure { log_sink = function(_, line) lines[#lines + 1] = line end, log_level = "warn" }
    local a = serve { faults = "503", seed = 1 }
    local b = serve { seed = 2 }
    local ma, mb = models(a, b)
    collect { model = ma, fallback = { mb }, messages = hi, policy = policy() }
    local said = {}
    for _, l in ipairs(lines) do if l:find("falling back to", 1, true) then said[#said + 1] = l end end
    assert.equal(1, #said)
    assert.matches("model openai/model%-a failed for good %(no attempts left %(3%)%), falling back to "
      .. "anthropic/model%-b: http: HTTP 503", said[1])
  end)

  it("leaves the first model's attempts out of a retry-safe stream", function()
    -- each attempt of the first model streams text, then an in-stream overload
    local a = serve { faults = "stream-error:overloaded_error", seed = 1 }
    local b = serve { seed = 2 }
    local ma, mb = models(a, b)
    local raw, safe = {}, {}
    for ev in luagent.stream { model = ma, fallback = { mb }, messages = hi, policy = policy() } do
      raw[#raw + 1] = ev
    end
    local i = 0
    for ev in events.retry_safe(function() i = i + 1 return raw[i] end) do safe[#safe + 1] = ev end
    assert.equal(3, #a:requests())
    -- the raw stream: each failed attempt's own end, then a reset before the second model's answer
    local ends = of_type(raw, "message_end")
    assert.equal(4, #ends)
    assert.matches("^attempt 3 failed for good on openai/model%-a, which falls back to anthropic/model%-b",
      ends[3].error_message)
    assert.is_nil(ends[3].final)
    local resets = of_type(raw, "stream_reset")
    assert.equal(3, #resets) -- before attempts 2 and 3, and before the second model's
    assert.equal(4, resets[3].attempt)
    assert.equal("provider_retry provider_retry model_fallback message_start message_end", types(safe))
    assert.equal("model-b", safe[#safe].request_model)
  end)

  it("shows the fallback in the --trace tree", function()
    local tracer = assert(luagent.default_runtime():trace { tree = true })
    tracer_left = tracer
    local a = serve { faults = "503", seed = 1 }
    local b = serve { seed = 2 }
    local ma, mb = models(a, b)
    collect { model = ma, fallback = { mb }, messages = hi, policy = policy() }
    local out = {}
    tracer:stop { write = function(_, ...) for _, x in ipairs({ ... }) do out[#out + 1] = x end end }
    local text = table.concat(out)
    assert.matches("chat model%-b [^\n]*  after openai/model%-a\n", text)
    assert.matches("attempt 2 [^\n]*HTTP 503, retried after 1%.000s\n", text)
    assert.matches("attempt 3 [^\n]*HTTP 503, fell back to anthropic/model%-b\n", text)
    assert.matches("attempt 4 [^\n]*\n", text)
  end)

  it("raises for a fallback that is not a list of models", function()
    local m = { kind = "openai", model = "x", base_url = "http://127.0.0.1:9/v1", api_key = "k" }
    local want = 'fallback must be a list of models ("kind/model" or providers)'
    assert.has_error(function() luagent.stream { model = m, fallback = "openai/y", messages = hi } end,
      "stream: " .. want)
    assert.has_error(function() luagent.stream { model = m, fallback = m, messages = hi } end, "stream: " .. want)
    assert.has_error(function() luagent.agent { model = m, fallback = { m, 5 } } end,
      "agent: " .. want .. "; item 2 is a number")
  end)
end)

describe("fallback models of an agent", function()
  -- The first model asks for `lookup` once; from its second request on, 503.
  local function script(_, _, body)
    for _, m in ipairs(body.messages or {}) do
      if m.role == "tool" then return { text = "done" } end
    end
    return { text = "looking", tools = { { id = "call_1", name = "lookup", arguments = { q = "x" } } } }
  end
  local lookup = { name = "lookup", description = "Looks up", read_only = true,
    params = { type = "object", properties = { q = { type = "string" } } }, run = function() return "found" end }

  it("sends the history in the second model's wire format; spans and cost name the model that answered", function()
    local file = os.tmpname()
    local rt = luagent.default_runtime()
    local tracer = assert(rt:trace { file = file })
    tracer_left = tracer
    local meter = rt:meter("cost")
    meter:reset()
    assert(meter:set_prices { ["model-a"] = { input = 1, output = 2 }, ["model-b"] = { input = 10, output = 20 } })
    local a = serve { faults = "503@2-100", seed = 1, script = script }
    local b = serve { seed = 2 }
    local ma, mb = models(a, b)
    local seen = {}
    local unsub = events.subscribe(function(ev) seen[#seen + 1] = ev end)
    local agent = luagent.agent { name = "fb", model = ma, fallback = { mb }, tools = { lookup },
                                  policy = policy() }
    local last = agent:run("go")
    unsub()
    local na, nb = #a:requests(), #b:requests()
    local body = b:requests()[1].body
    a:close() b:close()
    tracer:stop()
    assert.equal("stop", last.stop_reason)
    assert.equal(4, na) -- turn 1, then turn 2's three attempts
    assert.equal(1, nb)
    -- the history, provider-neutral, in Anthropic's shape
    local kinds = {}
    for _, m in ipairs(body.messages) do
      for _, part in ipairs(type(m.content) == "table" and m.content or {}) do kinds[#kinds + 1] = part.type end
    end
    assert.same({ "text", "tool_use", "tool_result" }, kinds)
    local call_id = last.messages[2].tool_calls[1].id
    assert.equal(call_id, body.messages[2].content[2].id)
    assert.equal(call_id, body.messages[3].content[1].tool_use_id)
    -- the cost: the answer priced as model-b's, its record named so
    local recs = meter:records()
    assert.equal(2, #recs)
    assert.equal("model-a", recs[1].model)
    assert.equal("model-b", recs[2].model)
    local finals = {}
    for _, ev in ipairs(seen) do if ev.type == "message_end" and ev.final then finals[#finals + 1] = ev end end
    local u = finals[2].total_usage
    assert.near((u.input_tokens * 10 + u.output_tokens * 20) / 1e6, recs[2].cost, 1e-12)
    -- the spans: the second chat span is model-b's, its fallen-back attempt says to whom
    local spans = {}
    for line in slurp(file):gmatch("[^\n]+") do
      for _, rs in ipairs(cjson.decode(line).resourceSpans) do
        for _, ss in ipairs(rs.scopeSpans) do
          for _, s in ipairs(ss.spans) do spans[#spans + 1] = s end
        end
      end
    end
    os.remove(file)
    local function attrs(s)
      local t = {}
      for _, kv in ipairs(s.attributes or {}) do
        local v = kv.value
        t[kv.key] = v.stringValue or v.intValue or v.arrayValue or v.boolValue or v.doubleValue
      end
      return t
    end
    local chats, fell = {}, nil
    for _, s in ipairs(spans) do
      if s.name:match("^chat ") then chats[#chats + 1] = s end
      if attrs(s)["luagent.fallback.to"] then fell = s end
    end
    table.sort(chats, function(x, y) return tonumber(attrs(x)["luagent.call"]) < tonumber(attrs(y)["luagent.call"]) end)
    assert.equal("chat model-a", chats[1].name)
    assert.equal("chat model-b", chats[2].name)
    local c2 = attrs(chats[2])
    assert.equal("model-b", c2["gen_ai.request.model"])
    assert.equal("anthropic", c2["gen_ai.provider.name"])
    assert.equal("openai/model-a", c2["luagent.fallback.from"].values[1].stringValue)
    assert.is_truthy(fell)
    assert.equal("attempt 3", fell.name)
    assert.equal("anthropic/model-b", attrs(fell)["luagent.fallback.to"])
    assert.equal("model-a", attrs(fell)["gen_ai.request.model"])
  end)
end)

describe("the policy's fallback_on_permanent", function()
  local policies = require "luagent.model.policy"
  local classify = require "luagent.model.classify"

  it("names the classifier's permanent classes, but cancelled, unusable and deadline", function()
    local permanent = {}
    for class, retried in pairs(classify.classes) do
      if not retried and class ~= "cancelled" and class ~= "unusable" and class ~= "deadline" then
        permanent[#permanent + 1] = class
      end
    end
    table.sort(permanent)
    assert.same(permanent, policies.permanent_classes)
  end)

  it("is false by default, a set of classes when given", function()
    assert.is_false(assert(policies.new {}).fallback_on_permanent)
    assert.same({ auth = true }, assert(policies.new { fallback_on_permanent = { "auth" } }).fallback_on_permanent)
    local all = assert(policies.new { fallback_on_permanent = true }).fallback_on_permanent
    for _, c in ipairs(policies.permanent_classes) do assert.is_true(all[c]) end
  end)

  it("refuses what is not a list of permanent classes", function()
    for _, bad in ipairs({ { "rate_limited" }, {}, "auth", 1 }) do
      local p, err = policies.new { fallback_on_permanent = bad }
      assert.is_nil(p)
      assert.matches("fallback_on_permanent must be true, false, or a list of permanent classes "
        .. "%(auth, client, context_overflow, payment, permanent%)", err.message)
    end
  end)
end)

describe("a fallback model with structured output and knobs", function()
  it("gets the output and the knobs in its own wire format: output_config, thinking, the extra_body key", function()
    local a = serve { faults = "503", seed = 1 }
    local b = serve { seed = 1 }
    local ma, mb = models(a, b)
    local schema = { type = "object", additionalProperties = false, required = { "city" },
      properties = { city = { type = "string" } } }
    local msg = assert(luagent.complete { model = ma, fallback = { mb }, policy = policy(),
      messages = { { role = "user", content = "Paris" } }, output = { schema = schema },
      reasoning = { effort = "low" }, thinking = { budget_tokens = 1024 }, extra_body = { x_tag = "t1" } })
    assert.equal("anthropic/model-b", msg.model)
    assert.same({ city = "Paris" }, msg.output)
    local ra = a:requests()
    assert.equal(3, #ra)
    for _, r in ipairs(ra) do
      assert.equal("json_schema", r.body.response_format.type)
      assert.equal("t1", r.body.x_tag)
      assert.equal("low", r.body.reasoning_effort)
    end
    local rb = b:requests()
    assert.equal(1, #rb)
    local body = rb[1].body
    assert.equal("json_schema", body.output_config.format.type)
    assert.same(schema, body.output_config.format.schema)
    assert.equal(1024, body.thinking.budget_tokens)
    assert.equal("t1", body.x_tag)
  end)
end)
