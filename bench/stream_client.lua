-- Benchmark client (not a test): luagent's whole streaming path (HTTP on
-- the loop, SSE framing in C, the OpenAI adapter decoding every chunk into
-- normalized events) against bench/stream_server.lua. Streams R requests,
-- C at a time (C tasks; default 1: one after another), and reports the CPU
-- this process used for them.
--   build/luagent run bench/stream_client.lua URL R N [MODE] [C]
-- N is the server's text chunks per response, to check what arrived. MODE
-- splits the path to show where the CPU goes: "provider" (default, the
-- whole path), "sse" (HTTP and SSE events as Lua tables, no decoding),
-- "json" (sse plus cjson.decode of every payload), "stream" (the provider
-- through the retry loop, luagent.stream: every event published on the
-- bus, where `luagent run --log/--trace/--cost/--otlp` attach their
-- consumers; bench/stream.sh's "observed" row is this mode with all of
-- them on). One warm-up request
-- (module loading, the connection) is not measured when C is 1; with C > 1
-- the C connections are opened within the measure. Prints one line:
-- "<mode> chunks=<SSE events> text=<text_delta events> cpu=<s>".
local luagent = require "luagent"
local http = require "luagent.base.http"
local common = require "luagent.model.providers.common"

local url, r, n = arg[1], math.tointeger(tonumber(arg[2] or "")), math.tointeger(tonumber(arg[3] or ""))
local mode = arg[4] or "provider"
local c = math.tointeger(tonumber(arg[5] or "1"))
local MODES = { provider = true, sse = true, json = true, stream = true }
if not url or not r or not n or not MODES[mode] or not c or c < 1 then
  io.stderr:write("usage: luagent run bench/stream_client.lua URL R N [provider|sse|json|stream] [C]\n")
  os.exit(2)
end

-- A key as real ones look: every output is scrubbed of it, as in production
-- (a placeholder key under 5 characters would skip that work).
local key = os.getenv("BENCH_KEY") or "sk-bench-0123456789abcdefghijklmnopqrstuvwxyz"
local provider = luagent.provider { kind = "openai", model = "bench", base_url = url, api_key = key }
local request = { messages = { { role = "user", content = "Say something." } }, max_tokens = 4096 }

-- Counts the SSE events the adapter was fed: each decoder's own count,
-- read once its stream is done (by the task that made it), so the chunk
-- count is what crossed the wire without adding work per event.
local sse_events = 0
local decoders = {} -- coroutine -> the decoder it made last
local adapter = provider.adapter
provider.adapter = setmetatable({
  decoder = function(ctx)
    local dec = adapter.decoder(ctx)
    decoders[coroutine.running()] = dec
    return dec
  end,
}, { __index = adapter })

-- Adds the events the calling task's last decoder was fed.
local function count_decoded()
  local co = coroutine.running()
  sse_events = sse_events + decoders[co].n
  decoders[co] = nil
end

-- Whole path: streams one request through the provider; returns its
-- text_delta count. Raises on a failure or on an end the server never sends.
local function via_provider()
  local events = mode == "stream"
    and luagent.stream { model = provider, messages = request.messages, max_tokens = request.max_tokens }
    or assert(provider:stream(request))
  local text, stop, usage = 0, nil, nil
  for ev in events do
    local t = ev.type
    if t == "text_delta" then
      text = text + 1
    elseif t == "message_end" then
      stop, usage = ev.stop_reason, ev.usage
    end
  end
  count_decoded()
  if stop ~= "stop" or not usage or usage.output_tokens ~= 2 * n then
    error(string.format("bad stream end: stop=%s output_tokens=%s", tostring(stop),
      tostring(usage and usage.output_tokens)))
  end
  return text
end

-- Partial paths: the same HTTP request, SSE events only (and, in "json"
-- mode, each payload decoded). Returns the count of content chunks, or
-- nil in "sse" mode, which does not look into the payloads.
local built = adapter.build({ model = "bench", messages = request.messages, max_tokens = request.max_tokens },
  { base_url = url, api_key = key })
local function via_http()
  local resp = assert(http.request { method = built.method, url = built.url, headers = built.headers,
    body = built.body, timeout = { connect = 10, first_byte = 120, idle = 60 } })
  local text = 0
  for ev in resp:events() do
    sse_events = sse_events + 1
    if mode == "json" and ev.data ~= "[DONE]" then
      local chunk = assert(common.decode(ev.data))
      local choice = chunk.choices[1]
      if choice and choice.delta.content then text = text + 1 end
    end
  end
  resp:close()
  if mode == "json" then return text end
end

local one = (mode == "provider" or mode == "stream") and via_provider or via_http
local text = 0
if c == 1 then
  one()
  sse_events = 0
end
local t0 = os.clock()
if c == 1 then
  for _ = 1, r do text = text + (one() or 0) end
else
  local started, tasks = 0, {}
  for i = 1, c do
    tasks[i] = luagent.spawn(function()
      while started < r do
        started = started + 1
        local t = one() or 0 -- yields: add after it returns
        text = text + t
      end
    end)
  end
  for i = 1, c do tasks[i]:join() end
end
local cpu = os.clock() - t0
if mode ~= "sse" and text ~= r * n then
  error(string.format("text_delta events: %d, expected %d", text, r * n))
end
print(string.format("%s chunks=%d text=%s cpu=%.4f", mode, sse_events, mode == "sse" and "-" or text, cpu))
