-- No key leaves through the observers: the real binary runs a script with a
-- recognisable fake key whose model echoes the key in its answers and tool
-- arguments (and whose tool returns it), through every fault kind of the
-- mock, with every output on: `--log debug --log-content`, `--otlp FILE`
-- (and a collector that refuses), `--events jsonl:FILE`, `--record`,
-- `--trace` and `--cost`. The key is in none of the outputs or files, in
-- any of its forms, while the content it was part of is there, scrubbed.
local helpers = require "spec.support.helpers"

local KEY = "sk-OBS/LEAK+0123456789abcdef=="

local SCRIPT = [==[
local luagent = require "luagent"
local mock = require "luagent.mock"
local KEY = os.getenv("LEAK_KEY")
-- every fault kind, each on its own request; each call below is one request
local FAULTS = table.concat({ "503@1", "429:retry-after=0@2", "401@3", "400:overflow@4", "402@5", "close@6",
  "reset:bytes=40@7", "stall:secs=2@8", "cut@9", "cut:finished@10", "bad-json@11",
  "stream-error:overloaded_error@12", "empty@13", "leak@14", "500@15" }, ",")
local srv = assert(mock.start { faults = FAULTS, seed = 1, script = function(_, _, body)
  for _, m in ipairs(body.messages or {}) do
    if m.role == "tool" then return { text = "the key is " .. KEY .. " (from the tool)" } end
  end
  return { text = "I will look up " .. KEY, tools = { { id = "k1", name = "echo", arguments = { key = KEY } } } }
end })
local model = { kind = "openai", model = "gpt-4o-mini", base_url = srv.url .. "/v1", api_key = KEY }
for i = 1, 15 do
  local msg, err = luagent.complete { model = model, messages = { { role = "user", content = "say " .. KEY } },
    policy = { max_retries = 0, attempt_timeout = 0.5, breaker = false, budget = false } }
  print(i, msg and msg.content or tostring(err))
end
local echo = { name = "echo", description = "Echoes", read_only = true,
  run = function(args) return "echo " .. tostring(args.key) .. " " .. KEY end }
local a = luagent.agent { name = "leaky", model = model, tools = { echo },
  policy = { backoff = { strategy = "fixed", base = 0.01 }, breaker = false, budget = false } }
local last = a:run("go " .. KEY)
print(last.stop_reason, last.messages[#last.messages].content)
srv:close()
]==]

local forms = helpers.key_forms

describe("observers with every output on", function()
  local r, files
  setup(function()
    local script = helpers.tempfile(SCRIPT, ".lua")
    files = { otlp = os.tmpname(), events = os.tmpname(), cassette = os.tmpname() }
    local out, err = os.tmpname(), os.tmpname()
    local cmd = table.concat({
      "env -u ANTHROPIC_API_KEY -u OPENROUTER_API_KEY -u OPENAI_API_KEY",
      "LEAK_KEY=" .. helpers.quote(KEY), "OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:1",
      helpers.quote(helpers.bin), "run", "--log debug --log-content --log-format json",
      "--otlp", files.otlp, "--events", "jsonl:" .. files.events, "--record", files.cassette,
      "--trace --cost", script,
      ">" .. out, "2>" .. err, "</dev/null" }, " ")
    local _, _, code = os.execute(cmd)
    r = { code = code, stdout = helpers.slurp(out), stderr = helpers.slurp(err) }
    for name, path in pairs(files) do r[name] = helpers.slurp(path) end
    for _, p in ipairs({ script, out, err, files.otlp, files.events, files.cassette }) do os.remove(p) end
  end)

  it("ran every fault and the agent, with every output written", function()
    assert.equal(0, r.code, r.stderr)
    for i = 1, 15 do assert.matches("\n?" .. i .. "\t", r.stdout) end
    assert.matches("stop\tthe key is %*%*%* %(from the tool%)", r.stdout)
    assert.matches('"level":"debug"', r.stderr)
    assert.matches('"content":"[^"]*%*%*%*', r.stderr) -- content was logged, scrubbed
    assert.matches("invoke_agent leaky", r.stderr) -- --trace
    assert.matches("costliest turns", r.stderr) -- --cost
    assert.matches("OTLP export to http://127%.0%.0%.1:1/v1/traces failed", r.stderr)
    assert.matches('"name":"execute_tool echo"', r.otlp)
    assert.matches('"type":"tool_execution_end"', r.events)
    assert.matches("%*%*%*", r.events)
    assert.is_true(#r.cassette > 0)
  end)

  for _, where in ipairs({ "stdout", "stderr", "otlp", "events", "cassette" }) do
    it("leaves the key out of " .. where, function()
      for _, f in ipairs(forms(KEY)) do
        assert.is_nil(r[where]:find(f, 1, true), "the key (" .. f .. ") is in " .. where)
      end
      -- nor a piece of it long enough to tell
      assert.is_nil(r[where]:find("0123456789abcdef", 1, true), "part of the key is in " .. where)
    end)
  end
end)
