-- The library's own lines (a hook that failed, a consumer removed, a broken
-- policy edit) as a value each runtime owns: the layers below write here and
-- never require the log, which is an observer (lua/luagent/observe/log.lua)
-- and decides where the lines go and which are shown.
local M = {}

local Diagnostics = {}
Diagnostics.__index = Diagnostics

-- new(sink) -> diagnostics writing through sink(level, msg, fields, about).
function M.new(sink)
  if type(sink) ~= "function" then error("diagnostics.new: expects a sink function", 2) end
  return setmetatable({ sink = sink }, Diagnostics)
end

-- d:write(level, msg [, fields [, about]]): one line at level ("debug",
-- "info", "warn", "error", or "note": a line for the person running the
-- host, such as a durable run's id, which the runtime shows as it is unless
-- its log was set up); fields are structured data the line carries;
-- `about` names the event type the line repeats (a log that writes that
-- event's own line leaves it out).
function Diagnostics:write(level, msg, fields, about)
  self.sink(level, msg, fields, about)
end

return M
