-- Benchmark: N agents (default 1,000) of 5 turns each, one Lua tool call
-- per turn, all running at once as tasks in one process against the mock
-- provider on loopback (real libcurl, real sockets; the mock in the same
-- process). Reports wall time, CPU time and peak RSS, in total and per agent.
--   build/luagent run bench/agents.lua [N] [kind]
-- With a third argument `journal`, the same N agents also run as durable
-- agents (every step written to a SQLite journal in a temporary file):
-- off, on, off, on, the best of each side by side, with each journal
-- write's latency (the writing agent waits for its commit in the journal's
-- writer thread; the loop and the other agents do not).
--   build/luagent run bench/agents.lua 1000 openai journal
local luagent = require "luagent"
local mock = require "luagent.mock"

local n = tonumber(arg[1]) or 1000
local kind = arg[2] or "openai"
local TURNS = 5

-- kB of a /proc/self/status field (VmRSS, VmHWM).
local function status_kb(field)
  local f = io.open("/proc/self/status")
  if not f then return 0 end
  local v = f:read("a"):match(field .. ":%s*(%d+)")
  f:close()
  return tonumber(v) or 0
end

-- The model asks for the tool once per turn, with the turn's number.
local srv = assert(mock.start { script = function(_, _, body)
  local done = 0
  for _, m in ipairs(body.messages or body.input or {}) do
    if m.role == "tool" or m.type == "function_call_output" or
       (type(m.content) == "table" and m.content[1] and m.content[1].type == "tool_result") then
      done = done + 1
    end
  end
  return { text = "step", tools = { { id = tostring(done + 1), name = "count", arguments = { turn = done + 1 } } } }
end })

local count = { name = "count", description = "Counts", read_only = true,
  params = { type = "object", properties = { turn = { type = "integer" } }, required = { "turn" } },
  run = function(args) luagent.sleep(0.001) return "turn " .. args.turn end }

-- One round of n agents; returns wall and CPU (seconds).
local function round(tag)
  local cpu0, wall0 = os.clock(), luagent.now()
  local tasks, calls = {}, 0
  for i = 1, n do
    tasks[i] = luagent.spawn(function()
      local a = luagent.agent { name = tag .. i, max_turns = TURNS, tools = { count },
        model = { kind = kind, model = "m", base_url = srv.url .. "/v1", api_key = "k" } }
      local last = a:run("go")
      assert(last.stop_reason == "max_turns" and last.turns == TURNS, tostring(last.reason or last.error))
      for _, m in ipairs(a.messages) do if m.role == "tool" then calls = calls + 1 end end
    end)
  end
  for i = 1, n do tasks[i]:join() end
  local wall, cpu = luagent.now() - wall0, os.clock() - cpu0
  assert(calls == n * TURNS, "expected " .. n * TURNS .. " tool calls, got " .. calls)
  return wall, cpu
end

collectgarbage()
local rss0 = status_kb("VmRSS")
local wall, cpu = round("a")
local peak = status_kb("VmHWM")
local jwall, jcpu, writes, spent, worst, times
if arg[3] == "journal" then
  local journal = require "luagent.agent.journal"
  local config = require "luagent.config"
  local path = os.tmpname() .. ".db"
  local store = assert(journal.open(path))
  journal.use(assert(journal.start(store, { script = "bench/agents.lua", args = {}, options = {}, quiet = true })))
  -- every journal write, timed: how long its agent waits for the commit
  writes, spent, worst, times = 0, 0, 0, {}
  for _, name in ipairs({ "append", "update" }) do
    local orig = store[name]
    store[name] = function(...)
      local t0 = luagent.now()
      local r1, r2 = orig(...)
      local dt = luagent.now() - t0
      writes, spent, worst = writes + 1, spent + dt, math.max(worst, dt)
      times[writes] = dt
      return r1, r2
    end
  end
  -- rounds alternate (on, off, on) on this shared, noisy machine; the best
  -- of each side is compared
  for r = 1, 2 do
    config.set { durable = true } -- as `luagent run --durable`: every agent journals
    collectgarbage()
    local w, c = round("d" .. r .. "_")
    if not jwall or w < jwall then jwall = w end
    if not jcpu or c < jcpu then jcpu = c end
    config.set { durable = false }
    if r == 1 then
      collectgarbage()
      w, c = round("b")
      wall, cpu = math.min(wall, w), math.min(cpu, c)
    end
  end
  journal.use(nil) -- the run lets its claim go before its store closes
  store:close()
  for _, suffix in ipairs({ "", "-wal", "-shm" }) do os.remove(path .. suffix) end
  os.remove((path:gsub("%.db$", "")))
end
srv:close()
print(string.format("agents: %d agents x %d turns (%d model calls, %d tool calls, %s wire format)",
  n, TURNS, n * TURNS, n * TURNS, kind))
print(string.format("agents: wall %.2f s, CPU %.2f s; per agent: wall %.2f ms, CPU %.2f ms",
  wall, cpu, wall / n * 1000, cpu / n * 1000))
print(string.format("agents: peak RSS %.1f MiB (%.1f MiB before the agents); %.1f KiB per agent",
  peak / 1024, rss0 / 1024, (peak - rss0) / n))
if jwall then
  print(string.format("durable: wall %.2f s, CPU %.2f s (journal off: wall %.2f s, CPU %.2f s; best of 2 each): "
    .. "x%.2f wall, x%.2f CPU",
    jwall, jcpu, wall, cpu, jwall / wall, jcpu / cpu))
  table.sort(times)
  print(string.format("durable: %d journal writes (one transaction each, in the writer thread; the writing "
    .. "agent waits for its commit): latency mean %.1f us, median %.1f us, p99 %.2f ms, max %.2f ms",
    writes, spent / writes * 1e6, times[writes // 2] * 1e6, times[math.ceil(writes * 0.99)] * 1000, worst * 1000))
end
