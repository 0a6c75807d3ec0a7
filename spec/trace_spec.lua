-- Traces (lua/luagent/observe/trace.lua) from the file export: an agent run against
-- the mock provider on loopback (a 503 on the first model request, a tool
-- that fails once and is retried), on the virtual clock, exported as OTLP
-- JSON lines and read back span by span: names, kinds, parent links, ids,
-- times and the GenAI attributes field by field. Also: `traceparent` on
-- provider requests when the policy asks for it (and only then), and the
-- tree `luagent run --trace` prints.
local luagent = require "luagent"
local mock = require "luagent.mock"
local retry = require "luagent.model.call"
local trace = require "luagent.observe.trace"
local events = require("luagent").events
local errors = require "luagent.base.errors"
local cjson = require "cjson"
local testserver = require "spec.support.testserver"
local slurp = require("spec.support.helpers").slurp

-- The model asks for `lookup` once, then answers.
local function script(_, _, body)
  for _, m in ipairs(body.messages or {}) do
    if m.role == "tool" then return { text = "done: " .. tostring(m.content) } end
  end
  return { text = "looking", tools = { { id = "call_1", name = "lookup", arguments = { q = "x" } } } }
end

local function lookup_tool()
  local runs = 0
  return { name = "lookup", description = "Looks up", read_only = true,
    params = { type = "object", properties = { q = { type = "string" } } },
    run = function()
      runs = runs + 1
      if runs == 1 then return nil, errors.new("reset", "connection reset by the lookup service") end
      return "found"
    end }
end

