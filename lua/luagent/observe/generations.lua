-- OpenRouter's generations, looked up after the fact. A stream cut before
-- its usage chunk reports no tokens, yet the attempt was billed; the book's
-- advice is to save each generation's id (every attempt's: the call's
-- final event carries them as `response_ids`, the cost meter and the run
-- journal keep them) and ask OpenRouter later what it cost: GET
-- {base}/generation?id=ID. The lookup answers 404 for a while after the
-- generation (4.5 to 8.5 minutes in the book's measurement), so settle()
-- asks again with a doubling wait, within a bound. Used by `luagent cost
-- settle` (lua/luagent/cli/cost.lua).
local core = require "luagent.core"
local errors = require "luagent.base.errors"
local http = require "luagent.base.http"
local json = require "luagent.base.json"
local secrets = require "luagent.base.secrets"

local M = {}

M.default_base_url = "https://openrouter.ai/api/v1"

-- wait: seconds settle() goes on asking (past OpenRouter's 8.5 minutes);
-- first_delay, max_delay: its waits between lookups (doubling);
-- timeout: one lookup's limit.
M.defaults = { wait = 600, first_delay = 15, max_delay = 60, timeout = 30 }

-- An answer is a small JSON object: read at most this much of it.
M.BODY_MAX = 64 * 1024

-- Failures worth asking again: not there yet (404), a rate limit or a
-- server error, a connection that failed.
local TRANSIENT_KINDS = { refused = true, reset = true, eof = true, timeout = true, truncated = true,
  transport = true, dns = true }
local function transient(err)
  local s = err.status
  if s then return s == 404 or s == 408 or s == 429 or s >= 500 end
  return TRANSIENT_KINDS[err.kind] or false
end

local function url_escape(s)
  return (s:gsub("[^%w%-%._~]", function(c) return string.format("%%%02X", c:byte()) end))
end

local function number(v) return type(v) == "number" and v or nil end

-- lookup(id, {base_url=, api_key=, timeout=}) -> {id=, cost=,
-- tokens_prompt=, tokens_completion=, model=} | nil, err: one lookup. A
-- generation not there (yet) is an `http` error with status 404.
function M.lookup(id, opts)
  if type(id) ~= "string" or id == "" then error("generations.lookup: id must be a non-empty string", 2) end
  opts = opts or {}
  local base = (opts.base_url or M.default_base_url):gsub("/+$", "")
  local headers = { accept = "application/json" }
  if opts.api_key and opts.api_key ~= "" then
    secrets.register(opts.api_key)
    headers.authorization = "Bearer " .. opts.api_key
  end
  local resp, err = http.request { method = "GET", url = base .. "/generation?id=" .. url_escape(id),
    headers = headers, timeout = { connect = 10, total = opts.timeout or M.defaults.timeout } }
  if not resp then return nil, err end
  local ok, body = pcall(resp.body, resp, M.BODY_MAX)
  resp:close()
  if not ok then
    if errors.is_cancel(body) or not errors.is(body) then error(body, 0) end
    return nil, body
  end
  local doc = json.decode(body)
  local data = type(doc) == "table" and doc.data
  local cost = type(data) == "table" and number(data.total_cost)
  if not cost then
    return nil, errors.new("protocol", "generation " .. id .. ": the answer has no number data.total_cost",
      { status = resp.status })
  end
  return { id = id, cost = cost, tokens_prompt = number(data.tokens_prompt),
    tokens_completion = number(data.tokens_completion), model = type(data.model) == "string" and data.model or nil }
end

-- Checks a number option: nil gives the default; else seconds >= 0.
local function seconds(opts, name)
  local v = opts[name]
  if v == nil then return M.defaults[name] end
  if type(v) ~= "number" or not (v >= 0 and v < math.huge) then
    error("generations.settle: opts." .. name .. " must be seconds >= 0", 3)
  end
  return v
end

-- settle(ids, {base_url=, api_key=, wait=, first_delay=, max_delay=,
-- timeout=}) -> a list in the order of `ids`: the lookup's record for each
-- generation that answered, else {id=, pending = true, error=} (still 404,
-- or a transient failure, when `wait` seconds had passed since settle
-- began) or {id=, error=} (a failure not worth asking again: a refused
-- key). Sleeps on the loop's clock (virtual in specs). Raises on misuse.
function M.settle(ids, opts)
  if type(ids) ~= "table" then error("generations.settle: ids must be a list of strings", 2) end
  for _, id in ipairs(ids) do
    if type(id) ~= "string" then error("generations.settle: ids must be a list of strings", 2) end
  end
  opts = opts or {}
  local wait, first, cap = seconds(opts, "wait"), seconds(opts, "first_delay"), seconds(opts, "max_delay")
  seconds(opts, "timeout")
  local deadline = core.now() + wait
  local out = {}
  for i, id in ipairs(ids) do
    local delay = first
    while true do
      local r, err = M.lookup(id, opts)
      if r then
        out[i] = r
        break
      end
      local left = deadline - core.now()
      if not transient(err) then
        out[i] = { id = id, error = err }
        break
      elseif left <= 0 then
        out[i] = { id = id, pending = true, error = err }
        break
      end
      core.sleep(math.min(delay, left))
      delay = math.min(delay * 2, cap)
    end
  end
  return out
end

return M
