-- What the mock provider says, in each wire format the registry knows
-- (lua/luagent/model/provider.lua): streamed SSE events and stream:false
-- JSON, error bodies in each provider's own shape, and the stream faults
-- (cut, bad-json, stream-error) as edits of an event list. What is the
-- format's own comes from its adapter's `mock` table; what every format
-- shares is here. Pure: no sockets, no clock (the caller passes `created`).
--
-- A response here is a table {status=, headers={{name, value}...},
-- events={{event=, data=}...}, format=} for a stream, or {status=, headers=,
-- body=}.
--
-- An adapter's `mock` table (all fields but `format`, `title`,
-- `request_id_header`, `own_statuses` and `generation_id` are needed for
-- the mock to serve the format):
--   format             the mock's name for the format (default: the adapter's name)
--   title              what `luagent mock --help` calls its endpoint
--   request_id_header  the header of the request id (default x-request-id)
--   read(body, path)   -> {messages={{role=, text=, tool_result=}...},
--                      tools={{name=, schema=}...}, include_usage=, model=,
--                      stream=, output=<the structured output's schema>}: a
--                      request (model and stream default to the body's
--                      fields of those names)
--   stream(view, reply, ctx) -> the SSE events {{event=, data=}...} of a reply
--   complete(view, reply, ctx) -> the stream:false JSON text of a reply
--                      (view: M.view; reply: {text=, words=<its pieces>,
--                      calls={{id=, name=, json=, pieces=}...}, output_tokens=,
--                      stop=<"length": cut at the token limit, else nil>};
--                      ctx: {n=<request number>, created=<unix time>})
--   error_body(status, e) -> an error's JSON text; e: {message=, message_given=,
--                      type=<overrides the type and code>, overflow=, in_flight=,
--                      request_id=}
--   overflow_message   its words for a context overflow
--   stream_error(type, message, view, ctx, seq) -> the in-stream error event
--                      (seq: the number of events before it)
--   phase(event)       -> "open", "delta", "close", "finish" or "end" (see
--                      M.phase), or nil for an event not of this format
--   own_statuses       {[status]=true}: statuses answered in this format's
--                      shape whatever the endpoint (a status only it sends)
--   generation_id(ctx) the id under which a streamed reply can be looked up
--                      (lua/luagent/mock/generations.lua)
local json = require "luagent.base.json"
local registry = require "luagent.model.provider"

local M = {}

M.null = json.null

------------------------------------------------------------------------------
-- The formats and where they are served
------------------------------------------------------------------------------

-- The mock's name of an adapter's format.
local function format_of(adapter)
  return adapter.mock.format or adapter.name
end

-- The registered adapter whose format is `format` and that the mock can
-- serve, or nil.
function M.wire(format)
  for _, a in ipairs(registry.adapters()) do
    if a.mock and a.mock.stream and format_of(a) == format then return a end
  end
end

-- The path of a base URL: where a kind's endpoints are on the mock, as on
-- its real server ("https://openrouter.ai/api/v1" -> "/api/v1").
function M.base_path(url)
  return (url:match("^%a[%w+.-]*://[^/]*(/.-)/*$") or "")
end

-- A path template as a Lua pattern: {name} stands for one segment.
local function path_pattern(path)
  return "^" .. path:gsub("[%^%$%(%)%%%.%[%]%*%+%-%?]", "%%%0"):gsub("{[%w_]+}", "[^/]+") .. "$"
end

