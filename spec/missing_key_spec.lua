-- Fail fast on a missing key (issue 26, item 2): a provider with no key and
-- no mock, cassette or base URL is an error before any request, naming the
-- variable and --mock; `luagent run` exits 2 at once (the old code sent the
-- request to the public URL without a key and retried the failure for
-- seconds). The real executable runs as a child process, with the keys and
-- base URLs of the environment left out.
local h = require "helpers"

local UNSET = { "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENROUTER_API_KEY",
  "OPENAI_BASE_URL", "ANTHROPIC_BASE_URL", "OPENROUTER_BASE_URL", "LUAGENT_LOG" }

-- Runs `luagent ARGS...` without keys (plus `env`'s assignments); returns
-- {code=, stdout=, stderr=, seconds=} (seconds: the child's wall time, as
-- the shell measured it around it).
local function run(env, ...)
  local out, err, took = os.tmpname(), os.tmpname(), os.tmpname()
  local words = { "env" }
  for _, name in ipairs(UNSET) do words[#words + 1] = "-u " .. name end
  for k, v in pairs(env or {}) do words[#words + 1] = k .. "=" .. h.quote(v) end
  words[#words + 1] = h.quote(h.bin)
  for _, a in ipairs({ ... }) do words[#words + 1] = h.quote(a) end
  local cmd = string.format("s=$(date +%%s%%N); timeout -s KILL 60 %s >%s 2>%s </dev/null; rc=$?;"
    .. " e=$(date +%%s%%N); echo $((e - s)) >%s; exit $rc", table.concat(words, " "), out, err, took)
  local _, _, code = os.execute(cmd)
  local r = { code = code, stdout = h.slurp(out), stderr = h.slurp(err),
    seconds = (tonumber(h.slurp(took)) or 0) / 1e9 }
  for _, p in ipairs({ out, err, took }) do os.remove(p) end
  return r
end

local function script(text) return h.tempfile(text, ".lua") end

local STREAM = [[
local luagent = require "luagent"
for ev in luagent.stream { model = "anthropic/claude-sonnet-4-5", policy = { max_retries = 0 },
                           messages = { { role = "user", content = "Hello" } } } do
  if ev.type == "text_delta" then io.write(ev.text) end
  if ev.type == "message_end" and ev.error then io.stderr:write("CALL FAILED: ", tostring(ev.error), "\n") end
end
]]

describe("a provider without a key", function()
  local files = {}
  after_each(function() for _, f in ipairs(files) do os.remove(f) end files = {} end)
  local function file(text)
    local f = script(text)
    files[#files + 1] = f
    return f
  end

  it("stops `luagent run` with exit 2 before any request, naming the variable, the line and --mock", function()
    local f = file(STREAM)
    local r = run(nil, "run", f)
    assert.equal(2, r.code, r.stderr)
    assert.matches("luagent: " .. f:gsub("%p", "%%%0") .. ":2: anthropic/claude%-sonnet%-4%-5: no API key: "
      .. "ANTHROPIC_API_KEY is not set", r.stderr)
    assert.matches("%-%-mock", r.stderr)
    assert.is_nil(r.stderr:find("CALL FAILED", 1, true), r.stderr) -- no call was made
    assert.is_nil(r.stderr:find("stack traceback", 1, true), r.stderr)
  end)

  it("exits within 100 ms of a script that does nothing", function()
    local noop, f = file('local luagent = require "luagent"\n'), file(STREAM)
    -- the fastest of three runs of each: a loaded machine's slow start-up
    -- is not the script's
    local base, took = math.huge, math.huge
    for _ = 1, 3 do
      local b = run(nil, "run", noop)
      assert.equal(0, b.code, b.stderr)
      base = math.min(base, b.seconds)
      local r = run(nil, "run", f)
      assert.equal(2, r.code, r.stderr)
      took = math.min(took, r.seconds)
    end
    assert.is_true(took < base + 0.1, string.format("%.3f s against %.3f s for nothing", took, base))
  end)

  it("stops an agent made without a key, naming OPENAI_API_KEY", function()
    local f = file([[
local luagent = require "luagent"
local a = luagent.agent { model = "openai/gpt-4o" }
print(a:run("hi"))
]])
    local r = run(nil, "run", f)
    assert.equal(2, r.code, r.stderr)
    assert.matches(":2: openai/gpt%-4o: no API key: OPENAI_API_KEY is not set", r.stderr)
  end)

  it("raises a usage record in a script that catches it, with the variable", function()
    local f = file([[
local luagent = require "luagent"
local ok, err = pcall(luagent.provider, "openrouter/some-model")
print(ok, err.kind, err.variable, err.message)
]])
    local r = run(nil, "run", f)
    assert.equal(0, r.code, r.stderr)
    assert.matches("^false\tusage\tOPENROUTER_API_KEY\t[^\n]*openrouter/some%-model: no API key: OPENROUTER_API_KEY is not set",
      r.stdout)
  end)

  it("uses the embedded mock with --mock, and a cassette, without a key", function()
    local r = run(nil, "run", "--mock", "--virtual-clock", file(STREAM))
    assert.equal(0, r.code, r.stderr)
    assert.matches("no API key set: using the embedded mock provider", r.stderr)
    assert.is_true(#r.stdout > 0)
    r = run(nil, "run", "--fast", "examples/hello.lua") -- its cassette beside it
    assert.equal(0, r.code, r.stderr)
    assert.matches("replaying examples/hello%.cassette%.jsonl", r.stderr)
  end)

  it("runs the `make run` demo without a key", function()
    local r = run(nil, "run", "--faults", "503@1", "--virtual-clock", "examples/triage.lua")
    assert.equal(0, r.code, r.stderr)
  end)

  it("goes to a base URL of the environment without a key (a local server needs none)", function()
    local f = file(STREAM)
    -- port 1 on loopback: refused at once, and the refusal is the call's
    local r = run({ ANTHROPIC_BASE_URL = "http://127.0.0.1:1" }, "run", f)
    assert.equal(0, r.code, r.stderr)
    assert.matches("CALL FAILED: refused: ", r.stderr)
  end)

  it("goes to a provider's own base_url without a key", function()
    local f = file([[
local luagent = require "luagent"
local p = luagent.provider { kind = "openai", model = "m", base_url = "http://127.0.0.1:1/v1" }
print(p:has_key())
]])
    local r = run(nil, "run", f)
    assert.equal(0, r.code, r.stderr)
    assert.equal("false\n", r.stdout)
  end)
end)
