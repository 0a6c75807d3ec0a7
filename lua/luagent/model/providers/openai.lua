-- OpenAI Chat Completions adapter (and the many servers that speak it):
-- builds POST {base}/chat/completions and decodes its streamed chunks into
-- the normalized events of lua/luagent/EVENTS.md; and all else about the
-- format (lua/luagent/model/provider.lua lists the fields), its mock side
-- last. Pure Lua, no I/O.
local common = require "luagent.model.providers.common"

local M = {
  name = "openai",
  kinds = { openai = { key_env = "OPENAI_API_KEY", base_env = "OPENAI_BASE_URL" } },
  default_base_url = "https://api.openai.com/v1",
  -- a base URL includes the version, as the OpenAI SDK takes it; a bare
  -- host gets /v1 (provider.base_url)
  version_path = "/v1", base_form = "versioned",
  path = "/chat/completions",
  -- Azure's no_capacity reads like an overflow; it is a rate limit
  stream_errors = { rate_limit_exceeded = "rate_limited", no_capacity = "rate_limited" },
  -- OpenAI's words, and those of servers that speak its chat format
  overflow_phrases = {
    "context_length_exceeded",            -- OpenAI code
    "maximum context length",             -- OpenAI, OpenRouter
    "maximum prompt length",              -- xAI
    "reduce the length of the messages",  -- Groq
    "exceeds the available context size", -- llama.cpp
    "greater than the context length",    -- LM Studio
  },
  secret_headers = { "openai-organization", "openai-project" },
  replay_fields = { "messages" },
}

------------------------------------------------------------------------------
-- Request
------------------------------------------------------------------------------

-- A content part in Chat Completions form (common.check_parts checked it).
-- `dialect` is "openrouter" when OpenRouter sends it: it takes a file by
-- URL in file_data, which OpenAI's own endpoint does not.
local function part(p, dialect)
  if p.type == "text" then return { type = "text", text = p.text } end
  if p.type == "image" then
    return { type = "image_url", image_url = { url = p.url or common.data_url(p), detail = p.detail } }
  end
  if p.url and dialect ~= "openrouter" then
    error("a file part by url is not sent by Chat Completions (give data = and mime =, or use openai_responses)", 0)
  end
  return { type = "file", file = { filename = common.part_name(p), file_data = p.url or common.data_url(p) } }
end

-- One history message in Chat Completions form.
local function message(m, dialect)
  if m.role == "user" then
    return { role = "user", content = common.render_parts(m.content, function(p) return part(p, dialect) end) }
  elseif m.role == "tool" then
    return { role = "tool", tool_call_id = m.tool_call_id, content = common.result_text(m.content) }
  end
  local out = { role = "assistant" }
  local calls = m.tool_calls
  if type(calls) == "table" and calls[1] ~= nil then
    out.tool_calls = {}
    for i, c in ipairs(calls) do
      out.tool_calls[i] = { id = c.id, type = "function",
        ["function"] = { name = c.name, arguments = common.arguments_text(c) } }
    end
    if m.content ~= nil and m.content ~= "" then out.content = m.content end
  else
    out.content = m.content or ""
  end
  return out
end

