-- The cost meter (lua/luagent/observe/cost.lua) against the mock provider on
-- loopback, on the virtual clock: every attempt's usage is priced, failed
-- attempts included, so an agent's total is the sum of all attempts' usage
-- times the prices; unknown models are "no price", never free; prices are
-- overridden by table or file; max_cost refuses a call before its request;
-- OpenRouter's generation ids (every attempt's) stay with the call.
local luagent = require "luagent"
local mock = require "luagent.mock"
local retry = require "luagent.model.call"
local events = require("luagent").events
local cost = require "luagent.observe.cost"

-- The default runtime's cost meter (made and started on first use).
local function meter() return luagent.default_runtime():meter("cost") end

-- A price nobody ships, so the expected figures are computed here.
local PRICE = { input = 1.5, output = 4, cache_read = 0.25, cache_write = 2 }

local function priced(u)
  local input, cr, cw = u.input_tokens, u.cache_read_tokens, u.cache_write_tokens
  return ((input - cr - cw) * PRICE.input + cr * PRICE.cache_read + cw * PRICE.cache_write
    + u.output_tokens * PRICE.output) / 1e6
end

-- The model asks for the tool `turns - 1` times, then answers.
local function script(turns)
  return function(_, _, body)
    local done = 0
    for _, m in ipairs(body.messages or {}) do
      if type(m.content) == "table" then
        for _, part in ipairs(m.content) do if part.type == "tool_result" then done = done + 1 end end
      elseif m.role == "tool" then
        done = done + 1
      end
    end
    if done + 1 >= turns then return { text = "all done" } end
    return { text = "step", tools = { { id = "t" .. done, name = "noop", arguments = {} } } }
  end
end

local noop = { name = "noop", description = "Does nothing", read_only = true, run = function() return "ok" end }

