-- OpenAI Responses adapter: builds POST {base}/responses and decodes its
-- semantic stream events into the normalized events of
-- lua/luagent/EVENTS.md. Pure Lua, no I/O.
local common = require "luagent.providers.common"

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

-- The function call an event refers to, by item id or output index.
local function find_call(dec, p)
  return dec:call(p.item_id) or dec:call(p.output_index)
end

-- The response object of a lifecycle event, or an empty table.
local function response_of(p)
  return type(p.response) == "table" and p.response or {}
end

-- Records the usage of a final response object, if it has one.
local function final_usage(dec, r)
  local u = r.usage
  if type(u) ~= "table" then return end
  local details = type(u.input_tokens_details) == "table" and u.input_tokens_details or {}
  dec:set_usage(common.usage(u.input_tokens, u.output_tokens, details.cached_tokens, 0))
end

-- response.created / response.in_progress: the message starts.
local function created(dec, p)
  local r = response_of(p)
  dec:start(r.id, r.model)
end

local handlers = {
  ["response.created"] = created,
  ["response.in_progress"] = created,
}

handlers["response.output_item.added"] = function(dec, p)
  local item = type(p.item) == "table" and p.item or {}
  if item.type ~= "function_call" then return end
  local call = dec:open_call(item.id, item.call_id, item.name)
  dec:alias(p.output_index, call)
  dec:add_arguments(call, item.arguments)
end

handlers["response.output_text.delta"] = function(dec, p) dec:add_text(p.delta) end
handlers["response.refusal.delta"] = function(dec, p) dec:add_text(p.delta) end
handlers["response.reasoning_summary_text.delta"] = function(dec, p) dec:add_thinking(p.delta) end
handlers["response.reasoning_text.delta"] = function(dec, p) dec:add_thinking(p.delta) end

handlers["response.function_call_arguments.delta"] = function(dec, p)
  local call = find_call(dec, p)
  if call then dec:add_arguments(call, p.delta) end
end

handlers["response.function_call_arguments.done"] = function(dec, p)
  local call = find_call(dec, p)
  if call then dec:close_call(call, p.arguments) end
end

handlers["response.output_item.done"] = function(dec, p)
  local item = type(p.item) == "table" and p.item or {}
  local call = item.type == "function_call" and (dec:call(item.id) or dec:call(p.output_index))
  if call then dec:close_call(call, item.arguments) end
end

handlers["response.completed"] = function(dec, p)
  local r = response_of(p)
  dec:start(r.id, r.model)
  final_usage(dec, r)
  dec:set_stop("stop", type(r.status) == "string" and r.status or "completed")
  dec:complete()
end

handlers["response.incomplete"] = function(dec, p)
  local r = response_of(p)
  dec:start(r.id, r.model)
  final_usage(dec, r)
  local details = type(r.incomplete_details) == "table" and r.incomplete_details or {}
  local reason = type(details.reason) == "string" and details.reason or "incomplete"
  dec:set_stop(reason == "max_output_tokens" and "length" or "stop", reason)
  dec:complete()
end

handlers["response.failed"] = function(dec, p)
  local r = response_of(p)
  final_usage(dec, r)
  return dec:stream_error(r.error, "response failed")
end

handlers["error"] = function(dec, p)
  if type(p.error) == "table" then return dec:stream_error(p.error, nil, p) end
  return dec:stream_error({ code = p.code, message = p.message }, nil, p)
end

local handle = common.dispatch(handlers)

-- A decoder for one response stream; ctx = {model=}.
function M.decoder(ctx)
  return common.decoder(M.name, ctx, handle, nil, "response.completed")
end

return M
