-- Shared pieces of the provider adapters (openai, anthropic,
-- openai_responses, ...): JSON that keeps empty arrays and JSON Schema exact,
-- request helpers, the stream decoder skeleton that turns provider chunks
-- into the normalized events of lua/luagent/EVENTS.md, and what their mock
-- sides share. Pure Lua, no I/O.
local json = require "luagent.base.json"
local errors = require "luagent.base.errors"

local M = {}

------------------------------------------------------------------------------
-- JSON (lua/luagent/base/json.lua; re-exported for the adapters)
------------------------------------------------------------------------------

M.null = json.null
M.array_mt = json.array_mt
M.array = json.array
M.raw = json.raw
M.encode = json.encode
M.decode = json.decode

local integerize = json.integerize

------------------------------------------------------------------------------
-- Requests
------------------------------------------------------------------------------

-- Checks the parts of a request every adapter needs; misuse raises with the
-- adapter's name (never with opts, which hold the key).
function M.check_request(name, req)
  if type(req) ~= "table" then error(name .. ".build: request must be a table", 3) end
  if type(req.model) ~= "string" or req.model == "" then
    error(name .. ".build: request.model must be a non-empty string", 3)
  end
  if type(req.messages) ~= "table" then error(name .. ".build: request.messages must be a table", 3) end
  for i, m in ipairs(req.messages) do
    if type(m) ~= "table" or (m.role ~= "user" and m.role ~= "assistant" and m.role ~= "tool") then
      error(name .. ".build: messages[" .. i .. "] has no valid role (user, assistant, tool)", 3)
    end
    if m.role == "user" and type(m.content) == "table" then
      local ok, err = M.check_parts(m.content, "messages[" .. i .. "].content")
      if not ok then error(name .. ".build: " .. err, 3) end
    end
  end
end

------------------------------------------------------------------------------
-- Content parts (EVENTS.md, "Conversation history and request"): a user
-- message's content may be a list of provider-neutral parts, which each
-- adapter renders in its format:
--   {type = "text", text =}
--   {type = "image", url = | data = <base64>, mime =, detail =}
--   {type = "file", url = | data = <base64>, mime =, name =}
------------------------------------------------------------------------------

local PART_TYPES = { text = true, image = true, file = true }

-- check_parts(parts, where) -> true, or nil and a message naming the part.
function M.check_parts(parts, where)
  if type(parts) ~= "table" then return nil, where .. " must be a string or a list of parts" end
  for j, p in ipairs(parts) do
    local at = where .. "[" .. j .. "]"
    if type(p) ~= "table" then return nil, at .. ": a part must be a table {type =, ...}" end
    if not PART_TYPES[p.type] then
      return nil, at .. ": unknown part type '" .. tostring(p.type) .. "' (text, image, file)"
    end
    if p.type == "text" then
      if type(p.text) ~= "string" then return nil, at .. ": a text part needs text (a string)" end
    else
      if (p.url == nil) == (p.data == nil) then return nil, at .. ": an " .. (p.type == "image" and "image" or "file part")
        .. " needs url or data (one of them)" end
      if p.url ~= nil and type(p.url) ~= "string" then return nil, at .. ": url must be a string" end
      if p.data ~= nil then
        if type(p.data) ~= "string" then return nil, at .. ": data must be a string (base64)" end
        if type(p.mime) ~= "string" or p.mime == "" then return nil, at .. ": data needs mime (\"image/png\", \"application/pdf\", ...)" end
      end
      if p.name ~= nil and type(p.name) ~= "string" then return nil, at .. ": name must be a string" end
    end
  end
  return true
end

-- The data: URL of a part given by data.
function M.data_url(p)
  return "data:" .. p.mime .. ";base64," .. p.data
end

-- A file part's name: its own, else the last segment of its URL's path.
function M.part_name(p)
  if p.name then return p.name end
  if p.url then
    local name = p.url:match("^[^?#]*/([^/?#]+)")
    return name
  end
end

