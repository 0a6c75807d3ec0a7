-- OpenAI Chat Completions adapter (and the many servers that speak it):
-- builds POST {base}/chat/completions and decodes its streamed chunks into
-- the normalized events of lua/luagent/EVENTS.md. Pure Lua, no I/O.
local common = require "luagent.model.providers.common"

local M = {
  name = "openai",
  default_base_url = "https://api.openai.com/v1",
}

------------------------------------------------------------------------------
-- Request
------------------------------------------------------------------------------

-- One history message in Chat Completions form.
local function message(m)
  if m.role == "user" then
    return { role = "user", content = m.content or "" }
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
-- history and request").
function M.build(req, opts)
  common.check_request(M.name, req)
  opts = opts or {}
  local stream = req.stream ~= false
  local messages = {}
  if req.system ~= nil and req.system ~= "" then
    messages[1] = { role = "system", content = req.system }
  end
  for _, m in ipairs(req.messages) do messages[#messages + 1] = message(m) end
  local body = { model = req.model, messages = common.array(messages), stream = stream,
    max_completion_tokens = req.max_tokens, temperature = req.temperature }
  if stream then body.stream_options = { include_usage = true } end
  if common.has_tools(req.tools) then
    body.tools = {}
    for i, t in ipairs(req.tools) do
      body.tools[i] = { type = "function", ["function"] = { name = t.name,
        description = t.description, parameters = common.schema(t.parameters) } }
    end
  end
  local headers = { ["content-type"] = "application/json" }
  if opts.api_key then headers.authorization = "Bearer " .. opts.api_key end
  return common.post(M, opts, "/chat/completions", headers, body, stream)
end

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

-- Whether decoders use the fast path (specs compare both ways).
M.fast = read_chunk ~= nil

-- A decoder for one response stream; ctx = {model=}.
function M.decoder(ctx)
  local dec = common.decoder(M.name, ctx, handle, "[DONE]", "[DONE]")
  if M.fast then dec.fast = fast end
  return dec
end

return M
