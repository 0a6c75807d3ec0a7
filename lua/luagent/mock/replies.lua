-- What the mock provider says, in each wire format: streamed SSE events and
-- stream:false JSON for OpenAI chat completions (and OpenRouter), Anthropic
-- messages and OpenAI responses; error bodies in each provider's own shape;
-- and the stream faults (cut, bad-json, stream-error) as edits of an event
-- list. Pure: no sockets, no clock (the caller passes `created`).
--
-- A response here is a table {status=, headers={{name, value}...},
-- events={{event=, data=}...}} for a stream, or {status=, headers=, body=}.
local json = require "luagent.base.json"

local M = {}

M.null = json.null

-- Wire format by endpoint path. "openrouter" is the OpenAI chat format with
-- OpenRouter's error shapes.
M.formats = {
  ["/v1/chat/completions"] = "openai",
  ["/api/v1/chat/completions"] = "openrouter",
  ["/v1/messages"] = "anthropic",
  ["/v1/responses"] = "responses",
}

------------------------------------------------------------------------------
-- JSON: replies must be deterministic byte for byte and look like the real
-- thing, so objects are built with json.object (key order kept)
------------------------------------------------------------------------------

M.object = json.object
M.raw = json.raw
M.array = json.array
M.encode = json.encode
M.decode = json.decode

------------------------------------------------------------------------------
-- Reading a request
------------------------------------------------------------------------------

