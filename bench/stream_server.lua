-- Benchmark server (not a test): answers every request with one prebuilt
-- OpenAI Chat Completions stream of N text chunks, as fast as the socket
-- takes it. HTTP/1.1 keep-alive with chunked encoding, one HTTP chunk per
-- SSE event as real servers flush them. The bytes are built once, so the
-- server costs little next to the clients it feeds.
--   build/luagent run bench/stream_server.lua PORT N
-- PORT 0 picks a free port; the first line printed is "listening PORT".
-- Per response: N content chunks (the first also carries the role), one
-- finish chunk, one usage chunk and `data: [DONE]`, i.e. N + 3 SSE events.
local luagent = require "luagent"
local core = require "luagent.core"

local port = math.tointeger(tonumber(arg[1] or "0"))
local n = math.tointeger(tonumber(arg[2] or "1000"))
if not port or not n or n < 1 then
  io.stderr:write("usage: luagent run bench/stream_server.lua PORT N\n")
  os.exit(2)
end

local WORDS = { " the", " model", " streams", " tokens", " quickly,", " one",
  " small", " delta", " at", " a", " time", " and", " the", " client", " keeps", " up." }
local PREFIX = '{"id":"chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG","object":"chat.completion.chunk",'
  .. '"created":1741570283,"model":"gpt-4o-2024-08-06","system_fingerprint":"fp_4d06d5a2b1",'
  .. '"service_tier":"default","choices":['

-- Frames one SSE data payload as one HTTP chunk.
local function chunk(payload)
  local ev = "data: " .. payload .. "\n\n"
  return string.format("%x\r\n%s\r\n", #ev, ev)
end

-- The whole response (head and chunked body) for N content chunks.
local function build_response()
  local parts = { "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\n"
    .. "Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n" }
  for i = 1, n do
    local a, b = WORDS[(2 * i - 2) % #WORDS + 1], WORDS[(2 * i - 1) % #WORDS + 1]
    local delta = i == 1 and '{"role":"assistant","content":"' .. a .. b .. '","refusal":null}'
      or '{"content":"' .. a .. b .. '"}'
    parts[#parts + 1] = chunk(PREFIX .. '{"index":0,"delta":' .. delta
      .. ',"logprobs":null,"finish_reason":null}],"usage":null}')
  end
  parts[#parts + 1] = chunk(PREFIX .. '{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}],"usage":null}')
  parts[#parts + 1] = chunk(PREFIX .. '],"usage":{"prompt_tokens":19,"completion_tokens":' .. 2 * n
    .. ',"total_tokens":' .. 19 + 2 * n .. ',"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},'
    .. '"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,'
    .. '"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}}}')
  parts[#parts + 1] = chunk("[DONE]")
  parts[#parts + 1] = "0\r\n\r\n"
  return table.concat(parts)
end

local RESPONSE = build_response()

-- Serves requests on one connection until the client closes it. Each
-- request (head plus Content-Length body) gets the prebuilt response.
local function serve(conn)
  local buf = ""
  while true do
    local head_end = buf:find("\r\n\r\n", 1, true)
    local len = head_end and tonumber(buf:sub(1, head_end):lower():match("\r\ncontent%-length:%s*(%d+)")) or 0
    if head_end and #buf >= head_end + 3 + len then
      buf = buf:sub(head_end + 4 + len)
      if not conn:write(RESPONSE) then break end
    else
      local data = conn:read()
      if not data then break end
      buf = buf .. data
    end
  end
  conn:close()
end

local srv = assert(core.tcp_listen("127.0.0.1", port))
local _, bound = srv:address()
io.stdout:write(string.format("listening %d (%d chunks, %d bytes per response)\n", bound, n + 3, #RESPONSE))
io.stdout:flush()
while true do
  local conn = srv:accept()
  if not conn then break end
  luagent.daemon(serve, conn)
end
