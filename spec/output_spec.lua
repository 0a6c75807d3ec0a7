-- Structured output (`output = {schema =, name =, retries =, strict =}` on
-- an agent or a call): sent the provider's native way in each wire format,
-- the answer decoded and checked with the schema checker, a message back
-- naming the field when it does not match (at most `retries` times), then
-- an error of kind output_invalid; the value is agent_end.output and the
-- second result of agent:run.
local luagent = require "luagent"
local mock = require "luagent.mock"
local json = require "luagent.base.json"

local PLACE = { type = "object", additionalProperties = false, required = { "city", "population" },
  properties = { city = { type = "string", minLength = 1 }, population = { type = "integer", minimum = 0 } } }

local srv
local function start(script)
  srv = assert(mock.start { script = script })
  return srv
end
before_each(function()
  luagent.configure { log_sink = function() end }
  luagent.clock.virtual()
end)
after_each(function()
  if srv then srv:close() srv = nil end
  luagent.configure { log_sink = false }
  luagent.clock.real()
end)

local function model(kind) return { kind = kind, model = "m", base_url = srv.base_urls[kind], api_key = "k" } end

describe("structured output on the wire", function()
  it("Chat Completions (and OpenRouter): response_format json_schema, strict when the schema allows it", function()
    for _, kind in ipairs { "openai", "openrouter" } do
      start()
      local msg = assert(luagent.complete { model = model(kind), messages = { { role = "user", content = "Paris?" } },
        output = { schema = PLACE, name = "place" } })
      local body = srv:requests()[1].body
      assert.same({ type = "json_schema", json_schema = { name = "place", strict = true, schema = PLACE } },
        body.response_format)
      -- the mock answers with a value of the schema
      assert.same({ city = "Paris?", population = 0 }, msg.output)
      srv:close()
      -- a schema OpenAI's strict mode would refuse (a field not required) goes with strict = false
      start()
      local loose = { type = "object", properties = { city = { type = "string" } } }
      assert(luagent.complete { model = model(kind), messages = { { role = "user", content = "x" } },
        output = { schema = loose } })
      assert.same({ name = "output", strict = false, schema = loose }, srv:requests()[1].body.response_format.json_schema)
      srv:close()
    end
  end)

  it("Responses: text.format json_schema", function()
    start()
    local msg = assert(luagent.complete { model = model("openai_responses"),
      messages = { { role = "user", content = "Lyon" } }, output = { schema = PLACE, name = "place", strict = false } })
    assert.same({ format = { type = "json_schema", name = "place", strict = false, schema = PLACE } },
      srv:requests()[1].body.text)
    assert.same({ city = "Lyon", population = 0 }, msg.output)
  end)

  it("Anthropic: output_config.format json_schema, bounds it does not take moved to the description", function()
    start()
    local msg = assert(luagent.complete { model = model("anthropic"),
      messages = { { role = "user", content = "Nice" } }, output = { schema = PLACE } })
    local format = srv:requests()[1].body.output_config.format
    assert.equal("json_schema", format.type)
    assert.same({ type = "object", additionalProperties = false, required = { "city", "population" },
      properties = { city = { type = "string", description = "minLength: 1" },
                     population = { type = "integer", description = "minimum: 0" } } }, format.schema)
    assert.same({ city = "Nice", population = 0 }, msg.output)
  end)
end)

-- A script whose first two answers do not match PLACE.
local function twice_wrong(_, n)
  if n == 1 then return { text = '{"city": 7, "population": 1}' } end
  if n == 2 then return { text = '{"city": "Paris"}' } end
  return { output = { city = "Paris", population = 2100000 } }
end

