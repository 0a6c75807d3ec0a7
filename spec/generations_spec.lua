-- OpenRouter's late cost lookup (lua/luagent/observe/generations.lua) against the
-- mock's generation endpoint (GET /api/v1/generation?id=, 404 until
-- `generation_delay` seconds after the generation), on the virtual clock:
-- asked again with backoff while it answers 404, within a bound; and
-- `luagent cost settle`, reading every attempt's generation id from a
-- durable run's journal or from an --events file.
local luagent = require "luagent"
local core = require "luagent.core"
local mock = require "luagent.mock"
local json = require "luagent.base.json"
local generations = require "luagent.observe.generations"
local journal = require "luagent.agent.journal"
local events = require("luagent").events
local helpers = require "helpers"

local srv

-- An OpenRouter model on the mock.
local function model()
  return { kind = "openrouter", model = "vendor/m", base_url = srv.url .. "/api/v1", api_key = "k" }
end

-- One call whose first attempt is cut after a delta (its generation was
-- billed all the same) and whose second answers; returns its final event.
local function call_with_a_failed_attempt()
  local final
  for ev in luagent.stream { model = model(), messages = { { role = "user", content = "hello there" } },
                             policy = { backoff = { strategy = "fixed", base = 0.1 } } } do
    if ev.final then final = ev end
  end
  return final
end

-- The generation lookups the mock received.
local function lookups()
  local n = 0
  for _, r in ipairs(srv:requests()) do
    if r.method == "GET" and r.path == "/api/v1/generation" then n = n + 1 end
  end
  return n
end