-- The text of a content value: a string, or the concatenated text of a list
-- of parts (text, input_text, output_text, tool_result blocks...).
local function text_of(content)
  if type(content) == "string" then return content end
  if type(content) ~= "table" then return nil end
  local parts = {}
  for _, part in ipairs(content) do
    if type(part) == "table" then
      local t = part.text or text_of(part.content) or text_of(part.output)
      if type(t) == "string" then parts[#parts + 1] = t end
    end
  end
  if #parts == 0 then return nil end
  return table.concat(parts)
end

-- True when an Anthropic content value holds a tool_result block.
local function has_tool_result(content)
  if type(content) ~= "table" then return false end
  for _, part in ipairs(content) do
    if type(part) == "table" and part.type == "tool_result" then return true end
  end
  return false
end

-- The offered tools as {{name=, schema=}...}, whatever the format.
local function tools_of(format, body)
  local tools = {}
  if type(body.tools) ~= "table" then return tools end
  for _, t in ipairs(body.tools) do
    if type(t) == "table" then
      local name, schema
      if format == "anthropic" then
        name, schema = t.name, t.input_schema
      elseif type(t["function"]) == "table" then
        name, schema = t["function"].name, t["function"].parameters
      else
        name, schema = t.name, t.parameters
      end
      if type(name) == "string" then
        tools[#tools + 1] = { name = name, schema = type(schema) == "table" and schema or {} }
      end
    end
  end
  return tools
end

-- What the replies need from a decoded request body: {model=, stream=,
-- include_usage=, last_text=, user_text=, last_is_tool_result=, tools=,
-- input_tokens=}. `raw` is the body text (for a token estimate).
function M.view(format, body, raw)
  body = type(body) == "table" and body or {}
  local v = {
    model = type(body.model) == "string" and body.model or "mock-model",
    stream = body.stream == true,
    include_usage = type(body.stream_options) == "table"
      and body.stream_options.include_usage == true,
    tools = tools_of(format, body),
    last_is_tool_result = false,
    input_tokens = math.max(1, (#(raw or "") + 3) // 4),
  }
  local items = format == "responses" and body.input or body.messages
  if type(items) == "string" then items = { { role = "user", content = items } } end
  if type(items) ~= "table" then items = {} end
  for _, item in ipairs(items) do
    if type(item) == "table" then
      local text
      if item.type == "function_call_output" then
        text = text_of(item.output)
      else
        text = text_of(item.content)
      end
      if item.role == "user" and not has_tool_result(item.content) then
        v.user_text = text or v.user_text
      end
      v.last_text = text
      v.last_is_tool_result = item.role == "tool"
        or item.type == "function_call_output"
        or (item.role == "user" and has_tool_result(item.content))
    end
  end
  return v
end

------------------------------------------------------------------------------
-- Canned content
------------------------------------------------------------------------------

M.default_text = "Hello from the luagent mock provider."

-- A placeholder value for a JSON Schema: the first enum value, else one of
-- the right type; the user's text stands in for strings.
local function placeholder(schema, text)
  if type(schema) ~= "table" then return text end
  if type(schema.enum) == "table" and schema.enum[1] ~= nil then return schema.enum[1] end
  local ty = schema.type
  if type(ty) == "table" then ty = ty[1] end
  if ty == "integer" or ty == "number" then return 1
  elseif ty == "boolean" then return true
  elseif ty == "array" then return M.array()
  elseif ty == "object" then return M.object()
  end
  return text
end

-- Arguments for a tool from its schema: every required property (all of
-- them when none is required), with placeholder values.
local function arguments_for(schema, text)
  local args = {}
  local props = type(schema.properties) == "table" and schema.properties or {}
  local names = type(schema.required) == "table" and schema.required or nil
  if not names then
    names = {}
    for k in pairs(props) do names[#names + 1] = k end
  end
  for _, name in ipairs(names) do
    if type(name) == "string" then args[name] = placeholder(props[name], text) end
  end
  return args
end

-- The content of a canned reply: {text=} or {tool={id=, name=, arguments=}}.
-- Rules: a tool call of the first tool when tools are offered and the last
-- message is not a tool result; otherwise the last message's text echoed.
-- `fault` may be the `empty` or `leak` fault; `n` is the request number.
function M.content(view, fault, n)
  local kind = fault and fault.kind
  if kind == "empty" then return { text = "" } end
  local echo = view.last_text
  if echo == nil or echo == "" then echo = M.default_text end
  local tool = view.tools[1]
  if kind == "leak" then
    local name = tool and tool.name or "search"
    local args = tool and arguments_for(tool.schema, view.user_text or echo)
      or { query = view.user_text or echo }
    return { text = "<tool_call>" .. M.encode(M.object("name", name, "arguments", args))
      .. "</tool_call>" }
  end
  if tool and not view.last_is_tool_result then
    return { tool = { id = tostring(n), name = tool.name,
      arguments = arguments_for(tool.schema, view.user_text or echo) } }
  end
  return { text = echo }
end

-- Splits text into word-sized pieces (each word with the spaces before it).
function M.words(text)
  local pieces = {}
  for piece in text:gmatch("%s*%S+") do pieces[#pieces + 1] = piece end
  local tail = text:match("%s+$")
  if tail then
    if #pieces == 0 then pieces[1] = tail else pieces[#pieces] = pieces[#pieces] .. tail end
  end
  return pieces
end

-- Splits a JSON text into pieces of about 8 bytes, on UTF-8 boundaries.
local function slices(s)
  local pieces, cur = {}, {}
  local size = 0
  for ch in s:gmatch(utf8.charpattern) do
    cur[#cur + 1] = ch
    size = size + #ch
    if size >= 8 then pieces[#pieces + 1] = table.concat(cur); cur, size = {}, 0 end
  end
  if #cur > 0 then pieces[#pieces + 1] = table.concat(cur) end
  return pieces
end

-- The tool calls of a content: content.tools (a list, from a script) or
-- the one content.tool; each gets its arguments' JSON text and pieces.
local function calls_of(content)
  local calls = content.tools or (content.tool and { content.tool }) or {}
  for _, c in ipairs(calls) do
    c.json = c.json or M.encode(c.arguments or M.object())
    c.pieces = c.pieces or slices(c.json)
  end
  return calls
end

-- The id of a chat completion (an OpenRouter generation's id) for request ctx.n.
function M.chat_id(ctx) return "chatcmpl-mock" .. ctx.n end

-- The content as pieces to stream and the output token count. A content
-- with tool calls streams its text (content.text, may be absent) first.
local function pieces_of(content)
  local calls = calls_of(content)
  if #calls > 0 then
    local n = content.text and #M.words(content.text) or 0
    for _, c in ipairs(calls) do n = n + #c.pieces end
    return calls[1].pieces, math.max(1, n)
  end
  local pieces = M.words(content.text)
  return pieces, math.max(1, #pieces)
end

-- output_tokens(content) -> the output token count of a content.
function M.output_tokens(content) return select(2, pieces_of(content)) end

------------------------------------------------------------------------------
-- OpenAI chat completions (and OpenRouter)
------------------------------------------------------------------------------

-- One SSE event carrying `value` as JSON.
local function ev(name, value)
  return { event = name, data = M.encode(value) }
end

-- A chat.completion.chunk with one choice (or the given choices).
local function chat_chunk(view, ctx, delta, finish, choices, usage)
  return ev(nil, M.object(
    "id", M.chat_id(ctx), "object", "chat.completion.chunk",
    "created", ctx.created, "model", view.model,
    "choices", choices or M.array { M.object("index", 0, "delta", delta,
      "logprobs", M.null, "finish_reason", finish or M.null) },
    "usage", usage or (view.include_usage and M.null or nil)))
end

-- OpenAI usage object.
local function chat_usage(view, output)
  return M.object("prompt_tokens", view.input_tokens, "completion_tokens", output,
    "total_tokens", view.input_tokens + output)
end

-- The streamed chat completion of `content`.
local function chat_stream(view, content, ctx)
  local pieces, output = pieces_of(content)
  local calls = calls_of(content)
  local tool = calls[1]
  local events = {}
  local function add(e) events[#events + 1] = e end
  if tool then
    add(chat_chunk(view, ctx, M.object("role", "assistant", "content", M.null)))
    for _, p in ipairs(content.text and M.words(content.text) or {}) do
      add(chat_chunk(view, ctx, M.object("content", p)))
    end
    for i, c in ipairs(calls) do
      add(chat_chunk(view, ctx, M.object("tool_calls", M.array { M.object(
        "index", i - 1, "id", "call_mock" .. c.id, "type", "function",
        "function", M.object("name", c.name, "arguments", "")) })))
      for _, p in ipairs(c.pieces) do
        add(chat_chunk(view, ctx, M.object("tool_calls", M.array { M.object(
          "index", i - 1, "function", M.object("arguments", p)) })))
      end
    end
  else
    add(chat_chunk(view, ctx, M.object("role", "assistant", "content", "", "refusal", M.null)))
    for _, p in ipairs(pieces) do add(chat_chunk(view, ctx, M.object("content", p))) end
  end
  add(chat_chunk(view, ctx, M.object(), tool and "tool_calls" or "stop"))
  if view.include_usage then
    add(chat_chunk(view, ctx, nil, nil, M.array(), chat_usage(view, output)))
  end
  add({ data = "[DONE]" })
  return events
end

-- The stream:false chat completion of `content`.
local function chat_complete(view, content, ctx)
  local _, output = pieces_of(content)
  local message
  local calls = calls_of(content)
  if calls[1] then
    local list = M.array()
    for i, c in ipairs(calls) do
      list[i] = M.object("id", "call_mock" .. c.id, "type", "function",
        "function", M.object("name", c.name, "arguments", c.json))
    end
    message = M.object("role", "assistant", "content", content.text or M.null, "refusal", M.null,
      "tool_calls", list)
  else
    message = M.object("role", "assistant", "content", content.text, "refusal", M.null)
  end
  return M.encode(M.object("id", M.chat_id(ctx), "object", "chat.completion",
    "created", ctx.created, "model", view.model,
    "choices", M.array { M.object("index", 0, "message", message, "logprobs", M.null,
      "finish_reason", calls[1] and "tool_calls" or "stop") },
    "usage", chat_usage(view, output)))
end

------------------------------------------------------------------------------
-- Anthropic messages
------------------------------------------------------------------------------

-- An Anthropic event: the SSE name repeats the data's `type`.
local function aev(value)
  return ev(value.type, value)
end

-- The streamed Anthropic message of `content`.
local function anthropic_stream(view, content, ctx)
  local pieces, output = pieces_of(content)
  local calls = calls_of(content)
  local tool = calls[1]
  local events = {}
  local function add(value) events[#events + 1] = aev(value) end
  add(M.object("type", "message_start", "message", M.object(
    "id", "msg_mock" .. ctx.n, "type", "message", "role", "assistant",
    "model", view.model, "content", M.array(), "stop_reason", M.null,
    "stop_sequence", M.null, "usage", M.object("input_tokens", view.input_tokens,
      "cache_creation_input_tokens", 0, "cache_read_input_tokens", 0, "output_tokens", 1))))
  local blocks = {}
  if not tool or content.text then
    blocks[1] = { block = M.object("type", "text", "text", ""),
      pieces = tool and M.words(content.text) or pieces, kind = "text_delta" }
  end
  for _, c in ipairs(calls) do
    blocks[#blocks + 1] = { block = M.object("type", "tool_use", "id", "toolu_mock" .. c.id,
      "name", c.name, "input", M.object()), pieces = c.pieces, kind = "input_json_delta" }
  end
  for i, b in ipairs(blocks) do
    add(M.object("type", "content_block_start", "index", i - 1, "content_block", b.block))
    if i == 1 then add(M.object("type", "ping")) end
    for _, p in ipairs(b.pieces) do
      local delta = b.kind == "input_json_delta" and M.object("type", "input_json_delta", "partial_json", p)
        or M.object("type", "text_delta", "text", p)
      add(M.object("type", "content_block_delta", "index", i - 1, "delta", delta))
    end
    add(M.object("type", "content_block_stop", "index", i - 1))
  end
  add(M.object("type", "message_delta", "delta", M.object(
    "stop_reason", tool and "tool_use" or "end_turn", "stop_sequence", M.null),
    "usage", M.object("output_tokens", output)))
  add(M.object("type", "message_stop"))
  return events
end

-- The stream:false Anthropic message of `content`.
local function anthropic_complete(view, content, ctx)
  local _, output = pieces_of(content)
  local calls = calls_of(content)
  local blocks = M.array()
  if not calls[1] or content.text then blocks[1] = M.object("type", "text", "text", content.text) end
  for _, c in ipairs(calls) do
    blocks[#blocks + 1] = M.object("type", "tool_use", "id", "toolu_mock" .. c.id,
      "name", c.name, "input", M.raw(c.json))
  end
  return M.encode(M.object("id", "msg_mock" .. ctx.n, "type", "message",
    "role", "assistant", "model", view.model, "content", blocks,
    "stop_reason", calls[1] and "tool_use" or "end_turn", "stop_sequence", M.null,
    "usage", M.object("input_tokens", view.input_tokens, "cache_creation_input_tokens", 0,
      "cache_read_input_tokens", 0, "output_tokens", output)))
end

------------------------------------------------------------------------------
-- OpenAI responses
------------------------------------------------------------------------------

-- A response object in `status` with `output` items and `usage`.
local function response_object(view, ctx, status, output, usage)
  return M.object("id", "resp_mock" .. ctx.n, "object", "response",
    "created_at", ctx.created, "status", status, "error", M.null,
    "incomplete_details", M.null, "model", view.model, "output", output,
    "parallel_tool_calls", true, "tool_choice", "auto", "tools", M.array(),
    "usage", usage or M.null)
end

-- Responses usage object.
local function responses_usage(view, output)
  return M.object("input_tokens", view.input_tokens,
    "input_tokens_details", M.object("cached_tokens", 0), "output_tokens", output,
    "output_tokens_details", M.object("reasoning_tokens", 0),
    "total_tokens", view.input_tokens + output)
end

-- The output items of `content` in `status`: a message item for its text
-- (when it has text or no tool call), then one function_call item per call.
-- Each item is {value=<item object>, call=<the call or nil>, id=}.
local function response_items(content, ctx, status)
  local calls, items = calls_of(content), {}
  if not calls[1] or content.text then
    local text = content.text or ""
    local parts = status == "completed"
      and M.array { M.object("type", "output_text", "annotations", M.array(), "text", text) }
      or M.array()
    items[1] = { id = "msg_mock" .. ctx.n, value = M.object("id", "msg_mock" .. ctx.n, "type", "message",
      "status", status, "role", "assistant", "content", parts) }
  end
  for i, c in ipairs(calls) do
    local id = "fc_mock" .. ctx.n .. (i > 1 and ("_" .. i) or "")
    items[#items + 1] = { id = id, call = c, value = M.object("id", id, "type", "function_call",
      "status", status, "arguments", status == "completed" and c.json or "",
      "call_id", "call_mock" .. c.id, "name", c.name) }
  end
  return items
end

-- The finished output items as a JSON array.
local function output_array(content, ctx)
  local out = M.array()
  for i, it in ipairs(response_items(content, ctx, "completed")) do out[i] = it.value end
  return out
end

-- The streamed response of `content`.
local function responses_stream(view, content, ctx)
  local _, output = pieces_of(content)
  local events = {}
  local function add(...)
    local value = M.object("type", select(1, ...), "sequence_number", #events, select(2, ...))
    events[#events + 1] = ev(value.type, value)
  end
  add("response.created", "response", response_object(view, ctx, "in_progress", M.array()))
  add("response.in_progress", "response", response_object(view, ctx, "in_progress", M.array()))
  local done = response_items(content, ctx, "completed")
  for idx, it in ipairs(response_items(content, ctx, "in_progress")) do
    local oi = idx - 1
    add("response.output_item.added", "output_index", oi, "item", it.value)
    if it.call then
      for _, p in ipairs(it.call.pieces) do
        add("response.function_call_arguments.delta", "item_id", it.id, "output_index", oi, "delta", p)
      end
      add("response.function_call_arguments.done", "item_id", it.id, "output_index", oi,
        "arguments", it.call.json)
    else
      local text = content.text or ""
      local function part(t)
        return M.object("type", "output_text", "annotations", M.array(), "text", t)
      end
      add("response.content_part.added", "item_id", it.id, "output_index", oi,
        "content_index", 0, "part", part(""))
      for _, p in ipairs(M.words(text)) do
        add("response.output_text.delta", "item_id", it.id, "output_index", oi,
          "content_index", 0, "delta", p, "logprobs", M.array())
      end
      add("response.output_text.done", "item_id", it.id, "output_index", oi,
        "content_index", 0, "text", text, "logprobs", M.array())
      add("response.content_part.done", "item_id", it.id, "output_index", oi,
        "content_index", 0, "part", part(text))
    end
    add("response.output_item.done", "output_index", oi, "item", done[idx].value)
  end
  add("response.completed", "response", response_object(view, ctx, "completed",
    output_array(content, ctx), responses_usage(view, output)))
  return events
end

-- The stream:false response of `content`.
local function responses_complete(view, content, ctx)
  local _, output = pieces_of(content)
  return M.encode(response_object(view, ctx, "completed",
    output_array(content, ctx), responses_usage(view, output)))
end

------------------------------------------------------------------------------
-- Successful replies
------------------------------------------------------------------------------

local renderers = {
  openai = { chat_stream, chat_complete },
  openrouter = { chat_stream, chat_complete },
  anthropic = { anthropic_stream, anthropic_complete },
  responses = { responses_stream, responses_complete },
}

-- Headers every reply carries: the content type and a request id in the
-- provider's header name.
local function base_headers(format, content_type, n)
  local id = format == "anthropic" and "request-id" or "x-request-id"
  return { { "Content-Type", content_type }, { id, "req_mock" .. n } }
end

M.sse_type = "text/event-stream; charset=utf-8"
M.json_type = "application/json"

-- The 200 reply to a model request with `content` (see M.content), streamed
-- or not as the request asked. ctx = {n=request number, created=unix time}.
-- A JSON reply carries `tokens` (its output token count) for pacing.
function M.reply(format, view, content, ctx)
  local r = renderers[format] or error("replies.reply: unknown format " .. tostring(format), 2)
  if view.stream then
    local headers = base_headers(format, M.sse_type, ctx.n)
    headers[#headers + 1] = { "Cache-Control", "no-cache" }
    return { status = 200, headers = headers, events = r[1](view, content, ctx) }
  end
  local _, tokens = pieces_of(content)
  return { status = 200, headers = base_headers(format, M.json_type, ctx.n),
    body = r[2](view, content, ctx), tokens = tokens }
end

-- Serializes events as an SSE body. An event named "message" (the SSE
-- default) or unnamed gets no `event:` line; multi-line data gets one
-- `data:` line per line.
function M.sse(events)
  local out = {}
  for _, e in ipairs(events) do
    if e.event and e.event ~= "message" then out[#out + 1] = "event: " .. e.event .. "\n" end
    for line in (e.data .. "\n"):gmatch("(.-)\r?\n") do out[#out + 1] = "data: " .. line .. "\n" end
    out[#out + 1] = "\n"
  end
  return table.concat(out)
end

------------------------------------------------------------------------------
-- Error statuses
------------------------------------------------------------------------------

M.reasons = {
  [100] = "Continue", [200] = "OK", [400] = "Bad Request", [401] = "Unauthorized",
  [402] = "Payment Required", [403] = "Forbidden", [404] = "Not Found",
  [405] = "Method Not Allowed", [408] = "Request Timeout", [409] = "Conflict",
  [413] = "Payload Too Large", [422] = "Unprocessable Entity",
  [429] = "Too Many Requests", [431] = "Request Header Fields Too Large",
  [500] = "Internal Server Error", [501] = "Not Implemented", [502] = "Bad Gateway",
  [503] = "Service Unavailable", [504] = "Gateway Timeout", [529] = "Overloaded",
}

-- Per status: the Anthropic error type, the OpenAI type and code, a message.
local status_errors = {
  [400] = { "invalid_request_error", "invalid_request_error", nil, "Invalid request." },
  [401] = { "authentication_error", "invalid_request_error", "invalid_api_key",
    "Incorrect API key provided." },
  [402] = { "billing_error", "insufficient_quota", "insufficient_quota",
    "Insufficient credits. Add more using https://openrouter.ai/settings/credits" },
  [403] = { "permission_error", "invalid_request_error", "permission_denied",
    "Your API key does not have permission to use the specified resource." },
  [404] = { "not_found_error", "invalid_request_error", "model_not_found",
    "The requested resource was not found." },
  [408] = { "timeout_error", "server_error", "timeout", "Request timed out." },
  [409] = { "invalid_request_error", "invalid_request_error", "conflict", "Conflict." },
  [413] = { "request_too_large", "invalid_request_error", "request_too_large",
    "Request exceeds the maximum allowed number of bytes." },
  [429] = { "rate_limit_error", "requests", "rate_limit_exceeded",
    "Rate limit reached for requests per min (RPM): Limit 500, Used 500, Requested 1." },
  [500] = { "api_error", "server_error", nil,
    "The server had an error while processing your request. Sorry about that!" },
  [502] = { "api_error", "server_error", nil, "Bad gateway." },
  [503] = { "overloaded_error", "server_error", nil,
    "The engine is currently overloaded, please try again later." },
  [504] = { "timeout_error", "server_error", nil, "Gateway timeout." },
  [529] = { "overloaded_error", "server_error", nil, "Overloaded" },
}

-- Context overflow messages, as each provider words them.
local overflow = {
  anthropic = "prompt is too long: 210000 tokens > 200000 maximum",
  openai = "This model's maximum context length is 200000 tokens. However, your messages "
    .. "resulted in 210000 tokens. Please reduce the length of the messages.",
  openrouter = "This endpoint's maximum context length is 200000 tokens. However, you "
    .. "requested about 210000 tokens. Please reduce the length of the messages.",
  responses = "Your input exceeds the context window of this model. Please adjust your "
    .. "input and try again.",
}

-- An error body for `status` in `format`'s shape. `opts`: overflow=true for
-- a context overflow, in_flight=true for OpenRouter's in-flight 402, type=
-- and message= to override.
function M.error_body(format, status, opts)
  opts = opts or {}
  local e = status_errors[status]
    or { status < 500 and "invalid_request_error" or "api_error",
         status < 500 and "invalid_request_error" or "server_error", nil,
         M.reasons[status] or ("HTTP " .. status) }
  local atype, otype, code, message = e[1], e[2], e[3], e[4]
  if opts.overflow then
    message = overflow[format]
    atype, otype, code = "invalid_request_error", "invalid_request_error", "context_length_exceeded"
  end
  if opts.type then atype, otype, code = opts.type, opts.type, opts.type end
  message = opts.message or message
  -- 402 is OpenRouter's (OpenAI and Anthropic refuse credit otherwise), so
  -- it takes OpenRouter's shape on every endpoint.
  if status == 402 or format == "openrouter" then
    local metadata
    if opts.in_flight then
      message = opts.message or ("This request would exceed your available credits given "
        .. "your current in-flight requests. Retry after in-flight requests settle, or add credits.")
      metadata = M.object("reason", "in_flight_budget_exhausted",
        "limit_source", "openrouter_in_flight_budget",
        "remedy_hint", "Retry after your in-flight requests settle (see the Retry-After header).")
    end
    return M.encode(M.object("error", M.object("code", status, "message", message,
      "metadata", metadata), "user_id", "user_mock"))
  end
  if format == "anthropic" then
    return M.encode(M.object("type", "error", "error", M.object("type", atype,
      "message", message), "request_id", opts.request_id))
  end
  return M.encode(M.object("error", M.object("message", message, "type", otype,
    "param", opts.overflow and (format == "responses" and "input" or "messages") or M.null,
    "code", code or M.null)))
end

-- An error response for a status fault: {status=, headers=, body=}. The
-- fault's retry-after, retry-after-ms, retry-after-date and x-should-retry
-- arguments become headers; `now` is the wall clock (unix seconds).
function M.status_error(format, fault, ctx)
  local status, args = fault.status, fault.args or {}
  local headers = base_headers(format, M.json_type, ctx.n)
  if args["retry-after"] then
    headers[#headers + 1] = { "Retry-After", json.encode(args["retry-after"]) }
  end
  if args["retry-after-ms"] then
    headers[#headers + 1] = { "retry-after-ms", json.encode(args["retry-after-ms"]) }
  end
  if args["retry-after-date"] then
    local when = math.floor((ctx.now or os.time()) + args["retry-after-date"])
    headers[#headers + 1] = { "Retry-After", os.date("!%a, %d %b %Y %H:%M:%S GMT", when) }
  end
  if args["x-should-retry"] ~= nil then
    headers[#headers + 1] = { "x-should-retry", tostring(args["x-should-retry"]) }
  end
  return { status = status, headers = headers, body = M.error_body(format, status, {
    overflow = args.overflow, in_flight = args["in-flight"], request_id = "req_mock" .. ctx.n }) }
end

------------------------------------------------------------------------------
-- Stream faults
------------------------------------------------------------------------------

-- The part of a reply an event belongs to: "open" (role chunk,
-- message_start, response.created...), "delta" (text or tool arguments),
-- "close" (block and item ends), "finish" (the stop reason and usage) or
-- "end" (the terminator: [DONE], message_stop, response.completed). Works on
-- recorded events too, so faults apply to cassettes.
function M.phase(e)
  local name, data = e.event, e.data
  if data == "[DONE]" or name == "message_stop" or name == "response.completed"
    or name == "response.failed" or name == "response.incomplete" then
    return "end"
  end
  if name == "message_delta" then return "finish" end
  if name == "content_block_delta" or (name and name:match("^response%..*%.delta$")) then
    return "delta"
  end
  if name == "content_block_stop" or (name and name:match("^response%..*%.done$")) then
    return "close"
  end
  if name ~= nil and name ~= "message" then return "open" end
  local chunk = M.decode(data)
  if type(chunk) ~= "table" or type(chunk.choices) ~= "table" then return "open" end
  local choice = chunk.choices[1]
  if choice == nil then return chunk.usage and "finish" or "open" end
  if choice.finish_reason ~= nil and choice.finish_reason ~= M.null then return "finish" end
  local delta = type(choice.delta) == "table" and choice.delta or {}
  if type(delta.content) == "string" and delta.content ~= "" then return "delta" end
  local call = type(delta.tool_calls) == "table" and delta.tool_calls[1]
  if type(call) == "table" and type(call["function"]) == "table"
    and (call["function"].arguments or "") ~= "" then
    return "delta"
  end
  return "open"
end

-- Stream error messages by type.
local stream_messages = {
  overloaded_error = "Overloaded",
  rate_limit_error = "Rate limited: too many requests, please slow down.",
  no_capacity = "The server is currently experiencing high demand and does not have "
    .. "capacity to handle your request.",
}

-- An in-stream error event of `etype` in `format`'s shape; `seq` is the
-- responses sequence number it takes.
function M.stream_error(format, etype, view, ctx, seq)
  local message = stream_messages[etype] or ("Mock stream error: " .. etype)
  if format == "anthropic" then
    return aev(M.object("type", "error", "error", M.object("type", etype, "message", message)))
  elseif format == "responses" then
    return ev("error", M.object("type", "error", "code", etype, "message", message,
      "param", M.null, "sequence_number", seq))
  elseif format == "openrouter" then
    return ev(nil, M.object("id", M.chat_id(ctx), "object", "chat.completion.chunk",
      "created", ctx.created, "model", view.model, "provider", "Mock",
      "error", M.object("code", etype, "message", message),
      "choices", M.array { M.object("index", 0, "delta", M.object("content", ""),
        "finish_reason", "error") }))
  end
  return ev(nil, M.object("error", M.object("message", message, "type", etype,
    "param", M.null, "code", etype)))
end

-- The `cut`, `bad-json` and `stream-error` faults applied to a reply (in
-- place; returns it). On a stream: `cut` keeps the opening and the deltas,
-- `cut:finished` drops only the terminator, `bad-json` adds a truncated copy
-- of the first delta after it, `stream-error:T` ends the stream with an
-- error event after `after` deltas (default 1). On a JSON body: `cut` and
-- `cut:finished` set resp.truncate (the server sends half the body, then
-- closes), `bad-json` truncates the body text, `stream-error` becomes a 200
-- whose body is the error (as OpenRouter does).
function M.apply(format, resp, fault, view, ctx)
  local kind, args = fault.kind, fault.args or {}
  if not resp.events then
    if kind == "cut" then resp.truncate = true
    elseif kind == "bad-json" then resp.body = resp.body:sub(1, #resp.body // 2)
    elseif kind == "stream-error" then
      resp.status = 200
      resp.body = M.stream_error(format, args.type, view, ctx, 0).data
    end
    return resp
  end
  local out, deltas = {}, 0
  local limit = args.after or 1
  for _, e in ipairs(resp.events) do
    local phase = M.phase(e)
    if kind == "cut" then
      if phase == "end" or (not args.finished and phase ~= "open" and phase ~= "delta") then
        break
      end
    elseif kind == "stream-error" then
      if phase ~= "open" and (phase ~= "delta" or deltas >= limit) then break end
    end
    out[#out + 1] = e
    if phase == "delta" then
      deltas = deltas + 1
      if kind == "bad-json" and deltas == 1 then
        out[#out + 1] = { event = e.event, data = e.data:sub(1, #e.data // 2) }
      end
    end
  end
  if kind == "bad-json" and deltas == 0 then
    table.insert(out, 2, { event = out[1] and out[1].event, data = '{"type":' })
  end
  if kind == "stream-error" then
    out[#out + 1] = M.stream_error(format, args.type, view, ctx, #out)
  end
  resp.events = out
  return resp
end

return M
