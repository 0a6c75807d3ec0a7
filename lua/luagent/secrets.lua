-- Secrets: the one scrubber every output goes through. Providers register
-- their API keys here; error records, events, `--events jsonl` lines,
-- cassettes and log lines are scrubbed with every key registered, so a key
-- a server echoes (in a header, a redirect's Location, an SSE event name, an
-- error body or the model's own text) never leaves the process.
--
-- A key is recognised in each form it can take on the wire: as is,
-- percent-encoded (upper- and lowercase hex, `+` for a space) and
-- JSON-escaped. Every key of M.MIN_LENGTH characters or more is a secret
-- (LiteLLM's 7-character `sk-1234` too); a shorter one is a placeholder
-- (specs' "k", "test"): strings that short are ordinary text, and a key
-- that short protects nothing. Each occurrence becomes "***".
local M = {}

-- Every form of every registered key, longest first (a longer form that
-- contains a shorter one is replaced whole).
local forms = {}
local registered = {} -- key -> true

-- The longest form; bodies cut at a size limit are read this much further
-- so a key across the cut is still recognised (see M.cut).
M.margin = 0

local function percent(key, lower, plus)
  local fmt = lower and "%%%02x" or "%%%02X"
  return (key:gsub("[^%w%-%._~]", function(c)
    if plus and c == " " then return "+" end
    return string.format(fmt, c:byte())
  end))
end

local JSON_ESC = { ['"'] = '\\"', ["\\"] = "\\\\", ["/"] = "\\/", ["\n"] = "\\n",
  ["\r"] = "\\r", ["\t"] = "\\t", ["\b"] = "\\b", ["\f"] = "\\f" }

-- The key inside a JSON string: with "/" escaped (as cjson and many
-- servers write it) or not (as luagent's own encoder does).
local function json_escaped(key, slash)
  return (key:gsub(slash and '[%c"\\/]' or '[%c"\\]', function(c)
    return JSON_ESC[c] or string.format("\\u%04x", c:byte())
  end))
end

-- Keys shorter than this are placeholders, not secrets.
M.MIN_LENGTH = 5

-- register(key): from now on `key` is scrubbed from every output. Ignores
-- nil and keys shorter than M.MIN_LENGTH.
function M.register(key)
  if type(key) ~= "string" or #key < M.MIN_LENGTH or registered[key] then return end
  registered[key] = true
  local seen = {}
  for _, f in ipairs(forms) do seen[f] = true end
  for _, f in ipairs({ key, percent(key), percent(key, true), percent(key, false, true),
                       percent(key, true, true), json_escaped(key, true), json_escaped(key) }) do
    if not seen[f] then
      seen[f] = true
      forms[#forms + 1] = f
      if #f > M.margin then M.margin = #f end
    end
  end
  table.sort(forms, function(a, b) return #a > #b end)
end

local function escape(s) return (s:gsub("%p", "%%%0")) end

-- text(s) -> s with every form of every key replaced by "***".
function M.text(s)
  if #forms == 0 or type(s) ~= "string" then return s end
  for _, f in ipairs(forms) do
    if s:find(f, 1, true) then s = s:gsub(escape(f), "***") end
  end
  return s
end

-- Scrubs the strings reachable from table `t`, in place (keys too).
local function scrub_table(t, seen)
  if seen[t] then return end
  seen[t] = true
  local rekey
  for k, v in pairs(t) do
    if type(v) == "string" then
      local c = M.text(v)
      if c ~= v then t[k] = c end
    elseif type(v) == "table" then
      scrub_table(v, seen)
    end
    if type(k) == "string" and M.text(k) ~= k then
      rekey = rekey or {}
      rekey[#rekey + 1] = k
    end
  end
  for _, k in ipairs(rekey or {}) do
    t[M.text(k)], t[k] = t[k], nil
  end
end

-- scrub(v) -> v with every string reachable from it scrubbed: a string is
-- returned scrubbed, a table is scrubbed in place (cycles are fine).
-- Cancellation records pass untouched: they are raised as they are.
function M.scrub(v)
  if #forms == 0 then return v end
  if type(v) == "string" then return M.text(v) end
  if type(v) == "table" and v.kind ~= "cancelled" then scrub_table(v, {}) end
  return v
end

-- tail(s) -> the length of the longest end of `s` that is the start of a
-- key form (but not a whole one): text a stream must hold back until the
-- next piece shows whether a key goes on there.
function M.tail(s)
  local best = 0
  for _, f in ipairs(forms) do
    -- candidates start where f's first byte occurs in the last #f - 1
    -- bytes of s, earliest (longest) first
    local first = f:sub(1, 1)
    local i = s:find(first, math.max(1, #s - #f + 2), true)
    while i and #s - i + 1 > best do
      if s:sub(i) == f:sub(1, #s - i + 1) then best = #s - i + 1 break end
      i = s:find(first, i + 1, true)
    end
  end
  return best
end

-- cut(s, max, more) -> `s` scrubbed and cut to `max` bytes. `s` should hold
-- up to `max + M.margin` bytes when the source had more (`more` true): the
-- end that may be the start of a cut key is dropped before scrubbing, so no
-- key prefix survives the cut.
function M.cut(s, max, more)
  if more then
    local n = M.tail(s)
    if n > 0 then s = s:sub(1, -n - 1) end
  end
  s = M.text(s)
  if #s > max then s = s:sub(1, max) end
  return s
end

return M