-- Builds the HTTP request for `req` (its shape: EVENTS.md, "Conversation
-- history and request") for `dialect` ("openai", or "openrouter": its
-- reasoning object, files by URL).
function M.build_dialect(dialect, req, opts)
  common.check_request(dialect, req)
  opts = opts or {}
  local stream = req.stream ~= false
  local messages = {}
  if req.system ~= nil and req.system ~= "" then
    messages[1] = { role = "system", content = req.system }
  end
  for i, m in ipairs(req.messages) do
    local ok, out = pcall(message, m, dialect)
    if not ok then error(dialect .. ".build: messages[" .. i .. "]: " .. tostring(out), 2) end
    messages[#messages + 1] = out
  end
  local body = { model = req.model, messages = common.array(messages), stream = stream,
    max_completion_tokens = req.max_tokens, temperature = req.temperature }
  local reasoning, thinking = req.reasoning, req.thinking
  if dialect == "openrouter" then
    -- one of effort (OpenAI-style) or max_tokens (Anthropic-style)
    if reasoning and reasoning.effort then
      body.reasoning = { effort = reasoning.effort }
    elseif thinking and thinking.budget_tokens then
      body.reasoning = { max_tokens = thinking.budget_tokens }
    end
  elseif reasoning and reasoning.effort then
    body.reasoning_effort = reasoning.effort
  end
  if stream then body.stream_options = { include_usage = true } end
  if common.has_tools(req.tools) then
    body.tools = {}
    for i, t in ipairs(req.tools) do
      body.tools[i] = { type = "function", ["function"] = { name = t.name,
        description = t.description, parameters = common.schema(t.parameters) } }
    end
  end
  if req.output then -- structured output, strict when the schema allows it
    body.response_format = { type = "json_schema", json_schema = { name = req.output.name,
      schema = common.output_schema(req.output), strict = common.output_strict(req.output) } }
  end
  local headers = { ["content-type"] = "application/json" }
  if opts.api_key then headers.authorization = "Bearer " .. opts.api_key end
  return common.post(M, opts, M.path, headers, body, stream)
end

function M.build(req, opts) return M.build_dialect(M.name, req, opts) end

------------------------------------------------------------------------------
-- Stream
------------------------------------------------------------------------------

local STOP = { stop = "stop", length = "length", tool_calls = "tool_use",
  function_call = "tool_use", content_filter = "stop" }

local want, need = common.want, common.need

-- Applies tool_calls entry t of choice c. Calls are keyed by `index`;
-- servers that omit it are matched by id, else continue the last call.
local function tool_delta(dec, tc, c, t)
  local key = want(tc.index, "integer", "choices[%d].delta.tool_calls[%d].index", c, t)
  local id = want(tc.id, "string", "choices[%d].delta.tool_calls[%d].id", c, t)
  local fn = want(tc["function"], "object", "choices[%d].delta.tool_calls[%d].function", c, t)
  local name, arguments
  if fn then
    name = want(fn.name, "string", "choices[%d].delta.tool_calls[%d].function.name", c, t)
    arguments = want(fn.arguments, "string", "choices[%d].delta.tool_calls[%d].function.arguments", c, t)
  end
  if key == nil then key = id or dec.last_key or 0 end
  dec.last_key = key
  local call = dec:call(key)
  if call == nil then call = dec:open_call(key, id, name) end
  dec:add_arguments(call, arguments)
end

-- Applies choice i of a chunk.
local function choice_delta(dec, choice, i)
  local delta = want(choice.delta, "object", "choices[%d].delta", i)
  if delta then
    dec:add_text(want(delta.content, "string", "choices[%d].delta.content", i))
    local rc = want(delta.reasoning_content, "string", "choices[%d].delta.reasoning_content", i)
    local reasoning = want(delta.reasoning, "string", "choices[%d].delta.reasoning", i)
    dec:add_thinking(rc or reasoning)
    local calls = want(delta.tool_calls, "array", "choices[%d].delta.tool_calls", i)
    for t = 1, calls and #calls or 0 do
      tool_delta(dec, need(calls[t], "object", "choices[%d].delta.tool_calls[%d]", i, t), i, t)
    end
  end
  local reason = want(choice.finish_reason, "string", "choices[%d].finish_reason", i)
  if reason == "error" then
    return dec:stream_error(nil, "stream ended with finish_reason \"error\"")
  elseif reason then
    dec:set_stop(STOP[reason] or "stop", reason)
    dec:close_calls()
  end
end

-- Turns one chunk into events.
local function handle(dec, chunk)
  local e = common.error_object(chunk.error, "error")
  if e then return dec:stream_error(e, nil, chunk.error) end
  dec:start(want(chunk.id, "string", "id"), want(chunk.model, "string", "model"))
  local choices = want(chunk.choices, "array", "choices")
  for i = 1, choices and #choices or 0 do
    local ok, err = choice_delta(dec, need(choices[i], "object", "choices[%d]", i), i)
    if ok == nil and err then return nil, err end
  end
  local u = want(chunk.usage, "object", "usage")
  if u then
    local details = want(u.prompt_tokens_details, "object", "usage.prompt_tokens_details")
    dec:set_usage(common.usage(want(u.prompt_tokens, "number", "usage.prompt_tokens"),
      want(u.completion_tokens, "number", "usage.completion_tokens"),
      details and want(details.cached_tokens, "number", "usage.prompt_tokens_details.cached_tokens"), 0))
  end
end

-- The fast path (host/chunk.c): what `handle` does for a chunk that C read
-- without decoding it (no error, no tool calls, no usage, one choice at
-- most). Returns false when C declined the chunk.
local has_core, core = pcall(require, "luagent.core")
local read_chunk = has_core and core.openai_chunk
local function fast(dec, data)
  local started = dec.started
  local ok, id, model, choices, content, thinking, reason = read_chunk(data, started)
  if not ok then return false end
  if not started then dec:start(id, model) end
  if choices == 1 then
    if content then dec:add_text(content) end
    if thinking then dec:add_thinking(thinking) end
    if reason then
      dec:set_stop(STOP[reason] or "stop", reason)
      dec:close_calls()
    end
  end
  return true
end

-- Whether the core has the fast path (a constant: not to be assigned).
local HAS_FAST = read_chunk ~= nil

-- A decoder for one response stream; ctx = {model=, fast=}: fast = false
-- decodes every chunk in Lua (specs compare both ways).
function M.decoder(ctx)
  local dec = common.decoder(M.name, ctx, handle, "[DONE]", "[DONE]")
  if HAS_FAST and ctx.fast ~= false then dec.fast = fast end
  return dec
end

------------------------------------------------------------------------------
-- The mock's side (lua/luagent/mock/replies.lua says what each field is)
------------------------------------------------------------------------------

local O, null, array, event = common.object, common.null, common.array, common.event

local mock = { title = "OpenAI chat completions" }
M.mock = mock

function mock.read(body)
  local rf = type(body.response_format) == "table" and body.response_format
  local js = rf and type(rf.json_schema) == "table" and rf.json_schema
  return { messages = common.mock_messages(body.messages), tools = common.mock_tools(body.tools, common.openai_tool),
    include_usage = type(body.stream_options) == "table" and body.stream_options.include_usage == true,
    output = js and type(js.schema) == "table" and js.schema or nil }
end

-- The id of a chat completion (an OpenRouter generation's id) for request ctx.n.
function mock.message_id(ctx) return "chatcmpl-mock" .. ctx.n end

-- A chat.completion.chunk with one choice (or the given choices).
local function chunk(view, ctx, delta, finish, choices, usage)
  return event(nil, O(
    "id", mock.message_id(ctx), "object", "chat.completion.chunk",
    "created", ctx.created, "model", view.model,
    "choices", choices or array { O("index", 0, "delta", delta,
      "logprobs", null, "finish_reason", finish or null) },
    "usage", usage or (view.include_usage and null or nil)))
end

-- OpenAI usage object.
local function usage_object(view, output)
  return O("prompt_tokens", view.input_tokens, "completion_tokens", output,
    "total_tokens", view.input_tokens + output)
end

function mock.stream(view, reply, ctx)
  local calls = reply.calls
  local tool = calls[1]
  local events = {}
  local function add(e) events[#events + 1] = e end
  if tool then
    add(chunk(view, ctx, O("role", "assistant", "content", null)))
    for _, p in ipairs(reply.words) do add(chunk(view, ctx, O("content", p))) end
    for i, c in ipairs(calls) do
      add(chunk(view, ctx, O("tool_calls", array { O(
        "index", i - 1, "id", "call_mock" .. c.id, "type", "function",
        "function", O("name", c.name, "arguments", "")) })))
      for _, p in ipairs(c.pieces) do
        add(chunk(view, ctx, O("tool_calls", array { O(
          "index", i - 1, "function", O("arguments", p)) })))
      end
    end
  else
    add(chunk(view, ctx, O("role", "assistant", "content", "", "refusal", null)))
    for _, p in ipairs(reply.words) do add(chunk(view, ctx, O("content", p))) end
  end
  add(chunk(view, ctx, O(), reply.stop == "length" and "length" or tool and "tool_calls" or "stop"))
  if view.include_usage then
    add(chunk(view, ctx, nil, nil, array(), usage_object(view, reply.output_tokens)))
  end
  add({ data = "[DONE]" })
  return events
end

function mock.complete(view, reply, ctx)
  local message
  local calls = reply.calls
  if calls[1] then
    local list = array()
    for i, c in ipairs(calls) do
      list[i] = O("id", "call_mock" .. c.id, "type", "function",
        "function", O("name", c.name, "arguments", c.json))
    end
    message = O("role", "assistant", "content", reply.text or null, "refusal", null, "tool_calls", list)
  else
    message = O("role", "assistant", "content", reply.text, "refusal", null)
  end
  return common.encode(O("id", mock.message_id(ctx), "object", "chat.completion",
    "created", ctx.created, "model", view.model,
    "choices", array { O("index", 0, "message", message, "logprobs", null,
      "finish_reason", reply.stop == "length" and "length" or calls[1] and "tool_calls" or "stop") },
    "usage", usage_object(view, reply.output_tokens)))
end

-- Per status: the error's type and code.
local ERRORS = {
  [400] = { "invalid_request_error" },
  [401] = { "invalid_request_error", "invalid_api_key" },
  [402] = { "insufficient_quota", "insufficient_quota" },
  [403] = { "invalid_request_error", "permission_denied" },
  [404] = { "invalid_request_error", "model_not_found" },
  [408] = { "server_error", "timeout" },
  [409] = { "invalid_request_error", "conflict" },
  [413] = { "invalid_request_error", "request_too_large" },
  [429] = { "requests", "rate_limit_exceeded" },
  [500] = { "server_error" }, [502] = { "server_error" }, [503] = { "server_error" },
  [504] = { "server_error" }, [529] = { "server_error" },
}

-- The error body of the OpenAI formats; `param` is what an overflow names
-- (the responses API says "input").
function M.mock_error_body(status, e, param)
  local t = ERRORS[status] or { status < 500 and "invalid_request_error" or "server_error" }
  local etype, code = t[1], t[2]
  if e.overflow then etype, code = "invalid_request_error", "context_length_exceeded" end
  if e.type then etype, code = e.type, e.type end
  return common.encode(O("error", O("message", e.message, "type", etype,
    "param", e.overflow and param or null, "code", code or null)))
end

function mock.error_body(status, e) return M.mock_error_body(status, e, "messages") end

mock.overflow_message = "This model's maximum context length is 200000 tokens. However, your messages "
  .. "resulted in 210000 tokens. Please reduce the length of the messages."

function mock.stream_error(etype, message)
  return event(nil, O("error", O("message", message, "type", etype, "param", null, "code", etype)))
end

-- The phase of a chunk; nil for an event that is not one.
function mock.phase(e)
  local name, data = e.event, e.data
  if data == "[DONE]" then return "end" end
  if name ~= nil and name ~= "message" then return nil end
  local c = common.decode(data)
  if type(c) ~= "table" or type(c.choices) ~= "table" then return nil end
  local choice = c.choices[1]
  if choice == nil then return c.usage and "finish" or "open" end
  if choice.finish_reason ~= nil and choice.finish_reason ~= null then return "finish" end
  local delta = type(choice.delta) == "table" and choice.delta or {}
  if type(delta.content) == "string" and delta.content ~= "" then return "delta" end
  local call = type(delta.tool_calls) == "table" and delta.tool_calls[1]
  if type(call) == "table" and type(call["function"]) == "table"
    and (call["function"].arguments or "") ~= "" then
    return "delta"
  end
  return "open"
end

return M
