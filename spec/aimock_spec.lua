-- The provider adapters against aimock (@copilotkit/aimock, a mock LLM server
-- written by others; see peers/): for each wire format aimock serves (Chat
-- Completions, Anthropic Messages, Responses) a text reply, a tool-call reply
-- and text with two tool calls are streamed through provider:stream over
-- loopback, and the normalized events checked against lua/luagent/EVENTS.md
-- and the fixture. Skipped, and counted as such, without node or the peers.
local luagent = require "luagent"
local cjson = require "cjson"
local peers = require "peers"

local MODEL = "aimock-test-model"

-- One case per fixture: what the user says and what aimock answers. Usage
-- is set in the fixture so every format reports known numbers.
local CASES = {
  { name = "a text reply", say = "say hello",
    content = "Hello from aimock: a reply long enough to arrive in several chunks.",
    usage = { input = 11, output = 7 } },
  { name = "a tool-call reply", say = "weather please",
    tools = { { id = "call_w1", name = "get_weather",
      arguments = { city = "Paris", days = 3, units = { temp = "C", wind = "km/h" } } } },
    usage = { input = 13, output = 9 } },
  { name = "text then two tool calls", say = "both please",
    content = "Checking two things.",
    tools = { { id = "call_a", name = "get_weather", arguments = { city = "Oslo" } },
              { id = "call_b", name = "get_time", arguments = {} } },
    usage = { input = 5, output = 4 } },
}

-- Each wire format with the raw stop reasons aimock sends for it.
local KINDS = {
  { kind = "openai", raw_stop = "stop", raw_tool_stop = "tool_calls" },
  { kind = "anthropic", raw_stop = "end_turn", raw_tool_stop = "tool_use" },
  { kind = "openai_responses", raw_stop = "completed", raw_tool_stop = "completed" },
}

-- Tools offered in every request (aimock matches on the user message; the
-- tools make the request realistic and exercise their encoding).
local TOOLS = {
  { name = "get_weather", description = "Weather for a city",
    parameters = { type = "object", required = { "city" }, properties = {
      city = { type = "string" }, days = { type = "integer" },
      units = { type = "object", properties = {} } } } },
  { name = "get_time", description = "The time now", parameters = { type = "object", properties = {} } },
}

-- The aimock fixture file for CASES.
local function fixtures()
  local list = {}
  for i, c in ipairs(CASES) do
    local calls
    for j, t in ipairs(c.tools or {}) do
      calls = calls or {}
      calls[j] = { id = t.id, name = t.name, arguments = t.arguments }
    end
    list[i] = { match = { userMessage = c.say }, response = { content = c.content, toolCalls = calls,
      usage = { prompt_tokens = c.usage.input, completion_tokens = c.usage.output,
        total_tokens = c.usage.input + c.usage.output } } }
  end
  return cjson.encode({ fixtures = list })
end

-- The events, one JSON line each, to show what a failing check saw.
local function trace(events)
  local lines = {}
  for i, ev in ipairs(events) do
    local ok, text = pcall(cjson.encode, ev)
    lines[i] = string.format("%3d %s", i, ok and text or tostring(ev.type))
  end
  return table.concat(lines, "\n")
end

