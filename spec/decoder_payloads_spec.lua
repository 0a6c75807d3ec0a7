-- Payloads of the wrong shape, field by field, through every decoder
-- (openai, also OpenRouter's; anthropic; openai_responses; the skeleton in
-- providers/common.lua): each is a protocol error whose message says what
-- was wrong in the payload's terms ("choices[1]: expected an object, got
-- null"), names the field (also as err.field) and never carries a Lua
-- error or the install path. The nulls a server may send where a value is
-- optional are no error. The OpenAI cases run with the C fast path on and
-- off (host/chunk.c must decline what the adapter refuses).
local openai = require "luagent.model.providers.openai"
local anthropic = require "luagent.model.providers.anthropic"
local responses = require "luagent.model.providers.openai_responses"

local ADAPTERS = { openai = openai, anthropic = anthropic, openai_responses = responses }

-- A first event that opens the message, so the bad one is read mid-stream.
local OPENING = {
  openai = { event = "message", data = '{"id":"c1","model":"m","choices":[{"index":0,"delta":{"role":"assistant"}}]}' },
  anthropic = { event = "message_start", data = '{"type":"message_start","message":{"id":"m1","model":"m"}}' },
  openai_responses = { event = "response.created",
    data = '{"type":"response.created","response":{"id":"r1","model":"m"}}' },
}

-- Feeds the opening event, then `data` (as SSE event `name`); returns the
-- decoder's error, or nil when it read both.
local function feed(provider, data, name, fast)
  local dec = ADAPTERS[provider].decoder({ model = "m", fast = fast })
  assert(dec:feed(OPENING[provider]))
  local out, err = dec:feed({ event = name or "message", data = data, offset = 999 })
  if out then return nil end
  return err
end

-- { data, field, what }: `what` is the text after "<field>: ".
local OPENAI = {
  { '{"choices":[null]}', "choices[1]", "expected an object, got null" },
  { '{"choices":[5]}', "choices[1]", "expected an object, got number" },
  { '{"choices":[{"delta":{}},"x"]}', "choices[2]", "expected an object, got string" },
  { '{"choices":{"a":1}}', "choices", "expected an array, got object" },
  { '{"choices":"x"}', "choices", "expected an array, got string" },
  { '{"id":5,"choices":[]}', "id", "expected a string, got number" },
  { '{"model":true,"choices":[]}', "model", "expected a string, got boolean" },
  { '{"choices":[{"delta":"x"}]}', "choices[1].delta", "expected an object, got string" },
  { '{"choices":[{"delta":[1]}]}', "choices[1].delta", "expected an object, got array" },
  { '{"choices":[{"delta":{"content":5}}]}', "choices[1].delta.content", "expected a string, got number" },
  { '{"choices":[{"delta":{"content":["a"]}}]}', "choices[1].delta.content", "expected a string, got array" },
  { '{"choices":[{"delta":{"content":false}}]}', "choices[1].delta.content", "expected a string, got boolean" },
  { '{"choices":[{"delta":{"reasoning_content":1}}]}', "choices[1].delta.reasoning_content",
    "expected a string, got number" },
  { '{"choices":[{"delta":{"reasoning_content":false,"reasoning":"x"}}]}', "choices[1].delta.reasoning_content",
    "expected a string, got boolean" },
  { '{"choices":[{"delta":{"reasoning":{"a":1}}}]}', "choices[1].delta.reasoning", "expected a string, got object" },
  { '{"choices":[{"delta":{"tool_calls":{"a":1}}}]}', "choices[1].delta.tool_calls", "expected an array, got object" },
  { '{"choices":[{"delta":{"tool_calls":[null]}}]}', "choices[1].delta.tool_calls[1]", "expected an object, got null" },
  { '{"choices":[{"delta":{"tool_calls":[{"index":"0"}]}}]}', "choices[1].delta.tool_calls[1].index",
    "expected an integer, got string" },
  { '{"choices":[{"delta":{"tool_calls":[{"index":0.5}]}}]}', "choices[1].delta.tool_calls[1].index",
    "expected an integer, got 0.5" },
  { '{"choices":[{"delta":{"tool_calls":[{"index":NaN}]}}]}', "choices[1].delta.tool_calls[1].index",
    "expected an integer, got NaN" },
  { '{"choices":[{"delta":{"tool_calls":[{"index":0,"id":7}]}}]}', "choices[1].delta.tool_calls[1].id",
    "expected a string, got number" },
  { '{"choices":[{"delta":{"tool_calls":[{"index":0,"function":"f"}]}}]}', "choices[1].delta.tool_calls[1].function",
    "expected an object, got string" },
  { '{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"name":1}}]}}]}',
    "choices[1].delta.tool_calls[1].function.name", "expected a string, got number" },
  { '{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"name":"f","arguments":{"a":1}}}]}}]}',
    "choices[1].delta.tool_calls[1].function.arguments", "expected a string, got object" },
  { '{"choices":[{"finish_reason":1}]}', "choices[1].finish_reason", "expected a string, got number" },
  { '{"choices":[],"usage":5}', "usage", "expected an object, got number" },
  { '{"choices":[],"usage":[1]}', "usage", "expected an object, got array" },
  { '{"usage":{"prompt_tokens":"5"}}', "usage.prompt_tokens", "expected a number, got string" },
  { '{"usage":{"completion_tokens":true}}', "usage.completion_tokens", "expected a number, got boolean" },
  { '{"usage":{"prompt_tokens_details":3}}', "usage.prompt_tokens_details", "expected an object, got number" },
  { '{"usage":{"prompt_tokens_details":{"cached_tokens":"x"}}}', "usage.prompt_tokens_details.cached_tokens",
    "expected a number, got string" },
  { '{"error":5}', "error", "expected an object, got number" },
}

