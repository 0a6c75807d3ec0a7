-- Unknown options are errors: the one helper every table luagent takes
-- from a user is checked with (an agent's options, a call's, a tool's
-- definition, a policy's fields, a runtime's settings, tools.mcp's and
-- tools.dir's options, a provider's spec). Each of those keeps its list of
-- known keys next to the code that reads them (a new option is added
-- there, in one place); this module only compares: an unknown key raises
-- naming the table, the key and the nearest known name,
--
--   agent: unknown option 'max_turn' (did you mean 'max_turns'?)
--
-- or, when no known name is near, the known ones.
--
-- This file requires nothing (lua/luagent/config.lua uses it, and a plain
-- lua5.4 reads that: mk/settings.lua).
local M = {}

-- distance(a, b) -> the edit distance of two strings: insertions,
-- deletions, substitutions and swaps of two neighbours, one each (optimal
-- string alignment).
function M.distance(a, b)
  local la, lb = #a, #b
  if la == 0 then return lb end
  if lb == 0 then return la end
  local prev2, prev, cur = {}, {}, {}
  for j = 0, lb do prev[j] = j end
  for i = 1, la do
    cur[0] = i
    local ca = a:byte(i)
    for j = 1, lb do
      local cb = b:byte(j)
      local cost = ca == cb and 0 or 1
      local d = math.min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost)
      if i > 1 and j > 1 and ca == b:byte(j - 1) and a:byte(i - 1) == cb then
        d = math.min(d, prev2[j - 2] + 1)
      end
      cur[j] = d
    end
    prev2, prev, cur = prev, cur, prev2
  end
  return prev[lb]
end

-- How names are compared: case and '-' for '_' are no edits.
local function folded(s) return (s:lower():gsub("%-", "_")) end

-- nearest(name, known) -> the known name (a list, in its order) nearest to
-- `name`, or nil when none is near: at most a third of the name's length
-- away (one edit for a short name, three at most). Ties go to the first.
function M.nearest(name, known)
  if type(name) ~= "string" then return nil end
  local f = folded(name)
  local limit = math.max(1, math.min(3, #name // 3))
  local best, best_d
  for _, k in ipairs(known) do
    local d = M.distance(f, folded(k))
    if d <= limit and (not best_d or d < best_d) then best, best_d = k, d end
  end
  return best
end

-- set(list) -> {name = true} of a list of known names.
function M.set(list)
  local s = {}
  for _, k in ipairs(list) do s[k] = true end
  return s
end

-- known{"a", "b", ...} -> the list of a table's known keys, in the order
-- messages list them, with `.set` its set: what check takes.
function M.known(list)
  list.set = M.set(list)
  return list
end

-- A key as a message shows it: a string quoted, any other key in brackets.
local function shown(k)
  if type(k) == "string" then return "'" .. k .. "'" end
  if type(k) == "number" or type(k) == "boolean" then return "[" .. tostring(k) .. "]" end
  return "[a " .. type(k) .. "]"
end
M.shown = shown

-- suggestion(key, known [, otherwise]) -> "(did you mean 'x'?)", or, when
-- no known name is near, `otherwise` (default "(known: a, b, ...)").
function M.suggestion(key, known, otherwise)
  local near = M.nearest(key, known)
  if near then return "(did you mean '" .. near .. "'?)" end
  return otherwise or ("(known: " .. table.concat(known, ", ") .. ")")
end

-- unknown(what, key, known [, noun [, otherwise]]) -> the message for an
-- unknown key of the table `what` names: "what: unknown option 'key'
-- (did you mean 'x'?)". `noun` is "option" unless given ("field").
function M.unknown(what, key, known, noun, otherwise)
  return string.format("%s: unknown %s %s %s", what, noun or "option", shown(key),
    M.suggestion(key, known, otherwise))
end

-- first_unknown(t, set) -> the first key of t (in sorted order, so the
-- message does not depend on hashing) that `set` does not hold, or nil.
-- Read with next: no metamethod of the caller's table runs.
function M.first_unknown(t, set)
  local first
  for k in next, t do
    if not (type(k) == "string" and set[k]) then
      if first == nil or tostring(k) < tostring(first) then first = k end
    end
  end
  return first
end

-- check(t, known, what [, level]) raises, at `level` (error's, counted
-- from check's caller: 1 is that caller, the default 2 its caller), when t
-- has a key that `known` (made by M.known) does not hold.
function M.check(t, known, what, level)
  local k = M.first_unknown(t, known.set)
  if k ~= nil then error(M.unknown(what, k, known), (level or 2) + 1) end
end

return M
