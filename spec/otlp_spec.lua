-- OTLP/HTTP export (lua/luagent/observe/trace.lua) through the real binary: an
-- agent run (a 503 retried, a tool) exported with `--otlp http://...` to a
-- real OTLP receiver, @elastic/mockotlpserver (a peer: skipped, and counted
-- as such, without node or `make peers`), which accepts it and whose own
-- normalization reads every span back. And, without peers: a collector
-- that refuses connections or never answers is logged once, never slows or
-- breaks the run, and spans over the queue bound are dropped and counted;
-- in process, against a test server: a reply that never ends is read a
-- few KiB deep, and only a 2xx status is a success.
local helpers = require "spec.support.helpers"
local peers = require "peers"
local luagent = require "luagent"
local core = require "luagent.core"
local http = require "luagent.base.http"
local testserver = require "spec.support.testserver"
local cjson = require "cjson"

local SCRIPT = [==[
local luagent = require "luagent"
local mock = require "luagent.mock"
local srv = assert(mock.start { faults = "503@1", seed = 1, script = function(_, _, body)
  for _, m in ipairs(body.messages or {}) do
    if m.role == "tool" then return { text = "done" } end
  end
  return { text = "looking", tools = { { id = "c1", name = "lookup", arguments = { q = "x" } } } }
end })
local lookup = { name = "lookup", description = "Looks up", read_only = true, run = function() return "found" end }
local t0 = luagent.now()
for i = 1, tonumber(arg[1] or "1") do
  local a = luagent.agent { name = "triage", tools = { lookup }, policy = { backoff = { strategy = "fixed", base = 0.05 } },
    model = { kind = "openai", model = "gpt-4o-mini", base_url = srv.url .. "/v1", api_key = "k" } }
  assert(a:run("go").stop_reason == "stop")
end
print(string.format("agents took %.3f s", luagent.now() - t0))
srv:close()
]==]

