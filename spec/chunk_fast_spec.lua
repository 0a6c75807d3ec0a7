-- The OpenAI chunk fast path (host/chunk.c, core.openai_chunk) against the
-- ordinary path (cjson + the adapter's handle): the same events and the same
-- errors for every fixture in spec/fixtures/providers, for hand-made chunks at
-- the edges of what the fast path accepts, and for every prefix of the
-- fixtures' chunks. fuzz/chunk_fuzz.c does the same with generated input.
local core = require "luagent.core"
local openai = require "luagent.model.providers.openai"

-- SSE events of a fixture file, through the real parser.
local function fixture_events(path)
  local f = assert(io.open(path, "rb"))
  local text = f:read("a")
  f:close()
  local parser = core.sse_parser()
  local events = assert(parser:feed(text))
  local tail = assert(parser:feed("\n\n")) -- a fixture cut without its blank line
  for _, ev in ipairs(tail) do events[#events + 1] = ev end
  return events
end

-- Everything an openai decoder makes of `events`, the fast path on or off:
-- a list of {"feed"|"finish", events} and {"error", record}.
local function transcript(events, fast)
  local dec = openai.decoder({ model = "requested-model", fast = fast })
  local out = {}
  for _, ev in ipairs(events) do
    local evs, err = dec:feed(ev)
    out[#out + 1] = evs and { "feed", evs } or { "error", err }
  end
  local evs, err = dec:finish()
  out[#out + 1] = evs and { "finish", evs } or { "error", err }
  return out
end

-- Asserts both paths agree on `events`.
local function same_both_ways(events, what)
  assert.same(transcript(events, false), transcript(events, true), what)
end

-- Wraps chunk payloads as SSE events.
local function as_events(payloads)
  local out = {}
  for i, p in ipairs(payloads) do out[i] = { event = "message", data = p } end
  return out
end

local function fixture_paths()
  local paths = {}
  local ls = assert(io.popen("ls spec/fixtures/providers/*.sse"))
  for p in ls:lines() do paths[#paths + 1] = p end
  ls:close()
  return paths
end

describe("the OpenAI chunk fast path", function()
  it("is on in the adapter and reads the common chunks itself", function()
    assert.is_function(openai.decoder({ model = "m" }).fast) -- on unless a decoder is asked otherwise
    local ok, id, model, n, content, thinking, reason = core.openai_chunk(
      '{"id":"c1","object":"chat.completion.chunk","created":1,"model":"m",'
      .. '"choices":[{"index":0,"delta":{"content":"Hi \\"you\\" \\u00e9\\n"},'
      .. '"logprobs":null,"finish_reason":null}],"usage":null}')
    assert.same({ true, "c1", "m", 1, 'Hi "you" \u{e9}\n', nil, nil },
      { ok, id, model, n, content, thinking, reason })
  end)

  it("declines what it cannot read exactly as cjson and the adapter", function()
    for _, chunk in ipairs({
      '{"choices":[{"delta":{"tool_calls":[{"index":0}]}}]}',
      '{"choices":[],"usage":{"prompt_tokens":1}}',
      '{"error":{"message":"x"}}',
      '{"choices":[{"delta":{}},{"delta":{}}]}',         -- two choices
      '{"choices":[{"finish_reason":"error"}]}',
      '{"id":"a","id":"b"}',                             -- a repeated key
      '{"c\\u006fntent":1}',                             -- an escaped key
      '{"id":"\\ud83d\\ude00"}',                         -- surrogate escapes
      '{"created":1e3}', '{"created":01}', '{"id":"\1"}', "{\"id\":\"\xff\"}",
      '[1]', '"text"', '{"id":"x"} x', '{"id":"x",}', '{', '',
    }) do
      assert.is_false(core.openai_chunk(chunk), chunk)
    end
  end)

  it("gives the ordinary path's events and errors for every fixture", function()
    local paths = fixture_paths()
    assert.is_true(#paths >= 16)
    for _, path in ipairs(paths) do
      same_both_ways(fixture_events(path), path)
    end
  end)

  it("gives the ordinary path's events for chunks at the edges", function()
    local chunks = {
      ' {"id":"x","model":"m","choices":[{"delta":{"content":"a"}}]} ',
      '{"id":7,"model":null,"choices":[{"delta":{"content":"","reasoning_content":"r"}}]}',
      '{"choices":[{"delta":{"reasoning_content":null,"reasoning":"r2"}}]}',
      '{"choices":[{"delta":{"reasoning_content":false,"reasoning":"r3"}}]}',
      '{"choices":[{"delta":{"reasoning_content":"","reasoning":"r4"}}]}',
      '{"choices":[{"delta":{"reasoning":"r5","content":7}}]}',
      '{"choices":[{"delta":"text","finish_reason":"length"}]}',
      '{"choices":[{"delta":[1,2],"finish_reason":"weird"}]}',
      '{"choices":{"0":{"delta":{"content":"no"}}}}',
      '{"choices":[{"delta":{"tool_calls":null,"content":"\\/\\b\\f\\r\\t\\u20ac\\n\\"\\\\"}}]}',
      '{"choices":[],"usage":null,"x":[{"y":[true,false,null,-0.5,12]}]}',
      '{"choices":[{"delta":{"content":"\u{1F600} ok"},"finish_reason":"tool_calls"}]}',
      '{"choices":[null]}', '{"choices":["s"]}', '{"choices":[[]]}',
      '{"choices":[{"delta":{"content":"after"},"finish_reason":"stop"}]}',
      "[DONE]",
    }
    same_both_ways(as_events(chunks), "edge chunks in one stream")
    for _, c in ipairs(chunks) do same_both_ways(as_events({ c }), c) end
  end)

  it("gives the ordinary path's result for every prefix of the fixtures' chunks", function()
    for _, path in ipairs(fixture_paths()) do
      for _, ev in ipairs(fixture_events(path)) do
        local data = ev.data
        for cut = 0, #data - 1 do
          same_both_ways(as_events({ data:sub(1, cut) }), path .. " cut at " .. cut)
        end
      end
    end
  end)
end)
