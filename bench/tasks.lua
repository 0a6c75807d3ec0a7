-- Benchmark: 10,000 tasks, each sleeping a random 0-1 s of real time, on one
-- loop. Prints wall time and the number of tasks; run through bench/run.sh,
-- which also reports peak RSS.
local luagent = require "luagent"

local n = tonumber(arg[1]) or 10000
math.randomseed(42)
local start = luagent.now()
local tasks = {}
for i = 1, n do
  tasks[i] = luagent.spawn(function() luagent.sleep(math.random()) end)
end
for i = 1, n do tasks[i]:join() end
print(string.format("tasks: %d sleeping tasks (0-1 s each) done in %.3f s wall", n, luagent.now() - start))