-- { SSE event name, data, field, what }
local ANTHROPIC = {
  { "message_start", '{"type":"message_start","message":5}', "message", "expected an object, got number" },
  { "message_start", '{"type":"message_start","message":{"id":1}}', "message.id", "expected a string, got number" },
  { "message_start", '{"type":"message_start","message":{"model":[1]}}', "message.model",
    "expected a string, got array" },
  { "message_start", '{"type":"message_start","message":{"usage":"x"}}', "message.usage",
    "expected an object, got string" },
  { "message_start", '{"type":"message_start","message":{"usage":{"input_tokens":"9"}}}', "message.usage.input_tokens",
    "expected a number, got string" },
  { "content_block_start", '{"type":"content_block_start","index":"0","content_block":{"type":"text","text":""}}',
    "index", "expected an integer, got string" },
  { "content_block_start", '{"type":"content_block_start","index":0,"content_block":"text"}', "content_block",
    "expected an object, got string" },
  { "content_block_start", '{"type":"content_block_start","index":0,"content_block":{"type":5}}',
    "content_block.type", "expected a string, got number" },
  { "content_block_start", '{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":5,"name":"f"}}',
    "content_block.id", "expected a string, got number" },
  { "content_block_start",
    '{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"t","name":{"a":1}}}',
    "content_block.name", "expected a string, got object" },
  { "content_block_start",
    '{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"t","name":"f","input":"x"}}',
    "content_block.input", "expected an object, got string" },
  { "content_block_start", '{"type":"content_block_start","index":0,"content_block":{"type":"text","text":5}}',
    "content_block.text", "expected a string, got number" },
  { "content_block_start",
    '{"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":false}}',
    "content_block.thinking", "expected a string, got boolean" },
  { "content_block_delta", '{"type":"content_block_delta","index":0,"delta":"x"}', "delta",
    "expected an object, got string" },
  { "content_block_delta", '{"type":"content_block_delta","index":0,"delta":{"type":1}}', "delta.type",
    "expected a string, got number" },
  { "content_block_delta", '{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":5}}',
    "delta.text", "expected a string, got number" },
  { "content_block_delta", '{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":5}}',
    "delta.thinking", "expected a string, got number" },
  { "content_block_delta", '{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":5}}',
    "delta.signature", "expected a string, got number" },
  { "content_block_delta",
    '{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":5}}',
    "delta.partial_json", "expected a string, got number" },
  { "content_block_delta", '{"type":"content_block_delta","index":0.5,"delta":{"type":"text_delta","text":"a"}}',
    "index", "expected an integer, got 0.5" },
  { "content_block_delta", '{"type":"content_block_delta","index":NaN,"delta":{"type":"text_delta","text":"a"}}',
    "index", "expected an integer, got NaN" },
  { "content_block_stop", '{"type":"content_block_stop","index":"a"}', "index", "expected an integer, got string" },
  { "message_delta", '{"type":"message_delta","delta":5}', "delta", "expected an object, got number" },
  { "message_delta", '{"type":"message_delta","delta":{"stop_reason":5}}', "delta.stop_reason",
    "expected a string, got number" },
  { "message_delta", '{"type":"message_delta","delta":{},"usage":"x"}', "usage", "expected an object, got string" },
  { "message_delta", '{"type":"message_delta","delta":{},"usage":{"output_tokens":"3"}}', "usage.output_tokens",
    "expected a number, got string" },
  { "error", '{"type":"error","error":5}', "error", "expected an object, got number" },
  { "message_delta", '{"type":5}', "type", "expected a string, got number" },
}