-- Streams one user message through a provider of `kind` at aimock and
-- returns every event, or nil and the error record. Bounded in time.
local function stream(url, kind, say, base_path)
  local p = luagent.provider { kind = kind, model = MODEL, base_url = url .. (base_path or "/v1"), api_key = "test" }
  return luagent.deadline(20, function()
    local iter, err = p:stream({ messages = { { role = "user", content = say } }, tools = TOOLS },
      { timeout = { connect = 2, first_byte = 10, idle = 10 } })
    if not iter then return nil, err end
    local events = {}
    for ev in iter do events[#events + 1] = ev end
    return events
  end)
end

-- Checks the events of case `c` from wire format `k`.
local function check(events, k, c)
  local first, last = events[1], events[#events]
  assert.equal("message_start", first.type)
  assert.equal(k.kind, first.provider)
  assert.equal(MODEL, first.model)
  assert.is_string(first.id)
  assert.equal("message_end", last.type)

  local count, texts, starts, ends, usage = {}, {}, {}, {}, nil
  for i, ev in ipairs(events) do
    count[ev.type] = (count[ev.type] or 0) + 1
    if ev.type == "text_delta" then
      assert.is_true(#ev.text > 0, "empty text_delta")
      texts[#texts + 1] = ev.text
    elseif ev.type == "tool_call_start" then
      assert.is_nil(starts[ev.index], "second tool_call_start for index " .. ev.index)
      starts[ev.index] = ev
    elseif ev.type == "tool_call_delta" then
      assert.is_truthy(starts[ev.index], "tool_call_delta before its start")
      assert.is_nil(ends[ev.index], "tool_call_delta after its end")
      assert.is_true(#ev.arguments > 0, "empty tool_call_delta")
    elseif ev.type == "tool_call_end" then
      assert.is_truthy(starts[ev.index], "tool_call_end before its start")
      assert.is_nil(ends[ev.index], "second tool_call_end for index " .. ev.index)
      ends[ev.index] = ev
    elseif ev.type == "usage" then
      assert.equal(#events - 1, i, "usage must come right before message_end")
      usage = ev
    else
      assert.is_truthy(ev.type == "message_start" or ev.type == "message_end", "unexpected " .. tostring(ev.type))
    end
  end
  assert.equal(1, count.message_start)
  assert.equal(1, count.message_end)
  assert.equal(c.content or "", table.concat(texts))

  local want = c.tools or {}
  assert.equal(#want, count.tool_call_start or 0)
  assert.equal(#want, count.tool_call_end or 0)
  for j, t in ipairs(want) do
    assert.same({ type = "tool_call_start", index = j, id = t.id, name = t.name }, starts[j])
    local e = ends[j]
    assert.equal(t.id, e.id)
    assert.equal(t.name, e.name)
    assert.is_nil(e.error)
    assert.same(t.arguments, e.arguments)
    assert.same(t.arguments, cjson.decode(e.raw_arguments))
  end
  if c.tools and c.tools[1].arguments.days then
    assert.equal("integer", math.type(ends[1].arguments.days))
  end

  local want_usage = { input_tokens = c.usage.input, output_tokens = c.usage.output,
    cache_read_tokens = 0, cache_write_tokens = 0 }
  assert.same(want_usage, last.usage)
  want_usage.type = "usage"
  assert.same(want_usage, usage)

  assert.equal(c.tools and "tool_use" or "stop", last.stop_reason)
  assert.equal(c.tools and k.raw_tool_stop or k.raw_stop, last.raw_stop_reason)
  assert.is_nil(last.error)
  local m = last.message
  assert.equal("assistant", m.role)
  assert.equal(c.content or "", m.content)
  assert.is_nil(m.thinking)
  if not c.tools then
    assert.is_nil(m.tool_calls)
  else
    assert.equal(#want, #m.tool_calls)
    for j, t in ipairs(want) do
      assert.same({ id = t.id, name = t.name, arguments = t.arguments,
        raw_arguments = ends[j].raw_arguments }, m.tool_calls[j])
    end
  end
end

local aimock, why = peers.find("@copilotkit/aimock", "aimock")

describe("provider adapters against aimock", function()
  if not aimock then
    pending("aimock not installed: run `make peers` (needs node and npm): " .. why)
    return
  end

  local server
  lazy_setup(function()
    local err
    server, err = peers.start {
      node = aimock.node, script = aimock.bin,
      files = { ["fixtures.json"] = fixtures(),
                ["aimock.json"] = '{"llm":{"fixtures":"{dir}/fixtures.json"}}' },
      args = { "--config", "{dir}/aimock.json", "--host", "127.0.0.1", "--port", "{port}" },
    }
    assert(server, "aimock " .. aimock.version .. " did not start: " .. tostring(err))
  end)

  lazy_teardown(function()
    if server then server:stop() end
  end)

  for _, k in ipairs(KINDS) do
    describe(k.kind .. " (aimock " .. aimock.version .. ")", function()
      for _, c in ipairs(CASES) do
        it("streams " .. c.name, function()
          local events, err = stream(server.url, k.kind, c.say)
          assert(events, tostring(err))
          local ok, failure = pcall(check, events, k, c)
          if not ok then
            io.stderr:write("\n", k.kind, " / ", c.name, ": events\n", trace(events), "\n")
            error(failure, 0)
          end
        end)
      end

      -- the issue-26 case: ANTHROPIC_BASE_URL as the Anthropic SDK takes
      -- it (the host), which failed with a bare 404
      it("takes aimock's host alone as its base URL, as the SDKs do", function()
        local events, err = stream(server.url, k.kind, CASES[1].say, "")
        assert(events, tostring(err))
        check(events, k, CASES[1])
      end)

      -- (aimock answers any path ending in /chat/completions or /responses:
      -- only Anthropic's base URL can be wrong enough for a 404 there)
      if k.kind == "anthropic" then it("names the URL, aimock's own words and the base URL's shape in a 404", function()
        local events, err = stream(server.url, k.kind, CASES[1].say, "/nowhere/v9")
        assert.is_nil(events)
        assert.equal(404, err.status)
        assert.matches("^HTTP 404 from POST " .. server.url:gsub("%p", "%%%0") .. "/nowhere/v9/", err.message)
        assert.matches("check the base URL '" .. server.url:gsub("%p", "%%%0") .. "/nowhere/v9' %(the provider's "
          .. "base_url%): it should look like https://", err.message)
        assert.matches(": not_found: Not found; check the base URL", err.message)
      end) end
    end)
  end
end)
