-- The library's own diagnostic lines (a policy edit rejected, a hook that
-- failed, a retry announced), with a level each, written to a sink.
--
-- The events are the full story of a run; these lines are for people. A retry
-- is `info` (it is expected behaviour, and scripts show retries from their
-- events), what a user must act on is `warn`. The threshold comes from
-- LUAGENT_LOG or `luagent run --log LEVEL`; the default is `warn`.
local M = {}

M.LEVELS = { debug = 1, info = 2, warn = 3, error = 4, off = 5 }

local threshold = M.LEVELS[os.getenv("LUAGENT_LOG") or ""] or M.LEVELS.warn

-- Where lines go: function(level, line). Embedders and specs replace it.
M.sink = function(_, line) io.stderr:write(line, "\n") end

-- Sets the threshold by name; raises for a name not in M.LEVELS.
function M.set_level(name)
  local n = M.LEVELS[name]
  if not n then error("log.set_level: unknown level '" .. tostring(name) .. "' (debug, info, warn, error, off)", 2) end
  threshold = n
end

-- The threshold's name.
function M.level()
  for name, n in pairs(M.LEVELS) do if n == threshold then return name end end
end

-- Whether a line at `level` would be written.
function M.enabled(level) return M.LEVELS[level] >= threshold and threshold < M.LEVELS.off end

-- Writes `line` at `level` when the threshold lets it through.
function M.write(level, line)
  if M.enabled(level) then M.sink(level, line) end
end

return M