local function run(args, env)
  local script = helpers.tempfile(SCRIPT, ".lua")
  local out, err = os.tmpname(), os.tmpname()
  local words = { "env", "-u", "OTEL_EXPORTER_OTLP_ENDPOINT", "-u", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT" }
  for k, v in pairs(env or {}) do words[#words + 1] = k .. "=" .. helpers.quote(v) end
  words[#words + 1] = helpers.quote(helpers.bin)
  words[#words + 1] = "run"
  for _, a in ipairs(args) do words[#words + 1] = helpers.quote(a) end
  words[#words + 1] = script
  words[#words + 1] = (args.agents or "1")
  local t0 = core.wall()
  local _, _, code = os.execute(table.concat(words, " ") .. " >" .. out .. " 2>" .. err .. " </dev/null")
  local r = { code = code, stdout = helpers.slurp(out), stderr = helpers.slurp(err), seconds = core.wall() - t0 }
  for _, p in ipairs({ script, out, err }) do os.remove(p) end
  return r
end

local function count(s, pattern) return select(2, s:gsub(pattern, "")) end

local receiver, why = peers.find("@elastic/mockotlpserver", "mockotlpserver")

describe("OTLP/HTTP export to a real receiver", function()
  if not receiver then
    pending("@elastic/mockotlpserver not installed: run `make peers` (needs node and npm): " .. why)
    return
  end

  local server
  lazy_setup(function()
    local err
    server, err = peers.start { node = receiver.node, script = "spec/support/otlp_receiver.js",
      args = { peers.root, "{port}", "{dir}/received.jsonl" }, ready = "/" }
    assert(server, "mockotlpserver " .. receiver.version .. " did not start: " .. tostring(err))
  end)
  lazy_teardown(function() if server then server:stop() end end)

  it("is accepted (mockotlpserver " .. receiver.version .. ") and read back span by span", function()
    local r = run({ "--otlp", server.url })
    assert.equal(0, r.code, r.stderr)
    assert.not_matches("OTLP", r.stderr) -- no failure, nothing dropped
    -- The receiver answers a POST before it hands the spans on (its
    -- http.js replies, then the same callback calls onTrace, which writes
    -- the line), so the run can end before the last line is written. Node
    -- serves a later request only once that callback has returned: when it
    -- answers one, every line is in the file.
    assert(http.fetch { method = "GET", url = server.url .. "/", http_errors = false,
      timeout = { connect = 5, total = 10 } })
    local text = helpers.slurp(server.dir .. "/received.jsonl")
    local spans = {}
    for line in text:gmatch("[^\n]+") do
      local req = cjson.decode(line)
      assert.is_nil(req.invalid, req.invalid)
      for _, rs in ipairs(req.resourceSpans) do
        assert.equal("luagent", rs.resource.attributes["service.name"])
        for _, ss in ipairs(rs.scopeSpans) do
          for _, s in ipairs(ss.spans) do spans[#spans + 1] = s end
        end
      end
    end
    assert.equal(8, #spans, text)
    local by_name, by_id = {}, {}
    for _, s in ipairs(spans) do
      by_name[s.name] = by_name[s.name] or {}
      table.insert(by_name[s.name], s)
      by_id[s.spanId] = s
    end
    local root = by_name["invoke_agent triage"][1]
    assert.equal("SPAN_KIND_INTERNAL", root.kind)
    assert.is_nil(root.parentSpanId)
    assert.equal("invoke_agent", root.attributes["gen_ai.operation.name"])
    assert.equal(2, #by_name["chat gpt-4o-mini"])
    for _, chat in ipairs(by_name["chat gpt-4o-mini"]) do
      assert.equal("SPAN_KIND_CLIENT", chat.kind)
      assert.equal(root.spanId, chat.parentSpanId)
      assert.equal(root.traceId, chat.traceId)
      assert.equal("openai", chat.attributes["gen_ai.provider.name"])
      assert.equal("gpt-4o-mini", chat.attributes["gen_ai.request.model"])
      assert.is_true(chat.attributes["gen_ai.usage.input_tokens"] > 0)
    end
    local failed = by_name["attempt 1"]
    local a503
    for _, a in ipairs(failed) do
      if a.attributes["http.response.status_code"] == 503 then a503 = a end
    end
    assert.is_table(a503)
    assert.equal("STATUS_CODE_ERROR", a503.status.code)
    assert.equal("chat gpt-4o-mini", by_id[a503.parentSpanId].name)
    local a2 = by_name["attempt 2"][1]
    assert.equal(a503.parentSpanId, a2.parentSpanId)
    assert.equal(1, a2.attributes["http.request.resend_count"])
    local tool = by_name["execute_tool lookup"][1]
    assert.equal("SPAN_KIND_INTERNAL", tool.kind)
    assert.equal(root.spanId, tool.parentSpanId)
    assert.equal("lookup", tool.attributes["gen_ai.tool.name"])
  end)
end)

describe("OTLP/HTTP export to a collector that fails", function()
  it("logs a refused collector once; the run goes on and says how many spans were dropped", function()
    local r = run({ "--otlp", "http://127.0.0.1:1", agents = "3" }) -- 8 + 7 + 7 spans (one 503)
    assert.equal(0, r.code, r.stderr)
    assert.matches("agents took", r.stdout)
    assert.equal(1, count(r.stderr, "OTLP export to http://127%.0%.0%.1:1/v1/traces failed %(refused"), r.stderr)
    assert.matches("OTLP export to http://127%.0%.0%.1:1/v1/traces: 0 span%(s%) sent, 22 dropped", r.stderr)
  end)

  it("never slows the run for a collector that never answers; spans over the queue bound are counted", function()
    local silent = assert(core.tcp_listen("127.0.0.1", 0)) -- accepts (the kernel does), never answers
    local _, port = silent:address()
    local url = "http://127.0.0.1:" .. port
    local r = run({ "--otlp", url, agents = "5" }, { OTEL_BSP_MAX_QUEUE_SIZE = "4" })
    silent:close()
    assert.equal(0, r.code, r.stderr)
    local took = tonumber(r.stdout:match("agents took ([%d.]+) s"))
    assert.is_true(took < 1.5, r.stdout) -- five runs with a 0.05 s backoff each: the export never waits
    assert.is_true(r.seconds < 6, "the process took " .. r.seconds .. " s") -- the final flush is bounded
    -- 36 spans (8 for the run with the 503, 7 for each other): 4 went into
    -- the queue and out in the stalled post, 4 more waited in the queue of
    -- 4, the others were dropped
    local sent, dropped, over = r.stderr:match("(%d+) span%(s%) sent, (%d+) dropped %((%d+) over the queue bound of 4%)")
    assert(sent, r.stderr)
    assert.equal(0, tonumber(sent))
    assert.equal(36, tonumber(dropped))
    assert.is_true(tonumber(over) > 0)
    assert.equal(1, count(r.stderr, "the collector did not answer"), r.stderr)
  end)

  it("bounds each post by OTEL_EXPORTER_OTLP_TIMEOUT (milliseconds): a post that times out is logged once", function()
    local silent = assert(core.tcp_listen("127.0.0.1", 0))
    local _, port = silent:address()
    local r = run({ "--otlp", "http://127.0.0.1:" .. port }, { OTEL_EXPORTER_OTLP_TIMEOUT = "200" })
    silent:close()
    assert.equal(0, r.code, r.stderr)
    -- 0.2 s, well within the run's final second for the export
    assert.equal(1, count(r.stderr, "failed %(timeout"), r.stderr)
    assert.equal(0, count(r.stderr, "the collector did not answer"), r.stderr)
  end)
end)

describe("OTLP/HTTP export, the collector's reply", function()
  -- A finished span, as trace.lua builds them.
  local function span(name)
    return { trace_id = core.random_id(32), span_id = core.random_id(16), name = name or "fine", kind = 1,
      start = 1, stop = 2, status = 0, attrs = {}, nattrs = 0 }
  end

  local lines, saved, tracer
  before_each(function()
    lines = {}
    saved = luagent.configure { log_sink = function(_, line) lines[#lines + 1] = line end, log_level = "warn" }
    tracer = assert(luagent.default_runtime():trace {})
  end)
  after_each(function()
    tracer:stop()
    luagent.configure(saved)
  end)

  local function logged(pattern)
    local n = 0
    for _, l in ipairs(lines) do if l:find(pattern) then n = n + 1 end end
    return n
  end

  it("is read a few KiB deep when it never ends: the batch counts as sent, the rest is never read", function()
    local LIMIT = 64 * 1024 * 1024 -- the server's own bound: the old exporter read all of it
    local sent, ended = 0, nil
    local srv = testserver.serve(function(conn)
      -- 200 and a body without a length, that runs to a close that never comes
      conn:write(testserver.head(200, { "Content-Type: application/json" }))
      local chunk = string.rep("{}", 32768)
      while sent < LIMIT do
        local ok, err = conn:write(chunk)
        if not ok then
          ended = err -- the exporter hung up
          return
        end
        sent = sent + #chunk
      end
      ended = "all sent"
      luagent.sleep(60)
    end)
    local x = tracer:http_exporter { url = srv.url .. "/v1/traces", timeout = 3 }
    x.sink(span())
    x.flush(10)
    for _ = 1, 1000 do -- (10 s at most) until the server's write fails
      if ended then break end
      luagent.sleep(0.01)
    end
    srv.close()
    assert.equal(1, x.sent)
    assert.equal(0, x.failures)
    assert.equal(0, #lines, table.concat(lines, "\n"))
    assert.is_truthy(ended)
    assert.are_not.equal("all sent", ended)
    assert.is_true(sent < LIMIT / 4, sent .. " bytes sent") -- what the sockets' buffers took, no more
  end)

  it("is a failure unless its status is 2xx (a 307 is not followed), reported once per kind", function()
    local statuses = { 307, 307, 500, 500, 202 }
    local srv
    srv = testserver.serve(function(conn)
      local status = statuses[srv.requests]
      conn:write(testserver.head(status, { "Location: http://127.0.0.1:1/v1/traces", "Content-Length: 2",
        "Connection: close" }) .. "{}")
    end)
    local x = tracer:http_exporter { url = srv.url .. "/v1/traces", timeout = 3 }
    for i = 1, #statuses do
      x.sink(span("s" .. i))
      x.flush(5)
    end
    srv.close()
    assert.equal(5, srv.requests)
    assert.equal(1, x.sent)
    assert.equal(4, x.failures)
    assert.equal(1, logged("OTLP export to .* failed %(HTTP 307"), table.concat(lines, "\n"))
    assert.equal(1, logged("OTLP export to .* failed %(HTTP 500"), table.concat(lines, "\n"))
  end)

  it("ends a reply that trickles past the timeout: the batch fails once, the export goes on", function()
    local srv = testserver.serve(function(conn)
      conn:write(testserver.head(200, { "Content-Type: application/json" }))
      for _ = 1, 600 do
        if not conn:write("{") then return end
        luagent.sleep(0.1)
      end
    end)
    local x = tracer:http_exporter { url = srv.url .. "/v1/traces", timeout = 0.5 }
    x.sink(span())
    x.flush(10)
    x.sink(span())
    x.flush(10)
    srv.close()
    assert.equal(0, x.sent)
    assert.equal(2, x.failures)
    assert.equal(1, logged("OTLP export to .* failed %(timeout"), table.concat(lines, "\n"))
  end)
end)
