-- Secrets: the one scrubber every output goes through. Providers register
-- their API keys here (and every *_API_KEY of the environment is one from
-- the start); error records, events, `--events jsonl` lines, cassettes, log
-- lines, tool results and errors (lua/luagent/agent/tools/init.lua) and the errors
-- `luagent` prints are scrubbed with every key registered, so a key a
-- server echoes (in a header, a redirect's Location, an SSE event name, an
-- error body or the model's own text) or a tool prints never leaves the
-- process.
--
-- A key is recognised in each form it can take on the wire: as is,
-- percent-encoded (upper- and lowercase hex, `+` for a space) and
-- JSON-escaped. Every key of M.MIN_LENGTH characters or more is a secret
-- (LiteLLM's 7-character `sk-1234` too); a shorter one is a placeholder
-- (specs' "k", "test"): strings that short are ordinary text, and a key
-- that short protects nothing. Each occurrence becomes "***".
local core = require "luagent.core"

local M = {}

-- Every form of every registered key, held by the C scrubber (host/scrub.c),
-- which tries them longest first (a longer form that contains a shorter one
-- is replaced whole).
local scrubber = core.scrubber()
local nforms = 0
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
  for _, f in ipairs({ key, percent(key), percent(key, true), percent(key, false, true),
                       percent(key, true, true), json_escaped(key, true), json_escaped(key) }) do
    scrubber:add(f) -- a form seen before is ignored
    if #f > M.margin then M.margin = #f end
  end
  nforms = nforms + 1
end

-- Names (of a header, a query parameter, an environment variable) that say
-- their value is a credential, by their words: Authorization, Cookie,
-- X-Api-Key, ?key=, ?accessToken=, ?sig=, GITHUB_TOKEN, DB_PASSWORD, ...
-- Other values (Accept, ?format=json, ?design=, LANG) are ordinary text.
local CREDENTIAL_WORDS = {}
for w in ([[key apikey token auth authorization bearer secret password passwd pass passphrase pwd
  sig signature cookie credential credentials]]):gmatch("%S+") do CREDENTIAL_WORDS[w] = true end

local function credential_name(name)
  for w in name:gsub("(%l)(%u)", "%1 %2"):lower():gmatch("%w+") do
    if CREDENTIAL_WORDS[w] then return true end
  end
  return false
end

local function unpercent(s)
  return (s:gsub("%+", " "):gsub("%%(%x%x)", function(x) return string.char(tonumber(x, 16)) end))
end

-- register_credential(name, value): `value` is a secret when its name (a
-- header's, an environment variable's) says it is a credential; the
-- credentials after an auth scheme ("Bearer xyz": "xyz") are one too.
function M.register_credential(name, value)
  if type(name) ~= "string" or type(value) ~= "string" or not credential_name(name) then return end
  M.register(value)
  M.register(value:match("^[%w-]+%s+(%S+)%s*$"))
end

-- register_url(url): the credentials a URL carries are secrets: its user
-- info (user and password: a token is often given as the user) and the
-- value of each query parameter whose name says it is one (?key=,
-- ?api_key=, ?token=, ?sig=), as written and percent-decoded.
function M.register_url(url)
  if type(url) ~= "string" then return end
  local userinfo = url:match("^%a[%w+.-]*://([^/?#]*)@")
  for part in (userinfo or ""):gmatch("[^:]+") do
    M.register(part)
    M.register(unpercent(part))
  end
  local query = url:match("%?([^#]*)") or ""
  for pair in query:gmatch("[^&;]+") do
    local name, value = pair:match("^([^=]*)=(.*)$")
    if name and credential_name(unpercent(name)) then
      M.register(value)
      M.register(unpercent(value))
    end
  end
end

-- url(u) -> URL `u` as a message may show it: its user info, and the value
-- of each query parameter whose name says it is a credential (as
-- register_url reads them), written "***" whether registered or not; then
-- every registered key scrubbed (M.text). A non-string is returned as it is.
function M.url(url)
  if type(url) ~= "string" then return url end
  local head, query = url:match("^([^?#]*)(.*)$")
  head = head:gsub("^(%a[%w+.-]*://)[^/]*@", "%1***@")
  query = query:gsub("([?&;])([^=&;#]*)=([^&;#]*)", function(sep, name)
    if credential_name(unpercent(name)) then return sep .. name .. "=***" end
  end)
  return M.text(head .. query)
end

-- text(s) -> s with every form of every key replaced by "***".
function M.text(s)
  if nforms == 0 or type(s) ~= "string" then return s end
  return scrubber:text(s)
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
  if nforms == 0 then return v end
  if type(v) == "string" then return M.text(v) end
  if type(v) == "table" and v.kind ~= "cancelled" then scrub_table(v, {}) end
  return v
end

-- tail(s) -> the length of the longest end of `s` that is the start of a
-- key form (but not a whole one): text a stream must hold back until the
-- next piece shows whether a key goes on there.
function M.tail(s)
  if nforms == 0 then return 0 end
  return scrubber:tail(s)
end

-- delta(held, s) -> text, tail: the next delta `s` of a stream of deltas,
-- after `held` (nil or what the stream held back last time): held .. s
-- scrubbed, without its end that may be the start of a key form (M.tail),
-- and that end (nil when none), to hold back until the next delta. With no
-- key registered: held .. s, nil.
M.delta = scrubber:delta_function()

-- Every *_API_KEY variable of the environment is a key from the start,
-- whether or not a provider of its kind is ever made: a tool, an MCP server
-- or the script itself may print any of them (children do not inherit them:
-- lua/luagent/base/child_env.lua).
for name, value in pairs(core.environment()) do
  if name:match("_API_KEY$") then M.register(value) end
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
