-- One agent script against the three wire formats on the mock (OpenAI chat
-- completions, Anthropic messages, OpenAI responses): the same events, the
-- same provider-neutral history, and that history round-trips through each
-- adapter, including an agent that continues in another format what an
-- agent began in one.
local luagent = require "luagent"
local mock = require "luagent.mock"
local json = require "luagent.base.json"

local KINDS = { "openai", "anthropic", "openai_responses" }

local add = { name = "add", description = "Adds two integers", read_only = true,
  params = { type = "object", properties = { a = { type = "integer" }, b = { type = "integer" } },
             required = { "a", "b" } },
  run = function(args) return tostring(args.a + args.b) end }
local fail = { name = "fail", description = "Always fails", read_only = true,
  run = function() return nil, "no such crash" end }

-- The script: two tool calls (one fails), then an answer with text.
local function script(_, n)
  if n == 1 then
    return { text = "Adding.", tools = { { id = "x1", name = "add", arguments = { a = 2, b = 40 } },
                                          { id = "x2", name = "fail", arguments = {} } } }
  end
  return { text = "The sum is 42." }
end

-- The request body's conversation turned back into neutral messages: what
-- each wire format carries of text, tool calls and tool results.
local function from_wire(kind, body)
  local out = {}
  if kind == "openai" then
    for _, m in ipairs(body.messages) do
      if m.role == "user" then out[#out + 1] = { role = "user", content = m.content }
      elseif m.role == "tool" then out[#out + 1] = { role = "tool", tool_call_id = m.tool_call_id, content = m.content }
      elseif m.role == "assistant" then
        local calls
        for i, c in ipairs(m.tool_calls or {}) do
          calls = calls or {}
          calls[i] = { id = c.id, name = c["function"].name, arguments = json.decode(c["function"].arguments) }
        end
        out[#out + 1] = { role = "assistant", content = m.content ~= json.null and m.content or "", tool_calls = calls }
      end
    end
  elseif kind == "anthropic" then
    for _, m in ipairs(body.messages) do
      if type(m.content) == "string" then
        out[#out + 1] = { role = m.role, content = m.content }
      elseif m.role == "assistant" then
        local msg = { role = "assistant", content = "" }
        for _, b in ipairs(m.content) do
          if b.type == "text" then msg.content = b.text
          elseif b.type == "tool_use" then
            msg.tool_calls = msg.tool_calls or {}
            msg.tool_calls[#msg.tool_calls + 1] = { id = b.id, name = b.name, arguments = b.input }
          end
        end
        out[#out + 1] = msg
      else
        for _, b in ipairs(m.content) do
          if b.type == "tool_result" then
            out[#out + 1] = { role = "tool", tool_call_id = b.tool_use_id, content = b.content, is_error = b.is_error }
          end
        end
      end
    end
  else
    local last
    for _, it in ipairs(body.input) do
      if it.role == "user" then out[#out + 1] = { role = "user", content = it.content }
      elseif it.role == "assistant" then
        last = { role = "assistant", content = it.content }
        out[#out + 1] = last
      elseif it.type == "function_call" then
        if not (last and out[#out] == last) then
          last = { role = "assistant", content = "" }
          out[#out + 1] = last
        end
        last.tool_calls = last.tool_calls or {}
        last.tool_calls[#last.tool_calls + 1] = { id = it.call_id, name = it.name, arguments = json.decode(it.arguments) }
      elseif it.type == "function_call_output" then
        out[#out + 1] = { role = "tool", tool_call_id = it.call_id, content = it.output }
      end
    end
  end
  return out
end

-- The history as the wire can carry it (ids, names, arguments, text, results).
local function neutral(kind, messages)
  local out = {}
  for i, m in ipairs(messages) do
    local c = { role = m.role, content = m.content }
    if m.role == "tool" then
      c.tool_call_id = m.tool_call_id
      if kind == "anthropic" then c.is_error = m.is_error end
    end
    if m.tool_calls then
      c.tool_calls = {}
      for j, t in ipairs(m.tool_calls) do c.tool_calls[j] = { id = t.id, name = t.name, arguments = t.arguments } end
    end
    out[i] = c
  end
  return out
end

local srv
before_each(function()
  luagent.configure { log_sink = function() end }
  luagent.clock.virtual()
  srv = assert(mock.start { script = script })
end)
after_each(function()
  srv:close()
  luagent.configure { log_sink = false }
  luagent.clock.real()
end)

local function agent(kind, messages)
  return luagent.agent { name = kind, model = { kind = kind, model = "m", base_url = srv.url .. "/v1", api_key = "k" },
    tools = { add, fail }, messages = messages, policy = { tool = { max_retries = 0 } } }
end

describe("the same agent script on every wire format", function()
  local histories = {}

  for _, kind in ipairs(KINDS) do
    it("runs on " .. kind .. " with the same events and history", function()
      local a = agent(kind)
      local types, ends = {}, {}
      for ev in a:prompt("What is 2 + 40?") do
        if ev.type:match("^agent_") or ev.type:match("^turn_") or ev.type:match("^tool_execution") then
          types[#types + 1] = ev.type
        end
        if ev.type == "tool_execution_end" then ends[ev.name == "add" and 1 or 2] = ev end
        if ev.type == "agent_end" then assert.equal("stop", ev.stop_reason) end
      end
      assert.equal("agent_start turn_start tool_execution_start tool_execution_start tool_execution_end "
        .. "tool_execution_end turn_end turn_start turn_end agent_end", table.concat(types, " "))
      assert.equal("42", ends[1].result)
      assert.equal("fail failed: no such crash", ends[2].error.message)
      local m = a.messages
      assert.equal(5, #m)
      assert.equal("Adding.", m[2].content)
      assert.equal(2, #m[2].tool_calls)
      assert.same({ a = 2, b = 40 }, m[2].tool_calls[1].arguments)
      assert.equal("add", m[2].tool_calls[1].name)
      assert.equal("42", m[3].content)
      assert.is_true(m[4].is_error)
      assert.equal("The sum is 42.", m[5].content)
      -- the second request carried the history in this wire format, and it
      -- reads back as the history the agent holds
      local body = srv:requests()[2].body
      assert.same(neutral(kind, { table.unpack(m, 1, 4) }), from_wire(kind, body))
      histories[kind] = m
    end)
  end

  for _, from in ipairs(KINDS) do
    for _, to in ipairs(KINDS) do
      if from ~= to then
        it("continues on " .. to .. " a history begun on " .. from, function()
          local h = histories[from]
          assert.is_table(h)
          local copy = {}
          for i, m in ipairs(h) do copy[i] = m end
          copy[#copy + 1] = { role = "user", content = "And 1 + 1?" }
          local want = neutral(to, copy)
          local a = agent(to, copy)
          local last
          for ev in a:continue() do last = ev end
          assert.equal("stop", last.stop_reason)
          local reqs = srv:requests()
          assert.same(want, from_wire(to, reqs[1].body)) -- the first request of the new agent
          assert.equal(#want + 4, #a.messages) -- its own turn: calls, 2 results, answer
        end)
      end
    end
  end
end)

describe("thinking in the history", function()
  -- The assistant message an adapter decodes from a recorded Anthropic
  -- stream with a signed thinking block.
  local function decoded_thinking_message()
    local f = assert(io.open("spec/fixtures/providers/anthropic_thinking.sse"))
    local text = f:read("a")
    f:close()
    local parser = require("luagent.core").sse_parser()
    local dec = require("luagent.model.providers.anthropic").decoder { model = "m" }
    local msg
    for _, sse in ipairs(assert(parser:feed(text))) do
      for _, ev in ipairs(assert(dec:feed(sse))) do
        if ev.type == "message_end" then msg = ev.message end
      end
    end
    return assert(msg)
  end

  it("goes back to Anthropic as the signed block it came as; other formats leave it out", function()
    local msg = decoded_thinking_message()
    assert.equal("Let me add: 2 + 2 = 4.", msg.thinking)
    for _, kind in ipairs(KINDS) do
      local a = agent(kind, { { role = "user", content = "2 + 2?" }, msg, { role = "user", content = "And 40 + 2?" } })
      a.sources = {} -- no tools: the scripted model answers with text
      for _ in a:continue() do end
      local body = srv:requests()[#srv:requests()].body
      if kind == "anthropic" then
        local blocks = body.messages[2].content
        assert.same({ type = "thinking", thinking = "Let me add: 2 + 2 = 4.",
          signature = "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds" }, blocks[1])
        assert.same({ type = "text", text = "It is 4." }, blocks[2])
      else
        local text = json.encode(body)
        assert.not_matches("Let me add", text)
        assert.matches("It is 4%.", text)
      end
    end
  end)
end)
