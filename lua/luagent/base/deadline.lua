-- deadline(seconds, fn, ...) -> fn's results. Runs fn as a child task and
-- cancels it when the time is up, raising an error of kind `timeout` (which
-- = "deadline"). If the caller is cancelled meanwhile, the child is too.
-- A base primitive (the face's luagent.deadline is this function), so the
-- layers above bound their waits without requiring the public face.
local core = require "luagent.core"
local errors = require "luagent.base.errors"

local function deadline(seconds, fn, ...)
  if type(seconds) ~= "number" or seconds ~= seconds then error("deadline: seconds must be a number", 2) end
  if type(fn) ~= "function" then error("deadline: fn must be a function", 2) end
  if seconds == math.huge then return fn(...) end -- no deadline at all
  local child = core.spawn(fn, ...)
  local expired = {}
  local watchdog = core.spawn(function()
    core.sleep(seconds)
    child:cancel(expired)
  end)
  local res = table.pack(pcall(child.join, child))
  watchdog:cancel()
  if res[1] then return table.unpack(res, 2, res.n) end
  local err = res[2]
  if child:status() ~= "done" and child:status() ~= "failed" then
    child:cancel() -- the caller itself was cancelled while waiting
  elseif errors.is(err) and err.kind == "cancelled" and err.reason == expired then
    err = errors.new("timeout", string.format("deadline of %g s exceeded", seconds),
      { which = "deadline", seconds = seconds })
  end
  error(err, 0)
end

return deadline