describe("generations.settle", function()
  before_each(function()
    luagent.configure { log_sink = function() end }
    luagent.clock.virtual()
  end)
  after_each(function()
    if srv then srv:close() srv = nil end
    luagent.configure { log_sink = false }
    luagent.clock.real()
  end)

  it("asks again with backoff while the lookup answers 404, then gives each generation's cost", function()
    srv = assert(mock.start { faults = "stream-error:overloaded_error@1", generation_delay = 300 })
    local final = call_with_a_failed_attempt()
    assert.equal("stop", final.stop_reason)
    -- every attempt's id is on the call's final event
    assert.same({ "chatcmpl-mock1", "chatcmpl-mock2" }, final.response_ids)
    local t0 = luagent.now()
    local out = generations.settle(final.response_ids, { base_url = srv.url .. "/api/v1", api_key = "k" })
    local waited = luagent.now() - t0
    assert.equal(2, #out)
    for i, r in ipairs(out) do
      assert.equal(final.response_ids[i], r.id)
      assert.is_nil(r.pending)
      assert.is_number(r.cost)
      assert.is_true(r.cost > 0)
      assert.is_true(r.tokens_prompt > 0)
    end
    -- 404 for 300 s: asked again and again, the waits doubling to their cap
    assert.is_true(waited >= 300 and waited < 400, "waited " .. waited)
    local n = lookups()
    assert.is_true(n >= 5 and n <= 12, n .. " lookups")
  end)

  it("stops at its bound: a generation still not there is pending", function()
    srv = assert(mock.start { faults = "stream-error:overloaded_error@1", generation_delay = 100000 })
    local final = call_with_a_failed_attempt()
    local t0 = luagent.now()
    local out = generations.settle(final.response_ids, { base_url = srv.url .. "/api/v1", wait = 120 })
    local waited = luagent.now() - t0
    assert.is_true(out[1].pending)
    assert.is_true(out[2].pending)
    assert.equal(404, out[1].error.status)
    assert.is_true(waited >= 120 and waited <= 121, "waited " .. waited)
    assert.is_true(lookups() <= 10)
  end)

  it("is served by `luagent mock --generation-delay SECONDS` too", function()
    assert.equal(300, assert(mock.parse_args { "--generation-delay", "300" }).generation_delay)
    assert.is_nil(mock.parse_args { "--generation-delay", "-1" })
    assert.is_nil(mock.start { generation_delay = "soon" })
  end)

  it("checks its arguments", function()
    assert.has_error(function() generations.settle("x", {}) end, "generations.settle: ids must be a list of strings")
    assert.has_error(function() generations.settle({}, { wait = -1 }) end,
      "generations.settle: opts.wait must be seconds >= 0")
  end)
end)

describe("luagent cost settle", function()
  local dir
  before_each(function()
    dir = os.tmpname()
    os.remove(dir)
    assert(os.execute("mkdir -p " .. helpers.quote(dir)))
    luagent.configure { log_sink = function() end }
  end)
  after_each(function()
    if srv then srv:close() srv = nil end
    journal.use(luagent.default_runtime(), nil)
    require("luagent").configure { durable = false }
    luagent.configure { log_sink = false }
    os.execute("rm -rf " .. helpers.quote(dir))
  end)

  -- The binary with `args`, while this process serves the mock.
  local function settle(...)
    local p = assert(core.process_spawn({ helpers.bin, "cost", "settle", ... }))
    local r = p:wait()
    p:close()
    return r
  end

  it("looks up every attempt's generation of a durable run, from its journal", function()
    srv = assert(mock.start { faults = "stream-error:overloaded_error@1" })
    local db = dir .. "/runs.db"
    local store = assert(journal.open(db))
    journal.use(luagent.default_runtime(), assert(journal.start(store, { script = "s.lua", args = {}, options = {}, quiet = true })))
    local id = luagent.default_runtime().journal.run.id
    local a = luagent.agent { name = "payer", durable = true, model = model(),
      policy = { backoff = { strategy = "fixed", base = 0.01 } } }
    local last = a:run("go")
    assert.equal("stop", last.stop_reason, tostring(last.error))
    journal.use(luagent.default_runtime(), nil) -- the run's claim let go while its store is open
    store:close()
    local r = settle("--journal", db, id)
    assert.equal(0, r.code, r.stderr)
    assert.matches("chatcmpl%-mock1%s+%$%d+%.%d+", r.stdout)
    assert.matches("chatcmpl%-mock2%s+%$%d+%.%d+", r.stdout)
    assert.matches("total %$%d+%.%d+ for 2 generation%(s%)", r.stdout)
    -- a run that is not there is a usage error
    r = settle("--journal", db, "nope")
    assert.equal(2, r.code)
    assert.matches("no run 'nope'", r.stderr)
  end)

  it("looks them up from an --events file", function()
    srv = assert(mock.start { faults = "stream-error:overloaded_error@1" })
    local file = dir .. "/events.jsonl"
    local f = assert(io.open(file, "w"))
    local stop = events.subscribe(events.retry_safe_consumer(events.jsonl(f)))
    local final = call_with_a_failed_attempt()
    stop()
    f:close()
    assert.equal("stop", final.stop_reason)
    local r = settle("--events", file)
    assert.equal(0, r.code, r.stderr)
    assert.matches("chatcmpl%-mock1%s+%$", r.stdout)
    assert.matches("chatcmpl%-mock2%s+%$", r.stdout)
    -- --base-url as a provider takes it, without /v1 too
    r = settle("--events", file, "--base-url", srv.url .. "/api")
    assert.equal(0, r.code, r.stderr)
    assert.matches("chatcmpl%-mock2%s+%$", r.stdout)
  end)

  it("prints the ids an events file holds escaped for the terminal, and a call it does not name as such", function()
    srv = assert(mock.start {})
    local file = dir .. "/events.jsonl"
    local f = assert(io.open(file, "w"))
    f:write(json.encode { type = "message_end", final = true, provider_kind = "openrouter",
      endpoint = srv.url .. "/api/v1", response_ids = { "gen-\27]0;pwned\7x" } }, "\n")
    f:close()
    local r = settle("--events", file, "--wait", "0") -- the mock knows no such id: asked once, pending
    assert.equal(1, r.code, r.stderr)
    assert.is_nil(r.stdout:find("\27", 1, true), r.stdout)
    assert.matches("gen-\\u{1b}]0;pwned\\u{07}x", r.stdout, 1, true)
    assert.matches("a call", r.stdout, 1, true)
    assert.is_nil(r.stdout:find("call nil", 1, true))
  end)

  it("says how it is used", function()
    local r = helpers.run("cost", "settle")
    assert.equal(2, r.code)
    assert.matches("settle: give RUN_ID or %-%-events FILE", r.stderr)
    r = helpers.run("help", "cost")
    assert.equal(0, r.code)
    assert.matches("usage: luagent cost settle", r.stdout)
    assert.matches("cost settle RUN_ID", helpers.run("--help").stdout)
  end)
end)