-- Renders content (a string, or parts) as `render(part, index)` makes each
-- part; a string stays a string.
function M.render_parts(content, render)
  if type(content) ~= "table" then return content or "" end
  local out = M.array()
  for j, p in ipairs(content) do out[#out + 1] = render(p, j) end
  return out
end

------------------------------------------------------------------------------
-- extra_body: merged over the body an adapter built
------------------------------------------------------------------------------

local function is_object(v)
  return type(v) == "table" and getmetatable(v) == nil and v[1] == nil
end

-- merge(base, extra) -> a new table: base's fields with extra's laid over
-- them; where both are objects they are merged the same way (deep), any
-- other value of extra replaces (lists too); json.null removes the field.
-- Neither table is changed.
function M.merge(base, extra)
  local out = {}
  for k, v in pairs(base) do out[k] = v end
  for k, v in pairs(extra) do
    if v == json.null then
      out[k] = nil
    elseif is_object(v) and is_object(out[k]) then
      out[k] = M.merge(out[k], v)
    else
      out[k] = v
    end
  end
  return out
end

-- Joins a base URL (trailing slashes dropped) and a path; a query the base
-- carries (?api-version=, ?key=) goes after the path.
function M.url(base, path)
  local head, query = base:match("^([^?#]*)(.*)$")
  return (head:gsub("/+$", "")) .. path .. query
end

-- The HTTP request every adapter builds: POST {base}{path} with the JSON
-- `body`, the adapter's `headers` (plus Accept: text/event-stream when
-- `stream`) merged with the caller's `opts.headers`.
-- `opts.extra_body` (the request's extra_body) is merged over `body`
-- (M.merge): what the caller gives wins.
function M.post(adapter, opts, path, headers, body, stream)
  if stream then headers.accept = "text/event-stream" end
  if type(opts.extra_body) == "table" then body = M.merge(body, opts.extra_body) end
  return {
    method = "POST",
    url = M.url(opts.base_url or adapter.default_base_url, path),
    headers = M.headers(headers, opts.headers),
    body = M.encode(body),
  }
end

-- A decoder's `handle` that dispatches each payload on its `type` (or the
-- SSE event name) to handlers[type](dec, payload); unknown types (pings,
-- new event kinds) are ignored.
function M.dispatch(handlers)
  return function(dec, p, ev)
    local kind = M.want(p.type, "string", "type") or ev.event
    local h = handlers[kind]
    if h then return h(dec, p) end
  end
end

-- Merges the adapter's headers with the caller's extra ones; names are
-- lowercased so an extra header replaces a default one whatever its case.
function M.headers(defaults, extra)
  local h = {}
  for k, v in pairs(defaults) do h[k:lower()] = v end
  for k, v in pairs(extra or {}) do h[k:lower()] = v end
  return h
end

-- JSON Schema keywords whose value is an array, and keywords whose value maps
-- names to schemas (so a property named "required" is not taken for one).
local ARRAY_KEYWORDS = { required = true, enum = true, anyOf = true, allOf = true,
  oneOf = true, prefixItems = true, examples = true, type = true }
local MAP_KEYWORDS = { properties = true, patternProperties = true, ["$defs"] = true,
  definitions = true, dependentSchemas = true }

-- Copies schema `s`, marking empty array keywords; tables that already have
-- a metatable (marked arrays, raw JSON) are the caller's choice and kept.
local function schema_copy(s)
  if type(s) ~= "table" or getmetatable(s) ~= nil then return s end
  local out = {}
  for k, v in pairs(s) do
    if ARRAY_KEYWORDS[k] and type(v) == "table" and next(v) == nil then
      out[k] = M.array()
    elseif MAP_KEYWORDS[k] and type(v) == "table" then
      local map = {}
      for name, sub in pairs(v) do map[name] = schema_copy(sub) end
      out[k] = map
    else
      out[k] = schema_copy(v)
    end
  end
  return out
end

-- A tool's parameters as JSON Schema ready to encode: a copy in which empty
-- array keywords (`required = {}`) stay arrays; absent means "no arguments".
function M.schema(parameters)
  if parameters == nil then return { type = "object", properties = {} } end
  return schema_copy(parameters)
end

