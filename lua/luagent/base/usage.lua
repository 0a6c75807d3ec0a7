-- Token usage: the counts a provider reports for an answer
-- ({input_tokens, output_tokens, cache_read_tokens, cache_write_tokens},
-- lua/luagent/EVENTS.md) and their sums, which the retry loop (a call's
-- attempts), the agent loop (a run's calls) and the cost meter keep. One
-- place, so that every total adds up the same way.
local M = {}

-- zero() -> a usage with every count at 0.
function M.zero()
  return { input_tokens = 0, output_tokens = 0, cache_read_tokens = 0, cache_write_tokens = 0 }
end

local tonumber = tonumber

-- add(total, u [, sign]) -> total with u's counts added (subtracted, with
-- sign = -1): a new total when total is nil; total as it is when u is no
-- table. A count u lacks, or holds as no number (a hand-edited journal's
-- null), adds 0. Written out, not looped over the field names: the meters
-- add on every call.
function M.add(total, u, sign)
  if type(u) ~= "table" then return total end
  total = total or M.zero()
  sign = sign or 1
  total.input_tokens = total.input_tokens + sign * (tonumber(u.input_tokens) or 0)
  total.output_tokens = total.output_tokens + sign * (tonumber(u.output_tokens) or 0)
  total.cache_read_tokens = total.cache_read_tokens + sign * (tonumber(u.cache_read_tokens) or 0)
  total.cache_write_tokens = total.cache_write_tokens + sign * (tonumber(u.cache_write_tokens) or 0)
  return total
end

return M
