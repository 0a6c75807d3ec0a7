-- A first look at tasks: three workers sleep for different times on one
-- loop; the main task waits for them, and a deadline cuts a slow one short.
local luagent = require "luagent"

local function worker(name, seconds)
  luagent.sleep(seconds)
  return string.format("%s slept %.2f s", name, seconds)
end

local start = luagent.now()
local tasks = {}
for i, secs in ipairs({ 0.3, 0.1, 0.2 }) do
  tasks[i] = luagent.spawn(worker, "worker " .. i, secs)
end
for _, t in ipairs(tasks) do print(t:join()) end
print(string.format("all three in %.2f s (they ran concurrently)", luagent.now() - start))

local ok, err = pcall(luagent.deadline, 0.1, worker, "slow worker", 10)
print("deadline:", ok, tostring(err))
