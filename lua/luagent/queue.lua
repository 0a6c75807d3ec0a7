-- A FIFO queue: push at the tail, pop at the head, both O(1). Used where an
-- iterator hands out, one at a time, events that arrive in batches.
local Queue = {}
Queue.__index = Queue

local M = {}

function M.new()
  return setmetatable({ head = 1, tail = 0 }, Queue)
end

function Queue:push(v)
  self.tail = self.tail + 1
  self[self.tail] = v
end

-- Pushes every element of the list `vs` (nil: nothing).
function Queue:push_all(vs)
  for _, v in ipairs(vs or {}) do self:push(v) end
end

-- The oldest element, removed; nil when empty.
function Queue:pop()
  if self.head > self.tail then return nil end
  local v = self[self.head]
  self[self.head] = nil
  self.head = self.head + 1
  return v
end

return M
