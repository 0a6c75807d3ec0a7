-- `luagent run` with the embedded default: the mock provider on loopback,
-- faults, cassette replay and recording, event output, policies. These run
-- the real executable as a child process.
local h = require "helpers"

local function lines(s)
  local out = {}
  for l in s:gmatch("[^\n]+") do out[#out + 1] = l end
  return out
end

describe("luagent run, embedded default", function()
  local env = "env -u OPENAI_API_KEY -u ANTHROPIC_API_KEY -u OPENROUTER_API_KEY "

  -- Runs the executable without provider keys; `run` replays without the
  -- recorded pauses (--fast) and waits on the virtual clock (--virtual-clock:
  -- backoff takes no real time) unless the first argument is "paced".
  local function run(first, ...)
    local out, err = os.tmpname(), os.tmpname()
    local args = { first, ... }
    if first == "paced" then args[1] = "run"
    elseif first == "run" then table.insert(args, 2, "--fast") table.insert(args, 3, "--virtual-clock") end
    local words = {}
    for _, a in ipairs(args) do words[#words + 1] = h.quote(a) end
    local _, _, code = os.execute(env .. h.quote(h.bin) .. " " .. table.concat(words, " ")
      .. " >" .. out .. " 2>" .. err .. " </dev/null")
    local r = { code = code, stdout = h.slurp(out), stderr = h.slurp(err) }
    os.remove(out)
    os.remove(err)
    return r
  end

  it("replays the example's own cassette and says so on stderr", function()
    local r = run("paced", "examples/hello.lua")
    assert.equal(0, r.code, r.stderr)
    assert.matches("no API key set: using the embedded mock provider at http://127%.0%.0%.1:%d+ %(replaying examples/hello%.cassette%.jsonl%)", r.stderr)
    assert.matches("^Most failures of a model call are transient", r.stdout)
    assert.matches("%[stop after 1 attempt%(s%); tokens in 38, out 79%]", r.stderr)
  end)

  it("shows an injected 503, the retry with its delay, and the recovered answer (make run)", function()
    local r = run("run", "--faults", "503@1", "--seed", "5", "examples/hello.lua")
    assert.equal(0, r.code, r.stderr)
    assert.matches("faults 503@1", r.stderr)
    -- the retry is told once: the script's own line from the event, no log line
    -- the failure names the request and the provider's own words
    assert.matches("%[attempt 1 of 6 failed: http: HTTP 503 from POST http://127%.0%.0%.1:%d+/v1/chat/completions: server_error: The engine is currently overloaded, please try again later%.; retrying in [%d.]+ s%]", r.stderr)
    local _, told = r.stderr:gsub("HTTP 503", "")
    assert.equal(1, told, r.stderr)
    assert.matches("%[stop after 2 attempt%(s%)", r.stderr)
    assert.matches("Jitter randomizes each wait", r.stdout)
  end)

  it("announces each retry on stderr with --log info, and rejects an unknown level", function()
    local r = run("run", "--log", "info", "--faults", "503@1", "--seed", "5", "examples/hello.lua")
    assert.equal(0, r.code, r.stderr)
    assert.matches('"level":"info",[^\n]*"msg":"provider error %(attempt 1/6%), retrying in [%d.]+s: http: HTTP 503 from POST http://127%.0%.0%.1:%d+/v1/chat/completions: server_error: The engine is currently overloaded, please try again later%."', r.stderr)
    r = run("run", "--log", "chatty", "examples/hello.lua")
    assert.equal(2, r.code)
    assert.matches("%-%-log wants debug, info, warn, error or off, not 'chatty'", r.stderr)
  end)

  it("runs on the virtual clock with --virtual-clock: an hour of sleep takes no real time", function()
    local script = h.tempfile([[
      local luagent = require "luagent"
      local t0 = luagent.now()
      luagent.sleep(3600)
      print(luagent.clock.is_virtual(), luagent.now() - t0 >= 3600)
    ]], ".lua")
    local started = os.time()
    local r = run("run", script)
    os.remove(script)
    assert.equal(0, r.code, r.stderr)
    assert.equal("true\ttrue\n", r.stdout)
    assert.is_true(os.time() - started < 60)
  end)

  it("names a bad fault spec, exit 2", function()
    local r = run("run", "--faults", "503@1,frob", "examples/hello.lua")
    assert.equal(2, r.code)
    assert.matches("unknown fault 'frob'", r.stderr)
  end)

  it("writes every event as one JSON line with --events jsonl", function()
    local r = run("run", "--faults", "503@1", "--events", "jsonl", "examples/hello.lua")
    assert.equal(0, r.code, r.stderr)
    local types = {}
    local cjson = require "cjson"
    for _, l in ipairs(lines(r.stdout)) do
      if l:sub(1, 1) == "{" then types[#types + 1] = cjson.decode(l).type end
    end
    assert.equal("provider_retry", types[1])
    assert.equal("message_start", types[2])
    assert.equal("message_end", types[#types])
  end)

  it("writes the events to a file of their own with --events jsonl:FILE, apart from the script's text", function()
    local file = os.tmpname()
    local r = run("run", "--faults", "503@1", "--events", "jsonl:" .. file, "examples/hello.lua")
    assert.equal(0, r.code, r.stderr)
    assert.is_nil(r.stdout:find("{", 1, true), r.stdout) -- only the script's own text
    assert.matches("Jitter randomizes each wait", r.stdout)
    local cjson = require "cjson"
    local evs = {}
    for _, l in ipairs(lines(h.slurp(file))) do evs[#evs + 1] = cjson.decode(l) end -- every line is JSON
    os.remove(file)
    assert.equal("provider_retry", evs[1].type)
    assert.equal("message_end", evs[#evs].type)
    assert.is_true(evs[#evs].final)
  end)

  it("writes the events to stdout with --events jsonl:-", function()
    local r = run("run", "--faults", "503@1", "--events", "jsonl:-", "examples/hello.lua")
    assert.equal(0, r.code, r.stderr)
    assert.truthy(r.stdout:find('^{"time":"[^"]+","attempt":1,'), r.stdout)
  end)

  it("names an events file it cannot open, and a destination it does not know, exit 2", function()
    local r = run("run", "--events", "jsonl:/nonexistent-dir/x.jsonl", "examples/hello.lua")
    assert.equal(2, r.code)
    assert.matches("run: %-%-events: cannot open '/nonexistent%-dir/x%.jsonl': No such file or directory", r.stderr)
    r = run("run", "--events", "xml", "examples/hello.lua")
    assert.equal(2, r.code)
    assert.matches("run: %-%-events wants 'jsonl:FILE' or 'jsonl:%-', not 'xml'", r.stderr)
  end)

  it("reports an events file it cannot write (a full disk: /dev/full) once, and exits 74", function()
    local r = run("run", "--faults", "503@1", "--events", "jsonl:/dev/full", "examples/hello.lua")
    assert.equal(74, r.code, r.stderr)
    assert.matches("Jitter randomizes each wait", r.stdout) -- the run went on
    local _, n = r.stderr:gsub("cannot write to '/dev/full': No space left on device", "")
    assert.equal(1, n, r.stderr)
    -- the same for the events on stdout (jsonl:-), and with --retry-safe
    local err = os.tmpname()
    local _, _, code = os.execute(env .. h.quote(h.bin) .. " run --fast --virtual-clock --faults 503@1 --retry-safe"
      .. " --events jsonl:- examples/hello.lua >/dev/full 2>" .. err .. " </dev/null")
    local text = h.slurp(err)
    os.remove(err)
    assert.equal(74, code, text)
    _, n = text:gsub("cannot write to 'stdout': No space left on device", "")
    assert.equal(1, n, text)
  end)

  it("keeps retried attempts out of the output with --retry-safe", function()
    local r = run("run", "--faults", "stream-error:overloaded_error@1", "--retry-safe", "examples/hello.lua")
    assert.equal(0, r.code, r.stderr)
    assert.is_nil(r.stdout:find("starts the answer over", 1, true))
    local plain = run("run", "--faults", "stream-error:overloaded_error@1", "examples/hello.lua")
    assert.matches("starts the answer over", plain.stdout) -- live mode shows the reset
  end)

  it("records a run as a cassette that replays byte-identically", function()
    local rec1, rec2 = os.tmpname(), os.tmpname()
    local r = run("run", "--record", rec1, "examples/hello.lua")
    assert.equal(0, r.code, r.stderr)
    assert.matches("recorded 1 exchange", r.stderr)
    r = run("run", "--cassette", rec1, "--record", rec2, "examples/hello.lua")
    assert.equal(0, r.code, r.stderr)
    local cjson = require "cjson"
    local original = cjson.decode(lines(h.slurp("examples/hello.cassette.jsonl"))[1])
    for _, path in ipairs({ rec1, rec2 }) do
      local got = cjson.decode(lines(h.slurp(path))[1])
      assert.equal(#original.events, #got.events)
      for i, e in ipairs(original.events) do
        assert.equal(e.event, got.events[i].event)
        assert.equal(e.data, got.events[i].data) -- byte for byte, in order
      end
      assert.same(original.request.body, got.request.body)
      assert.is_nil(h.slurp(path):find("mock-key", 1, true)) -- no key in a cassette
    end
    os.remove(rec1)
    os.remove(rec2)
  end)

  it("reports a request that diverges from the cassette", function()
    local script = h.tempfile([[
      local luagent = require "luagent"
      local msg, err = luagent.complete { model = "openai/gpt-4o-mini", system = "You are a concise assistant.",
        messages = { { role = "user", content = "something else entirely" } }, max_tokens = 200 }
      print(msg, err and err.status)
    ]], ".lua")
    local r = run("run", "--cassette", "examples/hello.cassette.jsonl", script)
    os.remove(script)
    assert.equal(0, r.code, r.stderr)
    local _, reports = r.stderr:gsub("cassette divergence: exchange 1: messages%[2%]%.content differs: recorded 'In three sentences", "")
    assert.equal(1, reports) -- reported once: a divergence is not retried
    assert.matches("got 'something else entirely'", r.stderr)
    assert.matches("nil\t422", r.stdout)
  end)

  it("names a malformed cassette with its file and line", function()
    local bad = h.tempfile('{"request":{"method":"POST","path":"/v1/chat/completions"},"status":200,"events":[]}\n{oops\n')
    local r = run("run", "--cassette", bad, "examples/hello.lua")
    os.remove(bad)
    assert.is_true(r.code ~= 0)
    assert.matches(bad:gsub("%p", "%%%0") .. ":2", r.stderr)
  end)

  it("uses --policy for calls that name none, and reports a broken one with file:line", function()
    local pol = h.tempfile("return { max_retries = 0 }\n", ".lua")
    local r = run("run", "--policy", pol, "--faults", "503@1", "examples/hello.lua")
    assert.equal(1, r.code)
    assert.matches("failed after 1 attempt", r.stderr)
    local broken = h.tempfile("return { max_retries = }\n", ".lua")
    r = run("run", "--policy", broken, "examples/hello.lua")
    assert.equal(1, r.code)
    assert.matches(broken:gsub("%p", "%%%0") .. ":1:", r.stderr)
    os.remove(pol)
    os.remove(broken)
  end)
end)

describe("luagent run, at its end", function()
  it("closes its runtime, after every output, and when the script ends with os.exit", function()
    for _, ending in ipairs { "", "os.exit(0)" } do
      local script = h.tempfile([[
        local luagent = require "luagent"
        luagent.default_runtime():on_close(function() io.stderr:write("runtime closed\n") end)
        io.stderr:write("script done\n")
      ]] .. ending, ".lua")
      local r = h.run("run", "--mock", "--cost", script)
      os.remove(script)
      assert.equal(0, r.code, r.stderr)
      assert.matches("script done\ncost %(USD.*\ntotal [^\n]*\nruntime closed\n$", r.stderr)
    end
  end)
end)