local function run_agent(kind, model, faults, opts)
  opts = opts or {}
  local srv = assert(mock.start { faults = faults, seed = 3, script = script(opts.turns or 2) })
  local seen = {}
  local unsub = events.subscribe(function(ev) seen[#seen + 1] = ev end)
  local a = luagent.agent { name = opts.name or "metered", tools = { noop }, max_cost = opts.max_cost,
    policy = { backoff = { strategy = "fixed", base = 0.1 } },
    model = { kind = kind, model = model, base_url = srv.url .. (kind == "openrouter" and "/api/v1" or "/v1"),
              api_key = "k" } }
  local last = a:run("go")
  unsub()
  local requests = #srv:requests()
  srv:close()
  return last, seen, requests
end

describe("cost", function()
  before_each(function()
    luagent.configure { log_sink = function() end }
    luagent.clock.virtual()
    luagent.default_runtime().endpoints:reset()
    meter():reset()
    assert(meter():set_prices { ["test-model"] = PRICE })
  end)
  after_each(function()
    meter():stop()
    luagent.configure { max_cost = false }
    luagent.configure { log_sink = false }
    luagent.clock.real()
  end)

  it("prices every attempt, failed ones with usage included: totals are the sum of all attempts", function()
    local last, seen = run_agent("anthropic", "test-model",
      "stream-error:overloaded_error@1,cut@2,stream-error:overloaded_error@4", { turns = 2 })
    assert.equal("stop", last.stop_reason)
    -- the attempts, as the events tell them: a failed one's usage is in its provider_retry
    local attempts, failed_with_usage, total = {}, 0, { input_tokens = 0, output_tokens = 0,
      cache_read_tokens = 0, cache_write_tokens = 0 }
    for _, ev in ipairs(seen) do
      if ev.type == "provider_retry" then
        attempts[#attempts + 1] = ev.usage
        if ev.usage and ev.usage.input_tokens > 0 then failed_with_usage = failed_with_usage + 1 end
      elseif ev.type == "message_end" and ev.final then
        attempts[#attempts + 1] = ev.usage
      end
    end
    assert.equal(5, #attempts) -- 3 failed, 2 that answered
    assert.equal(3, failed_with_usage) -- the cut streams had reported their usage
    local expected = 0
    for _, u in ipairs(attempts) do
      for k in pairs(total) do total[k] = total[k] + u[k] end
      expected = expected + priced(u)
    end
    assert.same(total, last.usage) -- the agent's usage is every attempt's
    assert.is_table(last.cost)
    assert.equal(2, last.cost.calls)
    assert.equal(5, last.cost.attempts)
    assert.equal(0, last.cost.unpriced_calls)
    assert.is_true(math.abs(last.cost.total - expected) < 1e-12, last.cost.total .. " vs " .. expected)
    assert.is_true(expected > priced(attempts[3]) + priced(attempts[5])) -- the failures cost something
    -- per call: the first call made 3 attempts
    local records = meter():records()
    assert.equal(2, #records)
    assert.equal(3, records[1].attempts)
    assert.equal(1, records[1].turn)
    assert.is_true(math.abs(records[1].cost - (priced(attempts[1]) + priced(attempts[2]) + priced(attempts[3]))) < 1e-12)
    -- the run's meter adds up the same
    assert.is_true(math.abs(meter():totals().total - expected) < 1e-12)
  end)

  it("reports a model without a price as 'no price', never as zero", function()
    local last = run_agent("openai", "unheard-of-model", nil, { turns = 1 })
    assert.equal("stop", last.stop_reason)
    assert.is_nil(last.cost.total)
    assert.equal(1, last.cost.unpriced_calls)
    local report = table.concat(meter():report(), "\n")
    assert.matches("metered%s+1%s+1%s+%d+%s+%d+%s+0%s+0%s+no price", report)
    assert.matches("unheard%-of%-model.*no price", report)
  end)

  it("finds dated and vendor-prefixed names, and takes overrides from a file", function()
    assert.equal(require("luagent.observe.prices")["claude-3-5-haiku"], meter():price("claude-3-5-haiku-20241022"))
    assert.equal(require("luagent.observe.prices")["gpt-4o-mini"], meter():price("openai/gpt-4o-mini"))
    assert.equal(require("luagent.observe.prices")["gpt-4o-mini"], meter():price("gpt-4o-mini-2024-07-18"))
    assert.equal(require("luagent.observe.prices")["claude-3-5-haiku"], meter():price("claude-3-5-haiku-latest"))
    -- a dated name of a later version with a price of its own takes that one
    assert.equal(5, meter():price("claude-opus-4-5-20251101").input)
    assert.equal(15, meter():price("claude-opus-4-1-20250805").input)
    assert.equal(3, meter():price("claude-sonnet-4-5-20250929").input)
    assert.is_nil(meter():price("o3-pro")) -- not a dated o3
    assert.is_nil(meter():price("gpt-4o-minimal"))
    assert.is_nil(meter():price("gpt-4o-mini-ish"))
    assert.is_nil(meter():price("no-such-model"))
    local bad = os.tmpname()
    local f = assert(io.open(bad, "w"))
    f:write('return { ["x-model"] = { input = 1, outptu = 2 } }\n')
    f:close()
    local ok, err = meter():load_prices(bad)
    assert.is_nil(ok)
    assert.equal(bad .. ": x-model: unknown field 'outptu' (input, output, cache_read, cache_write)", err)
    f = assert(io.open(bad, "w"))
    f:write('return { ["x-model"] = { input = 1, output = 2 } }\n')
    f:close()
    assert(meter():load_prices(bad))
    os.remove(bad)
    assert.same({ input = 1, output = 2 }, meter():price("x-model"))
    assert.equal(3e-6, cost.usage_cost({ input_tokens = 1, output_tokens = 1 }, meter():price("x-model")))
  end)

  it("refuses a call past an agent's max_cost before its request is sent", function()
    local last, seen, requests = run_agent("openai", "test-model", nil, { turns = 3, max_cost = 1e-9, name = "capped" })
    assert.equal("error", last.stop_reason)
    assert.equal("cost_limit", last.error.kind)
    assert.matches("^max_cost of the agent 'capped' %(%$0%.0000%) reached: %$0%.%d+ spent; the call was not sent",
      last.error.message)
    assert.equal(1, requests) -- the first call ran; the second was never sent
    assert.equal(2, last.turns)
    local final
    for _, ev in ipairs(seen) do if ev.type == "message_end" and ev.final then final = ev end end
    assert.equal(0, final.attempts)
  end)

  it("refuses calls past the run's cap, and when a capped model has no price", function()
    luagent.configure { max_cost = 0 }
    local last, _, requests = run_agent("openai", "test-model", nil)
    assert.equal("cost_limit", last.error.kind)
    assert.equal(0, requests)
    assert.matches("max_cost of the run", last.error.message)
    luagent.configure { max_cost = 100 }
    last, _, requests = run_agent("openai", "unheard-of-model", nil)
    assert.equal(0, requests)
    assert.matches("model 'unheard%-of%-model' has no price", last.error.message)
  end)

  it("keeps the costliest calls of a long run, in call order, not every call", function()
    -- a meter of its own runtime, keeping 3
    local rt = luagent.runtime { log_sink = function() end }
    local m = cost.new(rt, { keep = 3 })
    m:start()
    assert(m:set_prices { ["test-model"] = PRICE })
    -- call i costs i tokens out, except two expensive ones early, one
    -- between them later and one costliest late
    local out = { [2] = 900, [5] = 800, [20] = 850, [30] = 1000 }
    out[41] = 0 -- the cheapest last: below the floor, never kept
    for i = 1, 41 do
      rt.bus:publish { type = "message_end", call = 1000 + i, final = true, attempts = 1, stop_reason = "stop",
        request_model = "test-model", provider_kind = "openai",
        total_usage = { input_tokens = 0, output_tokens = out[i] or i, cache_read_tokens = 0, cache_write_tokens = 0 } }
    end
    local calls = {}
    for _, r in ipairs(m:records()) do calls[#calls + 1] = r.call end
    -- at least the 3 costliest (1002, 1020, 1030), every record in call
    -- order, and the cheap early calls are gone
    local kept = {}
    for _, c in ipairs(calls) do kept[c] = true end
    assert.is_true(kept[1002] and kept[1020] and kept[1030])
    for i = 2, #calls do assert.is_true(calls[i - 1] < calls[i]) end
    assert.is_nil(kept[1001])
    assert.is_nil(kept[1041])
    assert.is_true(#calls <= 2 * 3)
    -- the meters count and charge every call, kept or not
    local totals, sum = m:totals(), 0
    for i = 1, 41 do sum = sum + (out[i] or i) end
    assert.equal(41, totals.calls)
    assert.equal(41, totals.attempts)
    assert.equal(sum, totals.usage.output_tokens)
    assert.is_true(math.abs(totals.total - sum * m:price("test-model").output / 1e6) < 1e-12)
    -- past the floor, a retried call still gets its record: every attempt,
    -- the last answer's id
    local u = { input_tokens = 0, output_tokens = 2000, cache_read_tokens = 0, cache_write_tokens = 0 }
    rt.bus:publish { type = "message_start", call = 2000, id = "m1" }
    rt.bus:publish { type = "provider_retry", call = 2000, attempt = 1, usage = u, request_model = "test-model" }
    rt.bus:publish { type = "message_start", call = 2000, id = "m2" }
    rt.bus:publish { type = "message_end", call = 2000, final = true, attempts = 2, stop_reason = "stop",
      request_model = "test-model", provider_kind = "openai", response_ids = { "m1", "m2" },
      total_usage = { input_tokens = 0, output_tokens = 5000, cache_read_tokens = 0, cache_write_tokens = 0 } }
    local last = m:records()[#m:records()]
    assert.equal(2000, last.call)
    assert.equal(2, last.attempts)
    assert.equal(5000, last.usage.output_tokens)
    assert.equal("m2", last.message_id)
    assert.equal(43, m:totals().attempts)
    rt:close()
  end)

  it("prints the table with agent and model names escaped for the terminal", function()
    local hostile = "\27]0;pwned\7\27[2J\u{9b}H\r\n\u{202e}"
    local last = run_agent("openai", "model" .. hostile, nil, { turns = 1, name = "agent" .. hostile })
    assert.equal("stop", last.stop_reason)
    local lines = meter():report()
    for _, l in ipairs(lines) do
      assert.is_nil(l:find("[%c\127]"), l)
      assert.is_nil(l:find("\u{9b}", 1, true), l)
      assert.is_nil(l:find("\u{202e}", 1, true), l)
    end
    local text = table.concat(lines, "\n")
    assert.matches("\nagent\\u{1b}%]0;pwned", text) -- (cut to the column's 20 bytes)
    assert.matches("model\\u{1b}%]0;pwned\\u{07}\\u{1b}%[2J\\u{9b}H\\r\\n\\u{202e}  1 attempt", text)
  end)

  it("keeps OpenRouter's generation id with the call", function()
    assert(meter():set_prices { ["vendor/test-model"] = PRICE })
    local last = run_agent("openrouter", "vendor/test-model", nil)
    assert.equal("stop", last.stop_reason)
    local r = meter():records()[1]
    assert.equal("openrouter", r.provider_kind)
    assert.matches("^chatcmpl%-mock%d+$", r.generation_id) -- the id the server gave
    assert.matches("generation chatcmpl%-mock", table.concat(meter():report(), "\n"))
  end)

  it("keeps every attempt's OpenRouter generation id, a failed one's too (its cost is looked up later)", function()
    assert(meter():set_prices { ["vendor/test-model"] = PRICE })
    local last = run_agent("openrouter", "vendor/test-model", "stream-error:overloaded_error@1")
    assert.equal("stop", last.stop_reason)
    local r = meter():records()[1]
    assert.equal(2, r.attempts)
    assert.same({ "chatcmpl-mock1", "chatcmpl-mock2" }, r.generation_ids)
    assert.equal("chatcmpl-mock2", r.generation_id) -- the last attempt's
    assert.matches("generations chatcmpl%-mock1, chatcmpl%-mock2", table.concat(meter():report(), "\n"))
  end)
end)

describe("luagent.configure{max_cost=}", function()
  it("caps the run without any other step: setting it starts the meter", function()
    luagent.configure { log_sink = function() end }
    luagent.clock.virtual()
    luagent.default_runtime().endpoints:reset()
    local m = meter()
    assert(m:set_prices { ["test-model"] = PRICE })
    m:stop() -- no meter counting, as in a script that never asked for one
    m:reset()
    luagent.configure { max_cost = 0 }
    local ok, last, _, requests = pcall(run_agent, "openai", "test-model", nil)
    luagent.configure { max_cost = false, log_sink = false }
    m:stop()
    luagent.clock.real()
    assert(ok, last)
    assert.equal("cost_limit", last.error.kind)
    assert.equal(0, requests)
  end)
end)
