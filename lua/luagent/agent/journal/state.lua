-- A runtime's journal (rt.journal, lua/luagent/runtime.lua), apart from the
-- journal module so that a runtime holds one without loading SQLite: its
-- durable run (set by `luagent run --durable`, `luagent resume`, or its
-- first durable agent), the error that kept it from opening one (asked
-- again, it is the answer), and the stores it closes when the runtime
-- closes (the one it opened itself, one handed to it). Which file and what
-- the run records come from the runtime's settings (lua/luagent/config.lua:
-- journal_file, run_info, durable), read by lua/luagent/agent/journal/init.lua.
-- Two runtimes have two durable runs.
local M = {}

local Journal = {}
Journal.__index = Journal
M.Journal = Journal

-- new() -> the journal of a new runtime: no run yet, no store.
function M.new()
  return setmetatable({ run = nil, open_error = nil, stores = {} }, Journal)
end

-- Takes `store` to close with the journal (once).
function Journal:own(store)
  for _, s in ipairs(self.stores) do if s == store then return end end
  self.stores[#self.stores + 1] = store
end

-- journal:close(): the runtime closes: its run's heartbeat stops and its
-- claim is let go, then the stores it owns close. Closing twice is harmless.
function Journal:close()
  local run = self.run
  self.run = nil
  if run then run:release() end
  local stores = self.stores
  self.stores = {}
  for i = #stores, 1, -1 do stores[i]:close() end
end

return M
