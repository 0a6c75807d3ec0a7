-- Runs you can reconstruct afterwards (issue 26, item 7): what `luagent run
-- --events jsonl` writes and what `--trace` prints, from the real executable
-- against its embedded mock provider (real libcurl, real sockets), on the
-- virtual clock. Every JSON line has a time; agent_end lines carry the
-- history's length and its last message, not the history; the tree names a
-- stream cut mid-answer as such, with the bytes the transport received.
local h = require "helpers"
local cjson = require "cjson"

-- "2026-12-01T01:01:02.752Z": the time a log line carries.
local ISO = "^%d%d%d%d%-%d%d%-%d%dT%d%d:%d%d:%d%d%.%d%d%dZ$"

-- Runs `luagent run FILE` (FILE holding `source`) without provider keys,
-- on the virtual clock, with `flags` before FILE; returns the result with
-- the decoded --events lines (`lines`) and their text (`raw`).
local function run_source(source, flags)
  local path = h.tempfile(source, ".lua")
  local events = os.tmpname()
  local args = { "run", "--mock", "--fast", "--virtual-clock", "--events", "jsonl:" .. events }
  for _, f in ipairs(flags or {}) do args[#args + 1] = f end
  args[#args + 1] = path
  local r = h.run_env({ unset = { "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENROUTER_API_KEY" }, within = 120 },
    table.unpack(args))
  os.remove(path)
  r.lines = {}
  for line in h.slurp(events):gmatch("[^\n]+") do r.lines[#r.lines + 1] = cjson.decode(line) end
  r.raw = h.slurp(events)
  os.remove(events)
  return r
end

-- An agent that calls a tool once, then answers (the mock's echo model calls
-- a tool it is offered once): a history of four messages (user, assistant
-- with the call, tool, assistant) after one run.
local AGENT = [[
local luagent = require "luagent"
local a = luagent.agent { name = "recon", model = "openai/gpt-4o-mini",
  tools = { { name = "noop", description = "does nothing", read_only = true, run = function() return "ok" end } } }
luagent.events.subscribe(function(ev)
  if ev.type == "agent_end" then print("lua agent_end messages=" .. #ev.messages) end
end, { types = { "agent_end" } })
a:run("hello")
]]

describe("--events jsonl", function()
  it("gives every line a time: ISO 8601 UTC with milliseconds, as log lines have, in order", function()
    for _, flags in ipairs({ { "--faults", "503@1" }, { "--faults", "reset:bytes=300@1", "--retry-safe" } }) do
      local r = run_source(AGENT, flags)
      assert.equal(0, r.code, r.stderr)
      assert.is_true(#r.lines > 5, r.raw)
      local types, prev = {}, ""
      for _, ev in ipairs(r.lines) do
        assert.is_string(ev.time, cjson.encode(ev))
        assert.matches(ISO, ev.time)
        assert.is_true(ev.time >= prev, ev.time .. " before " .. prev)
        prev = ev.time
        types[ev.type] = true
      end
      for _, t in ipairs({ "agent_start", "turn_start", "message_start", "message_end", "provider_retry",
                           "tool_execution_start", "tool_execution_end", "turn_end", "agent_end" }) do
        assert.is_true(types[t], t .. " missing from " .. table.concat(flags, " "))
      end
      -- the time leads the line, as in a log line
      assert.matches('^{"time":"', r.raw)
    end
  end)

  it("writes agent_end with the history's length and its last message, not the history", function()
    local r = run_source(AGENT)
    assert.equal(0, r.code, r.stderr)
    local ends = {}
    for _, ev in ipairs(r.lines) do if ev.type == "agent_end" then ends[#ends + 1] = ev end end
    assert.equal(1, #ends)
    local e = ends[1]
    assert.is_nil(e.messages)
    assert.equal(4, e.history)
    assert.same("assistant", e.last_message.role)
    assert.is_string(e.last_message.content)
    assert.equal("stop", e.stop_reason)
    assert.equal(2, e.turns)
    -- the Lua event keeps the whole history
    assert.matches("lua agent_end messages=4", r.stdout)
  end)
end)

describe("--trace", function()
  -- The tree's attempt lines of hello.lua under `faults`.
  local function attempts(faults, more)
    local args = { "--trace", "--faults", faults }
    for _, a in ipairs(more or {}) do args[#args + 1] = a end
    local r = run_source(h.slurp("examples/hello.lua"), args)
    local out = {}
    for l in r.stderr:gmatch("[^\n]+") do
      if l:match("^%s+attempt %d") then out[#out + 1] = l end
    end
    return out, r
  end

  it("says 'stream cut after N bytes' for a stream reset mid-answer, with the bytes received", function()
    local lines, r = attempts("reset:bytes=2000@1")
    assert.equal(0, r.code, r.stderr)
    assert.matches("^%s+attempt 1 %S+  stream cut after 2000 bytes, retried after %S+$", lines[1], r.stderr)
    assert.matches("^%s+attempt 2 %S+  HTTP 200$", lines[2])
  end)

  it("says so for a stream that ends without its terminator, and for a final attempt", function()
    local lines, r = attempts("cut@1")
    assert.equal(0, r.code, r.stderr)
    local n = lines[1]:match("stream cut after (%d+) bytes, retried after")
    assert.is_truthy(n, r.stderr)
    assert.is_true(tonumber(n) > 0)
    local policy = h.tempfile("return { max_retries = 0 }\n", ".lua")
    lines, r = attempts("reset:bytes=1500@1", { "--policy", policy })
    os.remove(policy)
    assert.equal(1, r.code, r.stderr)
    assert.matches("^%s+attempt 1 %S+  stream cut after 1500 bytes, failed$", lines[1], r.stderr)
  end)

  it("still names an HTTP error status, and the error of a 200 that was no cut", function()
    local lines, r = attempts("503@1")
    assert.equal(0, r.code, r.stderr)
    assert.matches("^%s+attempt 1 %S+  HTTP 503, retried after %S+$", lines[1])
    lines, r = attempts("stream-error:overloaded_error@1")
    assert.equal(0, r.code, r.stderr)
    assert.matches("^%s+attempt 1 %S+  HTTP 200 overloaded, retried after %S+$", lines[1], r.stderr)
  end)
end)

describe("the trace tree, in process", function()
  it("says 'stream cut after N bytes' for an HTTP/2 stream reset mid-answer (RST_STREAM, curl 92)", function()
    local luagent = require "luagent"
    local h2 = require "h2server"
    local chunk = 'data: {"choices":[{"index":0,"delta":{"content":"hel"}}]}\n\n'
    local sse = 'data: {"choices":[{"index":0,"delta":{"content":"hello"}}]}\n\n'
      .. 'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'
    local srv = h2.serve(function(n)
      if n > 1 then return h2.answer(sse) end
      return { { "headers", 200, "text/event-stream" }, { "data", chunk }, { "rst", h2.errors.INTERNAL_ERROR } }
    end)
    local rt = luagent.runtime { log_sink = function() end }
    local tracer = assert(rt:trace { tree = true })
    luagent.clock.virtual()
    local ok, err = pcall(function()
      for _ in rt:stream { model = { kind = "openai", model = "m", base_url = srv.url .. "/v1", api_key = "k",
                                     http_version = "2-prior-knowledge" },
                           messages = { { role = "user", content = "hi" } }, seed = 3 } do end
    end)
    luagent.clock.real()
    local out = {}
    tracer:stop { write = function(_, text) out[#out + 1] = text return true end }
    rt:close()
    srv.close()
    assert(ok, tostring(err))
    local text = table.concat(out)
    assert.matches("\n  attempt 1 %S+  stream cut after " .. #chunk .. " bytes, retried after %S+\n", text)
    assert.matches("\n  attempt 2 %S+  HTTP 200\n", text)
  end)
end)
