-- A FIFO queue: push at the tail, pop at the head, both O(1). Used where an
-- iterator hands out, one at a time, events that arrive in batches; and
-- signal(), the wake-up a task waits on until another task has news.
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

-- How many elements wait.
function Queue:len()
  return self.tail - self.head + 1
end

-- The oldest element, removed; nil when empty.
function Queue:pop()
  if self.head > self.tail then return nil end
  local v = self[self.head]
  self[self.head] = nil
  self.head = self.head + 1
  return v
end

------------------------------------------------------------------------------
-- A wake-up between tasks
------------------------------------------------------------------------------

local core = require "luagent.core"

local WAKE = setmetatable({}, { __tostring = function() return "wake" end })

-- signal([daemon]) -> {wait=, notify=}: wait() suspends the caller until
-- notify() (at once if notified since the last wait). The waiter parks on
-- a pair of tasks joining each other: no timer (the virtual clock does not
-- jump for it) and no file descriptor; notify() cancels one of the pair.
-- With `daemon` the pair are daemon tasks (for waits of daemon tasks,
-- which run() must not wait for).
local function signal(daemon)
  local s = { pending = false }
  function s.notify()
    s.pending = true
    local w = s.waiter
    if w then
      s.waiter = nil
      w:cancel(WAKE)
    end
  end
  function s.wait()
    if s.pending then
      s.pending = false
      return
    end
    local other
    local w = core.spawn(function() pcall(function() other:join() end) end)
    other = core.spawn(function() pcall(w.join, w) end)
    if daemon then w:set_daemon(true) other:set_daemon(true) end
    s.waiter = w
    local ok, err = pcall(w.join, w)
    s.pending = false
    if not ok and not (type(err) == "table" and err.reason == WAKE) then
      if s.waiter == w then s.waiter = nil end
      w:cancel(WAKE)
      error(err, 0) -- the waiting task itself was cancelled
    end
  end
  return s
end
M.signal = signal

return M
