-- Benchmark: the cost of sharing the endpoint state through Redis. 1,000
-- tasks each make CALLS calls to the embedded mock (which answers every
-- call), with the endpoint state local and then shared through a
-- redis-server on loopback (started here on a free port, in a temporary
-- folder, and stopped after), ROUNDS times each, alternating which goes
-- first, side by side in one run. Prints each round's wall time, and the
-- ratios of the medians and of the best rounds (the machine is shared and
-- noisy: read the ratios).
--   luagent run bench/shared.lua [TASKS] [CALLS] [ROUNDS]
local luagent = require "luagent"
local core = require "luagent.core"
local endpoint = require "luagent.endpoint"
local mock = require "luagent.mock"

local tasks_n = tonumber(arg[1]) or 1000
local calls = tonumber(arg[2]) or 2
local rounds = tonumber(arg[3]) or 5

local function sh(cmd)
  local p = io.popen(cmd, "r")
  local out = p:read("a")
  p:close()
  return out
end

local server = sh("command -v redis-server"):match("%S+")
if not server then
  print("shared: redis-server is not installed (apt-get install redis-server); skipped")
  return
end
local listener = assert(core.tcp_listen("127.0.0.1", 0))
local _, port = listener:address()
listener:close()
local dir = sh("mktemp -d"):gsub("%s+$", "")
os.execute(string.format("%s --port %d --bind 127.0.0.1 --save '' --appendonly no --dir %s "
  .. "</dev/null >%s/log 2>&1 & echo $! >%s/pid", server, port, dir, dir, dir))
local pid = io.open(dir .. "/pid"):read("a"):match("%d+")
local url = "redis://127.0.0.1:" .. port .. "/0"
for _ = 1, 250 do
  local c = core.redis_connect("127.0.0.1", port, 0.5)
  if c then c:close() break end
  luagent.sleep(0.02)
end

local messages = { { role = "user", content = "hi" } }

-- EVALSHA commands Redis has run so far.
local function evalshas()
  local c = assert(core.redis_connect("127.0.0.1", port, 1))
  local info = assert(c:command(1, "INFO", "commandstats"))
  c:close()
  return tonumber(info:match("cmdstat_evalsha:calls=(%d+)") or "0")
end

-- One round: tasks_n tasks x calls calls, against a fresh mock (its request
-- log grows); wall seconds.
local function round(shared)
  endpoint.reset()
  local srv = assert(mock.start {})
  local model = { kind = "openai", model = "m", base_url = srv.url .. "/v1", api_key = "k" }
  local policy = { shared = shared and { redis = url } or false }
  local t0 = luagent.now()
  local tasks = {}
  for i = 1, tasks_n do
    tasks[i] = luagent.spawn(function()
      for _ = 1, calls do assert(luagent.complete { model = model, messages = messages, policy = policy }) end
    end)
  end
  for i = 1, tasks_n do tasks[i]:join() end
  local wall = luagent.now() - t0
  if shared then
    local h = luagent.health()[model.base_url]
    assert(h.backend == "redis", "the shared round ran on local state")
  end
  srv:close()
  collectgarbage()
  return wall
end

local function main()
  local times = { local_ = {}, shared = {} }
  round(false) -- warm up: the mock's connections, the code paths
  local before = evalshas()
  round(true)
  print(string.format("shared: %.2f Redis round trips (EVALSHA) per call", (evalshas() - before) / (tasks_n * calls)))
  for r = 1, rounds do
    local a, b -- alternate which goes first, so a drift of the machine cancels
    if r % 2 == 1 then a = round(false) b = round(true) else b = round(true) a = round(false) end
    times.local_[r], times.shared[r] = a, b
    print(string.format("shared: round %d: local %.3f s, redis %.3f s (%d tasks x %d calls)", r, a, b,
      tasks_n, calls))
  end
  local function median(t)
    table.sort(t)
    return t[(#t + 1) // 2]
  end
  local ml, ms = median(times.local_), median(times.shared)
  print(string.format("shared: median wall time: local %.3f s, redis %.3f s: redis/local = %.3f (%+.1f %%)",
    ml, ms, ms / ml, (ms / ml - 1) * 100))
  local bl, bs = times.local_[1], times.shared[1] -- sorted by median()
  print(string.format("shared: best wall time:   local %.3f s, redis %.3f s: redis/local = %.3f (%+.1f %%)",
    bl, bs, bs / bl, (bs / bl - 1) * 100))
end

-- the server goes, whatever happened
local ok, err = pcall(main)
endpoint.reset()
os.execute("kill " .. pid .. "; rm -rf " .. dir)
if not ok then error(err, 0) end
