-- Provider adapters: request building and stream decoding against recorded
-- SSE fixtures (spec/fixtures/providers/*.sse), and the event contract of
-- lua/luagent/EVENTS.md.
package.path = "lua/?.lua;lua/?/init.lua;" .. package.path

local cjson = require "cjson"
local errors = require "luagent.base.errors"
local common = require "luagent.model.providers.common"

local ADAPTERS = {
  openai = require "luagent.model.providers.openai",
  anthropic = require "luagent.model.providers.anthropic",
  openai_responses = require "luagent.model.providers.openai_responses",
}
local PREFIX = { openai = "openai", anthropic = "anthropic", openai_responses = "responses" }
local KEY = "sk-TESTKEY-123"

------------------------------------------------------------------------------
-- Helpers
------------------------------------------------------------------------------

-- The fields each event type may carry, read from EVENTS.md itself (the
-- "Stream events" section: under each "### type" heading, the first column
-- of its first table whose header starts with "field"), so the document
-- and this check cannot drift; anything else fails.
local function documented_fields(path)
  local f = assert(io.open(path, "rb"))
  local text = f:read("a")
  f:close()
  local section = assert(text:match("\n## Stream events.-\n(.-)\n## "), "no Stream events section in " .. path)
  local fields, current, in_table, done = {}, nil, false, {}
  for line in (section .. "\n"):gmatch("(.-)\n") do
    local heading = line:match("^### ([%w_]+)%s*$")
    if heading then
      current, in_table = heading, false
    elseif current and not done[current] then
      local first = line:match("^|%s*`?([%w_]+)`?%s*|")
      if first == "field" and not in_table then
        in_table, fields[current] = true, {}
      elseif in_table and first then
        fields[current][first] = true
      elseif in_table and not line:match("^|") then
        in_table, done[current] = false, true
      end
    end
  end
  return fields
end
local FIELDS = documented_fields("lua/luagent/EVENTS.md")

-- Reads a fixture's text.
local function fixture(name)
  local f = assert(io.open("spec/fixtures/providers/" .. name .. ".sse", "rb"))
  local text = f:read("a")
  f:close()
  return text
end

-- A tiny SSE splitter for the fixtures: blank lines end events, `:` lines are
-- comments, one space after the colon is dropped, data lines join with "\n".
local function split_sse(text)
  local events = {}
  text = text:gsub("\r\n", "\n")
  for block in text:gmatch("(.-)\n\n") do
    local name, data = nil, nil
    for line in (block .. "\n"):gmatch("(.-)\n") do
      if line ~= "" and line:sub(1, 1) ~= ":" then
        local field, value = line:match("^([^:]*):(.*)$")
        if not field then field, value = line, "" end
        value = value:gsub("^ ", "")
        if field == "event" then name = value
        elseif field == "data" then data = data and (data .. "\n" .. value) or value end
      end
    end
    if data then events[#events + 1] = { event = name or "message", data = data } end
  end
  return events
end

-- Walks any value and fails when a string in it contains the test key.
local function assert_no_key(v, seen)
  seen = seen or {}
  if type(v) == "string" then
    assert.is_nil(v:find(KEY, 1, true), "API key leaked: " .. v)
  elseif type(v) == "table" and not seen[v] then
    seen[v] = true
    for k, x in pairs(v) do assert_no_key(k, seen); assert_no_key(x, seen) end
    if errors.is(v) then assert_no_key(tostring(v), seen) end
  end
end

-- Checks the contract on a run's events: known types and fields only, one
-- message_start first, at most one message_end and it is last.
local function assert_contract(events, ended)
  for i, e in ipairs(events) do
    local allowed = FIELDS[e.type]
    assert.is_truthy(allowed, "unknown event type " .. tostring(e.type))
    for k in pairs(e) do
      assert.is_truthy(k == "type" or allowed[k], e.type .. " has undocumented field " .. tostring(k))
    end
    assert.equal(i == 1, e.type == "message_start")
    assert.equal(ended and i == #events, e.type == "message_end")
  end
  assert_no_key(events)
end

-- Decodes SSE events with `provider`'s decoder. Returns all events, and the
-- error with "feed" or "finish" when the decoder failed.
local function decode(provider, sse_events)
  local dec = ADAPTERS[provider].decoder({ model = "requested-model" })
  local all = {}
  local function failed(err, where)
    assert.is_true(errors.is(err))
    assert_no_key(err)
    -- sticky: both entry points repeat the same record
    assert.equal(err, select(2, dec:feed({ event = "message", data = "{}" })))
    assert.equal(err, select(2, dec:finish()))
    return all, err, where
  end
  for _, ev in ipairs(sse_events) do
    local out, err = dec:feed(ev)
    if out == nil then return failed(err, "feed") end
    for _, e in ipairs(out) do all[#all + 1] = e end
  end
  local out, err = dec:finish()
  if out == nil then return failed(err, "finish") end
  for _, e in ipairs(out) do all[#all + 1] = e end
  return all
end

-- Decodes fixture `<prefix>_<case>.sse`; checks the contract as it goes.
local function run(provider, case)
  local events, err, where = decode(provider, split_sse(fixture(PREFIX[provider] .. "_" .. case)))
  assert_contract(events, err == nil)
  return events, err, where
end

local of_type = require("spec.support.helpers").of_type

-- The types, in order.
local function types(events)
  local out = {}
  for i, e in ipairs(events) do out[i] = e.type end
  return out
end

-- Concatenated text of the events of type `t`.
local function joined(events, t, field)
  local out = {}
  for _, e in ipairs(of_type(events, t)) do out[#out + 1] = e[field or "text"] end
  return table.concat(out)
end

-- Checks a tool call run: starts, per-index deltas that join to the raw
-- arguments, ends, and the same calls in message_end.
local function assert_tool_calls(events, expected)
  local starts, ends = of_type(events, "tool_call_start"), of_type(events, "tool_call_end")
  assert.equal(#expected, #starts)
  assert.equal(#expected, #ends)
  local msg = events[#events].message
  for i, want in ipairs(expected) do
    assert.same({ type = "tool_call_start", index = i, id = want.id, name = want.name }, starts[i])
    local parts = {}
    for _, d in ipairs(of_type(events, "tool_call_delta")) do
      if d.index == i then
        assert.equal(want.id, d.id)
        parts[#parts + 1] = d.arguments
      end
    end
    local e = ends[i]
    assert.equal(i, e.index)
    assert.equal(want.id, e.id)
    assert.equal(want.name, e.name)
    assert.equal(want.raw, e.raw_arguments)
    assert.equal(want.raw, table.concat(parts))
    assert.same(want.arguments, e.arguments)
    if want.error then
      assert.matches("^invalid JSON arguments: ", e.error)
    else
      assert.is_nil(e.error)
    end
    assert.same({ id = want.id, name = want.name, arguments = e.arguments,
      raw_arguments = want.raw, error = e.error }, msg.tool_calls[i])
  end
  assert.equal(#expected, #msg.tool_calls)
end

local function usage(i, o, r, w)
  return { input_tokens = i, output_tokens = o, cache_read_tokens = r, cache_write_tokens = w }
end

-- The last event, which must be message_end.
local function ending(events)
  local e = events[#events]
  assert.equal("message_end", e.type)
  return e
end

local WEATHER = { city = "Paris", days = 3, tags = {} }
local WEATHER_RAW = '{"city": "Paris", "days": 3, "tags": []}'
local TIME_RAW = '{"tz": "Europe/Paris"}'

------------------------------------------------------------------------------
-- JSON encoding
------------------------------------------------------------------------------

describe("providers.common JSON", function()
  it("encodes numbers exactly, integers as integers", function()
    assert.equal("[3,0.1,9007199254740993,-2.5,1e+300]",
      common.encode({ 3, 0.1, 9007199254740993, -2.5, 1e300 }))
    assert.equal("3", common.encode(3.0))
    assert.equal("0.30000000000000004", common.encode(0.1 + 0.2))
    assert.has_error(function() common.encode(0 / 0) end)
  end)

  it("keeps marked empty arrays and sorts object keys", function()
    assert.equal('{"a":[],"b":{},"c":null,"d":[1,"x"],"e":true}',
      common.encode({ e = true, d = { 1, "x" }, c = cjson.null, b = {}, a = common.array() }))
    assert.equal('"a\\"b\\n"', common.encode('a"b\n'))
    assert.equal('{"x":[1,2]}', common.encode({ x = common.raw("[1,2]") }))
  end)

  it("sends empty schema arrays as [] without touching the caller's table", function()
    local params = { type = "object", required = {}, properties = {
      required = {}, -- a property named "required" with the empty schema
      tags = { type = "array", items = {}, enum = {} } } }
    local text = common.encode(common.schema(params))
    assert.equal('{"properties":{"required":{},"tags":{"enum":[],"items":{},"type":"array"}},'
      .. '"required":[],"type":"object"}', text)
    assert.is_nil(getmetatable(params.required))
    assert.equal('{"properties":{},"type":"object"}', common.encode(common.schema(nil)))
  end)

  it("decodes integral numbers in tool arguments as integers", function()
    local dec = ADAPTERS.anthropic.decoder({})
    dec:feed({ event = "content_block_start",
      data = '{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"t","name":"n","input":{}}}' })
    dec:feed({ event = "content_block_delta",
      data = '{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{\\"n\\": 2, \\"f\\": 0.5}"}}' })
    local out = dec:feed({ event = "content_block_stop", data = '{"type":"content_block_stop","index":0}' })
    assert.equal("integer", math.type(out[1].arguments.n))
    assert.equal(0.5, out[1].arguments.f)
  end)
end)

------------------------------------------------------------------------------
-- Requests
------------------------------------------------------------------------------

local function request(extra)
  local req = {
    model = "m-1", system = "Be brief.", max_tokens = 100, temperature = 0.5,
    messages = {
      { role = "user", content = "Weather and time in Paris?" },
      { role = "assistant", content = "Checking.", tool_calls = {
        { id = "c1", name = "get_weather", arguments = { city = "Paris", tags = {} },
          raw_arguments = '{"city":"Paris","tags":[]}' },
        { id = "c2", name = "get_time", arguments = {} } } },
      { role = "tool", tool_call_id = "c1", name = "get_weather", content = "18C" },
      { role = "tool", tool_call_id = "c2", name = "get_time", content = "boom", is_error = true },
      { role = "user", content = "Thanks" },
    },
    tools = {
      { name = "get_weather", description = "Weather for a city", parameters = { type = "object",
        properties = { city = { type = "string" } }, required = { "city" } } },
      { name = "get_time", description = "Time", parameters = { type = "object",
        properties = {}, required = {} } },
    },
  }
  for k, v in pairs(extra or {}) do req[k] = v end
  return req
end

-- Builds with the test key; checks the key is only in the auth header.
local function build(provider, req, opts)
  opts = opts or {}
  opts.api_key = KEY
  local r = ADAPTERS[provider].build(req, opts)
  assert.equal("POST", r.method)
  assert_no_key({ r.url, r.body })
  local carriers = 0
  for k, v in pairs(r.headers) do
    assert.equal(k:lower(), k)
    if v:find(KEY, 1, true) then carriers = carriers + 1 end
  end
  assert.equal(1, carriers)
  return r, cjson.decode(r.body)
end

describe("request building", function()
  for provider, adapter in pairs(ADAPTERS) do
    it(provider .. " raises on misuse, naming itself and not the key", function()
      for _, bad in ipairs({ "x", { messages = {} }, { model = "m" },
          { model = "m", messages = { { role = "system", content = "x" } } } }) do
        local ok, err = pcall(adapter.build, bad, { api_key = KEY })
        assert.is_false(ok)
        assert.matches("^" .. provider .. "%.build: ", (err:gsub("^[^:]*:%d+: ", "")))
        assert_no_key(err)
      end
    end)

    it(provider .. " omits empty tools and the system prompt when absent", function()
      local req = request({ tools = {} })
      req.system = nil
      local _, body = build(provider, req)
      assert.is_nil(body.tools)
      assert.is_nil(body.system)
      assert.is_nil(body.instructions)
      assert.not_equal("system", body.messages and body.messages[1].role)
    end)

    it(provider .. " joins base_url and lets extra headers replace defaults", function()
      local r = build(provider, request(), { base_url = "http://127.0.0.1:8080/v1/",
        headers = { ["Content-Type"] = "application/json; charset=utf-8", ["X-Trace"] = "t1" } })
      assert.matches("^http://127%.0%.0%.1:8080/v1/[a-z/]+$", r.url)
      assert.equal("application/json; charset=utf-8", r.headers["content-type"])
      assert.equal("t1", r.headers["x-trace"])
    end)
  end

  it("openai: chat/completions with bearer, usage chunk, system first, tool mapping", function()
    local r, body = build("openai", request())
    assert.equal("https://api.openai.com/v1/chat/completions", r.url)
    assert.equal("Bearer " .. KEY, r.headers.authorization)
    assert.equal("application/json", r.headers["content-type"])
    assert.is_true(body.stream)
    assert.same({ include_usage = true }, body.stream_options)
    assert.equal("m-1", body.model)
    assert.equal(100, body.max_completion_tokens)
    assert.equal(0.5, body.temperature)
    assert.same({ role = "system", content = "Be brief." }, body.messages[1])
    assert.same({ role = "user", content = "Weather and time in Paris?" }, body.messages[2])
    assert.same({ role = "assistant", content = "Checking.", tool_calls = {
      { id = "c1", type = "function", ["function"] = { name = "get_weather",
        arguments = '{"city":"Paris","tags":[]}' } },
      { id = "c2", type = "function", ["function"] = { name = "get_time", arguments = "{}" } },
    } }, body.messages[3])
    assert.same({ role = "tool", tool_call_id = "c1", content = "18C" }, body.messages[4])
    assert.same({ role = "tool", tool_call_id = "c2", content = "boom" }, body.messages[5])
    assert.same({ role = "user", content = "Thanks" }, body.messages[6])
    assert.equal(6, #body.messages)
    assert.same({ type = "function", ["function"] = { name = "get_weather",
      description = "Weather for a city", parameters = { type = "object",
        properties = { city = { type = "string" } }, required = { "city" } } } }, body.tools[1])
    assert.truthy(r.body:find('"parameters":{"properties":{},"required":[],"type":"object"}', 1, true))
    local _, plain = build("openai", request({ stream = false }))
    assert.is_false(plain.stream)
    assert.is_nil(plain.stream_options)
  end)

  it("anthropic: messages with x-api-key, version, top-level system, merged tool results", function()
    local r, body = build("anthropic", request())
    assert.equal("https://api.anthropic.com/v1/messages", r.url)
    assert.equal(KEY, r.headers["x-api-key"])
    assert.equal("2023-06-01", r.headers["anthropic-version"])
    assert.equal("application/json", r.headers["content-type"])
    assert.is_nil(r.headers.authorization)
    assert.equal("Be brief.", body.system)
    assert.equal(100, body.max_tokens)
    assert.is_true(body.stream)
    assert.same({ role = "user", content = "Weather and time in Paris?" }, body.messages[1])
    assert.same({ role = "assistant", content = {
      { type = "text", text = "Checking." },
      { type = "tool_use", id = "c1", name = "get_weather", input = { city = "Paris", tags = {} } },
      { type = "tool_use", id = "c2", name = "get_time", input = {} },
    } }, body.messages[2])
    assert.same({ role = "user", content = {
      { type = "tool_result", tool_use_id = "c1", content = "18C", is_error = false },
      { type = "tool_result", tool_use_id = "c2", content = "boom", is_error = true },
      { type = "text", text = "Thanks" },
    } }, body.messages[3])
    assert.equal(3, #body.messages)
    assert.truthy(r.body:find('"input":{"city":"Paris","tags":[]}', 1, true))
    assert.truthy(r.body:find('"input":{},"name":"get_time"', 1, true))
    assert.same({ name = "get_weather", description = "Weather for a city", input_schema = {
      type = "object", properties = { city = { type = "string" } }, required = { "city" } } }, body.tools[1])
    assert.truthy(r.body:find('"input_schema":{"properties":{},"required":[],"type":"object"}', 1, true))
    local req = request()
    req.max_tokens = nil
    local _, dflt = build("anthropic", req)
    assert.equal(4096, dflt.max_tokens)
  end)

  it("anthropic: each round of tool results is its own user message", function()
    local call = function(id) return { role = "assistant", content = "", tool_calls = {
      { id = id, name = "t", arguments = {} } } } end
    local result = function(id) return { role = "tool", tool_call_id = id, content = id .. "!" } end
    local _, body = build("anthropic", request({ messages = { { role = "user", content = "go" },
      call("a"), result("a"), call("b"), result("b") } }))
    assert.equal(5, #body.messages)
    assert.same({ { type = "tool_use", id = "b", name = "t", input = {} } }, body.messages[4].content)
    assert.same({ role = "user", content = { { type = "tool_result", tool_use_id = "b",
      content = "b!", is_error = false } } }, body.messages[5])
  end)

  it("anthropic: sends signed thinking back, drops unsigned thinking", function()
    local msgs = { { role = "user", content = "2+2?" },
      { role = "assistant", content = "4", thinking = "add", thinking_signature = "sig" },
      { role = "user", content = "and 3+3?" },
      { role = "assistant", content = "6", thinking = "add again" },
      { role = "user", content = "ok" } }
    local _, body = build("anthropic", request({ messages = msgs, tools = nil }))
    assert.same({ { type = "thinking", thinking = "add", signature = "sig" },
      { type = "text", text = "4" } }, body.messages[2].content)
    assert.same({ { type = "text", text = "6" } }, body.messages[4].content)
  end)

  it("sends an incomplete (aborted) assistant message as its text; anthropic without trailing whitespace", function()
    local partial = { role = "assistant", content = "Hello wor \n", incomplete = true, stop_reason = "aborted" }
    local msgs = { { role = "user", content = "hi" }, partial }
    local _, body = build("anthropic", request({ messages = msgs, tools = nil }))
    -- a final assistant message is a prefill, which may not end in whitespace
    assert.same({ { type = "text", text = "Hello wor" } }, body.messages[2].content)
    _, body = build("openai", request({ messages = msgs, tools = nil }))
    assert.same({ role = "assistant", content = "Hello wor \n" }, body.messages[3])
    _, body = build("openai_responses", request({ messages = msgs, tools = nil }))
    assert.same({ role = "assistant", content = "Hello wor \n" }, body.input[2])
  end)

  it("openai_responses: responses with bearer, instructions, input items", function()
    local r, body = build("openai_responses", request())
    assert.equal("https://api.openai.com/v1/responses", r.url)
    assert.equal("Bearer " .. KEY, r.headers.authorization)
    assert.equal("Be brief.", body.instructions)
    assert.equal(100, body.max_output_tokens)
    assert.is_nil(body.max_tokens)
    assert.is_true(body.stream)
    assert.same({
      { role = "user", content = "Weather and time in Paris?" },
      { role = "assistant", content = "Checking." },
      { type = "function_call", call_id = "c1", name = "get_weather", arguments = '{"city":"Paris","tags":[]}' },
      { type = "function_call", call_id = "c2", name = "get_time", arguments = "{}" },
      { type = "function_call_output", call_id = "c1", output = "18C" },
      { type = "function_call_output", call_id = "c2", output = "boom" },
      { role = "user", content = "Thanks" },
    }, body.input)
    assert.same({ type = "function", name = "get_weather", description = "Weather for a city",
      parameters = { type = "object", properties = { city = { type = "string" } },
        required = { "city" } } }, body.tools[1])
    assert.truthy(r.body:find('"parameters":{"properties":{},"required":[],"type":"object"}', 1, true))
  end)

  it("replays a decoded assistant message as the same request", function()
    -- a message_end message goes back into history unchanged
    local events = run("openai", "tools")
    local msg = ending(events).message
    local r = build("openai", request({ messages = { { role = "user", content = "q" }, msg } }))
    assert.truthy(r.body:find(cjson.encode(WEATHER_RAW), 1, true))
    local ra = build("anthropic", request({ messages = { { role = "user", content = "q" }, msg } }))
    assert.truthy(ra.body:find('"input":' .. WEATHER_RAW, 1, true))
  end)
end)

------------------------------------------------------------------------------
-- OpenAI Chat Completions stream
------------------------------------------------------------------------------

describe("openai decoder", function()
  it("decodes plain text with the usage-only final chunk", function()
    local events = run("openai", "text")
    assert.same({ "message_start", "text_delta", "text_delta", "usage", "message_end" }, types(events))
    assert.same({ type = "message_start", provider = "openai", model = "gpt-4o-mini-2024-07-18",
      id = "chatcmpl-T1" }, events[1])
    assert.equal("Hello, wörld", joined(events, "text_delta"))
    local u = usage(12, 3, 4, 0)
    u.type = "usage"
    assert.same(u, events[4])
    assert.same({ type = "message_end", stop_reason = "stop", raw_stop_reason = "stop",
      message = { role = "assistant", content = "Hello, wörld" }, usage = usage(12, 3, 4, 0) }, events[5])
  end)

  it("assembles two parallel tool calls split mid-token and mid-JSON", function()
    local events = run("openai", "tools")
    assert_tool_calls(events, {
      { id = "call_A", name = "get_weather", raw = WEATHER_RAW, arguments = WEATHER },
      { id = "call_B", name = "get_time", raw = TIME_RAW, arguments = { tz = "Europe/Paris" } } })
    local e = ending(events)
    assert.equal("tool_use", e.stop_reason)
    assert.equal("tool_calls", e.raw_stop_reason)
    assert.equal("", e.message.content)
    assert.same(usage(80, 40, 0, 0), e.usage)
    assert.equal("integer", math.type(e.message.tool_calls[1].arguments.days))
  end)

  it("ends tool calls at the finish reason, before usage and [DONE]", function()
    local dec = ADAPTERS.openai.decoder({})
    local evs = split_sse(fixture("openai_tools"))
    for i = 1, 7 do assert(dec:feed(evs[i])) end
    assert.truthy(evs[8].data:find('"finish_reason":"tool_calls"', 1, true))
    assert.same({ "tool_call_end", "tool_call_end" }, types(assert(dec:feed(evs[8]))))
  end)

  it("reports invalid tool-call JSON on the event, empty arguments as {}", function()
    local events = run("openai", "bad_args")
    assert_tool_calls(events, {
      { id = "call_X", name = "read_file", raw = '{"path": "a.txt"', arguments = nil, error = true },
      { id = "call_Y", name = "list_dir", raw = "", arguments = {} } })
    assert.equal("tool_use", ending(events).stop_reason)
  end)

  it("returns an in-stream error object as stream_error, fields as sent", function()
    local events, err, where = run("openai", "error")
    assert.same({ "message_start", "text_delta" }, types(events))
    assert.equal("feed", where)
    assert.equal("stream_error", err.kind)
    assert.equal("The server had an error while processing your request. Sorry about that!", err.message)
    assert.equal("server_error", err.type)
    assert.equal("server_error", err.code)
    assert.equal("503", err.status)
    assert.equal("openai", err.provider)
    assert.is_true(err.delivered)
    assert.equal(cjson.null, err.raw.param)
  end)

  it("returns finish_reason error with its error object (numeric code)", function()
    local _, err = run("openai", "error_finish")
    assert.equal("stream_error", err.kind)
    assert.equal(502, err.code)
    assert.equal("Provider disconnected unexpectedly", err.message)
    assert.is_nil(err.type)
    assert.is_true(err.delivered)
  end)

  it("returns finish_reason error without an error object as stream_error", function()
    local _, err = decode("openai", { { event = "message",
      data = '{"id":"x","choices":[{"index":0,"delta":{},"finish_reason":"error"}]}' } })
    assert.equal("stream_error", err.kind)
    assert.matches("finish_reason", err.message)
    assert.is_false(err.delivered)
  end)

  it("fails truncated when neither [DONE] nor a finish reason came", function()
    local events, err, where = run("openai", "truncated")
    assert.equal("finish", where)
    assert.equal("truncated", err.kind)
    assert.matches("%[DONE%]", err.message)
    assert.is_true(err.delivered)
    assert.equal("Once upon", joined(events, "text_delta"))
    local _, err2 = decode("openai", { split_sse(fixture("openai_truncated"))[1] })
    assert.is_false(err2.delivered)
  end)

  it("succeeds without [DONE] once a finish reason came", function()
    local events, err = run("openai", "truncated_after_finish")
    assert.is_nil(err)
    assert.same({ "message_start", "text_delta", "message_end" }, types(events))
    local e = ending(events)
    assert.equal("length", e.stop_reason)
    assert.equal("length", e.raw_stop_reason)
    assert.equal("Done.", e.message.content)
    assert.is_nil(e.usage)
  end)

  it("fails protocol on invalid JSON, naming the event", function()
    local events, err = run("openai", "bad_json")
    assert.same({ "message_start", "text_delta" }, types(events))
    assert.equal("protocol", err.kind)
    assert.equal(2, err.event_index)
    assert.matches("^invalid JSON in SSE data at event 2: ", err.message)
    assert.is_true(err.delivered)
  end)

  it("maps finish reasons and keeps reasoning deltas", function()
    for raw, want in pairs({ stop = "stop", length = "length", tool_calls = "tool_use",
        function_call = "tool_use", content_filter = "stop", eos = "stop" }) do
      local events = decode("openai", {
        { event = "message", data = '{"id":"x","model":"m","choices":[{"index":0,"delta":'
          .. '{"reasoning_content":"hmm","content":"a"},"finish_reason":"' .. raw .. '"}]}' },
        { event = "message", data = "[DONE]" } })
      assert_contract(events, true)
      local e = ending(events)
      assert.equal(want, e.stop_reason)
      assert.equal(raw, e.raw_stop_reason)
      assert.equal("hmm", e.message.thinking)
    end
  end)
end)

------------------------------------------------------------------------------
-- Anthropic Messages stream
------------------------------------------------------------------------------

describe("anthropic decoder", function()
  it("decodes plain text, ignores pings, merges usage", function()
    local events = run("anthropic", "text")
    assert.same({ "message_start", "text_delta", "text_delta", "usage", "message_end" }, types(events))
    assert.same({ type = "message_start", provider = "anthropic",
      model = "claude-sonnet-4-5-20250929", id = "msg_T1" }, events[1])
    local e = ending(events)
    assert.same({ type = "message_end", stop_reason = "stop", raw_stop_reason = "end_turn",
      message = { role = "assistant", content = "Hello, wörld" }, usage = usage(25, 15, 0, 0) }, e)
  end)

  it("assembles tool_use blocks split mid-token, counts cache tokens into input", function()
    local events = run("anthropic", "tools")
    assert_tool_calls(events, {
      { id = "toolu_A", name = "get_weather", raw = WEATHER_RAW, arguments = WEATHER },
      { id = "toolu_B", name = "get_time", raw = TIME_RAW, arguments = { tz = "Europe/Paris" } } })
    local e = ending(events)
    assert.equal("tool_use", e.stop_reason)
    assert.equal("tool_use", e.raw_stop_reason)
    assert.equal("Let me check.", e.message.content)
    assert.same(usage(130, 60, 100, 20), e.usage)
    -- a tool call ends at its block's stop, before the next block starts
    local t = types(events)
    local first_end, second_start
    for i, ty in ipairs(t) do
      if ty == "tool_call_end" and not first_end then first_end = i end
      if ty == "tool_call_start" and events[i].index == 2 then second_start = i end
    end
    assert.is_true(first_end < second_start)
  end)

  it("decodes thinking and keeps the signature on the message", function()
    local events = run("anthropic", "thinking")
    assert.same({ "message_start", "thinking_delta", "thinking_delta", "text_delta", "usage",
      "message_end" }, types(events))
    local m = ending(events).message
    assert.equal("Let me add: 2 + 2 = 4.", m.thinking)
    assert.equal("It is 4.", m.content)
    assert.equal("EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds", m.thinking_signature)
  end)

  it("returns event: error as stream_error with partial usage", function()
    local events, err, where = run("anthropic", "error")
    assert.same({ "message_start", "text_delta" }, types(events))
    assert.equal("feed", where)
    assert.equal("stream_error", err.kind)
    assert.equal("Overloaded", err.message)
    assert.equal("overloaded_error", err.type)
    assert.is_nil(err.code)
    assert.is_nil(err.status)
    assert.equal("anthropic", err.provider)
    assert.is_true(err.delivered)
    assert.same(usage(25, 1, 0, 0), err.usage)
    assert.same({ type = "overloaded_error", message = "Overloaded" }, err.raw)
    assert.equal("stream_error: Overloaded", tostring(err))
  end)

  it("fails truncated without message_stop and stop reason", function()
    local _, err, where = run("anthropic", "truncated")
    assert.equal("finish", where)
    assert.equal("truncated", err.kind)
    assert.matches("message_stop", err.message)
    assert.is_true(err.delivered)
  end)

  it("succeeds without message_stop once message_delta gave a stop reason", function()
    local events, err = run("anthropic", "truncated_after_finish")
    assert.is_nil(err)
    local e = ending(events)
    assert.equal("length", e.stop_reason)
    assert.equal("max_tokens", e.raw_stop_reason)
    assert.same(usage(25, 5, 0, 0), e.usage)
  end)

  it("reports invalid tool JSON and empty input", function()
    local events = run("anthropic", "bad_args")
    assert_tool_calls(events, {
      { id = "toolu_X", name = "read_file", raw = '{"path": "a.txt"', arguments = nil, error = true },
      { id = "toolu_Y", name = "list_dir", raw = "", arguments = {} } })
  end)

  it("fails protocol on invalid JSON", function()
    local _, err = run("anthropic", "bad_json")
    assert.equal("protocol", err.kind)
    assert.equal(2, err.event_index)
    assert.is_false(err.delivered)
  end)

  it("maps stop reasons", function()
    for raw, want in pairs({ end_turn = "stop", stop_sequence = "stop", max_tokens = "length",
        tool_use = "tool_use", refusal = "stop", something_new = "stop" }) do
      local events = decode("anthropic", {
        { event = "message_delta", data = '{"type":"message_delta","delta":{"stop_reason":"'
          .. raw .. '"},"usage":{"output_tokens":2}}' },
        { event = "message_stop", data = '{"type":"message_stop"}' } })
      assert_contract(events, true)
      assert.equal(want, ending(events).stop_reason)
      assert.equal(raw, ending(events).raw_stop_reason)
    end
  end)
end)

------------------------------------------------------------------------------
-- OpenAI Responses stream
------------------------------------------------------------------------------

describe("openai_responses decoder", function()
  it("decodes plain text and final usage", function()
    local events = run("openai_responses", "text")
    assert.same({ "message_start", "text_delta", "text_delta", "usage", "message_end" }, types(events))
    assert.same({ type = "message_start", provider = "openai_responses",
      model = "gpt-4.1-2025-04-14", id = "resp_T1" }, events[1])
    assert.same({ type = "message_end", stop_reason = "stop", raw_stop_reason = "completed",
      message = { role = "assistant", content = "Hello, wörld" }, usage = usage(12, 3, 4, 0) },
      ending(events))
  end)

  it("assembles function calls and reports tool_use", function()
    local events = run("openai_responses", "tools")
    assert_tool_calls(events, {
      { id = "call_A", name = "get_weather", raw = WEATHER_RAW, arguments = WEATHER },
      { id = "call_B", name = "get_time", raw = TIME_RAW, arguments = { tz = "Europe/Paris" } } })
    local e = ending(events)
    assert.equal("tool_use", e.stop_reason)
    assert.equal("completed", e.raw_stop_reason)
  end)

  it("decodes reasoning summaries as thinking", function()
    local events = run("openai_responses", "reasoning")
    assert.same({ "message_start", "thinking_delta", "thinking_delta", "text_delta", "usage",
      "message_end" }, types(events))
    local e = ending(events)
    assert.equal("**Adding** 2 and 2 gives 4.", e.message.thinking)
    assert.equal("It is 4.", e.message.content)
    assert.same(usage(30, 90, 0, 0), e.usage)
  end)

  it("returns response.failed as stream_error", function()
    local events, err = run("openai_responses", "failed")
    assert.same({ "message_start", "text_delta" }, types(events))
    assert.equal("stream_error", err.kind)
    assert.equal("server_error", err.code)
    assert.equal("The model failed to generate a response.", err.message)
    assert.is_true(err.delivered)
    assert.equal("openai_responses", err.provider)
  end)

  it("returns an error event as stream_error", function()
    local events, err = run("openai_responses", "error")
    assert.same({ "message_start" }, types(events))
    assert.equal("stream_error", err.kind)
    assert.equal("rate_limit_exceeded", err.code)
    assert.equal("Rate limit reached for requests.", err.message)
    assert.is_false(err.delivered)
    assert.equal("error", err.raw.type)
  end)

  it("fails truncated without response.completed", function()
    local _, err, where = run("openai_responses", "truncated")
    assert.equal("finish", where)
    assert.equal("truncated", err.kind)
    assert.matches("response%.completed", err.message)
    assert.is_true(err.delivered)
  end)

  it("ends response.incomplete for max_output_tokens as length", function()
    local events, err = run("openai_responses", "incomplete")
    assert.is_nil(err)
    local e = ending(events)
    assert.equal("length", e.stop_reason)
    assert.equal("max_output_tokens", e.raw_stop_reason)
    assert.equal("Long answ", e.message.content)
    assert.same(usage(12, 16, 0, 0), e.usage)
  end)

  it("reports invalid function-call JSON and empty arguments", function()
    local events = run("openai_responses", "bad_args")
    assert_tool_calls(events, {
      { id = "call_X", name = "read_file", raw = '{"path": "a.txt"', arguments = nil, error = true },
      { id = "call_Y", name = "list_dir", raw = "", arguments = {} } })
  end)

  it("takes the arguments of .done when no deltas came", function()
    local events = decode("openai_responses", {
      { event = "response.output_item.added", data = '{"type":"response.output_item.added",'
        .. '"output_index":0,"item":{"id":"fc_1","type":"function_call","arguments":"",'
        .. '"call_id":"call_1","name":"f"}}' },
      { event = "response.function_call_arguments.done", data = '{"type":'
        .. '"response.function_call_arguments.done","item_id":"fc_1","output_index":0,'
        .. '"arguments":"{\\"a\\": 1}"}' },
      { event = "response.completed", data = '{"type":"response.completed","response":'
        .. '{"id":"r","status":"completed"}}' } })
    assert_contract(events, true)
    assert.same({ a = 1 }, of_type(events, "tool_call_end")[1].arguments)
    assert.same({ a = 1 }, ending(events).message.tool_calls[1].arguments)
  end)

  it("fails protocol on invalid JSON", function()
    local _, err = run("openai_responses", "bad_json")
    assert.equal("protocol", err.kind)
    assert.equal(3, err.event_index)
  end)
end)

------------------------------------------------------------------------------
-- All providers
------------------------------------------------------------------------------

describe("every decoder", function()
  for provider in pairs(ADAPTERS) do
    it(provider .. " ignores unknown events, empty data and events after the end", function()
      local dec = ADAPTERS[provider].decoder({ model = "m" })
      for _, ev in ipairs({ { event = "future_thing", data = '{"type":"future_thing","x":1}' },
          { event = "message", data = "" }, { event = "message", data = "42" } }) do
        local out, err = dec:feed(ev)
        assert.is_nil(err)
        for _, e in ipairs(out) do assert.equal("message_start", e.type) end
      end
      local out, err = dec:finish()
      assert.is_nil(out)
      assert.equal("truncated", err.kind)
      assert.is_false(err.delivered)
    end)

    it(provider .. " counts tool and thinking events as delivered", function()
      local fixture_case = { openai = "tools", anthropic = "thinking", openai_responses = "tools" }
      local evs = split_sse(fixture(PREFIX[provider] .. "_" .. fixture_case[provider]))
      local head = { table.unpack(evs, 1, 3) }
      local events, err = decode(provider, head)
      assert.equal("truncated", err.kind)
      for _, e in ipairs(events) do assert.not_equal("text_delta", e.type) end
      assert.is_true(#events > 1)
      assert.is_true(err.delivered)
    end)

    it(provider .. " emits nothing twice after the end", function()
      local text = fixture(PREFIX[provider] .. "_text")
      local evs = split_sse(text)
      local dec = ADAPTERS[provider].decoder({})
      for _, ev in ipairs(evs) do assert(dec:feed(ev)) end
      assert.same({}, assert(dec:finish()))
      assert.same({}, assert(dec:feed(evs[#evs])))
    end)

    it(provider .. " uses the requested model when the stream names none", function()
      local dec = ADAPTERS[provider].decoder({ model = "requested" })
      local first = ({ openai = '{"choices":[{"index":0,"delta":{"content":"x"}}]}',
        anthropic = '{"type":"content_block_start","index":0,"content_block":{"type":"text","text":"x"}}',
        openai_responses = '{"type":"response.output_text.delta","delta":"x"}' })[provider]
      local out = assert(dec:feed({ event = "message", data = first }))
      assert.same({ type = "message_start", provider = provider, model = "requested" }, out[1])
      assert.same({ type = "text_delta", text = "x" }, out[2])
    end)
  end
end)

------------------------------------------------------------------------------
-- Through the C SSE parser, byte by byte
------------------------------------------------------------------------------

describe("fixtures through core.sse_parser", function()
  local ok, core = pcall(require, "luagent.core")
  local names = {}
  local dir = io.popen("ls spec/fixtures/providers")
  for name in dir:lines() do names[#names + 1] = name:match("^(.-)%.sse$") end
  dir:close()

  it("has every fixture listed", function()
    assert.is_true(#names >= 25)
  end)

  for _, name in ipairs(names) do
    it(name .. " decodes the same when fed one byte at a time", function()
      if not (ok and type(core) == "table" and core.sse_parser) then
        pending("luagent.core is not built")
        return
      end
      local text = fixture(name)
      local parser = core.sse_parser()
      local evs = {}
      for i = 1, #text do
        for _, ev in ipairs(assert(parser:feed(text:sub(i, i)))) do evs[#evs + 1] = ev end
      end
      assert.same(split_sse(text), evs)
      local provider = name:match("^openai_") and "openai" or name:match("^anthropic_") and "anthropic"
        or "openai_responses"
      local a, aerr = decode(provider, split_sse(text))
      local b, berr = decode(provider, evs)
      assert.same(a, b)
      assert.same(aerr, berr)
    end)
  end
end)

describe("the field lists of EVENTS.md", function()
  it("are read from the document: every stream event type, with its fields", function()
    local want = { "message_start", "text_delta", "thinking_delta", "tool_call_start", "tool_call_delta",
                   "tool_call_end", "usage", "message_end" }
    local got = {}
    for t in pairs(FIELDS) do got[#got + 1] = t end
    table.sort(got)
    table.sort(want)
    assert.same(want, got)
    assert.same({ provider = true, model = true, id = true }, FIELDS.message_start)
    assert.same({ input_tokens = true, output_tokens = true, cache_read_tokens = true, cache_write_tokens = true },
      FIELDS.usage)
    -- message_end's own table, not the stop reason mapping after it
    assert.same({ stop_reason = true, raw_stop_reason = true, message = true, usage = true, error = true },
      FIELDS.message_end)
  end)
end)
