-- OpenAI Responses adapter: builds POST {base}/responses and decodes its
-- semantic stream events into the normalized events of
-- lua/luagent/EVENTS.md; and all else about the format
-- (lua/luagent/model/provider.lua lists the fields), its mock side last.
-- Pure Lua, no I/O.
local common = require "luagent.model.providers.common"
local openai = require "luagent.model.providers.openai"

local M = {
  name = "openai_responses",
  kinds = { openai_responses = { key_env = "OPENAI_API_KEY", base_env = "OPENAI_BASE_URL", otel_name = "openai" } },
  default_base_url = "https://api.openai.com/v1",
  -- a base URL includes the version, as the OpenAI SDK takes it; a bare
  -- host gets /v1 (provider.base_url)
  version_path = "/v1", base_form = "versioned",
  path = "/responses",
  stream_errors = { rate_limit_exceeded = "rate_limited", no_capacity = "rate_limited" },
  overflow_phrases = {
    "context_length_exceeded",            -- its code
    "exceeds the context window",
  },
  secret_headers = { "openai-organization", "openai-project" },
  replay_fields = { "input" },
}

------------------------------------------------------------------------------
-- Request
------------------------------------------------------------------------------

-- Appends the input items for one history message to `items`: a message,
-- and for an assistant its function_call items; a tool result becomes a
-- function_call_output item.
-- A content part in Responses form (common.check_parts checked it).
local function part(p)
  if p.type == "text" then return { type = "input_text", text = p.text } end
  if p.type == "image" then
    return { type = "input_image", image_url = p.url or common.data_url(p), detail = p.detail }
  end
  if p.url then return { type = "input_file", file_url = p.url, filename = p.name } end
  return { type = "input_file", filename = common.part_name(p), file_data = common.data_url(p) }
end

