-- Benchmark (not a test): what logs, traces and cost cost per streamed
-- chunk, measured in one process. Blocks of K calls through luagent.stream
-- alternate with the observers on (`--log info --trace --cost --otlp` as
-- `luagent run` sets them: log lines at info, spans with their tree and an
-- OTLP file, the cost meter) and off; their CPU is summed per mode.
-- Alternating blocks in one process take out what separate processes
-- differ by (where the heap and the code land in the caches), which moves
-- bench/stream.sh's two rows by a few percent from run to run. An "on"
-- block's time includes turning the observers on and off (opening the
-- files; at the end, the traces still waiting to be turned into text, the
-- tree printed, the files closed), which a run pays once: blocks of 100
-- calls keep that small. The modules stay loaded in the off blocks.
--   build/luagent run bench/observers.lua URL [BLOCKS] [K] 2>/dev/null
-- Prints one line: "observers off=<us per call> on=<us per call> cost=<+%>".
local luagent = require "luagent"
-- loaded before the blocks, as `luagent run --trace --cost` loads them
require "luagent.observe.trace"
require "luagent.observe.cost"

local url = arg[1]
local blocks = math.tointeger(tonumber(arg[2] or "40"))
local k = math.tointeger(tonumber(arg[3] or "100"))
if not url or not blocks or not k or blocks < 2 or k < 1 then
  io.stderr:write("usage: luagent run bench/observers.lua URL [BLOCKS] [K]\n")
  os.exit(2)
end

local key = os.getenv("BENCH_KEY") or "sk-bench-0123456789abcdefghijklmnopqrstuvwxyz"
local provider = luagent.provider { kind = "openai", model = "bench", base_url = url, api_key = key }
local messages = { { role = "user", content = "Say something." } }
local otlp = os.tmpname()
local devnull = assert(io.open("/dev/null", "w"))

local function call()
  for _ in luagent.stream { model = provider, messages = messages, max_tokens = 4096 } do end
end

-- the runtime `luagent run` made: its logger, tracer and meter
local rt = luagent.default_runtime()
local tracer, meter

local function observers_on()
  rt.settings:set { log_level = "info" }
  tracer = assert(rt:trace { tree = true, file = otlp })
  meter = rt:meter("cost")
end

local function observers_off()
  tracer:stop(devnull) -- the tree is printed, to nowhere
  meter:stop()
  meter:reset()
  rt.settings:set { log_level = "warn" }
end

for _ = 1, 20 do call() end -- warm-up: modules, the connection
local spent, calls = { on = 0, off = 0 }, { on = 0, off = 0 }
for b = 1, blocks do
  local mode = b % 2 == 1 and "on" or "off"
  local t0 = os.clock()
  if mode == "on" then observers_on() end
  for _ = 1, k do call() end
  if mode == "on" then observers_off() end
  spent[mode] = spent[mode] + os.clock() - t0
  calls[mode] = calls[mode] + k
end
os.remove(otlp)
local off, on = spent.off / calls.off * 1e6, spent.on / calls.on * 1e6
print(string.format("observers off=%.1f on=%.1f cost=%+.1f%%", off, on, (on / off - 1) * 100))
