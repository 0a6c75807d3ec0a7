-- Anthropic Messages adapter: builds POST {base}/messages and decodes its
-- streamed events into the normalized events of lua/luagent/EVENTS.md.
-- Pure Lua, no I/O.
local common = require "luagent.model.providers.common"

local M = {
  name = "anthropic",
  default_base_url = "https://api.anthropic.com/v1",
  version = "2023-06-01",
  default_max_tokens = 4096,
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
      results[#results + 1] = { type = "text", text = m.content or "" }
    else
      results = nil
      if m.role == "user" then
        out[#out + 1] = { role = "user", content = m.content or "" }
      else
        local blocks = assistant_blocks(m)
        out[#out + 1] = { role = "assistant", content = blocks[1] and blocks or (m.content or "") }
      end
    end
  end
  return out
end

-- Builds the HTTP request for `req` (its shape: EVENTS.md, "Conversation
-- history and request").
function M.build(req, opts)
  common.check_request(M.name, req)
  opts = opts or {}
  local stream = req.stream ~= false
  local body = { model = req.model, messages = common.array(messages(req.messages)),
    max_tokens = req.max_tokens or M.default_max_tokens, stream = stream,
    temperature = req.temperature }
  if req.system ~= nil and req.system ~= "" then body.system = req.system end
  if common.has_tools(req.tools) then
    body.tools = {}
    for i, t in ipairs(req.tools) do
      body.tools[i] = { name = t.name, description = t.description,
        input_schema = common.schema(t.parameters) }
    end
  end
  local headers = { ["content-type"] = "application/json", ["anthropic-version"] = M.version }
  if opts.api_key then headers["x-api-key"] = opts.api_key end
  return common.post(M, opts, "/messages", headers, body, stream)
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

return M