-- The adapter served at `path` ({kind's base path}{adapter's path}), or
-- nil; the first registered wins.
function M.wire_at(path)
  local kinds = {}
  for kind in pairs(registry.kinds) do kinds[#kinds + 1] = kind end
  table.sort(kinds)
  for _, a in ipairs(registry.adapters()) do
    if a.mock and a.mock.stream then
      for _, kind in ipairs(kinds) do
        local k = registry.kinds[kind]
        if k.adapter == a and path:match(path_pattern(M.base_path(k.base_url) .. a.path)) then return a end
      end
    end
  end
end

-- format_at(path) -> the format served at a path, or nil.
function M.format_at(path)
  local a = M.wire_at(path)
  return a and format_of(a)
end

-- The format served at each path: M.formats[path] (a view of M.format_at).
M.formats = setmetatable({}, { __index = function(_, path) return M.format_at(path) end })

-- The endpoints the mock serves: {{method=, path=, title=}...}, in the
-- order the adapters registered.
function M.endpoints()
  local out = {}
  for _, a in ipairs(registry.adapters()) do
    if a.mock and a.mock.stream then
      local names = {}
      for kind, k in pairs(registry.kinds) do if k.adapter == a then names[#names + 1] = kind end end
      table.sort(names)
      local seen = {}
      for _, kind in ipairs(names) do
        local path = M.base_path(registry.kinds[kind].base_url) .. a.path
        if not seen[path] then
          seen[path] = true
          out[#out + 1] = { method = "POST", path = path, title = a.mock.title or a.name }
        end
      end
    end
  end
  return out
end

-- The adapter of `format`; raises (for `who`) when there is none.
local function wire(format, who)
  return M.wire(format) or error("replies." .. who .. ": unknown format " .. tostring(format), 3)
end

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

-- What the replies need from a decoded request body: {model=, stream=,
-- include_usage=, last_text=, user_text=, last_is_tool_result=, tools=,
-- output= (the schema of structured output, when asked), input_tokens=}. `raw` is the body text (for a token estimate), `path`
-- the request's (a format may name the model there).
function M.view(format, body, raw, path)
  body = type(body) == "table" and body or {}
  local read = wire(format, "view").mock.read(body, path)
  local model = read.model or body.model
  local stream = read.stream
  if stream == nil then stream = body.stream == true end
  local v = {
    model = type(model) == "string" and model or "mock-model",
    stream = stream == true,
    include_usage = read.include_usage == true,
    tools = read.tools or {},
    output = type(read.output) == "table" and read.output or nil, -- structured output's schema
    last_is_tool_result = false,
    input_tokens = math.max(1, (#(raw or "") + 3) // 4),
  }
  for _, m in ipairs(read.messages or {}) do
    if m.role == "user" and not m.tool_result then
      v.user_text = m.text or v.user_text
    end
    v.last_text = m.text
    v.last_is_tool_result = m.tool_result == true
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
M.arguments_for = arguments_for

-- An example value of JSON Schema `s` (structured output's canned
-- answer): a const, the first enum value, the first anyOf/oneOf choice, a
-- local $ref followed; an object with every property; strings are `text`
-- cut or padded to their length bounds, numbers the lowest bound (else 0),
-- arrays as many items as minItems asks (else one). `root` resolves $ref.
local function example(s, text, root, depth)
  if type(s) ~= "table" or depth > 16 then return M.null end
  if type(s["$ref"]) == "string" then
    local node = root
    for part in s["$ref"]:sub(2):gmatch("/([^/]*)") do
      node = type(node) == "table" and node[(part:gsub("~1", "/"):gsub("~0", "~"))] or nil
    end
    return example(node, text, root, depth + 1)
  end
  if s.const ~= nil then return s.const end
  if type(s.enum) == "table" and s.enum[1] ~= nil then return s.enum[1] end
  local choices = type(s.anyOf) == "table" and s.anyOf or type(s.oneOf) == "table" and s.oneOf
  if choices and choices[1] ~= nil then return example(choices[1], text, root, depth + 1) end
  if type(s.allOf) == "table" and s.allOf[1] ~= nil then return example(s.allOf[1], text, root, depth + 1) end
  local ty = s.type
  if type(ty) == "table" then
    local first = ty[1]
    for _, t in ipairs(ty) do if t ~= "null" then first = t break end end
    ty = first
  end
  if ty == nil and type(s.properties) == "table" then ty = "object" end
  if ty == "object" then
    local names, props = {}, type(s.properties) == "table" and s.properties or {}
    for k in pairs(props) do names[#names + 1] = k end
    table.sort(names)
    local args = {}
    for _, k in ipairs(names) do
      args[#args + 1] = k
      args[#args + 1] = example(props[k], text, root, depth + 1)
    end
    return M.object(table.unpack(args))
  elseif ty == "array" then
    local n = math.max(type(s.minItems) == "number" and s.minItems or 1, 0)
    if type(s.maxItems) == "number" then n = math.min(n, s.maxItems) end
    local out = M.array()
    for i = 1, n do out[i] = example(s.items, text, root, depth + 1) end
    return out
  elseif ty == "integer" or ty == "number" then
    local v = type(s.minimum) == "number" and s.minimum
      or type(s.exclusiveMinimum) == "number" and s.exclusiveMinimum + 1
      or type(s.maximum) == "number" and math.min(0, s.maximum) or 0
    return ty == "integer" and (math.tointeger(math.ceil(v)) or 0) or v
  elseif ty == "boolean" then return true
  elseif ty == "null" then return M.null
  end
  local str = text
  if type(s.maxLength) == "number" and utf8.len(str) and utf8.len(str) > s.maxLength then
    str = str:sub(1, (utf8.offset(str, s.maxLength + 1) or #str + 1) - 1)
  end
  if type(s.minLength) == "number" then
    local n = utf8.len(str) or #str
    if n < s.minLength then str = str .. string.rep("x", s.minLength - n) end
  end
  return str
end

-- example(schema, text) -> an example value of a JSON Schema.
function M.example(schema, text) return example(schema, text or "", schema, 0) end

-- The content of a canned reply: {text=} or {tool={id=, name=, arguments=}}.
-- Rules: a tool call of the first tool when tools are offered and the last
-- message is not a tool result; otherwise, when the request asks for
-- structured output, an example value of its schema (the user's text for
-- strings); otherwise the last message's text echoed.
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
  if view.output then return { output = M.example(view.output, view.user_text or echo) } end
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

-- The output token count of a content: its text's words and its calls'
-- pieces (a content with tool calls streams its text, if any, first).
local function tokens_of(content)
  local n = content.text and #M.words(content.text) or 0
  for _, c in ipairs(calls_of(content)) do n = n + #c.pieces end
  return math.max(1, n)
end

-- output_tokens(content) -> the output token count of a content.
function M.output_tokens(content) return tokens_of(content) end

-- The reply an adapter renders of a content (see the head of this file);
-- a content's `output` (a value: structured output) is its text as JSON.
local function reply_of(content)
  if content.output ~= nil and content.text == nil then content.text = M.encode(content.output) end
  return { text = content.text, words = content.text and M.words(content.text) or {},
    calls = calls_of(content), output_tokens = tokens_of(content), stop = content.stop }
end

------------------------------------------------------------------------------
-- Successful replies
------------------------------------------------------------------------------

-- Headers every reply carries: the content type and a request id in the
-- provider's header name.
local function base_headers(adapter, content_type, n)
  return { { "Content-Type", content_type }, { adapter.mock.request_id_header or "x-request-id", "req_mock" .. n } }
end

M.sse_type = "text/event-stream; charset=utf-8"
M.json_type = "application/json"

-- The 200 reply to a model request with `content` (see M.content), streamed
-- or not as the request asked. ctx = {n=request number, created=unix time}.
-- A JSON reply carries `tokens` (its output token count) for pacing.
function M.reply(format, view, content, ctx)
  local adapter = wire(format, "reply")
  local reply = reply_of(content)
  if view.stream then
    local headers = base_headers(adapter, M.sse_type, ctx.n)
    headers[#headers + 1] = { "Cache-Control", "no-cache" }
    return { status = 200, headers = headers, events = adapter.mock.stream(view, reply, ctx), format = format }
  end
  return { status = 200, headers = base_headers(adapter, M.json_type, ctx.n),
    body = adapter.mock.complete(view, reply, ctx), tokens = reply.output_tokens }
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

-- Per status: a message (each format puts it in its own shape).
local status_messages = {
  [400] = "Invalid request.",
  [401] = "Incorrect API key provided.",
  [402] = "Insufficient credits. Add more using https://openrouter.ai/settings/credits",
  [403] = "Your API key does not have permission to use the specified resource.",
  [404] = "The requested resource was not found.",
  [408] = "Request timed out.",
  [409] = "Conflict.",
  [413] = "Request exceeds the maximum allowed number of bytes.",
  [429] = "Rate limit reached for requests per min (RPM): Limit 500, Used 500, Requested 1.",
  [500] = "The server had an error while processing your request. Sorry about that!",
  [502] = "Bad gateway.",
  [503] = "The engine is currently overloaded, please try again later.",
  [504] = "Gateway timeout.",
  [529] = "Overloaded",
}

-- The adapter whose shape answers `status` on every endpoint, or nil.
local function status_owner(status)
  for _, a in ipairs(registry.adapters()) do
    if a.mock and a.mock.own_statuses and a.mock.own_statuses[status] and a.mock.error_body then return a end
  end
end

-- An error body for `status` in `format`'s shape (or the shape of the
-- format that owns the status). `opts`: overflow=true for a context
-- overflow (in the format's words), in_flight=true for an in-flight budget
-- 402, type= and message= to override.
function M.error_body(format, status, opts)
  opts = opts or {}
  local adapter = wire(format, "error_body")
  local message = opts.message or (opts.overflow and adapter.mock.overflow_message)
    or status_messages[status] or M.reasons[status] or ("HTTP " .. status)
  local shape = status_owner(status) or adapter
  return shape.mock.error_body(status, { message = message, message_given = opts.message ~= nil,
    type = opts.type, overflow = opts.overflow, in_flight = opts.in_flight, request_id = opts.request_id })
end

-- An error response for a status fault: {status=, headers=, body=}. The
-- fault's retry-after, retry-after-ms, retry-after-date and x-should-retry
-- arguments become headers; `now` is the wall clock (unix seconds).
function M.status_error(format, fault, ctx)
  local status, args = fault.status, fault.args or {}
  local headers = base_headers(wire(format, "status_error"), M.json_type, ctx.n)
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
-- "end" (the terminator: [DONE], message_stop, response.completed), as the
-- adapter of `format` says (any adapter's, when no format is given; "open"
-- when none knows the event). Works on recorded events too, so faults
-- apply to cassettes.
function M.phase(e, format)
  return M.phaser(format)(e)
end

-- phaser(format) -> M.phase for the events of one format (nil: any), the
-- format looked up once.
function M.phaser(format)
  local adapter = format and M.wire(format)
  if adapter then
    local phase = adapter.mock.phase
    return function(e) return phase(e) or "open" end
  end
  local all = registry.adapters()
  return function(e)
    for _, a in ipairs(all) do
      local phase = a.mock and a.mock.phase and a.mock.phase(e)
      if phase then return phase end
    end
    return "open"
  end
end

-- Stream error messages by type.
local stream_messages = {
  overloaded_error = "Overloaded",
  rate_limit_error = "Rate limited: too many requests, please slow down.",
  no_capacity = "The server is currently experiencing high demand and does not have "
    .. "capacity to handle your request.",
}

-- An in-stream error event of `etype` in `format`'s shape; `seq` is the
-- number of events before it (the responses API numbers its events).
function M.stream_error(format, etype, view, ctx, seq)
  local message = stream_messages[etype] or ("Mock stream error: " .. etype)
  return wire(format, "stream_error").mock.stream_error(etype, message, view, ctx, seq)
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
  local phase_of = M.phaser(format)
  for _, e in ipairs(resp.events) do
    local phase = phase_of(e)
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
