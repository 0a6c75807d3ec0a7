-- What the mock provider answers, checked without sockets: the JSON
-- encoder, the canned replies in the three wire formats (streamed and not),
-- provider-shaped errors, stream faults, the HTTP request parser and the
-- response plans of mock.handle.
local cjson = require "cjson"
local replies = require "luagent.mock.replies"
local faults = require "luagent.mock.faults"
local mock = require "luagent.mock"

------------------------------------------------------------------------------
-- Helpers
------------------------------------------------------------------------------

local NOW = 1700000000

-- Parses SSE text into {{event=, data=}...} (event nil when absent).
local function parse_sse(text)
  local events = {}
  for block in text:gmatch("(.-)\n\n") do
    local e, data = {}, {}
    for line in (block .. "\n"):gmatch("(.-)\n") do
      local k, v = line:match("^(%w+): ?(.*)$")
      if k == "event" then e.event = v elseif k == "data" then data[#data + 1] = v end
    end
    e.data = table.concat(data, "\n")
    events[#events + 1] = e
  end
  return events
end

-- Removes chunked framing; also whether the terminating chunk was there.
local function dechunk(s)
  local out, pos = {}, 1
  while true do
    local size, from = s:match("^(%x+)\r\n()", pos)
    if not size then return table.concat(out), false end
    size = tonumber(size, 16)
    if size == 0 then return table.concat(out), s:sub(from) == "\r\n" end
    out[#out + 1] = s:sub(from, from + size - 1)
    if #s < from + size + 1 then return table.concat(out), false end
    pos = from + size + 2
  end
end

-- What a client receives from a plan: {status=, headers=, body=<unframed>,
-- complete=<framing finished>, steps=<kinds of the plan's steps>}.
local function receive(plan)
  local raw, steps = {}, {}
  for _, s in ipairs(plan) do
    if s.write then raw[#raw + 1] = s.write end
    steps[#steps + 1] = s.write and "write" or s.sleep and "sleep" or s.reset and "reset" or "close"
  end
  raw = table.concat(raw)
  local head, body = raw:match("^(.-\r\n)\r\n(.*)$")
  if not head then return { steps = steps, raw = raw } end
  local r = { status = tonumber(head:match("^HTTP/1%.1 (%d+) ")), headers = {}, steps = steps }
  for k, v in head:gmatch("\n([^:\r\n]+): ([^\r\n]*)") do r.headers[k:lower()] = v end
  if r.headers["transfer-encoding"] == "chunked" then
    r.body, r.complete = dechunk(body)
  else
    r.body = body
    r.complete = #body == tonumber(r.headers["content-length"])
  end
  return r
end

-- A parsed POST of `body` (a table, sent as JSON, or text) to `path`.
local function request(path, body, extra)
  body = type(body) == "table" and cjson.encode(body) or body
  local raw = "POST " .. path .. " HTTP/1.1\r\nHost: mock\r\n" .. (extra or "")
    .. "Content-Length: " .. #body .. "\r\n\r\n" .. body
  local status, req, rest = mock.parse_request(raw)
  assert.equal("ok", status)
  assert.equal("", rest)
  return req
end

-- The endpoint and a request body for a conversation ending in `text`.
local bodies = {
  openai = function(text, extra)
    local b = { model = "gpt-4o", messages = { { role = "system", content = "be brief" },
      { role = "user", content = text } } }
    for k, v in pairs(extra or {}) do b[k] = v end
    return "/v1/chat/completions", b
  end,
  anthropic = function(text, extra)
    local b = { model = "claude-x", max_tokens = 100, system = "be brief",
      messages = { { role = "user", content = { { type = "text", text = text } } } } }
    for k, v in pairs(extra or {}) do b[k] = v end
    return "/v1/messages", b
  end,
  responses = function(text, extra)
    local b = { model = "gpt-4o", input = { { role = "user", content = text } } }
    for k, v in pairs(extra or {}) do b[k] = v end
    return "/v1/responses", b
  end,
}
bodies.openrouter = function(text, extra)
  local _, b = bodies.openai(text, extra)
  return "/api/v1/chat/completions", b
end

-- Tools in each format: get_weather(city: string required, days: integer).
local schema = { type = "object", required = { "city" },
  properties = { city = { type = "string" }, days = { type = "integer" } } }
local tools = {
  openai = { { type = "function", ["function"] = { name = "get_weather", parameters = schema } } },
  anthropic = { { name = "get_weather", input_schema = schema } },
  responses = { { type = "function", name = "get_weather", parameters = schema } },
}
tools.openrouter = tools.openai

-- The state handle() works on, with a fixed clock.
local function state(opts)
  opts = opts or {}
  opts.now = function() return NOW end
  return assert(mock.state(opts))
end

-- Sends one request through handle() and returns what the client receives.
local function exchange(st, format, text, extra, headers)
  local path, body = bodies[format](text, extra)
  return receive(mock.handle(st, request(path, body, headers)))
end

-- The decoded data of each event, and the events.
local function decoded(r)
  local events = parse_sse(r.body)
  local out = {}
  for i, e in ipairs(events) do
    out[i] = e.data == "[DONE]" and "[DONE]" or assert(cjson.decode(e.data))
  end
  return out, events
end

-- The text a stream carries, concatenated from its deltas, per format.
local function streamed_text(format, datas)
  local parts = {}
  for _, d in ipairs(datas) do
    if format == "anthropic" then
      if d.type == "content_block_delta" then
        parts[#parts + 1] = d.delta.text or d.delta.partial_json
      end
    elseif format == "responses" then
      if d.type == "response.output_text.delta"
        or d.type == "response.function_call_arguments.delta" then
        parts[#parts + 1] = d.delta
      end
    elseif type(d) == "table" and d.choices and d.choices[1] then
      local delta = d.choices[1].delta
      if type(delta.content) == "string" then parts[#parts + 1] = delta.content end
      if delta.tool_calls then parts[#parts + 1] = delta.tool_calls[1]["function"].arguments end
    end
  end
  return table.concat(parts)
end

------------------------------------------------------------------------------
-- JSON
------------------------------------------------------------------------------

describe("replies.encode", function()
  it("keeps the order of objects made with replies.object", function()
    assert.equal('{"z":1,"a":"x","m":null}',
      replies.encode(replies.object("z", 1, "a", "x", "skipped", nil, "m", replies.null)))
  end)

  it("tells arrays from objects, empty ones included", function()
    assert.equal('{"a":[],"o":{},"l":[1,2,"3"]}', replies.encode(replies.object(
      "a", replies.array(), "o", replies.object(), "l", { 1, 2, "3" })))
    assert.equal("{}", replies.encode({}))
  end)

  it("sorts the keys of plain tables", function()
    assert.equal('{"a":true,"b":{"c":false,"d":1.5}}',
      replies.encode({ b = { d = 1.5, c = false }, a = true }))
  end)

  it("escapes what JSON needs and leaves UTF-8 alone", function()
    assert.equal([["q\"b\\s/\n\t\u0001é"]], replies.encode('q"b\\s/\n\t\1é'))
    assert.equal("caf\195\169", cjson.decode(replies.encode("caf\195\169")))
  end)

  it("writes integral floats without a fraction and keeps others exact", function()
    assert.equal("[1024,0.1,3,-2.5]", replies.encode({ 1024.0, 0.1, 3, -2.5 }))
    assert.equal(1 / 3, cjson.decode(replies.encode({ 1 / 3 }))[1])
  end)

  it("raises for what JSON cannot hold", function()
    assert.has_error(function() replies.encode({ f = print }) end)
    assert.has_error(function() replies.encode(0 / 0) end)
  end)
end)

------------------------------------------------------------------------------
-- Reading requests and choosing content
------------------------------------------------------------------------------

describe("replies.view and replies.content", function()
  it("finds the last user text in every format", function()
    for format, make in pairs(bodies) do
      local _, body = make("what now?", { stream = true })
      local v = replies.view(replies.formats[(make("x"))], body, cjson.encode(body))
      assert.equal("what now?", v.last_text, format)
      assert.is_true(v.stream, format)
      assert.is_false(v.last_is_tool_result, format)
      assert.same({ text = "what now?" }, replies.content(v, nil, 1), format)
    end
  end)

  it("calls the first tool when tools are offered", function()
    for format, make in pairs(bodies) do
      local path, body = make("weather in Paris?", { tools = tools[format] })
      local v = replies.view(replies.formats[path], body)
      local c = replies.content(v, nil, 4)
      assert.equal("get_weather", c.tool.name, format)
      assert.equal("4", c.tool.id)
      assert.same({ city = "weather in Paris?" }, c.tool.arguments, format)
    end
  end)

  it("echoes the tool result when the last message is one", function()
    local cases = {
      openai = { { role = "user", content = "hi" },
        { role = "assistant", content = cjson.null, tool_calls = { { id = "c1", type = "function",
          ["function"] = { name = "get_weather", arguments = "{}" } } } },
        { role = "tool", tool_call_id = "c1", content = "sunny" } },
      anthropic = { { role = "user", content = "hi" },
        { role = "assistant", content = { { type = "tool_use", id = "t1", name = "get_weather",
          input = {} } } },
        { role = "user", content = { { type = "tool_result", tool_use_id = "t1",
          content = { { type = "text", text = "sunny" } } } } } },
      responses = { { role = "user", content = "hi" },
        { type = "function_call", call_id = "c1", name = "get_weather", arguments = "{}" },
        { type = "function_call_output", call_id = "c1", output = "sunny" } },
    }
    for format, items in pairs(cases) do
      local body = { model = "m", tools = tools[format] }
      body[format == "responses" and "input" or "messages"] = items
      local v = replies.view(format, body)
      assert.is_true(v.last_is_tool_result, format)
      assert.equal("hi", v.user_text, format)
      assert.same({ text = "sunny" }, replies.content(v, nil, 1), format)
    end
  end)

  it("says something canned when there is nothing to echo", function()
    local v = replies.view("openai", { model = "m", messages = {} })
    assert.same({ text = replies.default_text }, replies.content(v, nil, 1))
  end)

  it("makes empty and leaked-markup replies for those faults", function()
    local v = replies.view("anthropic", { model = "m", tools = tools.anthropic,
      messages = { { role = "user", content = "Paris" } } })
    assert.same({ text = "" }, replies.content(v, faults.parse("empty")[1], 1))
    local leak = replies.content(v, faults.parse("leak")[1], 1).text
    assert.equal('<tool_call>{"name":"get_weather","arguments":{"city":"Paris"}}</tool_call>', leak)
  end)

  it("splits text into words with their spaces", function()
    assert.same({ "Hello", " big", "  world ", }, replies.words("Hello big  world "))
    assert.same({}, replies.words(""))
  end)
end)

------------------------------------------------------------------------------
-- Streams
------------------------------------------------------------------------------

describe("streamed replies", function()
  it("follow the OpenAI chat chunk sequence, with usage when asked", function()
    for _, format in ipairs({ "openai", "openrouter" }) do
      local r = exchange(state(), format, "hello there",
        { stream = true, stream_options = { include_usage = true } })
      assert.equal(200, r.status)
      assert.equal("text/event-stream; charset=utf-8", r.headers["content-type"])
      assert.is_true(r.complete)
      local d, events = decoded(r)
      assert.equal(6, #d)
      for _, e in ipairs(events) do assert.is_nil(e.event) end
      assert.same({ role = "assistant", content = "", refusal = cjson.null }, d[1].choices[1].delta)
      assert.equal("chat.completion.chunk", d[1].object)
      assert.equal("chatcmpl-mock1", d[1].id)
      assert.equal(NOW, d[1].created)
      assert.equal("gpt-4o", d[1].model)
      assert.equal("hello there", streamed_text(format, d))
      assert.equal("stop", d[4].choices[1].finish_reason)
      assert.same({}, d[5].choices)
      assert.same({ "completion_tokens", "prompt_tokens", "total_tokens" },
        (function() local k = {} for n in pairs(d[5].usage) do k[#k + 1] = n end
          table.sort(k) return k end)())
      assert.equal(2, d[5].usage.completion_tokens)
      assert.equal(d[5].usage.prompt_tokens + 2, d[5].usage.total_tokens)
      assert.equal("[DONE]", d[6])
    end
  end)

  it("leave usage out of OpenAI chunks unless asked", function()
    local d = decoded(exchange(state(), "openai", "hi", { stream = true }))
    assert.equal(4, #d)
    assert.is_nil(d[1].usage)
    assert.equal("[DONE]", d[4])
  end)

  it("follow the Anthropic event sequence", function()
    local d, events = decoded(exchange(state(), "anthropic", "hello there", { stream = true }))
    local types = {}
    for i, x in ipairs(d) do
      types[i] = x.type
      assert.equal(x.type, events[i].event)
    end
    assert.same({ "message_start", "content_block_start", "ping", "content_block_delta",
      "content_block_delta", "content_block_stop", "message_delta", "message_stop" }, types)
    assert.equal("msg_mock1", d[1].message.id)
    assert.equal("claude-x", d[1].message.model)
    assert.same({}, d[1].message.content)
    assert.equal("hello there", streamed_text("anthropic", d))
    assert.equal("end_turn", d[7].delta.stop_reason)
    assert.equal(2, d[7].usage.output_tokens)
    assert.is_true(d[1].message.usage.input_tokens > 0)
  end)

  it("follow the Responses event sequence with sequence numbers", function()
    local d, events = decoded(exchange(state(), "responses", "hello there", { stream = true }))
    local types = {}
    for i, x in ipairs(d) do
      types[i] = x.type
      assert.equal(x.type, events[i].event)
      assert.equal(i - 1, x.sequence_number)
    end
    assert.same({ "response.created", "response.in_progress", "response.output_item.added",
      "response.content_part.added", "response.output_text.delta", "response.output_text.delta",
      "response.output_text.done", "response.content_part.done", "response.output_item.done",
      "response.completed" }, types)
    assert.equal("hello there", streamed_text("responses", d))
    assert.equal("hello there", d[7].text)
    local done = d[10].response
    assert.equal("completed", done.status)
    assert.equal("hello there", done.output[1].content[1].text)
    assert.equal(2, done.usage.output_tokens)
    assert.equal(done.usage.input_tokens + 2, done.usage.total_tokens)
  end)

  it("stream tool calls whose argument deltas make the arguments", function()
    local finish = { openai = "tool_calls", openrouter = "tool_calls", anthropic = "tool_use" }
    for format in pairs(bodies) do
      local d = decoded(exchange(state(), format, "Paris", { stream = true, tools = tools[format] }))
      assert.same({ city = "Paris" }, cjson.decode(streamed_text(format, d)), format)
      if format == "anthropic" then
        assert.same({ type = "tool_use", id = "toolu_mock1", name = "get_weather", input = {} },
          d[2].content_block)
        assert.equal("tool_use", d[#d - 1].delta.stop_reason)
      elseif format == "responses" then
        local item = d[#d].response.output[1]
        assert.equal("function_call", item.type)
        assert.equal("call_mock1", item.call_id)
        assert.same({ city = "Paris" }, cjson.decode(item.arguments))
      else
        local call = d[2].choices[1].delta.tool_calls[1]
        assert.equal("call_mock1", call.id)
        assert.equal("get_weather", call["function"].name)
        assert.equal(finish[format], d[#d - 1].choices[1].finish_reason)
      end
    end
  end)

  it("have the phases the stream faults rely on", function()
    local want = {
      openai = "open delta delta finish end",
      anthropic = "open open open delta delta close finish end",
      responses = "open open open open delta delta close close close end",
    }
    for format, phases in pairs(want) do
      local r = exchange(state(), format, "a b", { stream = true })
      local got = {}
      for i, e in ipairs(parse_sse(r.body)) do got[i] = replies.phase(e) end
      assert.equal(phases, table.concat(got, " "), format)
    end
  end)
end)

describe("stream:false replies", function()
  it("are one JSON document in each format", function()
    local r = exchange(state(), "openai", "hello there")
    assert.equal("application/json", r.headers["content-type"])
    local j = cjson.decode(r.body)
    assert.equal("chat.completion", j.object)
    assert.equal("hello there", j.choices[1].message.content)
    assert.equal("stop", j.choices[1].finish_reason)
    assert.equal(2, j.usage.completion_tokens)

    j = cjson.decode(exchange(state(), "anthropic", "hello there").body)
    assert.equal("message", j.type)
    assert.same({ { type = "text", text = "hello there" } }, j.content)
    assert.equal("end_turn", j.stop_reason)

    j = cjson.decode(exchange(state(), "responses", "hello there").body)
    assert.equal("response", j.object)
    assert.equal("completed", j.status)
    assert.equal("hello there", j.output[1].content[1].text)
  end)

  it("carry tool calls in each format", function()
    local j = cjson.decode(exchange(state(), "openai", "Paris", { tools = tools.openai }).body)
    assert.equal("tool_calls", j.choices[1].finish_reason)
    assert.same({ city = "Paris" }, cjson.decode(j.choices[1].message.tool_calls[1]["function"].arguments))
    j = cjson.decode(exchange(state(), "anthropic", "Paris", { tools = tools.anthropic }).body)
    assert.same({ type = "tool_use", id = "toolu_mock1", name = "get_weather",
      input = { city = "Paris" } }, j.content[1])
    j = cjson.decode(exchange(state(), "responses", "Paris", { tools = tools.responses }).body)
    assert.equal("get_weather", j.output[1].name)
  end)
end)

------------------------------------------------------------------------------
-- Faults on the wire
------------------------------------------------------------------------------

describe("status faults", function()
  it("answer in the provider's error shape", function()
    local r = exchange(state { faults = "529" }, "anthropic", "hi", { stream = true })
    assert.equal(529, r.status)
    assert.equal("application/json", r.headers["content-type"])
    assert.same({ type = "error", error = { type = "overloaded_error", message = "Overloaded" },
      request_id = "req_mock1" }, cjson.decode(r.body))
    r = exchange(state { faults = "429" }, "openai", "hi", { stream = true })
    local e = cjson.decode(r.body).error
    assert.equal("rate_limit_exceeded", e.code)
    assert.equal("requests", e.type)
    r = exchange(state { faults = "503" }, "openrouter", "hi")
    e = cjson.decode(r.body).error
    assert.equal(503, e.code)
  end)

  it("put context overflow in each provider's words", function()
    local j = cjson.decode(exchange(state { faults = "400:overflow" }, "anthropic", "hi").body)
    assert.equal("invalid_request_error", j.error.type)
    assert.equal("prompt is too long: 210000 tokens > 200000 maximum", j.error.message)
    j = cjson.decode(exchange(state { faults = "400:overflow" }, "openai", "hi").body)
    assert.equal("context_length_exceeded", j.error.code)
    assert.matches("maximum context length", j.error.message)
    j = cjson.decode(exchange(state { faults = "400:overflow" }, "responses", "hi").body)
    assert.equal("context_length_exceeded", j.error.code)
  end)

  it("tell OpenRouter's in-flight 402 from a plain one", function()
    local j = cjson.decode(exchange(state { faults = "402:in-flight" }, "openrouter", "hi").body)
    assert.equal(402, j.error.code)
    assert.equal("openrouter_in_flight_budget", j.error.metadata.limit_source)
    j = cjson.decode(exchange(state { faults = "402" }, "openrouter", "hi").body)
    assert.equal(402, j.error.code)
    assert.is_nil(j.error.metadata)
    assert.matches("Insufficient credits", j.error.message)
  end)

  it("send the retry headers they are given", function()
    local r = exchange(state { faults = "429:retry-after=2:retry-after-ms=1500:x-should-retry=true" },
      "openai", "hi")
    assert.equal(429, r.status)
    assert.equal("2", r.headers["retry-after"])
    assert.equal("1500", r.headers["retry-after-ms"])
    assert.equal("true", r.headers["x-should-retry"])
    r = exchange(state { faults = "503:retry-after=0.5" }, "openai", "hi")
    assert.equal("0.5", r.headers["retry-after"])
    r = exchange(state { faults = "429:retry-after-date=+5" }, "openai", "hi")
    assert.equal(os.date("!%a, %d %b %Y %H:%M:%S GMT", NOW + 5), r.headers["retry-after"])
    r = exchange(state { faults = "500:x-should-retry=false" }, "anthropic", "hi")
    assert.equal("false", r.headers["x-should-retry"])
  end)

  it("apply only to the requests in their scope", function()
    local st = state { faults = "503@1,500@3" }
    local got = {}
    for i = 1, 4 do got[i] = exchange(st, "openai", "hi").status end
    assert.same({ 503, 200, 500, 200 }, got)
  end)
end)

describe("connection faults", function()
  it("close closes before any response", function()
    local path, body = bodies.openai("hi")
    assert.same({ { close = true } }, mock.handle(state { faults = "close" }, request(path, body)))
  end)

  it("reset sends exactly the headers and N body bytes, then an RST", function()
    for _, n in ipairs({ 0, 1, 200, 100000 }) do
      local r = exchange(state { faults = "reset:bytes=" .. n }, "openai", "hello there",
        { stream = true })
      local full = exchange(state(), "openai", "hello there", { stream = true })
      assert.equal(200, r.status)
      assert.equal(math.min(n, #full.body), #r.body)
      assert.equal(full.body:sub(1, n), r.body)
      assert.is_false(r.complete)
      assert.equal("reset", r.steps[#r.steps])
    end
  end)

  it("reset cuts a JSON body too", function()
    local r = exchange(state { faults = "reset:bytes=10" }, "anthropic", "hi")
    assert.equal(10, #r.body)
    assert.equal("reset", r.steps[#r.steps])
  end)

  it("stall waits before the headers", function()
    local path, body = bodies.openai("hi")
    local plan = mock.handle(state { faults = "stall:secs=30" }, request(path, body))
    assert.same({ sleep = 30 }, plan[1])
    assert.matches("^HTTP/1%.1 200", plan[2].write)
  end)

  it("stall:after waits after N body bytes, then finishes the reply", function()
    local full = exchange(state(), "anthropic", "hello there", { stream = true }).body
    local first_event = #full:match("^.-\n\n")
    -- Inside an event, at an event's end, and past the end of the body.
    for _, n in ipairs({ 50, first_event, #full + 10 }) do
      local path, body = bodies.anthropic("hello there", { stream = true })
      local plan = mock.handle(state { faults = "stall:secs=7:after=" .. n }, request(path, body))
      local stalls = 0
      for i, s in ipairs(plan) do
        if s.sleep then
          stalls = stalls + 1
          assert.equal(7, s.sleep)
          local r = receive({ table.unpack(plan, 1, i - 1) })
          assert.equal(math.min(n, #full), #r.body)
          assert.is_false(r.complete)
        end
      end
      assert.equal(1, stalls)
      local r = receive(plan)
      assert.is_true(r.complete)
      assert.equal(full, r.body)
    end
  end)
end)

describe("stream faults", function()
  it("cut ends after the deltas with no finish reason nor terminator", function()
    for format in pairs(bodies) do
      local r = exchange(state { faults = "cut" }, format, "hello there", { stream = true })
      assert.is_true(r.complete, format)
      local phases = {}
      for _, e in ipairs(parse_sse(r.body)) do phases[replies.phase(e)] = true end
      assert.is_true(phases.delta, format)
      assert.is_nil(phases.finish, format)
      assert.is_nil(phases["end"], format)
      assert.equal("hello there", streamed_text(format, (decoded(r))), format)
    end
  end)

  it("cut:finished keeps the finish reason and drops only the terminator", function()
    local last = { openai = "stop", anthropic = "message_delta",
      responses = "response.output_item.done" }
    for format, want in pairs(last) do
      local full = parse_sse(exchange(state(), format, "a b", { stream = true }).body)
      local r = exchange(state { faults = "cut:finished" }, format, "a b", { stream = true })
      local events = parse_sse(r.body)
      assert.equal(#full - 1, #events, format)
      local d = cjson.decode(events[#events].data)
      local got = format == "openai" and d.choices[1].finish_reason or d.type
      assert.equal(want, got, format)
    end
  end)

  it("stream-error ends with an error event in the provider's shape", function()
    local r = exchange(state { faults = "stream-error:overloaded_error" }, "anthropic", "a b c",
      { stream = true })
    local events = parse_sse(r.body)
    assert.equal("error", events[#events].event)
    assert.same({ type = "error", error = { type = "overloaded_error", message = "Overloaded" } },
      cjson.decode(events[#events].data))
    assert.equal("a", streamed_text("anthropic", (decoded(r))))

    r = exchange(state { faults = "stream-error:rate_limit_error:after=2" }, "openai", "a b c",
      { stream = true })
    local d = decoded(r)
    assert.equal("a b", streamed_text("openai", d))
    assert.equal("rate_limit_error", d[#d].error.type)
    assert.equal("rate_limit_error", d[#d].error.code)

    r = exchange(state { faults = "stream-error:no_capacity:after=0" }, "openrouter", "a b",
      { stream = true })
    d = decoded(r)
    assert.equal("", streamed_text("openrouter", d))
    assert.equal("no_capacity", d[#d].error.code)
    assert.equal("error", d[#d].choices[1].finish_reason)

    r = exchange(state { faults = "stream-error:no_capacity" }, "responses", "a b", { stream = true })
    d = decoded(r)
    assert.equal("error", d[#d].type)
    assert.equal("no_capacity", d[#d].code)
    assert.equal(#d - 1, d[#d].sequence_number)
  end)

  it("bad-json sends one chunk that does not parse and goes on", function()
    for format in pairs(bodies) do
      local r = exchange(state { faults = "bad-json" }, format, "hello there", { stream = true })
      local bad = 0
      for _, e in ipairs(parse_sse(r.body)) do
        if e.data ~= "[DONE]" and not pcall(cjson.decode, e.data) then bad = bad + 1 end
      end
      assert.equal(1, bad, format)
      local phases = {}
      for _, e in ipairs(parse_sse(r.body)) do phases[#phases + 1] = replies.phase(e) end
      assert.equal("end", phases[#phases], format)
    end
  end)

  it("on stream:false: cut sends half the body and closes; stream-error is a 200", function()
    local full = exchange(state(), "openai", "hello there")
    local r = exchange(state { faults = "cut" }, "openai", "hello there")
    assert.equal(full.headers["content-length"], r.headers["content-length"])
    assert.equal(#full.body // 2, #r.body)
    assert.is_false(r.complete)
    assert.equal("close", r.steps[#r.steps])
    r = exchange(state { faults = "bad-json" }, "anthropic", "hi")
    assert.is_true(r.complete)
    assert.is_false(pcall(cjson.decode, r.body))
    r = exchange(state { faults = "stream-error:overloaded_error" }, "anthropic", "hi")
    assert.equal(200, r.status)
    assert.equal("overloaded_error", cjson.decode(r.body).error.type)
  end)

  it("empty and leak stream unusable content", function()
    local d = decoded(exchange(state { faults = "empty" }, "anthropic", "hi", { stream = true }))
    assert.equal("", streamed_text("anthropic", d))
    assert.equal("message_stop", d[#d].type)
    d = decoded(exchange(state { faults = "leak" }, "openai", "Paris",
      { stream = true, tools = tools.openai }))
    assert.equal('<tool_call>{"name":"get_weather","arguments":{"city":"Paris"}}</tool_call>',
      streamed_text("openai", d))
    assert.equal("stop", d[#d - 1].choices[1].finish_reason)
  end)
end)

------------------------------------------------------------------------------
-- SSE text
------------------------------------------------------------------------------

describe("replies.sse", function()
  it("writes event lines only for named events and splits multi-line data", function()
    assert.equal("data: x\n\nevent: ping\ndata: {}\n\ndata: a\ndata: b\n\n",
      replies.sse({ { data = "x" }, { event = "ping", data = "{}" },
        { event = "message", data = "a\nb" } }))
  end)
end)

------------------------------------------------------------------------------
-- HTTP
------------------------------------------------------------------------------

describe("mock.parse_request", function()
  local raw = "POST /v1/messages?beta=true HTTP/1.1\r\nHost: x\r\nX-Api-Key: k\r\n"
    .. "Accept: a\r\naccept: b\r\nContent-Length: 5\r\n\r\nhello"

  it("parses a request with a body", function()
    local status, req, rest = mock.parse_request(raw .. "GET / HTTP/1.1\r\n")
    assert.equal("ok", status)
    assert.equal("POST", req.method)
    assert.equal("/v1/messages", req.path)
    assert.equal("beta=true", req.query)
    assert.equal("k", req.headers["x-api-key"])
    assert.equal("a, b", req.headers.accept)
    assert.equal("hello", req.body)
    assert.is_false(req.close)
    assert.equal("GET / HTTP/1.1\r\n", rest)
  end)

  it("asks for more until the request is whole, whatever the split", function()
    for i = 0, #raw - 1 do
      local status, head = mock.parse_request(raw:sub(1, i))
      assert.equal("more", status, i)
      if head then assert.equal(#raw, head.need) end
    end
  end)

  it("reads chunked bodies, in any split", function()
    local chunked = "POST /v1/messages HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
      .. "5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\n\r\nNEXT"
    local status, req, rest = mock.parse_request(chunked)
    assert.equal("ok", status)
    assert.equal("hello world", req.body)
    assert.equal("NEXT", rest)
    for i = 0, #chunked - 5 do assert.equal("more", (mock.parse_request(chunked:sub(1, i)))) end
  end)

  it("notes Expect: 100-continue once the header is in", function()
    local status, head = mock.parse_request(
      "POST /v1/messages HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n")
    assert.equal("more", status)
    assert.is_true(head.expect_continue)
  end)

  it("knows when the client wants the connection closed", function()
    local function close(s) return select(2, mock.parse_request(s)).close end
    assert.is_true(close("GET / HTTP/1.1\r\nConnection: close\r\n\r\n"))
    assert.is_true(close("GET / HTTP/1.0\r\n\r\n"))
    assert.is_false(close("GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"))
  end)

  it("rejects malformed requests with a status", function()
    local cases = {
      ["BROKEN\r\n\r\n"] = 400,
      ["GET / HTTP/2.0\r\n\r\n"] = 400,
      ["GET / HTTP/1.1\r\nno colon\r\n\r\n"] = 400,
      ["GET / HTTP/1.1\r\nContent-Length: -1\r\n\r\n"] = 400,
      ["GET / HTTP/1.1\r\nContent-Length: 1, 1\r\n\r\n"] = 400,
      ["GET / HTTP/1.1\r\nContent-Length: 999999999999\r\n\r\n"] = 413,
      ["GET / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n"] = 501,
      ["GET / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"] = 400,
      ["GET / HTTP/1.1\r\nX: " .. ("a"):rep(mock.MAX_HEAD) .. "\r\n\r\n"] = 431,
      ["GET / HTTP/1.1\r\nX: " .. ("a"):rep(mock.MAX_HEAD)] = 431,
    }
    for raw_req, want in pairs(cases) do
      local status, failure = mock.parse_request(raw_req)
      assert.equal("bad", status, raw_req:sub(1, 40))
      assert.equal(want, failure.status, raw_req:sub(1, 40))
    end
    local r = receive(mock.bad_request_plan({ status = 400, message = "malformed request line" }))
    assert.equal(400, r.status)
    assert.equal("close", r.headers.connection)
    assert.equal("malformed request line", cjson.decode(r.body).error.message)
  end)
end)

describe("mock.handle", function()
  it("keeps the connection open unless the client asks to close", function()
    local path, body = bodies.openai("hi", { stream = true })
    local plan = mock.handle(state(), request(path, body))
    assert.is_nil(plan[#plan].close)
    plan = mock.handle(state(), request(path, body, "Connection: close\r\n"))
    assert.same({ close = true }, plan[#plan])
    assert.equal("close", receive(plan).headers.connection)
  end)

  it("paces a stream: ttft before the first token, 1/tps between tokens", function()
    local path, body = bodies.anthropic("one two three", { stream = true })
    local plan = mock.handle(state { ttft = 0.75, tps = 4 }, request(path, body))
    local sleeps = {}
    for _, s in ipairs(plan) do if s.sleep then sleeps[#sleeps + 1] = s.sleep end end
    assert.same({ 0.75, 0.25, 0.25 }, sleeps)
    local first_sleep
    for i, s in ipairs(plan) do if s.sleep then first_sleep = i break end end
    local r = receive({ table.unpack(plan, 1, first_sleep - 1) })
    local names = {}
    for i, e in ipairs(parse_sse(r.body)) do names[i] = e.event end
    assert.same({ "message_start", "content_block_start", "ping" }, names)
  end)

  it("paces a JSON reply as one wait before the headers", function()
    local path, body = bodies.openai("one two three")
    local plan = mock.handle(state { ttft = 1, tps = 2 }, request(path, body))
    assert.same({ sleep = 2.5 }, plan[1])
  end)

  it("logs requests with secrets masked and serves the log", function()
    local st = state { faults = "503@1" }
    local path, body = bodies.openai("hi")
    mock.handle(st, request(path, body, "Authorization: Bearer sk-secret-123\r\n"))
    mock.handle(st, request("/v1/messages", "not json", "x-api-key: sk-ant-456\r\n"))
    local status, get = mock.parse_request("GET /__luagent/requests HTTP/1.1\r\n\r\n")
    assert.equal("ok", status)
    local r = receive(mock.handle(st, get))
    assert.equal(200, r.status)
    assert.is_nil(r.body:find("secret", 1, true))
    assert.is_nil(r.body:find("sk-ant", 1, true))
    local log = cjson.decode(r.body)
    assert.equal(2, #log)
    assert.same({ 1, "POST", "/v1/chat/completions", "Bearer ***", "hi" },
      { log[1].n, log[1].method, log[1].path, log[1].headers.authorization,
        log[1].body.messages[2].content })
    assert.same({ 2, "***", "not json" }, { log[2].n, log[2].headers["x-api-key"], log[2].body })
    assert.equal(2, #st.log)
  end)

  it("answers a body that is not JSON with a 400 in the provider's shape", function()
    local r = receive(mock.handle(state(), request("/v1/messages", "{oops")))
    assert.equal(400, r.status)
    assert.equal("invalid_request_error", cjson.decode(r.body).error.type)
  end)

  it("answers unknown paths with 404 and wrong methods with 405", function()
    local _, req = mock.parse_request("GET /v2/nothing HTTP/1.1\r\n\r\n")
    local r = receive(mock.handle(state(), req))
    assert.equal(404, r.status)
    assert.equal("no route for GET /v2/nothing", cjson.decode(r.body).error.message)
    _, req = mock.parse_request("GET /v1/messages HTTP/1.1\r\n\r\n")
    r = receive(mock.handle(state(), req))
    assert.equal(405, r.status)
    assert.equal("POST", r.headers.allow)
  end)

  it("counts only model requests for fault scopes", function()
    local st = state { faults = "503@2" }
    local _, get = mock.parse_request("GET /nothing HTTP/1.1\r\n\r\n")
    mock.handle(st, get)
    assert.equal(200, exchange(st, "openai", "hi").status)
    assert.equal(503, exchange(st, "openai", "hi").status)
  end)
end)

describe("mock.parse_args", function()
  it("reads every flag, with = or a separate value", function()
    assert.same({ listen = "127.0.0.1:9", cassette = "c.jsonl", faults = "503@1", seed = 7,
      ttft = 0.5, tps = 20, recorded_speed = true },
      mock.parse_args({ "--listen", "127.0.0.1:9", "--cassette=c.jsonl", "--faults", "503@1",
        "--seed=7", "--ttft", "0.5", "--tps", "20", "--recorded-speed" }))
    assert.same({ help = true }, mock.parse_args({ "-h" }))
  end)

  it("names an unknown flag, a bad value or a stray argument", function()
    local function fails(argv, message)
      local opts, err = mock.parse_args(argv)
      assert.is_nil(opts)
      assert.equal("usage", err.kind)
      assert.equal(message, err.message)
    end
    fails({ "--frob" }, "unknown flag '--frob'")
    fails({ "--seed", "x" }, "bad value 'x' for --seed")
    fails({ "--tps", "0" }, "bad value '0' for --tps")
    fails({ "--listen" }, "--listen needs a value")
    fails({ "--help=1" }, "--help takes no value")
    fails({ "extra" }, "unexpected argument 'extra'")
  end)

  it("main returns 2 for usage errors and prints help", function()
    local out, err = {}, {}
    local function sink(t) return { write = function(_, ...) for _, s in ipairs({ ... }) do
      t[#t + 1] = s end end, flush = function() end } end
    assert.equal(2, mock.main({ "--frob" }, sink(out), sink(err)))
    assert.matches("luagent mock: unknown flag '%-%-frob'", table.concat(err))
    assert.equal(0, mock.main({ "--help" }, sink(out), sink(err)))
    assert.matches("usage: luagent mock", table.concat(out))
  end)

  it("state() reports bad faults, seeds and pacing as usage errors", function()
    local _, err = mock.state({ faults = "frob" })
    assert.equal("unknown fault 'frob' in --faults 'frob'", err.message)
    _, err = mock.state({ seed = 1.5 })
    assert.equal("usage", err.kind)
    _, err = mock.state({ tps = -1 })
    assert.equal("usage", err.kind)
  end)
end)

------------------------------------------------------------------------------
-- Serving: the accept loop, connection tasks and plan execution, on the
-- virtual clock, over fake sockets that follow the core's TCP API.
------------------------------------------------------------------------------

local has_core, luagent = pcall(require, "luagent")

-- A fake TCP provider. `scripts` lists connections; each is the list of
-- chunks the client sends, after which it reads EOF. Every write, reset and
-- close is recorded with the loop time it happened at.
local function fake_tcp(scripts)
  local net = { conns = {} }
  function net.tcp_listen(host)
    local listener = { n = 0 }
    function listener.address() return host, 4242 end
    function listener.accept()
      listener.n = listener.n + 1
      local script = scripts[listener.n]
      if not script then luagent.sleep(1e9) end
      local conn = { pos = 0, log = {}, out = {} }
      function conn.read()
        conn.pos = conn.pos + 1
        return script[conn.pos]
      end
      function conn.write(_, s)
        conn.out[#conn.out + 1] = s
        conn.log[#conn.log + 1] = { "write", luagent.now(), #s }
        return true
      end
      function conn.reset() conn.log[#conn.log + 1] = { "reset", luagent.now() } end
      function conn.close() conn.log[#conn.log + 1] = { "close", luagent.now() } end
      net.conns[#net.conns + 1] = conn
      return conn
    end
    function listener.close() listener.closed = true end
    return listener
  end
  return net
end

-- Runs fn in a task on the virtual clock.
local function virtually(fn)
  luagent.clock.virtual()
  local ok, err = pcall(function() return luagent.spawn(fn):join() end)
  luagent.clock.real()
  assert(ok, tostring(err))
end

-- Serves `scripts` with `opts` until the loop is idle; returns the server
-- and the fake connections.
local function serve(scripts, opts)
  local server, net
  virtually(function()
    net = fake_tcp(scripts)
    opts = opts or {}
    opts.tcp, opts.now = net, function() return NOW end
    server = assert(mock.start(opts))
    luagent.sleep(1000)
    server:close()
  end)
  return server, net.conns
end

-- The raw text of a POST of `body` (a table) to `path`.
local function post(path, body, extra)
  local text = cjson.encode(body)
  return "POST " .. path .. " HTTP/1.1\r\nHost: mock\r\n" .. (extra or "")
    .. "Content-Length: " .. #text .. "\r\n\r\n" .. text
end

describe("serving over the TCP API", function()
  if not has_core then
    pending("needs the core (build/lua/luagent/core.so)")
    return
  end

  local path, body = bodies.openai("hi", { stream = true })
  local one = post(path, body)

  it("answers pipelined and keep-alive requests on one connection", function()
    local server, conns = serve({ { one .. one, one } })
    assert.equal("http://127.0.0.1:4242", server.url)
    local out = table.concat(conns[1].out)
    local _, responses = out:gsub("HTTP/1%.1 200 OK\r\n", "")
    assert.equal(3, responses)
    local _, ends = out:gsub("\r\n0\r\n\r\n", "")
    assert.equal(3, ends)
    assert.equal("close", conns[1].log[#conns[1].log][1])
    assert.equal(3, #server:requests())
  end)

  it("reads requests split anywhere and answers Expect: 100-continue", function()
    local raw = post("/v1/messages", { model = "m", messages = { { role = "user", content = "x" } } },
      "Expect: 100-continue\r\n")
    local pieces = {}
    for i = 1, #raw, 7 do pieces[#pieces + 1] = raw:sub(i, i + 6) end
    local _, conns = serve({ pieces })
    local out = table.concat(conns[1].out)
    assert.equal("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n", out:sub(1, 42))
    local _, continues = out:gsub("100 Continue", "")
    assert.equal(1, continues)
  end)

  it("stalls on the loop's clock", function()
    local _, conns = serve({ { one, one } }, { faults = "stall:secs=30@1" })
    local log = conns[1].log
    assert.equal("write", log[1][1])
    assert.equal(30, log[1][2])
  end)

  it("paces tokens on the loop's clock", function()
    local p, b = bodies.anthropic("one two three", { stream = true })
    local _, conns = serve({ { post(p, b) } }, { ttft = 0.5, tps = 10 })
    local times = {}
    for _, entry in ipairs(conns[1].log) do
      if entry[1] == "write" then times[#times + 1] = entry[2] end
    end
    assert.same({ 0, 0.5, 0.6, 0.7 }, times)
  end)

  it("resets after the bytes asked and closes on close", function()
    local _, conns = serve({ { one }, { one } }, { faults = "reset:bytes=10@1,close@2" })
    local log = conns[1].log
    assert.equal("reset", log[#log][1])
    local r = receive({ { write = table.concat(conns[1].out) } })
    assert.equal(10, #r.body)
    assert.same({ { "close", 0 } }, conns[2].log)
  end)

  it("answers a malformed request with 400 and closes", function()
    local _, conns = serve({ { "NONSENSE\r\n\r\n" } })
    assert.matches("^HTTP/1%.1 400 Bad Request\r\n", table.concat(conns[1].out))
    assert.equal("close", conns[1].log[#conns[1].log][1])
  end)

  it("lets a waiter go when the server closes", function()
    virtually(function()
      local server = assert(mock.start({ tcp = fake_tcp({}) }))
      local waiter = luagent.spawn(function() server:wait(); return "released" end)
      luagent.sleep(5)
      assert.equal("waiting", waiter:status())
      server:close()
      assert.equal("released", waiter:join())
      local ok, err = pcall(server.task.join, server.task)
      assert.is_false(ok)
      assert.equal("cancelled", err.kind)
    end)
  end)

  it("reports a bad start as a usage error before listening", function()
    virtually(function()
      local net = fake_tcp({})
      local server, err = mock.start({ tcp = net, faults = "frob" })
      assert.is_nil(server)
      assert.equal("unknown fault 'frob' in --faults 'frob'", err.message)
      server, err = mock.start({ tcp = net, listen = "nowhere" })
      assert.is_nil(server)
      assert.equal("--listen wants HOST:PORT, got 'nowhere'", err.message)
    end)
  end)
end)