-- Runs the agent with tracing to a file; returns the decoded lines and
-- the agent's last event.
local function traced_run(policy)
  local file = os.tmpname()
  local tracer = assert(luagent.default_runtime():trace { file = file })
  local srv = assert(mock.start { faults = "503@1", seed = 1, script = script })
  local a = luagent.agent { name = "triage", tools = { lookup_tool() }, policy = policy,
    model = { kind = "openai", model = "gpt-4o-mini", base_url = srv.url .. "/v1", api_key = "k" } }
  local last = a:run("go")
  srv:close()
  tracer:stop()
  local lines = {}
  for line in slurp(file):gmatch("[^\n]+") do lines[#lines + 1] = cjson.decode(line) end
  os.remove(file)
  return lines, last
end

local function attrs_of(span)
  local t = {}
  for _, kv in ipairs(span.attributes or {}) do t[kv.key] = kv.value end
  return t
end

-- Publishes the events of a model call made outside any agent, answered
-- at the first attempt, as the retry loop would.
local function bare_call(id)
  local events = require("luagent").events
  events.publish { type = "message_start", call = id, id = "r" .. id, model = "m" }
  events.publish { type = "message_end", call = id, final = true, attempts = 1, stop_reason = "stop",
    request_model = "m", provider_kind = "openai", status = 200 }
end

-- Stops tracing; returns the lines of the tree it prints.
local function stop_with_tree(tracer)
  local out = {}
  tracer:stop { write = function(_, ...) for _, s in ipairs({ ... }) do out[#out + 1] = s end end }
  local lines = {}
  for l in table.concat(out):gmatch("([^\n]*)\n") do lines[#lines + 1] = l end
  return lines
end

describe("trace, from the OTLP file export", function()
  before_each(function()
    luagent.configure { log_sink = function() end }
    luagent.clock.virtual()
    luagent.default_runtime().endpoints:reset()
  end)
  after_each(function()
    luagent.configure { log_sink = false }
    luagent.clock.real()
  end)

  it("writes one TracesData line per agent run: spans, kinds, parents and GenAI attributes", function()
    local lines, last = traced_run({ backoff = { strategy = "fixed", base = 0.5 } })
    assert.equal("stop", last.stop_reason)
    assert.equal(1, #lines)
    local rs = lines[1].resourceSpans
    assert.equal(1, #rs)
    local res = {}
    for _, kv in ipairs(rs[1].resource.attributes) do res[kv.key] = kv.value.stringValue end
    assert.equal("luagent", res["service.name"])
    assert.equal("luagent", rs[1].scopeSpans[1].scope.name)
    local spans = rs[1].scopeSpans[1].spans
    local by_id, trace_id = {}, spans[1].traceId
    for _, s in ipairs(spans) do
      assert.matches("^%x+$", s.traceId)
      assert.equal(32, #s.traceId)
      assert.equal(trace_id, s.traceId) -- one trace
      assert.equal(16, #s.spanId)
      assert.matches("^%x+$", s.spanId)
      assert.is_nil(by_id[s.spanId])
      by_id[s.spanId] = s
      assert.matches("^%d+$", s.startTimeUnixNano) -- 64-bit integers as strings
      assert.matches("^%d+$", s.endTimeUnixNano)
      assert(math.tointeger(s.endTimeUnixNano) >= math.tointeger(s.startTimeUnixNano), s.name .. " " .. s.startTimeUnixNano .. " " .. s.endTimeUnixNano)
    end
    local function children(s, name)
      local out = {}
      for _, c in ipairs(spans) do
        if c.parentSpanId == s.spanId and (not name or c.name == name) then out[#out + 1] = c end
      end
      table.sort(out, function(a, b) return math.tointeger(a.startTimeUnixNano) < math.tointeger(b.startTimeUnixNano) end)
      return out
    end
    assert.equal(9, #spans) -- agent, 2 chats with 3 attempts, a tool with 2 attempts

    -- invoke_agent: the root
    local root
    for _, s in ipairs(spans) do if not s.parentSpanId then assert.is_nil(root) root = s end end
    assert.equal("invoke_agent triage", root.name)
    assert.equal(trace.KIND.INTERNAL, root.kind)
    local ra = attrs_of(root)
    assert.same({ stringValue = "invoke_agent" }, ra["gen_ai.operation.name"])
    assert.same({ stringValue = "triage" }, ra["gen_ai.agent.name"])
    assert.equal(last.agent_id, ra["gen_ai.agent.id"].stringValue)
    assert.same({ intValue = tostring(last.usage.input_tokens) }, ra["gen_ai.usage.input_tokens"])
    assert.same({ intValue = tostring(last.usage.output_tokens) }, ra["gen_ai.usage.output_tokens"])

    -- two chat spans under it, CLIENT
    local chats = children(root, "chat gpt-4o-mini")
    assert.equal(2, #chats)
    for i, chat in ipairs(chats) do
      assert.equal(trace.KIND.CLIENT, chat.kind)
      local ca = attrs_of(chat)
      assert.same({ stringValue = "chat" }, ca["gen_ai.operation.name"])
      assert.same({ stringValue = "openai" }, ca["gen_ai.provider.name"])
      assert.same({ stringValue = "gpt-4o-mini" }, ca["gen_ai.request.model"])
      assert.same({ stringValue = "gpt-4o-mini" }, ca["gen_ai.response.model"])
      assert.matches("^chatcmpl%-mock%d+$", ca["gen_ai.response.id"].stringValue)
      assert.matches("^%d+$", ca["gen_ai.usage.input_tokens"].intValue)
      assert.is_true(math.tointeger(ca["gen_ai.usage.input_tokens"].intValue) > 0)
      assert.is_true(math.tointeger(ca["gen_ai.usage.output_tokens"].intValue) > 0)
      assert.same({ intValue = "0" }, ca["gen_ai.usage.cache_read.input_tokens"])
      assert.same({ intValue = "0" }, ca["gen_ai.usage.cache_creation.input_tokens"])
      assert.same({ arrayValue = { values = { { stringValue = i == 1 and "tool_calls" or "stop" } } } },
        ca["gen_ai.response.finish_reasons"])
      assert.same({ stringValue = "127.0.0.1" }, ca["server.address"])
      assert.matches("^%d+$", ca["server.port"].intValue)
      assert.is_nil(ca["error.type"])
      assert.equal(trace.STATUS.UNSET, chat.status.code)
    end

    -- the first call: attempt 1 failed with a 503 and was retried, attempt 2 answered
    local attempts = children(chats[1])
    assert.equal(2, #attempts)
    assert.equal("attempt 1", attempts[1].name)
    assert.equal(trace.KIND.CLIENT, attempts[1].kind)
    local a1 = attrs_of(attempts[1])
    assert.same({ intValue = "503" }, a1["http.response.status_code"])
    assert.same({ stringValue = "overloaded" }, a1["error.type"])
    assert.same({ intValue = "500" }, a1["luagent.retry.delay_ms"])
    assert.is_nil(a1["http.request.resend_count"])
    assert.equal(trace.STATUS.ERROR, attempts[1].status.code)
    assert.matches("HTTP 503", attempts[1].status.message)
    local a2 = attrs_of(attempts[2])
    assert.equal("attempt 2", attempts[2].name)
    assert.same({ intValue = "200" }, a2["http.response.status_code"])
    assert.same({ intValue = "1" }, a2["http.request.resend_count"])
    assert.is_nil(a2["error.type"])
    -- the wait followed attempt 1: attempt 2 starts 0.5 s after it ended
    assert.equal(500000000, math.tointeger(attempts[2].startTimeUnixNano) - math.tointeger(attempts[1].endTimeUnixNano))
    assert.equal(1, #children(chats[2]))

    -- execute_tool, INTERNAL, with its two attempts
    local tools = children(root, "execute_tool lookup")
    assert.equal(1, #tools)
    local tool = tools[1]
    assert.equal(trace.KIND.INTERNAL, tool.kind)
    local ta = attrs_of(tool)
    assert.same({ stringValue = "execute_tool" }, ta["gen_ai.operation.name"])
    assert.same({ stringValue = "lookup" }, ta["gen_ai.tool.name"])
    assert.same({ stringValue = "call_mockcall_1" }, ta["gen_ai.tool.call.id"]) -- as the mock names it
    local tool_attempts = children(tool)
    assert.equal(2, #tool_attempts)
    assert.equal("attempt 1", tool_attempts[1].name)
    assert.equal(trace.STATUS.ERROR, tool_attempts[1].status.code)
    assert.same({ stringValue = "reset" }, attrs_of(tool_attempts[1])["error.type"])
    assert.equal(trace.STATUS.UNSET, tool_attempts[2].status.code)
    -- the tool ran between the two model calls
    assert.is_true(math.tointeger(tool.startTimeUnixNano) >= math.tointeger(chats[1].endTimeUnixNano))
    assert.is_true(math.tointeger(chats[2].startTimeUnixNano) >= math.tointeger(tool.endTimeUnixNano))
  end)

  it("marks a call that failed for good with error.type and an error status", function()
    local file = os.tmpname()
    local tracer = assert(luagent.default_runtime():trace { file = file })
    local srv = assert(mock.start { faults = "401", seed = 1 })
    local msg, err = luagent.complete { model = { kind = "anthropic", model = "claude-3-5-haiku",
      base_url = srv.url .. "/v1", api_key = "k" }, messages = { { role = "user", content = "hi" } } }
    srv:close()
    tracer:stop()
    assert.is_nil(msg)
    assert.equal("http", err.kind)
    local spans = cjson.decode(slurp(file)).resourceSpans[1].scopeSpans[1].spans
    os.remove(file)
    assert.equal(2, #spans) -- a call without an agent is a trace of its own: chat at the root
    local chat, attempt = spans[1], spans[2]
    assert.equal("chat claude-3-5-haiku", chat.name)
    assert.is_nil(chat.parentSpanId)
    assert.equal(chat.spanId, attempt.parentSpanId)
    assert.equal(trace.STATUS.ERROR, chat.status.code)
    local ca = attrs_of(chat)
    assert.same({ stringValue = "anthropic" }, ca["gen_ai.provider.name"])
    assert.same({ stringValue = "auth" }, ca["error.type"])
    assert.same({ intValue = "401" }, attrs_of(attempt)["http.response.status_code"])
  end)

  it("sends traceparent (the attempt's span) when the policy enables it, and only then", function()
    local seen = {}
    local srv = testserver.serve(function(conn, req)
      seen[#seen + 1] = req.headers.traceparent or false
      local body = table.concat({
        'data: {"id":"c1","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}',
        'data: {"id":"c1","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}',
        "data: [DONE]", "", "" }, "\n\n")
      conn:write(testserver.head(200, { "Content-Type: text/event-stream", "Content-Length: " .. #body,
        "Connection: close" }) .. body)
    end)
    local file = os.tmpname()
    local tracer = assert(luagent.default_runtime():trace { file = file })
    local model = { kind = "openai", model = "m", base_url = srv.url .. "/v1", api_key = "k" }
    local msgs = { { role = "user", content = "hi" } }
    assert(luagent.complete { model = model, messages = msgs, policy = { traceparent = true } })
    assert(luagent.complete { model = model, messages = msgs })
    tracer:stop()
    -- nothing traced: still a well-formed header, with ids of its own
    assert(luagent.complete { model = model, messages = msgs, policy = { traceparent = true } })
    srv.close()
    assert.equal(3, #seen)
    assert.is_false(seen[2])
    assert.matches("^00%-" .. string.rep("%x", 32) .. "%-" .. string.rep("%x", 16) .. "%-01$", seen[3])
    assert.not_equal(seen[1], seen[3])
    local spans = cjson.decode(slurp(file):match("^[^\n]+")).resourceSpans[1].scopeSpans[1].spans
    os.remove(file)
    local attempts = {}
    for _, s in ipairs(spans) do
      if s.name == "attempt 1" then attempts[#attempts + 1] = "00-" .. s.traceId .. "-" .. s.spanId .. "-01" end
    end
    assert.equal(2, #attempts) -- both calls' spans, in one batch
    assert.equal(attempts[1], seen[1])
  end)

  it("batches the file export: traces that end within a second share a line", function()
    local call = bare_call
    local file = os.tmpname()
    local tracer = assert(luagent.default_runtime():trace { file = file })
    local t = luagent.spawn(function()
      call(1)
      luagent.sleep(0.5)
      call(2) -- within a second of the first: the same line
      luagent.sleep(2)
      assert.matches("^{", slurp(file)) -- written by the batch's timer, before the run ends
      call(3)
    end)
    t:join()
    tracer:stop()
    local lines = {}
    for line in slurp(file):gmatch("[^\n]+") do
      local spans = cjson.decode(line).resourceSpans[1].scopeSpans[1].spans
      local names = {}
      for _, sp in ipairs(spans) do names[#names + 1] = sp.name end
      lines[#lines + 1] = table.concat(names, ",")
    end
    os.remove(file)
    assert.same({ "chat m,attempt 1,chat m,attempt 1", "chat m,attempt 1" }, lines)
  end)

  it("ends a batch's line at once when it holds `batch` spans", function()
    local call = bare_call
    local file = os.tmpname()
    local tracer = assert(luagent.default_runtime():trace { file = file, batch = 4 }) -- two calls: a chat span and an attempt each
    call(1)
    call(2)
    local first = slurp(file) -- whole already: no timer, no stop
    call(3)
    tracer:stop()
    local lines = {}
    for line in slurp(file):gmatch("[^\n]+") do lines[#lines + 1] = line end
    os.remove(file)
    assert.equal(lines[1] .. "\n", first)
    assert.equal(2, #lines)
    assert.equal(4, #cjson.decode(lines[1]).resourceSpans[1].scopeSpans[1].spans)
    assert.equal(2, #cjson.decode(lines[2]).resourceSpans[1].scopeSpans[1].spans)
  end)

  it("takes its file lines' bound from the runtime's otlp_batch setting (OTEL_BSP_MAX_EXPORT_BATCH_SIZE)", function()
    local rt = luagent.runtime { otlp_batch = 2, log_sink = function() end }
    local file = os.tmpname()
    local tracer = assert(rt:trace { file = file })
    for id = 1, 3 do
      rt.bus:publish { type = "message_start", call = id, id = "r" .. id, model = "m" }
      rt.bus:publish { type = "message_end", call = id, final = true, attempts = 1, stop_reason = "stop",
        request_model = "m", provider_kind = "openai", status = 200 }
    end
    tracer:stop()
    rt:close()
    local counts = {}
    for line in slurp(file):gmatch("[^\n]+") do
      counts[#counts + 1] = #cjson.decode(line).resourceSpans[1].scopeSpans[1].spans
    end
    os.remove(file)
    assert.same({ 2, 2, 2 }, counts) -- a call's two spans a line, where 512 would hold them all
  end)

  it("turns finished traces into text render_batch at a time, in the order they ended", function()
    local file = os.tmpname()
    local tracer = assert(luagent.default_runtime():trace { file = file, tree = true })
    for id = 1, 2 * trace.RENDER_BATCH + 5 do bare_call(id) end
    local tree = stop_with_tree(tracer)
    local lines = {}
    for line in slurp(file):gmatch("[^\n]+") do lines[#lines + 1] = line end
    os.remove(file)
    assert.equal(1, #lines)
    local spans = cjson.decode(lines[1]).resourceSpans[1].scopeSpans[1].spans
    assert.equal(2 * (2 * trace.RENDER_BATCH + 5), #spans)
    for i = 1, #spans, 2 do
      local chat, attempt = spans[i], spans[i + 1]
      assert.equal("chat m", chat.name)
      assert.equal(chat.spanId, attempt.parentSpanId)
      for _, kv in ipairs(chat.attributes) do
        if kv.key == "luagent.call" then assert.equal(tostring((i + 1) // 2), kv.value.intValue) end
      end
    end
    assert.equal(#spans, #tree)
  end)

  it("writes what rendered before a batch that fails at the end, and closes the file", function()
    local file = os.tmpname()
    local tracer = assert(luagent.default_runtime():trace {})
    local sink, close = tracer:file_exporter(file, { render_batch = 2 })
    local good = { trace_id = string.rep("a", 32), span_id = string.rep("b", 16), name = "fine", kind = 1,
      start = 1, stop = 2, status = 0, attrs = {}, nattrs = 0 }
    sink(good)
    sink(good) -- a batch: rendered at once
    sink({ name = "no span" }) -- waits, fails at the end
    assert.has_error(close)
    tracer:stop()
    local lines = {}
    for line in slurp(file):gmatch("[^\n]+") do lines[#lines + 1] = line end
    os.remove(file)
    assert.equal(1, #lines)
    assert.equal("fine", cjson.decode(lines[1]).resourceSpans[1].scopeSpans[1].spans[1].name)
  end)

  it("drops a batch that fails to turn into text, and goes on with the next", function()
    local file = os.tmpname()
    local tracer = assert(luagent.default_runtime():trace {})
    local sink, close = tracer:file_exporter(file, { render_batch = 1 })
    local ok, err = pcall(sink, { name = "no span" })
    assert.is_false(ok)
    assert.matches("not a span", tostring(err))
    local s = { trace_id = string.rep("a", 32), span_id = string.rep("b", 16), name = "fine", kind = 1,
      start = 1, stop = 2, status = 0, attrs = {}, nattrs = 0 }
    sink(s)
    close()
    tracer:stop()
    local lines = {}
    for line in slurp(file):gmatch("[^\n]+") do lines[#lines + 1] = line end
    os.remove(file)
    assert.equal(1, #lines)
    local spans = cjson.decode(lines[1]).resourceSpans[1].scopeSpans[1].spans
    assert.equal(1, #spans)
    assert.equal("fine", spans[1].name)
  end)

  it("leaves an attempt a refused retry ended as provider_retry wrote it (each attribute once)", function()
    local events = require("luagent").events
    local file = os.tmpname()
    local tracer = assert(luagent.default_runtime():trace { file = file })
    local usage = { input_tokens = 3, output_tokens = 1, cache_read_tokens = 0, cache_write_tokens = 0 }
    events.publish { type = "message_start", call = 7, id = "r7", model = "m" }
    events.publish { type = "provider_retry", call = 7, attempt = 1, max_attempts = 3, status = 503,
      class = "overloaded", delay_ms = 500, source = "backoff", usage = usage, error = "HTTP 503" }
    -- the retry is refused before a second attempt starts: the final event names attempt 1
    events.publish { type = "message_end", call = 7, final = true, attempts = 1, stop_reason = "error",
      status = 503, usage = usage, request_model = "m", provider_kind = "openai",
      error = { kind = "budget_exhausted", message = "the endpoint's retry budget is exhausted" } }
    tracer:stop()
    local spans = cjson.decode(slurp(file):match("^[^\n]+")).resourceSpans[1].scopeSpans[1].spans
    os.remove(file)
    local attempt
    for _, sp in ipairs(spans) do if sp.name == "attempt 1" then attempt = sp end end
    local seen = {}
    for _, kv in ipairs(attempt.attributes) do
      assert.is_nil(seen[kv.key], "attribute " .. kv.key .. " written twice")
      seen[kv.key] = kv.value
    end
    assert.same({ stringValue = "overloaded" }, seen["error.type"])
    assert.same({ intValue = "503" }, seen["http.response.status_code"])
  end)

  it("prints a tool call that ran once, fine, as one line; one that failed, with its attempts", function()
    local tracer = assert(luagent.default_runtime():trace { tree = true })
    local function tool(id, err)
      events.publish { type = "tool_execution_start", agent = "a", agent_id = "a#1", call_id = id, name = "look" }
      events.publish { type = "tool_execution_end", agent = "a", agent_id = "a#1", call_id = id, name = "look",
        attempts = 1, error = err }
    end
    tool("c1")
    tool("c2", { kind = "tool_error", message = "no such record" })
    local lines = stop_with_tree(tracer)
    assert.equal(3, #lines)
    assert.matches("^execute_tool look %S+$", lines[1])
    assert.matches("^execute_tool look %S+  error: tool_error$", lines[2])
    assert.matches("^  attempt 1 %S+  no such record, failed$", lines[3])
  end)

  it("prints names, models and messages from models, tools and servers escaped for the terminal", function()
    local hostile = "\27]0;pwned\7\27[2J\u{9b}H\r\n\u{202e}\xff"
    local tracer = assert(luagent.default_runtime():trace { tree = true })
    events.publish { type = "agent_start", agent = "a" .. hostile, agent_id = "a#1" }
    events.publish { type = "message_start", call = 1, agent_id = "a#1", id = "r1", model = "m" .. hostile }
    events.publish { type = "message_end", call = 1, agent_id = "a#1", final = true, attempts = 1, stop_reason = "error",
      request_model = "m" .. hostile, provider_kind = "openai", error = { kind = "protocol", message = "bad " .. hostile } }
    events.publish { type = "tool_execution_start", agent = "a", agent_id = "a#1", call_id = "c1", name = "look" .. hostile }
    events.publish { type = "tool_execution_end", agent = "a", agent_id = "a#1", call_id = "c1", name = "look" .. hostile,
      attempts = 1, error = { kind = "tool_error" .. hostile, message = "no such record " .. hostile } }
    events.publish { type = "agent_end", agent = "a" .. hostile, agent_id = "a#1", stop_reason = "stop", turns = 1 }
    local lines = stop_with_tree(tracer)
    assert.equal(5, #lines, table.concat(lines, "\n"))
    for _, l in ipairs(lines) do
      assert.is_nil(l:find("[%c\127]"), l)
      assert.is_nil(l:find("\u{9b}", 1, true), l)
      assert.is_nil(l:find("\u{202e}", 1, true), l)
    end
    local esc = "\\u{1b}%]0;pwned\\u{07}\\u{1b}%[2J\\u{9b}H\\r\\n\\u{202e}\\xff"
    assert.matches("^invoke_agent a" .. esc .. " ", lines[1])
    -- the call and the tool started at the same (virtual) time: in either order
    local text = table.concat(lines, "\n", 2)
    assert.matches("\n?  chat m" .. esc .. " %S+  error: protocol\n    attempt 1 %S+  bad " .. esc .. ", failed", text)
    assert.matches("\n?  execute_tool look" .. esc .. " %S+  error: tool_error" .. esc
      .. "\n    attempt 1 %S+  no such record " .. esc .. ", failed", text)
  end)

  it("prints the tree from memory when there is no temporary file, a line per span", function()
    local tmpfile = io.tmpfile
    io.tmpfile = function() return nil end
    local rt = luagent.default_runtime()
    local ok, tracer = pcall(rt.trace, rt, { tree = true })
    io.tmpfile = tmpfile
    assert(ok, tracer)
    for id = 1, 2 do bare_call(id) end
    local lines = stop_with_tree(tracer)
    assert.equal(4, #lines)
    assert.matches("^chat m ", lines[1])
    assert.matches("^  attempt 1 .*HTTP 200$", lines[2])
    assert.matches("^chat m ", lines[3])
    assert.matches("^  attempt 1 .*HTTP 200$", lines[4])
  end)

  it("prints the tree with durations, the failed attempts and their waits", function()
    local tracer = assert(luagent.default_runtime():trace { tree = true })
    local srv = assert(mock.start { faults = "503@1", seed = 1, script = script })
    local a = luagent.agent { name = "triage", tools = { lookup_tool() },
      policy = { backoff = { strategy = "fixed", base = 0.5 }, tool = { backoff = { strategy = "fixed", base = 0.25 } } },
      model = { kind = "openai", model = "gpt-4o-mini", base_url = srv.url .. "/v1", api_key = "k" } }
    a:run("go")
    srv:close()
    local out = {}
    tracer:stop { write = function(_, ...) for _, s in ipairs({ ... }) do out[#out + 1] = s end end }
    local text = table.concat(out)
    local lines = {}
    for l in text:gmatch("[^\n]+") do lines[#lines + 1] = l end
    assert.matches("^invoke_agent triage [%d.]+m?s$", lines[1])
    assert.matches("^  chat gpt%-4o%-mini ", lines[2])
    assert.matches("^    attempt 1 %S+  HTTP 503, retried after 500%.0ms$", lines[3])
    assert.matches("^    attempt 2 %S+  HTTP 200$", lines[4])
    assert.matches("^  execute_tool lookup ", lines[5])
    assert.matches("^    attempt 1 %S+  reset: connection reset by the lookup service, retried after 250%.0ms$", lines[6])
    assert.matches("^    attempt 2 ", lines[7])
    assert.matches("^  chat gpt%-4o%-mini ", lines[8])
    assert.equal(9, #lines)
  end)
end)

describe("luagent run --otlp FILE", function()
  it("writes the last batch and the cost table when the script ends with os.exit", function()
    local helpers = require "spec.support.helpers"
    local file = os.tmpname()
    local script = helpers.tempfile([[
      local luagent = require "luagent"
      assert(luagent.complete { model = "openai/gpt-4o-mini", messages = { { role = "user", content = "hi" } } })
      os.exit(3)
    ]], ".lua")
    local r = helpers.run("run", "--mock", "--log", "off", "--otlp", file, "--cost", script)
    local text = slurp(file)
    os.remove(file)
    os.remove(script)
    assert.equal(3, r.code)
    local spans = cjson.decode(text:match("^[^\n]+")).resourceSpans[1].scopeSpans[1].spans
    assert.equal("chat gpt-4o-mini", spans[1].name)
    assert.matches("costliest turns", r.stderr)
  end)
end)

describe("an OTLP file that cannot be written", function()
  local helpers = require "spec.support.helpers"

  it("is reported once (a full disk: /dev/full), the run goes on and exits 74", function()
    local script = helpers.tempfile([[
      local luagent = require "luagent"
      for _ = 1, 3 do
        assert(luagent.complete { model = "openai/gpt-4o-mini", messages = { { role = "user", content = "hi" } } })
      end
      print("done")
    ]], ".lua")
    local r = helpers.run("run", "--mock", "--otlp", "/dev/full", "--cost", script)
    os.remove(script)
    assert.equal(74, r.code, r.stderr)
    assert.matches("done", r.stdout)
    assert.matches("costliest turns", r.stderr) -- the other outputs are still written
    local _, n = r.stderr:gsub("cannot write to '/dev/full': No space left on device", "")
    assert.equal(1, n, r.stderr)
  end)

  it("makes tracer:stop answer nil and the message; later spans are not written", function()
    local logged = {}
    local saved = luagent.configure { log_sink = function(_, line) logged[#logged + 1] = line end, log_level = "warn" }
    -- each text goes out at once: the first trace meets the full disk
    local tracer = assert(luagent.default_runtime():trace { file = "/dev/full", file_chunk = 1 })
    for id = 1, 3 do bare_call(id) end
    local ok, err = tracer:stop()
    luagent.configure(saved)
    assert.is_nil(ok)
    assert.matches("^cannot write to '/dev/full': No space left on device", err)
    local n = 0
    for _, l in ipairs(logged) do if l:find("/dev/full", 1, true) then n = n + 1 end end
    assert.equal(1, n, table.concat(logged, "\n"))
  end)
end)

describe("trace and span ids (core.random_id)", function()
  local core = require "luagent.core"

  it("are 16 or 32 lowercase hex digits, never all zeros, and do not repeat", function()
    local seen = {}
    for _ = 1, 20000 do
      for _, n in ipairs({ 16, 32 }) do
        local id = core.random_id(n)
        assert.equal(n, #id)
        assert.truthy(id:match("^[0-9a-f]+$"))
        assert.falsy(id:match("^0+$"))
        assert.is_nil(seen[id])
        seen[id] = true
      end
    end
    assert.has_error(function() core.random_id(8) end)
  end)

  it("differ between runs of a script that seeds math.random with a constant", function()
    local helpers = require "spec.support.helpers"
    local script = helpers.tempfile([[
      math.randomseed(42)
      print(require("luagent.observe.trace").hex_id(32))
    ]], ".lua")
    local a = helpers.run("run", script)
    local b = helpers.run("run", script)
    os.remove(script)
    assert.equal(0, a.code)
    assert.matches("^%x+\n$", a.stdout)
    assert.not_equal(a.stdout, b.stdout)
  end)
end)

local h = require "spec.support.helpers"

describe("trace, with the cost meter", function()
  -- the cost meter adds agent_end.cost before any other consumer sees the
  -- event, whichever started first (--max-cost starts the meter when the
  -- runtime is made, before the tracer)
  for _, flags in ipairs({ { "--max-cost", "100" }, { "--cost" } }) do
    it("gives the agent's span its cost with " .. flags[1], function()
      local otlp = os.tmpname()
      local args = { "run", "--mock", "--otlp", otlp }
      for _, f in ipairs(flags) do args[#args + 1] = f end
      args[#args + 1] = h.tempfile([[
          local luagent = require "luagent"
          local a = luagent.agent { name = "priced", model = "openai/gpt-4o-mini" }
          assert(a:run("hello").stop_reason == "stop")
        ]], ".lua")
      local r = h.run_env({ within = 60 }, table.unpack(args))
      local text = h.slurp(otlp)
      os.remove(otlp)
      assert.equal(0, r.code, r.stderr)
      assert.matches('"key":"luagent.cost","value":{"doubleValue":', text, 1, true)
    end)
  end
end)
