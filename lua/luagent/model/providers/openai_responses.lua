-- OpenAI Responses adapter: builds POST {base}/responses and decodes its
-- semantic stream events into the normalized events of
-- lua/luagent/EVENTS.md. Pure Lua, no I/O.
local common = require "luagent.model.providers.common"

local M = {
  name = "openai_responses",
  default_base_url = "https://api.openai.com/v1",
}

------------------------------------------------------------------------------
-- Request
------------------------------------------------------------------------------

-- Appends the input items for one history message to `items`: a message,
-- and for an assistant its function_call items; a tool result becomes a
-- function_call_output item.
local function add_items(items, m)
  if m.role == "user" then
    items[#items + 1] = { role = "user", content = m.content or "" }
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
  if common.has_tools(req.tools) then
    body.tools = {}
    for i, t in ipairs(req.tools) do
      body.tools[i] = { type = "function", name = t.name, description = t.description,
        parameters = common.schema(t.parameters) }
    end
  end
  local headers = { ["content-type"] = "application/json" }
  if opts.api_key then headers.authorization = "Bearer " .. opts.api_key end
  return common.post(M, opts, "/responses", headers, body, stream)
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

return M