describe("an answer that does not match", function()
  it("is sent back naming the field, at most `retries` times: fails twice, then 3 requests", function()
    start(twice_wrong)
    local a = luagent.agent { model = model("openai"), output = { schema = PLACE, retries = 2 } }
    local retries = {}
    local sub = luagent.subscribe(function(ev) if ev.type == "output_retry" then retries[#retries + 1] = ev end end)
    local lines = {}
    local saved = luagent.configure { log_sink = function(_, line) lines[#lines + 1] = line end, log_level = "info",
      log_format = "json" }
    local logger = luagent.default_runtime().log -- (make test runs with --log off: no consumer started)
    logger:start()
    local last, output = a:run("Where is the Louvre?")
    logger:stop()
    luagent.configure(saved)
    sub()
    local logged = table.concat(lines, "\n")
    assert.matches('"msg":"the answer does not match the output schema; asking again","attempt":1', logged, 1, true)
    assert.not_matches("expected string", logged, 1, true) -- the answer's words only with content logging
    assert.equal("stop", last.stop_reason)
    assert.same({ city = "Paris", population = 2100000 }, output)
    assert.same(output, last.output)
    local reqs = srv:requests()
    assert.equal(3, #reqs)
    -- the retry message is the last user message of the next request, naming the field
    local second = reqs[2].body.messages
    assert.matches("output%.city: expected string, got integer", second[#second].content)
    local third = reqs[3].body.messages
    assert.matches("output: missing required field 'population'", third[#third].content)
    assert.equal(2, #retries)
    assert.equal(1, retries[1].attempt)
    assert.same({ "output.city: expected string, got integer" }, retries[1].errors)
    assert.equal(2, retries[2].attempt)
    assert.equal(3, last.turns)
  end)

  it("ends the run with an output_invalid error once the retries are spent", function()
    start(function() return { text = "not json" } end)
    local a = luagent.agent { model = model("anthropic"), output = { schema = PLACE, retries = 1 } }
    local last, output = a:run("Where?")
    assert.is_nil(output)
    assert.equal("error", last.stop_reason)
    assert.equal("output_invalid", last.error.kind)
    assert.matches("^the answer does not match the output schema after 2 answers: output: not JSON", last.error.message)
    assert.equal("not json", last.error.text)
    assert.equal(2, #srv:requests())
  end)

  it("is retried by luagent.complete too; its error is returned", function()
    start(twice_wrong)
    local msg = assert(luagent.complete { model = model("openai_responses"),
      messages = { { role = "user", content = "Louvre?" } }, output = { schema = PLACE } })
    assert.same({ city = "Paris", population = 2100000 }, msg.output)
    assert.equal(3, #srv:requests())
    srv:close()
    start(twice_wrong)
    local none, err = luagent.complete { model = model("openai"), messages = { { role = "user", content = "x" } },
      output = { schema = PLACE, retries = 1 } }
    assert.is_nil(none)
    assert.equal("output_invalid", err.kind)
    assert.same({ "output: missing required field 'population'" }, err.errors)
  end)

  it("cut at its token limit is not sent back by luagent.complete either: the message, at once", function()
    for _, kind in ipairs { "openai", "anthropic" } do
      start(function() return { text = '{"city": "Par', stop = "length" } end)
      local msg, err = luagent.complete { model = model(kind), messages = { { role = "user", content = "x" } },
        output = { schema = PLACE } }
      assert.is_nil(err)
      assert.equal("length", msg.stop_reason)
      assert.is_nil(msg.output)
      assert.equal('{"city": "Par', msg.content)
      assert.equal(1, #srv:requests())
      -- the agent stops there too
      local a = luagent.agent { model = model(kind), output = { schema = PLACE } }
      local last, output = a:run("x")
      assert.equal("length", last.stop_reason)
      assert.is_nil(output)
      assert.equal(2, #srv:requests())
      srv:close()
    end
  end)

  it("raises for an output option it cannot use, naming it", function()
    start()
    assert.has_error(function() luagent.agent { model = model("openai"), output = { schema = "x" } } end,
      "agent: output.schema must be a table (a JSON Schema)")
    assert.has_error(function() luagent.agent { model = model("openai"), output = { schema = PLACE, retries = -1 } } end,
      "agent: output.retries must be an integer >= 0")
    assert.has_error(function() luagent.agent { model = model("openai"), output = { schema = PLACE, retry = 1 } } end,
      "agent: output: unknown option 'retry' (known: name, retries, schema, strict)")
    assert.has_error(function()
      luagent.complete { model = model("openai"), messages = {}, output = { schema = { type = "array" } } }
    end, 'complete: output.schema.type must be "object" (structured output takes an object at the root)')
  end)
end)

describe("a durable run with structured output", function()
  local helpers = require "spec.support.helpers"
  it("resumed after its retried turn failed for good: the first answer replayed, the retry message made again", function()
    local dir = helpers.tempdir()
    local env = { LUAGENT_HOME = dir, OUTPUT_FAULTS = "503@2-1000" }
    local r = helpers.run_env(env, "run", "spec/fixtures/durable/output.lua")
    -- turn 1 answered (not matching), turn 2 (the retry) failed for good: 2 requests
    assert.equal("error\tnil\thttp\t2\n", r.stdout, r.stderr)
    local id = assert(r.stderr:match("luagent: durable run (%S+)"), r.stderr)
    r = helpers.run_env({ LUAGENT_HOME = dir }, "resume", id)
    assert.equal(0, r.code, r.stderr)
    -- one request: turn 1 came from the journal; turn 2 carried the retry message
    assert.equal("stop\tParis\tnil\t1\n", r.stdout)
    os.execute("rm -rf " .. helpers.quote(dir))
  end)
end)

describe("structured output in a trace", function()
  it("each call's chat span says gen_ai.output.type json; the retries are calls of the run", function()
    local cjson = require "cjson"
    local file = os.tmpname()
    local tracer = assert(luagent.default_runtime():trace { file = file })
    start(twice_wrong)
    local a = luagent.agent { model = model("openai"), output = { schema = PLACE } }
    a:run("Louvre?")
    tracer:stop()
    local chats = {}
    local f = assert(io.open(file))
    for line in f:lines() do -- one TracesData line per run
      for _, rs in ipairs(cjson.decode(line).resourceSpans) do
        for _, span in ipairs(rs.scopeSpans[1].spans) do
          if span.name:match("^chat ") then
            for _, kv in ipairs(span.attributes or {}) do
              if kv.key == "gen_ai.output.type" then chats[#chats + 1] = kv.value.stringValue end
            end
          end
        end
      end
    end
    f:close()
    os.remove(file)
    assert.same({ "json", "json", "json" }, chats)
  end)
end)

describe("the mock's answer to structured output", function()
  it("is an example value that matches the schema asked ($ref, anyOf, const, bounds)", function()
    local replies = require "luagent.mock.replies"
    local schema = require "luagent.agent.tools.schema"
    local s = { type = "object", additionalProperties = false,
      required = { "kind", "name", "tags", "n", "home", "either", "maybe" },
      properties = { kind = { const = "place" }, name = { type = "string", minLength = 3, maxLength = 5 },
        tags = { type = "array", items = { type = "string" }, minItems = 2 },
        n = { type = "number", exclusiveMinimum = 4 }, home = { ["$ref"] = "#/$defs/home" },
        either = { anyOf = { { type = "integer", minimum = 7 }, { type = "string" } } },
        maybe = { type = { "null", "boolean" } } },
      ["$defs"] = { home = { type = "object", required = { "zip" }, properties = { zip = { type = "integer", maximum = -2 } } } } }
    local v = replies.example(s, "a long text")
    assert.is_true(schema.check(s, json.decode(json.encode(v)), "output"))
    assert.same({ kind = "place", name = "a lon", tags = { "a long text", "a long text" }, n = 5,
      home = { zip = -2 }, either = 7, maybe = true }, json.decode(json.encode(v)))
  end)
end)

describe("misuse of stream and complete with output", function()
  local FILE = debug.getinfo(1, "S").short_src
  -- f's error starts with this spec's path and the line f is on, then `msg`
  local function raises_here(f, msg)
    local line = debug.getinfo(f, "S").linedefined
    local ok, err = pcall(f)
    assert.is_false(ok)
    assert.equal(FILE .. ":" .. line .. ": " .. msg, err)
  end
  local function m() return model("openai") end
  local S = { type = "objekt" }

  it("stream checks output as complete does: an unknown key, a bad schema", function()
    start()
    raises_here(function() luagent.stream { model = m(), messages = {}, output = { schema = PLACE, bogus = 1 } } end,
      "stream: output: unknown option 'bogus' (known: name, retries, schema, strict)")
    raises_here(function() luagent.stream { model = m(), messages = {}, output = { schema = S } } end,
      'stream: output.schema.type must be "object" (structured output takes an object at the root)')
    assert.equal(0, #srv:requests())
  end)

  it("complete's errors name the user's line and complete", function()
    start()
    raises_here(function() luagent.complete { model = m(), messages = {}, thinking = 1 } end,
      "complete: thinking must be a table {budget_tokens = N}")
    raises_here(function() luagent.complete { model = m(), messages = {}, fallback = "x" } end,
      'complete: fallback must be a list of models ("kind/model" or providers)')
    raises_here(function() luagent.complete { model = m(), messages = {}, output = { schema = PLACE }, max_token = 1 } end,
      "complete: unknown option 'max_token' (did you mean 'max_tokens'?)")
    raises_here(function() luagent.complete { model = m(), messages = {}, output = { schema = PLACE, bogus = 1 } } end,
      "complete: output: unknown option 'bogus' (known: name, retries, schema, strict)")
    raises_here(function() luagent.complete { model = m(), messages = {}, output = { schema = PLACE }, thinking = 1 } end,
      "complete: thinking must be a table {budget_tokens = N}")
    raises_here(function() luagent.stream { model = m(), messages = {}, fallback = "x" } end,
      'stream: fallback must be a list of models ("kind/model" or providers)')
    assert.equal(0, #srv:requests())
  end)
end)

describe("structured output with an approval", function()
  it("approve + continue, a wrong answer sent back, a right one: the tool ran once, 3 requests with response_format", function()
    local paid = 0
    local pay = { name = "pay", description = "Pays", needs_approval = true,
      params = { type = "object", properties = { amount = { type = "integer" } } },
      run = function() paid = paid + 1 return "paid" end }
    start(function(_, n)
      if n == 1 then return { tools = { { id = "c1", name = "pay", arguments = { amount = 5 } } } } end
      if n == 2 then return { text = '{"city": 7}' } end
      return { output = { city = "Paris", population = 1 } }
    end)
    local a = luagent.agent { model = model("openai"), tools = { pay }, output = { schema = PLACE } }
    local evs = {}
    for ev in a:prompt("pay, then say where") do evs[#evs + 1] = ev end
    assert.equal("approval_required", evs[#evs].stop_reason)
    assert.equal(0, paid)
    assert.is_true(a:approve("call_mockc1"))
    local types, last = {}, nil
    for ev in a:continue() do types[ev.type] = (types[ev.type] or 0) + 1 last = ev end
    assert.equal("stop", last.stop_reason)
    assert.same({ city = "Paris", population = 1 }, last.output)
    assert.equal(1, types.output_retry)
    assert.equal(1, paid)
    local reqs = srv:requests()
    assert.equal(3, #reqs)
    for i = 1, 3 do assert.equal("json_schema", reqs[i].body.response_format.type) end
    local third = reqs[3].body.messages
    assert.matches("output%.city: expected string, got integer", third[#third].content)
  end)
end)