-- { data, field, what } (the SSE event name is the payload's type)
local RESPONSES = {
  { '{"type":"response.created","response":5}', "response", "expected an object, got number" },
  { '{"type":"response.in_progress","response":{"id":5}}', "response.id", "expected a string, got number" },
  { '{"type":"response.created","response":{"model":true}}', "response.model", "expected a string, got boolean" },
  { '{"type":"response.output_item.added","output_index":0,"item":"x"}', "item", "expected an object, got string" },
  { '{"type":"response.output_item.added","output_index":0,"item":{"type":5}}', "item.type",
    "expected a string, got number" },
  { '{"type":"response.output_item.added","output_index":0,"item":{"type":"function_call","id":5}}', "item.id",
    "expected a string, got number" },
  { '{"type":"response.output_item.added","output_index":0,"item":{"type":"function_call","id":"i","call_id":5}}',
    "item.call_id", "expected a string, got number" },
  { '{"type":"response.output_item.added","output_index":0,"item":{"type":"function_call","id":"i","name":[1]}}',
    "item.name", "expected a string, got array" },
  { '{"type":"response.output_item.added","output_index":0,"item":{"type":"function_call","id":"i","arguments":{"a":1}}}',
    "item.arguments", "expected a string, got object" },
  { '{"type":"response.output_item.added","output_index":"0","item":{"type":"function_call","id":"i"}}',
    "output_index", "expected an integer, got string" },
  { '{"type":"response.output_text.delta","delta":5}', "delta", "expected a string, got number" },
  { '{"type":"response.refusal.delta","delta":false}', "delta", "expected a string, got boolean" },
  { '{"type":"response.reasoning_summary_text.delta","delta":{"a":1}}', "delta", "expected a string, got object" },
  { '{"type":"response.reasoning_text.delta","delta":1}', "delta", "expected a string, got number" },
  { '{"type":"response.function_call_arguments.delta","item_id":5,"delta":"x"}', "item_id",
    "expected a string, got number" },
  { '{"type":"response.function_call_arguments.delta","item_id":"i","output_index":0.5,"delta":"x"}', "output_index",
    "expected an integer, got 0.5" },
  { '{"type":"response.function_call_arguments.delta","item_id":"i","delta":5}', "delta",
    "expected a string, got number" },
  { '{"type":"response.function_call_arguments.done","item_id":"i","arguments":5}', "arguments",
    "expected a string, got number" },
  { '{"type":"response.output_item.done","output_index":0,"item":5}', "item", "expected an object, got number" },
  { '{"type":"response.completed","response":{"status":5}}', "response.status", "expected a string, got number" },
  { '{"type":"response.completed","response":{"usage":5}}', "response.usage", "expected an object, got number" },
  { '{"type":"response.completed","response":{"usage":{"input_tokens":"1"}}}', "response.usage.input_tokens",
    "expected a number, got string" },
  { '{"type":"response.completed","response":{"usage":{"input_tokens_details":5}}}',
    "response.usage.input_tokens_details", "expected an object, got number" },
  { '{"type":"response.incomplete","response":{"incomplete_details":5}}', "response.incomplete_details",
    "expected an object, got number" },
  { '{"type":"response.incomplete","response":{"incomplete_details":{"reason":5}}}',
    "response.incomplete_details.reason", "expected a string, got number" },
  { '{"type":"response.failed","response":{"error":5}}', "response.error", "expected an object, got number" },
  { '{"type":"error","error":5}', "error", "expected an object, got number" },
  { '{"type":{"a":1}}', "type", "expected a string, got object" },
}

-- Asserts err is the protocol record for `field` and `what`.
local function assert_names(err, field, what, label)
  assert.is_table(err, label .. ": no error")
  assert.equal("protocol", err.kind, label)
  assert.equal("unexpected payload in SSE data at event 2: " .. field .. ": " .. what .. " (byte offset 0)",
    err.message, label)
  assert.equal(field, err.field, label)
  assert.is_nil(err.message:find(".lua:", 1, true), label)
  assert.is_nil(err.message:find("attempt to", 1, true), label)
end

describe("a decoder given a payload of the wrong shape", function()
  it("openai (and OpenRouter): names the field and what was wrong, fast path on or off", function()
    for _, c in ipairs(OPENAI) do
      for _, fast in ipairs({ false, true }) do
        assert_names(feed("openai", c[1], nil, fast), c[2], c[3], c[1] .. (fast and " (fast)" or ""))
      end
    end
  end)

  it("anthropic: names the field and what was wrong", function()
    for _, c in ipairs(ANTHROPIC) do assert_names(feed("anthropic", c[2], c[1]), c[3], c[4], c[2]) end
  end)

  it("openai_responses: names the field and what was wrong", function()
    for _, c in ipairs(RESPONSES) do
      local name = c[1]:match('"type":"([^"]+)"')
      assert_names(feed("openai_responses", c[1], name), c[2], c[3], c[1])
    end
  end)

  it("takes null where a field is optional, as servers send it", function()
    local ok = {
      { "openai", nil, '{"id":null,"model":null,"choices":[{"index":0,"delta":{"role":"assistant","content":null,'
        .. '"tool_calls":null,"reasoning_content":null,"reasoning":null},"finish_reason":null,"logprobs":null}],'
        .. '"usage":null,"error":null}' },
      { "openai", nil, '{"choices":null}' },
      { "openai", nil, '{"choices":[{"delta":null}]}' },
      { "openai", nil, '{"choices":[{"delta":{"tool_calls":[{"index":null,"id":"c","function":{"name":"f",'
        .. '"arguments":null}}]}}]}' },
      { "openai", nil, '{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":null,'
        .. '"prompt_tokens_details":null}}' },
      { "anthropic", "message_delta", '{"type":"message_delta","delta":{"stop_reason":null,"stop_sequence":null},'
        .. '"usage":{"output_tokens":5,"cache_read_input_tokens":null}}' },
      { "anthropic", "content_block_start", '{"type":"content_block_start","index":0,"content_block":null}' },
      { "openai_responses", "response.completed", '{"type":"response.completed","response":{"status":"completed",'
        .. '"usage":{"input_tokens":1,"output_tokens":2,"input_tokens_details":null},"error":null}}' },
    }
    for _, c in ipairs(ok) do
      for _, fast in ipairs({ false, true }) do
        local err = feed(c[1], c[3], c[2], fast)
        assert.is_nil(err, c[3] .. ": " .. tostring(err))
      end
    end
  end)

  it("reports an adapter's own Lua error without the file and line it happened at", function()
    local dec = anthropic.decoder({ model = "m" })
    dec.handle = function(_, p) return p.missing.field end
    local _, err = dec:feed({ event = "message_start", data = '{"type":"message_start"}' })
    assert.equal("protocol", err.kind)
    assert.matches("^unexpected payload in SSE data at event 1: the anthropic adapter could not read it: "
      .. "attempt to index a nil value %(field 'missing'%) %(byte offset 0%)$", err.message)
    assert.is_nil(err.field)
  end)

  it("reads a string error as the provider's message (openai, anthropic, responses)", function()
    local err = feed("openai", '{"error":"model overloaded"}')
    assert.equal("stream_error", err.kind)
    assert.equal("model overloaded", err.message)
    err = feed("anthropic", '{"type":"error","error":"overloaded"}', "error")
    assert.equal("stream_error", err.kind)
    assert.equal("overloaded", err.message)
    err = feed("openai_responses", '{"type":"error","error":"boom"}', "error")
    assert.equal("stream_error", err.kind)
    assert.equal("boom", err.message)
  end)
end)