-- Structured output (request.output = {name =, schema =, strict =}: the
-- call layer's, from an `output` option). Whether `schema` meets OpenAI's
-- strict mode, which refuses any other: every object lists all its
-- properties in `required` and sets additionalProperties = false.
local function strict_ready(s, seen)
  if type(s) ~= "table" then return true end
  if seen[s] then return true end
  seen[s] = true
  local props = type(s.properties) == "table" and s.properties or nil
  if s.type == "object" or props then
    if s.additionalProperties ~= false then return false end
    local required = {}
    for _, name in ipairs(type(s.required) == "table" and s.required or {}) do required[name] = true end
    for name in pairs(props or {}) do if not required[name] then return false end end
  end
  for k, v in pairs(s) do
    if type(v) == "table" and k ~= "enum" and k ~= "const" and k ~= "required" and k ~= "examples" then
      if not strict_ready(v, seen) then return false end
    end
  end
  return true
end

-- The output's `strict`: as given, else whether the schema allows it.
function M.output_strict(output)
  if output.strict ~= nil then return output.strict end
  return strict_ready(output.schema, {})
end

-- The output's schema ready to encode (empty array keywords kept arrays).
function M.output_schema(output)
  return schema_copy(output.schema)
end

-- True when `tools` holds at least one tool (empty lists are omitted).
function M.has_tools(tools)
  return type(tools) == "table" and tools[1] ~= nil
end

-- A tool call's arguments as JSON object text. Replays the exact text the
-- model sent when it is still valid, else encodes the table.
function M.arguments_text(call)
  if type(call.raw_arguments) == "string" and type(M.decode(call.raw_arguments)) == "table" then
    return call.raw_arguments
  end
  if type(call.arguments) == "table" then return M.encode(call.arguments) end
  if type(call.arguments) == "string" and type(M.decode(call.arguments)) == "table" then
    return call.arguments
  end
  return "{}"
end

-- A tool call's arguments as a value to embed in a body (Anthropic `input`).
function M.arguments_value(call)
  return M.raw(M.arguments_text(call))
end

-- A tool result's content as text.
function M.result_text(content)
  if content == nil then return "" end
  if type(content) == "string" then return content end
  if type(content) == "table" then return M.encode(content) end
  return tostring(content)
end

------------------------------------------------------------------------------
-- Reading payloads
------------------------------------------------------------------------------

-- Decoders read what a server sent through want() and need(): a field of
-- the wrong type is the server's fault, reported as a protocol error that
-- names the field in the payload's own terms ("choices[1].delta.content:
-- expected a string, got number"), never as a Lua error of the adapter.
-- null and an absent field are the same: nil.

-- The metatable of the fault a handler raises; Decoder:feed catches it.
local FAULT = { __name = "luagent.payload_fault" }

local EXPECTED = { string = "a string", number = "a number", integer = "an integer", object = "an object",
  array = "an array" }

-- The JSON type of a decoded value (cjson leaves arrays unmarked: a table
-- with an element 1 is an array, any other an object; {} may be either).
local function json_type(v)
  if v == nil then return "nothing" end
  if v == json.null then return "null" end
  local t = type(v)
  if t == "table" then return v[1] ~= nil and "array" or "object" end
  return t
end

-- Raises the fault of `v` where `kind` was expected; `path` (a format,
-- with its arguments) names the field, made only now.
function M.fault(v, kind, path, ...)
  local field = select("#", ...) > 0 and string.format(path, ...) or path
  local got = json_type(v)
  if kind == "integer" and got == "number" then got = v ~= v and "NaN" or tostring(v) end -- 0.5, NaN
  error(setmetatable({ field = field, message = field .. ": expected " .. EXPECTED[kind] .. ", got " .. got },
    FAULT), 0)
end

local math_type, tointeger = math.type, math.tointeger

-- want(v, kind, path, ...) -> v (as an integer for "integer"), or nil for
-- null or absent; a fault for any other type. Kinds: string, number,
-- integer (a whole number), object, array.
function M.want(v, kind, path, ...)
  if v == nil or v == json.null then return nil end
  local t = type(v)
  if kind == "string" or kind == "number" then
    if t == kind then return v end
  elseif kind == "integer" then
    local i = t == "number" and (math_type(v) == "integer" and v or tointeger(v))
    if i then return i end
  elseif t == "table" then -- an object or an array; {} is either
    if (v[1] == nil) == (kind == "object") or next(v) == nil then return v end
  end
  M.fault(v, kind, path, ...)
end

-- need(v, kind, path, ...) -> v, as want, but null and absent are faults
-- too (an element of an array of objects).
function M.need(v, kind, path, ...)
  if v == nil or v == json.null then M.fault(v, kind, path, ...) end
  return M.want(v, kind, path, ...)
end

-- error_object(v, path) -> a provider's error object: the object, a string
-- as its message, or nil for null; any other type is a fault.
function M.error_object(v, path)
  if type(v) == "string" then return { message = v } end
  return M.want(v, "object", path)
end

------------------------------------------------------------------------------
-- Stream decoding
------------------------------------------------------------------------------

-- Normalized usage with every field an integer (0 when not reported).
function M.usage(input, output, cache_read, cache_write)
  local function n(x) return math.tointeger(tonumber(x) or 0) or 0 end
  return { type = "usage", input_tokens = n(input), output_tokens = n(output),
    cache_read_tokens = n(cache_read), cache_write_tokens = n(cache_write) }
end

-- Decodes a tool call's assembled argument text. Returns the table, or nil
-- and a message. Empty text means no arguments. Strict (json.decode_strict):
-- the text goes on to command and MCP tools as it is, so it must hold
-- exactly the value the schema checks, and a non-finite number would make
-- every later encoding of the call raise.
local function decode_arguments(raw)
  if raw == "" then return {} end
  local v, err = json.decode_strict(raw, "arguments")
  if v == nil then return nil, "invalid JSON arguments: " .. err end
  if type(v) ~= "table" then return nil, "invalid JSON arguments: expected an object" end
  return integerize(v)
end

local Decoder = {}
Decoder.__index = Decoder
local math_type = math.type

-- Makes a decoder for adapter `name`. `handle(dec, payload, sse_event)` turns
-- one decoded data payload into events through the methods below and returns
-- nothing, or nil and an error from dec:fail(). `sentinel` is a data text that
-- ends the stream ("[DONE]"). `terminator` names it in truncation messages.
function M.decoder(name, ctx, handle, sentinel, terminator)
  return setmetatable({
    provider = name, model = ctx and ctx.model, handle = handle,
    sentinel = sentinel, terminator = terminator,
    -- fields a stream reads per event are present (false or 0), so they
    -- are found without the metatable's miss: failed, offset
    n = 0, out = nil, started = false, ended = false, failed = false, delivered = false, offset = 0,
    text = {}, thinking = {}, calls = {}, by_key = {},
    usage_ev = nil, stop = nil, raw_stop = nil,
  }, Decoder)
end

-- Types that count as output the user has seen (retrying would repeat it).
local DELIVERED = { text_delta = true, thinking_delta = true, tool_call_start = true,
  tool_call_delta = true, tool_call_end = true }

-- Feeds one SSE event; returns the array of normalized events it produced,
-- or nil and an error record (sticky: later calls return the same error).
-- `out` (optional) is the empty array to fill and return: a reader that
-- hands the events out one by one reuses one.
function Decoder:feed(ev, out)
  if self.failed then return nil, self.failed end
  if type(ev) ~= "table" then error(self.provider .. " decoder: feed expects an SSE event table", 2) end
  self.n = self.n + 1
  out = out or {}
  self.out = out
  local data = ev.data
  -- where the event began in the body: just past the one before it
  local offset = self.offset
  if math_type(ev.offset) == "integer" then self.offset = ev.offset end
  if self.ended or data == nil or data == "" then return out end
  if data == self.sentinel then
    self:complete()
    return self:flush(out)
  end
  -- a C fast path reads the commonest chunks without decoding them to a
  -- table; it declines whatever it cannot read exactly as below
  local fast = self.fast
  if fast and fast(self, data) then
    if self.delivered then return out end
    return self:flush(out)
  end
  local payload, jerr = M.decode(json.clean_utf8(data))
  if payload == nil then
    return self:fail("protocol", string.format("invalid JSON in SSE data at event %d: %s (byte offset %d)",
      self.n, jerr, offset), { event_index = self.n, offset = offset })
  end
  if type(payload) ~= "table" then return out end
  -- a payload of an unexpected shape must not raise: it is the server's
  -- fault, reported as a protocol error like malformed JSON, in its terms
  local ran, ok, err = pcall(self.handle, self, payload, ev)
  if not ran then
    self.out = {}
    local fields, what = { event_index = self.n, offset = offset }, ok
    if getmetatable(what) == FAULT then
      fields.field, what = what.field, what.message
    else -- the adapter's own bug: said without where in its file it happened
      what = "the " .. self.provider .. " adapter could not read it: " .. (tostring(what):gsub("^[^\n]-:%d+: ", ""))
    end
    return self:fail("protocol", string.format("unexpected payload in SSE data at event %d: %s (byte offset %d)",
      self.n, what, offset), fields)
  end
  if ok == nil and err then return nil, err end
  return self:flush(out)
end

-- Returns the final events once the body has ended, or nil and an error:
-- `truncated` unless the stream's terminator or a stop reason was seen.
function Decoder:finish()
  if self.failed then return nil, self.failed end
  local out = {}
  self.out = out
  if self.ended then return out end
  if self.stop == nil then
    return self:fail("truncated", "stream ended before " .. self.terminator, {})
  end
  self:complete()
  return self:flush(out)
end

-- Notes what `out` delivered and returns it.
function Decoder:flush(out)
  if self.delivered then return out end
  for _, e in ipairs(out) do
    if DELIVERED[e.type] then self.delivered = true; break end
  end
  return out
end

-- Records the decoder's failure; returns nil and the error. Events of the
-- failing call are dropped, so `delivered` counts earlier calls only.
function Decoder:fail(kind, message, fields)
  fields.provider = self.provider
  fields.delivered = self.delivered
  if self.usage_ev then fields.usage = self:usage_table() end
  self.failed = errors.new(kind, message, fields)
  return nil, self.failed
end

-- Fails with a stream_error built from a provider's error object `obj`,
-- keeping its type/code/status exactly as sent; `raw` (default `obj`) is the
-- decoded object kept on the record.
function Decoder:stream_error(obj, fallback, raw)
  local t = type(obj) == "table" and obj or {}
  local msg = t.message
  if type(msg) ~= "string" or msg == "" then msg = fallback or "provider reported an error" end
  local function keep(v) if v ~= json.null then return v end end
  return self:fail("stream_error", msg, { type = keep(t.type), code = keep(t.code),
    status = keep(t.status), raw = raw or obj })
end

-- Emits one event into the current output.
function Decoder:emit(e)
  self.out[#self.out + 1] = e
end

-- Emits message_start once; `id` and `model` come from the provider when
-- known. Every content method calls it, so it always comes first.
function Decoder:start(id, model)
  if self.started then return end
  self.started = true
  if type(model) ~= "string" then model = self.model end
  self:emit({ type = "message_start", provider = self.provider, model = model,
    id = type(id) == "string" and id or nil })
end

-- Emits a text delta (empty strings are dropped).
function Decoder:add_text(s)
  if type(s) ~= "string" or s == "" then return end
  if not self.started then self:start() end
  local text, out = self.text, self.out
  text[#text + 1] = s
  out[#out + 1] = { type = "text_delta", text = s }
end

-- Emits a thinking delta (empty strings are dropped).
function Decoder:add_thinking(s)
  if type(s) ~= "string" or s == "" then return end
  self:start()
  self.thinking[#self.thinking + 1] = s
  self:emit({ type = "thinking_delta", text = s })
end

-- Keeps the signature of thinking block `key` (Anthropic), which must go
-- back with the thinking when the conversation continues. Not an event. A
-- message with several signed blocks cannot be replayed as one, so keeps none.
function Decoder:add_signature(s, key)
  if type(s) ~= "string" then return end
  if self.signature_key ~= nil and self.signature_key ~= key then self.signature_many = true end
  self.signature_key = key
  self.signature = (self.signature or "") .. s
end

-- Opens tool call `key` (the provider's handle for it: an index, a block
-- index or an item id) and emits tool_call_start. Returns the call.
function Decoder:open_call(key, id, name)
  self:start()
  local call = { index = #self.calls + 1, id = id, name = name, parts = {} }
  self.calls[call.index] = call
  if key ~= nil then self.by_key[key] = call end
  self:emit({ type = "tool_call_start", index = call.index, id = id, name = name })
  return call
end

-- Makes `key` a second name of `call` (an item id and an output index).
function Decoder:alias(key, call)
  if key ~= nil then self.by_key[key] = call end
end

-- The open or closed call known as `key`, or nil.
function Decoder:call(key)
  return self.by_key[key]
end

-- Appends argument text to an open call and emits tool_call_delta.
function Decoder:add_arguments(call, s)
  if call.closed or type(s) ~= "string" or s == "" then return end
  call.parts[#call.parts + 1] = s
  self:emit({ type = "tool_call_delta", index = call.index, id = call.id, arguments = s })
end

-- Closes a call: decodes its arguments (`full`, when the provider sends the
-- whole text at the end, wins over the assembled parts) and emits
-- tool_call_end. Invalid JSON is reported on the event, never raised.
function Decoder:close_call(call, full)
  if call.closed then return end
  call.closed = true
  call.raw = type(full) == "string" and full or table.concat(call.parts)
  call.arguments, call.error = decode_arguments(call.raw)
  self:emit({ type = "tool_call_end", index = call.index, id = call.id, name = call.name,
    arguments = call.arguments, raw_arguments = call.raw, error = call.error })
end

-- Closes every call still open, in order.
function Decoder:close_calls()
  for _, call in ipairs(self.calls) do self:close_call(call) end
end

-- Records the latest normalized usage (an M.usage table).
function Decoder:set_usage(u)
  self.usage_ev = u
end

-- A copy of the usage without its `type`, as message_end and errors carry it.
function Decoder:usage_table()
  local u = self.usage_ev
  return { input_tokens = u.input_tokens, output_tokens = u.output_tokens,
    cache_read_tokens = u.cache_read_tokens, cache_write_tokens = u.cache_write_tokens }
end

-- Records the normalized and raw stop reason (see complete() for tool_use).
function Decoder:set_stop(stop, raw)
  self.stop, self.raw_stop = stop, raw
end

-- Ends the message: closes calls, emits usage (when known) and the one
-- message_end with the assembled assistant message. A plain stop after tool
-- calls is reported as tool_use: the calls still wait for their results.
function Decoder:complete()
  if self.ended then return end
  self.ended = true
  self:start()
  self:close_calls()
  local stop = self.stop or "stop"
  if stop == "stop" and #self.calls > 0 then stop = "tool_use" end
  local usage
  if self.usage_ev then
    self:emit(self.usage_ev)
    usage = self:usage_table()
  end
  local message = { role = "assistant", content = table.concat(self.text) }
  if #self.thinking > 0 then message.thinking = table.concat(self.thinking) end
  if self.signature and not self.signature_many then message.thinking_signature = self.signature end
  if #self.calls > 0 then
    message.tool_calls = {}
    for i, c in ipairs(self.calls) do
      message.tool_calls[i] = { id = c.id, name = c.name, arguments = c.arguments,
        raw_arguments = c.raw, error = c.error }
    end
  end
  self:emit({ type = "message_end", stop_reason = stop, raw_stop_reason = self.raw_stop,
    message = message, usage = usage })
end

M.Decoder = Decoder

------------------------------------------------------------------------------
-- The mock's side: what the adapters' `mock` tables share (the mock provider,
-- lua/luagent/mock/replies.lua, says what it asks of them). Pure.
------------------------------------------------------------------------------

M.object = json.object -- key order kept: a mock's replies are the same bytes every time

-- One SSE event carrying `value` as JSON; `name` may be nil.
function M.event(name, value)
  return { event = name, data = M.encode(value) }
end

-- The text of a content value: a string, or the concatenated text of a list
-- of parts (text, input_text, output_text, tool_result blocks...).
local function content_text(content)
  if type(content) == "string" then return content end
  if type(content) ~= "table" then return nil end
  local parts = {}
  for _, part in ipairs(content) do
    if type(part) == "table" then
      local t = part.text or content_text(part.content) or content_text(part.output)
      if type(t) == "string" then parts[#parts + 1] = t end
    end
  end
  if #parts == 0 then return nil end
  return table.concat(parts)
end
M.content_text = content_text

-- True when a content value holds a tool_result block (Anthropic's).
local function has_tool_result(content)
  if type(content) ~= "table" then return false end
  for _, part in ipairs(content) do
    if type(part) == "table" and part.type == "tool_result" then return true end
  end
  return false
end

-- A request's history items (a list, or a string: one user message) as
-- the mock reads them: {{role=, text=, tool_result=}...}. One reading for
-- the three bundled formats: a tool role, a function_call_output item and
-- a user message of tool_result blocks are tool results.
function M.mock_messages(items)
  if type(items) == "string" then items = { { role = "user", content = items } } end
  if type(items) ~= "table" then return {} end
  local out = {}
  for _, item in ipairs(items) do
    if type(item) == "table" then
      local text
      if item.type == "function_call_output" then
        text = content_text(item.output)
      else
        text = content_text(item.content)
      end
      out[#out + 1] = { role = item.role, text = text, tool_result = item.role == "tool"
        or item.type == "function_call_output" or (item.role == "user" and has_tool_result(item.content)) }
    end
  end
  return out
end

-- A request's offered tools as {{name=, schema=}...}; pick(t) -> name, schema.
function M.mock_tools(tools, pick)
  local out = {}
  if type(tools) ~= "table" then return out end
  for _, t in ipairs(tools) do
    if type(t) == "table" then
      local name, schema = pick(t)
      if type(name) == "string" then
        out[#out + 1] = { name = name, schema = type(schema) == "table" and schema or {} }
      end
    end
  end
  return out
end

-- A tool's name and schema in the OpenAI forms (a function object, or
-- flat as in the responses API).
function M.openai_tool(t)
  local fn = t["function"]
  if type(fn) == "table" then return fn.name, fn.parameters end
  return t.name, t.parameters
end

return M
