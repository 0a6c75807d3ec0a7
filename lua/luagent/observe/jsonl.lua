-- The JSON-lines writer: a bus consumer writing each event as one line
-- (`luagent run --events jsonl`; luagent.events.jsonl).
local bus = require "luagent.base.bus"

local M = {}

-- jsonl(file) -> a consumer writing each event as one JSON line to file
-- (default stdout; a Lua file, or an output file: lua/luagent/base/outfile.lua),
-- flushed at each line. A write that fails (a full disk) raises: the bus
-- removes the consumer and reports it once, and no more lines are written.
function M.jsonl(file)
  file = file or io.stdout
  return function(ev)
    local ok, err = file:write(bus.to_json(ev), "\n")
    if ok then ok, err = file:flush() end
    if not ok then error("events.jsonl: " .. tostring(err) .. "; no more events are written", 0) end
  end
end

return M
