-- Benchmark: N agents (default 1,000) of 5 turns each, one Lua tool call
-- per turn, all running at once as tasks in one process against the mock
-- provider on loopback (real libcurl, real sockets; the mock in the same
-- process). Reports wall time, CPU time and peak RSS, in total and per agent.
--   build/luagent run bench/agents.lua [N] [kind]
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

collectgarbage()
local rss0 = status_kb("VmRSS")
local cpu0, wall0 = os.clock(), luagent.now()
local tasks, calls = {}, 0
for i = 1, n do
  tasks[i] = luagent.spawn(function()
    local a = luagent.agent { name = "a" .. i, max_turns = TURNS, tools = { count },
      model = { kind = kind, model = "m", base_url = srv.url .. "/v1", api_key = "k" } }
    local last = a:run("go")
    assert(last.stop_reason == "max_turns" and last.turns == TURNS, tostring(last.reason or last.error))
    for _, m in ipairs(a.messages) do if m.role == "tool" then calls = calls + 1 end end
  end)
end
for i = 1, n do tasks[i]:join() end
local wall, cpu = luagent.now() - wall0, os.clock() - cpu0
local peak = status_kb("VmHWM")
srv:close()
assert(calls == n * TURNS, "expected " .. n * TURNS .. " tool calls, got " .. calls)
print(string.format("agents: %d agents x %d turns (%d model calls, %d tool calls, %s wire format)",
  n, TURNS, n * TURNS, calls, kind))
print(string.format("agents: wall %.2f s, CPU %.2f s; per agent: wall %.2f ms, CPU %.2f ms",
  wall, cpu, wall / n * 1000, cpu / n * 1000))
print(string.format("agents: peak RSS %.1f MiB (%.1f MiB before the agents); %.1f KiB per agent",
  peak / 1024, rss0 / 1024, (peak - rss0) / n))