local function add_items(items, m)
  if m.role == "user" then
    items[#items + 1] = { role = "user", content = common.render_parts(m.content, part) }
  elseif m.role == "tool" then
    items[#items + 1] = { type = "function_call_output", call_id = m.tool_call_id,
      output = common.result_text(m.content) }
  else
    local calls = type(m.tool_calls) == "table" and m.tool_calls or {}
    if (m.content ~= nil and m.content ~= "") or calls[1] == nil then
      items[#items + 1] = { role = "assistant", content = m.content or "" }
    end
    for _, c in ipairs(calls) do
      items[#items + 1] = { type = "function_call", call_id = c.id, name = c.name,
        arguments = common.arguments_text(c) }
    end
  end
end

-- Builds the HTTP request for `req` (its shape: EVENTS.md, "Conversation
-- history and request").
function M.build(req, opts)
  common.check_request(M.name, req)
  opts = opts or {}
  local stream = req.stream ~= false
  local input = common.array()
  for _, m in ipairs(req.messages) do add_items(input, m) end
  local body = { model = req.model, input = input, stream = stream,
    max_output_tokens = req.max_tokens, temperature = req.temperature }
  if req.system ~= nil and req.system ~= "" then body.instructions = req.system end
  local r = req.reasoning
  if r and (r.effort or r.summary) then body.reasoning = { effort = r.effort, summary = r.summary } end
  if common.has_tools(req.tools) then
    body.tools = {}
    for i, t in ipairs(req.tools) do
      body.tools[i] = { type = "function", name = t.name, description = t.description,
        parameters = common.schema(t.parameters) }
    end
  end
  if req.output then -- structured output: text.format, flat (no json_schema wrapper)
    body.text = { format = { type = "json_schema", name = req.output.name,
      schema = common.output_schema(req.output), strict = common.output_strict(req.output) } }
  end
  local headers = { ["content-type"] = "application/json" }
  if opts.api_key then headers.authorization = "Bearer " .. opts.api_key end
  return common.post(M, opts, M.path, headers, body, stream)
end

------------------------------------------------------------------------------
-- Stream
------------------------------------------------------------------------------

local want = common.want

-- The function call an event refers to, by item id or output index.
local function find_call(dec, p)
  local id = want(p.item_id, "string", "item_id")
  local index = want(p.output_index, "integer", "output_index")
  return (id ~= nil and dec:call(id)) or (index ~= nil and dec:call(index)) or nil
end

-- The response object of a lifecycle event, or nil.
local function response_of(p)
  return want(p.response, "object", "response")
end

-- Records the usage of a final response object, if it has one.
local function final_usage(dec, r)
  local u = want(r.usage, "object", "response.usage")
  if not u then return end
  local details = want(u.input_tokens_details, "object", "response.usage.input_tokens_details")
  dec:set_usage(common.usage(want(u.input_tokens, "number", "response.usage.input_tokens"),
    want(u.output_tokens, "number", "response.usage.output_tokens"),
    details and want(details.cached_tokens, "number", "response.usage.input_tokens_details.cached_tokens"), 0))
end

-- Starts the message with the id and model of response object `r`.
local function start(dec, r)
  dec:start(want(r.id, "string", "response.id"), want(r.model, "string", "response.model"))
end

-- response.created / response.in_progress: the message starts.
local function created(dec, p)
  local r = response_of(p)
  if r then start(dec, r) else dec:start() end
end

local handlers = {
  ["response.created"] = created,
  ["response.in_progress"] = created,
}

-- The item of an output_item event and its type, or nil.
local function item_of(p)
  local item = want(p.item, "object", "item")
  return item, item and want(item.type, "string", "item.type")
end

handlers["response.output_item.added"] = function(dec, p)
  local item, kind = item_of(p)
  if kind ~= "function_call" then return end
  local index = want(p.output_index, "integer", "output_index")
  local call = dec:open_call(want(item.id, "string", "item.id"), want(item.call_id, "string", "item.call_id"),
    want(item.name, "string", "item.name"))
  dec:alias(index, call)
  dec:add_arguments(call, want(item.arguments, "string", "item.arguments"))
end

local function text_delta(dec, p) dec:add_text(want(p.delta, "string", "delta")) end
local function thinking_delta(dec, p) dec:add_thinking(want(p.delta, "string", "delta")) end
handlers["response.output_text.delta"] = text_delta
handlers["response.refusal.delta"] = text_delta
handlers["response.reasoning_summary_text.delta"] = thinking_delta
handlers["response.reasoning_text.delta"] = thinking_delta

handlers["response.function_call_arguments.delta"] = function(dec, p)
  local call = find_call(dec, p)
  local delta = want(p.delta, "string", "delta")
  if call then dec:add_arguments(call, delta) end
end

handlers["response.function_call_arguments.done"] = function(dec, p)
  local call = find_call(dec, p)
  local arguments = want(p.arguments, "string", "arguments")
  if call then dec:close_call(call, arguments) end
end

handlers["response.output_item.done"] = function(dec, p)
  local item, kind = item_of(p)
  if kind ~= "function_call" then return end
  local id = want(item.id, "string", "item.id")
  local index = want(p.output_index, "integer", "output_index")
  local call = (id ~= nil and dec:call(id)) or (index ~= nil and dec:call(index))
  if call then dec:close_call(call, want(item.arguments, "string", "item.arguments")) end
end

handlers["response.completed"] = function(dec, p)
  local r = response_of(p) or {}
  start(dec, r)
  final_usage(dec, r)
  dec:set_stop("stop", want(r.status, "string", "response.status") or "completed")
  dec:complete()
end

handlers["response.incomplete"] = function(dec, p)
  local r = response_of(p) or {}
  start(dec, r)
  final_usage(dec, r)
  local details = want(r.incomplete_details, "object", "response.incomplete_details")
  local reason = details and want(details.reason, "string", "response.incomplete_details.reason") or "incomplete"
  dec:set_stop(reason == "max_output_tokens" and "length" or "stop", reason)
  dec:complete()
end

handlers["response.failed"] = function(dec, p)
  local r = response_of(p) or {}
  final_usage(dec, r)
  return dec:stream_error(common.error_object(r.error, "response.error"), "response failed", r.error)
end

handlers["error"] = function(dec, p)
  local e = common.error_object(p.error, "error")
  if e then return dec:stream_error(e, nil, p) end
  return dec:stream_error({ code = p.code, message = p.message }, nil, p)
end

local handle = common.dispatch(handlers)

-- A decoder for one response stream; ctx = {model=}.
function M.decoder(ctx)
  return common.decoder(M.name, ctx, handle, nil, "response.completed")
end

------------------------------------------------------------------------------
-- The mock's side (lua/luagent/mock/replies.lua says what each field is)
------------------------------------------------------------------------------

local O, null, array = common.object, common.null, common.array

local mock = { format = "responses", title = "OpenAI responses" }
M.mock = mock

function mock.read(body)
  local format = type(body.text) == "table" and type(body.text.format) == "table" and body.text.format
  return { messages = common.mock_messages(body.input), tools = common.mock_tools(body.tools, common.openai_tool),
    output = format and format.type == "json_schema" and type(format.schema) == "table" and format.schema or nil }
end

-- A response object in `status` with `output` items and `usage`.
local function response_object(view, ctx, status, output, usage)
  return O("id", "resp_mock" .. ctx.n, "object", "response",
    "created_at", ctx.created, "status", status, "error", null,
    "incomplete_details", null, "model", view.model, "output", output,
    "parallel_tool_calls", true, "tool_choice", "auto", "tools", array(),
    "usage", usage or null)
end

-- Responses usage object.
local function usage_object(view, output)
  return O("input_tokens", view.input_tokens,
    "input_tokens_details", O("cached_tokens", 0), "output_tokens", output,
    "output_tokens_details", O("reasoning_tokens", 0),
    "total_tokens", view.input_tokens + output)
end

-- The output items of a reply in `status`: a message item for its text
-- (when it has text or no tool call), then one function_call item per call.
-- Each item is {value=<item object>, call=<the call or nil>, id=}.
local function response_items(reply, ctx, status)
  local calls, items = reply.calls, {}
  if not calls[1] or reply.text then
    local text = reply.text or ""
    local parts = status == "completed"
      and array { O("type", "output_text", "annotations", array(), "text", text) }
      or array()
    items[1] = { id = "msg_mock" .. ctx.n, value = O("id", "msg_mock" .. ctx.n, "type", "message",
      "status", status, "role", "assistant", "content", parts) }
  end
  for i, c in ipairs(calls) do
    local id = "fc_mock" .. ctx.n .. (i > 1 and ("_" .. i) or "")
    items[#items + 1] = { id = id, call = c, value = O("id", id, "type", "function_call",
      "status", status, "arguments", status == "completed" and c.json or "",
      "call_id", "call_mock" .. c.id, "name", c.name) }
  end
  return items
end

-- The finished output items as a JSON array.
local function output_array(reply, ctx)
  local out = array()
  for i, it in ipairs(response_items(reply, ctx, "completed")) do out[i] = it.value end
  return out
end

function mock.stream(view, reply, ctx)
  local events = {}
  local function add(...)
    local value = O("type", select(1, ...), "sequence_number", #events, select(2, ...))
    events[#events + 1] = common.event(value.type, value)
  end
  add("response.created", "response", response_object(view, ctx, "in_progress", array()))
  add("response.in_progress", "response", response_object(view, ctx, "in_progress", array()))
  local done = response_items(reply, ctx, "completed")
  for idx, it in ipairs(response_items(reply, ctx, "in_progress")) do
    local oi = idx - 1
    add("response.output_item.added", "output_index", oi, "item", it.value)
    if it.call then
      for _, p in ipairs(it.call.pieces) do
        add("response.function_call_arguments.delta", "item_id", it.id, "output_index", oi, "delta", p)
      end
      add("response.function_call_arguments.done", "item_id", it.id, "output_index", oi,
        "arguments", it.call.json)
    else
      local text = reply.text or ""
      local function part(t)
        return O("type", "output_text", "annotations", array(), "text", t)
      end
      add("response.content_part.added", "item_id", it.id, "output_index", oi,
        "content_index", 0, "part", part(""))
      for _, p in ipairs(reply.words) do
        add("response.output_text.delta", "item_id", it.id, "output_index", oi,
          "content_index", 0, "delta", p, "logprobs", array())
      end
      add("response.output_text.done", "item_id", it.id, "output_index", oi,
        "content_index", 0, "text", text, "logprobs", array())
      add("response.content_part.done", "item_id", it.id, "output_index", oi,
        "content_index", 0, "part", part(text))
    end
    add("response.output_item.done", "output_index", oi, "item", done[idx].value)
  end
  add("response.completed", "response", response_object(view, ctx, "completed",
    output_array(reply, ctx), usage_object(view, reply.output_tokens)))
  return events
end

function mock.complete(view, reply, ctx)
  return common.encode(response_object(view, ctx, "completed",
    output_array(reply, ctx), usage_object(view, reply.output_tokens)))
end

function mock.error_body(status, e) return openai.mock_error_body(status, e, "input") end

mock.overflow_message = "Your input exceeds the context window of this model. Please adjust your "
  .. "input and try again."

function mock.stream_error(etype, message, _, _, seq)
  return common.event("error", O("type", "error", "code", etype, "message", message,
    "param", null, "sequence_number", seq))
end

-- The phase of one of its events, by name (response.*, and its error).
function mock.phase(e)
  local name = e.event
  if name == "response.completed" or name == "response.failed" or name == "response.incomplete" then
    return "end"
  end
  if type(name) ~= "string" then return nil end
  if name:match("^response%..*%.delta$") then return "delta" end
  if name:match("^response%..*%.done$") then return "close" end
  if name == "error" or name:match("^response%.") then return "open" end
  return nil
end

return M
