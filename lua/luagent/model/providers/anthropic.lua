-- Anthropic Messages adapter: builds POST {base}/messages and decodes its
-- streamed events into the normalized events of lua/luagent/EVENTS.md; and
-- all else about the format (lua/luagent/model/provider.lua lists the
-- fields), its mock side last. Pure Lua, no I/O.
local common = require "luagent.model.providers.common"

local M = {
  name = "anthropic",
  kinds = { anthropic = { key_env = "ANTHROPIC_API_KEY", base_env = "ANTHROPIC_BASE_URL" } },
  default_base_url = "https://api.anthropic.com/v1",
  -- a base URL with or without /v1 (provider.base_url): the API's root, as the
  -- Anthropic SDK takes ANTHROPIC_BASE_URL, or ending in /v1 (the AI SDK's form)
  version_path = "/v1", base_form = "root",
  path = "/messages",
  version = "2023-06-01",
  default_max_tokens = 4096,
  stream_errors = { rate_limit_error = "rate_limited", overloaded_error = "overloaded" },
  overflow_phrases = {
    "model_context_window_exceeded",      -- its stop reason
    "prompt is too long",
  },
  secret_headers = { "x-api-key", "anthropic-organization-id" },
  replay_fields = { "system", "messages" },
}

------------------------------------------------------------------------------
-- Request
------------------------------------------------------------------------------

-- The assistant's content blocks: its signed thinking (only a signed block
-- can be sent back), text, then tool_use blocks.
local function assistant_blocks(m)
  local blocks = {}
  if type(m.thinking) == "string" and m.thinking ~= "" and type(m.thinking_signature) == "string" then
    blocks[#blocks + 1] = { type = "thinking", thinking = m.thinking, signature = m.thinking_signature }
  end
  local text = m.content
  -- an aborted answer's text may end mid-line; sent last it is a prefill,
  -- which the API refuses when it ends in whitespace
  if m.incomplete and type(text) == "string" then text = text:gsub("%s+$", "") end
  if type(text) == "string" and text ~= "" then
    blocks[#blocks + 1] = { type = "text", text = text }
  end
  for _, c in ipairs(type(m.tool_calls) == "table" and m.tool_calls or {}) do
    blocks[#blocks + 1] = { type = "tool_use", id = c.id, name = c.name,
      input = common.arguments_value(c) }
  end
  return blocks
end

-- A content part as an Anthropic block (common.check_parts checked it):
-- an image, a document (a file), by URL or base64 data.
local function part(p)
  if p.type == "text" then return { type = "text", text = p.text } end
  local source
  if p.url then
    source = { type = "url", url = p.url }
  else
    source = { type = "base64", media_type = p.mime, data = p.data }
  end
  if p.type == "image" then return { type = "image", source = source } end
  return { type = "document", source = source, title = p.name }
end

-- A user message's content: text, or its parts as blocks.
local function user_content(content)
  return common.render_parts(content, part)
end

-- Translates the history. Tool results become tool_result blocks of one user
-- message (consecutive results share it, and user text that follows joins it
-- as a text block, as the API wants one user turn after a tool_use turn).
local function messages(history)
  local out, results = {}, nil
  for _, m in ipairs(history) do
    if m.role == "tool" then
      if results == nil then
        results = {}
        out[#out + 1] = { role = "user", content = results }
      end
      results[#results + 1] = { type = "tool_result", tool_use_id = m.tool_call_id,
        content = common.result_text(m.content), is_error = m.is_error == true }
    elseif m.role == "user" and results ~= nil then
      if type(m.content) == "table" then
        for _, p in ipairs(m.content) do results[#results + 1] = part(p) end
      else
        results[#results + 1] = { type = "text", text = m.content or "" }
      end
    else
      results = nil
      if m.role == "user" then
        out[#out + 1] = { role = "user", content = user_content(m.content) }
      else
        local blocks = assistant_blocks(m)
        out[#out + 1] = { role = "assistant", content = blocks[1] and blocks or (m.content or "") }
      end
    end
  end
  return out
end

-- cache = true: the cache_control of a breakpoint (ephemeral; a ttl when
-- given as {ttl =}), or nil when the request does not ask for caching.
local function cache_control(cache)
  if not cache then return nil end
  return { type = "ephemeral", ttl = type(cache) == "table" and cache.ttl or nil }
end

-- Marks the last block of the last user turn of `msgs` with `cc` (a
-- string content becomes one text block).
local function mark_last_user(msgs, cc)
  for i = #msgs, 1, -1 do
    local m = msgs[i]
    if m.role == "user" then
      if type(m.content) == "string" then
        if m.content ~= "" then m.content = { { type = "text", text = m.content, cache_control = cc } } end
      elseif type(m.content) == "table" and #m.content > 0 then
        local last = {}
        for k, v in pairs(m.content[#m.content]) do last[k] = v end
        last.cache_control = cc
        m.content[#m.content] = last
      end
      return
    end
  end
end

-- Keywords Anthropic's structured outputs do not take (the request is
-- refused with them): moved into the description, as its SDKs do; the
-- answer is still checked against the whole schema (agent/output.lua).
local UNSUPPORTED = { "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
  "minLength", "maxLength", "maxItems" }
-- Keywords whose value is a schema, and those whose value is a map or a
-- list of schemas.
local SUB = { items = true, additionalProperties = true, ["not"] = true }
local SUBS = { properties = true, ["$defs"] = true, definitions = true, anyOf = true, oneOf = true, allOf = true }

-- The output schema as Anthropic takes it (a copy): every object closed
-- (additionalProperties = false unless given), the bounds it does not take
-- said in words in the description ("minimum: 0").
local function output_schema(s)
  if type(s) ~= "table" or getmetatable(s) ~= nil then return s end
  local out, said = {}, {}
  for k, v in pairs(s) do
    if SUB[k] then out[k] = output_schema(v)
    elseif SUBS[k] and type(v) == "table" then
      local m = {}
      for name, sub in pairs(v) do m[name] = output_schema(sub) end
      out[k] = m
    else out[k] = v end
  end
  for _, k in ipairs(UNSUPPORTED) do
    if out[k] ~= nil then
      said[#said + 1] = k .. ": " .. tostring(out[k])
      out[k] = nil
    end
  end
  if type(out.minItems) == "number" and out.minItems > 1 then
    said[#said + 1] = "minItems: " .. tostring(out.minItems)
    out.minItems = nil
  end
  if said[1] then
    local words = table.concat(said, ", ")
    out.description = type(out.description) == "string" and out.description .. " (" .. words .. ")" or words
  end
  if (out.type == "object" or out.properties) and out.additionalProperties == nil then out.additionalProperties = false end
  return out
end

-- Builds the HTTP request for `req` (its shape: EVENTS.md, "Conversation
-- history and request"). cache: cache_control on the system prompt, the
-- last tool and the last user turn (three of the API's four breakpoints);
-- thinking: extended thinking with its budget, max_tokens above it.
function M.build(req, opts)
  common.check_request(M.name, req)
  opts = opts or {}
  local stream = req.stream ~= false
  local cc = cache_control(req.cache)
  local msgs = messages(req.messages)
  if cc then mark_last_user(msgs, cc) end
  local thinking = req.thinking
  local max_tokens = req.max_tokens
  if thinking and thinking.budget_tokens and max_tokens == nil then
    max_tokens = thinking.budget_tokens + M.default_max_tokens
  end
  local body = { model = req.model, messages = common.array(msgs),
    max_tokens = max_tokens or M.default_max_tokens, stream = stream,
    temperature = req.temperature }
  if thinking then
    local kind = thinking.type or "enabled"
    body.thinking = { type = kind, budget_tokens = kind == "enabled" and thinking.budget_tokens or nil }
  end
  if req.system ~= nil and req.system ~= "" then
    body.system = cc and { { type = "text", text = req.system, cache_control = cc } } or req.system
  end
  if common.has_tools(req.tools) then
    body.tools = {}
    for i, t in ipairs(req.tools) do
      body.tools[i] = { name = t.name, description = t.description,
        input_schema = common.schema(t.parameters) }
    end
    if cc then body.tools[#body.tools].cache_control = cc end
  end
  if req.output then -- structured output: output_config.format (no name, always constrained)
    body.output_config = { format = { type = "json_schema",
      schema = common.output_schema { schema = output_schema(req.output.schema) } } }
  end
  local headers = { ["content-type"] = "application/json", ["anthropic-version"] = M.version }
  if opts.api_key then headers["x-api-key"] = opts.api_key end
  return common.post(M, opts, M.path, headers, body, stream)
end

------------------------------------------------------------------------------
-- Stream
------------------------------------------------------------------------------

local STOP = { end_turn = "stop", stop_sequence = "stop", max_tokens = "length",
  tool_use = "tool_use", refusal = "stop", pause_turn = "stop",
  model_context_window_exceeded = "length" }

local want = common.want

local USAGE_FIELDS = { "input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens" }

-- Merges a usage object (`path` names it) into the running one: input
-- arrives in message_start, output (cumulative) in message_delta.
-- Normalized input counts every prompt token, cached or not, as OpenAI's does.
local function merge_usage(dec, u, path)
  u = want(u, "object", path)
  if not u then return end
  local raw = dec.raw_usage or {}
  dec.raw_usage = raw
  for _, k in ipairs(USAGE_FIELDS) do
    local n = want(u[k], "number", "%s.%s", path, k)
    if n then raw[k] = n end
  end
  local read = raw.cache_read_input_tokens or 0
  local write = raw.cache_creation_input_tokens or 0
  dec:set_usage(common.usage((raw.input_tokens or 0) + read + write, raw.output_tokens, read, write))
end

-- The content block index of an event.
local function index_of(p) return want(p.index, "integer", "index") end

local handlers = {}

function handlers.message_start(dec, p)
  local msg = want(p.message, "object", "message")
  if not msg then return dec:start() end
  dec:start(want(msg.id, "string", "message.id"), want(msg.model, "string", "message.model"))
  merge_usage(dec, msg.usage, "message.usage")
end

function handlers.content_block_start(dec, p)
  local index = index_of(p)
  local block = want(p.content_block, "object", "content_block")
  if not block then return end
  local kind = want(block.type, "string", "content_block.type")
  if kind == "tool_use" then
    local call = dec:open_call(index, want(block.id, "string", "content_block.id"),
      want(block.name, "string", "content_block.name"))
    local input = want(block.input, "object", "content_block.input")
    if input and next(input) ~= nil then
      dec:add_arguments(call, common.encode(input)) -- a proxy that sent it whole
    end
  elseif kind == "text" then
    dec:add_text(want(block.text, "string", "content_block.text"))
  elseif kind == "thinking" then
    dec:add_thinking(want(block.thinking, "string", "content_block.thinking"))
  end
end

function handlers.content_block_delta(dec, p)
  local index = index_of(p)
  local d = want(p.delta, "object", "delta")
  if not d then return end
  local kind = want(d.type, "string", "delta.type")
  if kind == "text_delta" then
    dec:add_text(want(d.text, "string", "delta.text"))
  elseif kind == "thinking_delta" then
    dec:add_thinking(want(d.thinking, "string", "delta.thinking"))
  elseif kind == "signature_delta" then
    dec:add_signature(want(d.signature, "string", "delta.signature"), index)
  elseif kind == "input_json_delta" then
    local part = want(d.partial_json, "string", "delta.partial_json")
    local call = index ~= nil and dec:call(index)
    if call then dec:add_arguments(call, part) end
  end
end

function handlers.content_block_stop(dec, p)
  local index = index_of(p)
  local call = index ~= nil and dec:call(index)
  if call then dec:close_call(call) end
end

function handlers.message_delta(dec, p)
  local d = want(p.delta, "object", "delta")
  local reason = d and want(d.stop_reason, "string", "delta.stop_reason")
  if reason then dec:set_stop(STOP[reason] or "stop", reason) end
  merge_usage(dec, p.usage, "usage")
end

function handlers.message_stop(dec)
  dec:complete()
end

function handlers.error(dec, p)
  return dec:stream_error(common.error_object(p.error, "error"), nil, p.error)
end

local handle = common.dispatch(handlers)

-- A decoder for one response stream; ctx = {model=}.
function M.decoder(ctx)
  return common.decoder(M.name, ctx, handle, nil, "message_stop")
end

------------------------------------------------------------------------------
-- The mock's side (lua/luagent/mock/replies.lua says what each field is)
------------------------------------------------------------------------------

local O, null, array, raw = common.object, common.null, common.array, common.raw

local mock = { title = "Anthropic messages", request_id_header = "request-id" }
M.mock = mock

function mock.read(body)
  local config = type(body.output_config) == "table" and body.output_config
  local format = config and type(config.format) == "table" and config.format
  return { messages = common.mock_messages(body.messages),
    tools = common.mock_tools(body.tools, function(t) return t.name, t.input_schema end),
    output = format and format.type == "json_schema" and type(format.schema) == "table" and format.schema or nil }
end

-- An event: the SSE name repeats the data's `type`.
local function event(value)
  return common.event(value.type, value)
end

function mock.stream(view, reply, ctx)
  local calls = reply.calls
  local tool = calls[1]
  local events = {}
  local function add(value) events[#events + 1] = event(value) end
  add(O("type", "message_start", "message", O(
    "id", "msg_mock" .. ctx.n, "type", "message", "role", "assistant",
    "model", view.model, "content", array(), "stop_reason", null,
    "stop_sequence", null, "usage", O("input_tokens", view.input_tokens,
      "cache_creation_input_tokens", 0, "cache_read_input_tokens", 0, "output_tokens", 1))))
  local blocks = {}
  if not tool or reply.text then
    blocks[1] = { block = O("type", "text", "text", ""), pieces = reply.words, kind = "text_delta" }
  end
  for _, c in ipairs(calls) do
    blocks[#blocks + 1] = { block = O("type", "tool_use", "id", "toolu_mock" .. c.id,
      "name", c.name, "input", O()), pieces = c.pieces, kind = "input_json_delta" }
  end
  for i, b in ipairs(blocks) do
    add(O("type", "content_block_start", "index", i - 1, "content_block", b.block))
    if i == 1 then add(O("type", "ping")) end
    for _, p in ipairs(b.pieces) do
      local delta = b.kind == "input_json_delta" and O("type", "input_json_delta", "partial_json", p)
        or O("type", "text_delta", "text", p)
      add(O("type", "content_block_delta", "index", i - 1, "delta", delta))
    end
    add(O("type", "content_block_stop", "index", i - 1))
  end
  add(O("type", "message_delta", "delta", O(
    "stop_reason", reply.stop == "length" and "max_tokens" or tool and "tool_use" or "end_turn", "stop_sequence", null),
    "usage", O("output_tokens", reply.output_tokens)))
  add(O("type", "message_stop"))
  return events
end

function mock.complete(view, reply, ctx)
  local calls = reply.calls
  local blocks = array()
  if not calls[1] or reply.text then blocks[1] = O("type", "text", "text", reply.text) end
  for _, c in ipairs(calls) do
    blocks[#blocks + 1] = O("type", "tool_use", "id", "toolu_mock" .. c.id,
      "name", c.name, "input", raw(c.json))
  end
  return common.encode(O("id", "msg_mock" .. ctx.n, "type", "message",
    "role", "assistant", "model", view.model, "content", blocks,
    "stop_reason", reply.stop == "length" and "max_tokens" or calls[1] and "tool_use" or "end_turn",
    "stop_sequence", null,
    "usage", O("input_tokens", view.input_tokens, "cache_creation_input_tokens", 0,
      "cache_read_input_tokens", 0, "output_tokens", reply.output_tokens)))
end

-- Per status: the error's type.
local ERROR_TYPES = {
  [400] = "invalid_request_error", [401] = "authentication_error", [402] = "billing_error",
  [403] = "permission_error", [404] = "not_found_error", [408] = "timeout_error",
  [409] = "invalid_request_error", [413] = "request_too_large", [429] = "rate_limit_error",
  [500] = "api_error", [502] = "api_error", [503] = "overloaded_error", [504] = "timeout_error",
  [529] = "overloaded_error",
}

function mock.error_body(status, e)
  local etype = ERROR_TYPES[status] or (status < 500 and "invalid_request_error" or "api_error")
  if e.overflow then etype = "invalid_request_error" end
  etype = e.type or etype
  return common.encode(O("type", "error", "error", O("type", etype, "message", e.message),
    "request_id", e.request_id))
end

mock.overflow_message = "prompt is too long: 210000 tokens > 200000 maximum"

function mock.stream_error(etype, message)
  return event(O("type", "error", "error", O("type", etype, "message", message)))
end

-- The phase of each of its events, by name.
local PHASES = { message_start = "open", content_block_start = "open", ping = "open", error = "open",
  content_block_delta = "delta", content_block_stop = "close", message_delta = "finish",
  message_stop = "end" }

function mock.phase(e)
  return e.event and PHASES[e.event]
end

return M
