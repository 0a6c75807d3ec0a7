-- Providers: one model endpoint with its adapter, key and base URL. One call
-- is one attempt: provider:stream(request) sends it and returns an iterator of
-- normalized events (lua/luagent/EVENTS.md), or nil and an error record.
-- Retries belong to the layer above.
local http = require "luagent.http"
local errors = require "luagent.errors"
local queue = require "luagent.queue"

local M = {}

-- Known kinds: which adapter, where the key and base URL come from.
M.kinds = {
  openai = { adapter = "openai", key_env = "OPENAI_API_KEY", base_env = "OPENAI_BASE_URL" },
  anthropic = { adapter = "anthropic", key_env = "ANTHROPIC_API_KEY", base_env = "ANTHROPIC_BASE_URL" },
  openai_responses = { adapter = "openai_responses", key_env = "OPENAI_API_KEY", base_env = "OPENAI_BASE_URL" },
  openrouter = { adapter = "openai", key_env = "OPENROUTER_API_KEY", base_env = "OPENROUTER_BASE_URL",
                 base_url = "https://openrouter.ai/api/v1" },
}

-- Set by `luagent run` when the embedded mock provider stands in for every
-- provider (no API key): {url=<mock base>, api_key=<placeholder>}.
M.embedded = nil
-- Set by `luagent run --record FILE`: a recorder (lua/luagent/record.lua).
M.recorder = nil

-- Default per-attempt timeouts (seconds); the retry policy may override them.
M.default_timeout = { connect = 10, first_byte = 120, idle = 60 }

local Provider = {}
Provider.__index = Provider
Provider.__name = "luagent.Provider"

-- Keys live here, keyed by provider, never as a field: printing, logging or
-- encoding a provider cannot reveal its key.
local secrets = setmetatable({}, { __mode = "k" })

function Provider:__tostring()
  return string.format("provider %s/%s at %s", self.kind, self.model, self.base_url)
end

-- Keys shorter than this are placeholders (mocks, specs), not secrets worth
-- rewriting every message for.
local MIN_SECRET = 8

-- Replaces every occurrence of the key in the strings of `err` (messages,
-- echoed bodies) with "***". Cancellation records are left alone.
local function scrub(err, key)
  if type(err) ~= "table" or not key or #key < MIN_SECRET or err.kind == "cancelled" then return err end
  local function clean(s) return (s:gsub(key:gsub("%p", "%%%0"), "***")) end
  for k, v in pairs(err) do
    if type(v) == "string" then err[k] = clean(v)
    elseif type(v) == "table" and k ~= "raw" then scrub(v, key) end
  end
  if type(err.raw) == "table" then scrub(err.raw, key) end
  return err
end
M.scrub = scrub

-- new("kind/model") or new{kind=, model=, base_url=, api_key=, headers=,
-- timeout=} -> provider. An unknown kind or a missing model raises.
function M.new(spec)
  if type(spec) == "string" then
    local kind, model = spec:match("^([%w_]+)/(.+)$")
    if not kind then error("provider: expected 'kind/model', got '" .. spec .. "'", 2) end
    spec = { kind = kind, model = model }
  end
  if type(spec) ~= "table" then error("provider: expects a string or a table", 2) end
  local info = M.kinds[spec.kind]
  if not info then error("provider: unknown kind '" .. tostring(spec.kind) .. "'", 2) end
  if type(spec.model) ~= "string" or spec.model == "" then error("provider: model is required", 2) end
  local adapter = require("luagent.providers." .. info.adapter)
  local base_url = spec.base_url or os.getenv(info.base_env) or info.base_url or adapter.default_base_url
  local key = spec.api_key or os.getenv(info.key_env)
  if M.embedded and not spec.base_url then
    base_url = M.embedded.url .. (spec.kind == "openrouter" and "/api/v1" or "/v1")
    key = M.embedded.api_key
  end
  local p = setmetatable({
    kind = spec.kind,
    model = spec.model,
    adapter = adapter,
    base_url = base_url,
    headers = spec.headers,
    timeout = spec.timeout,
  }, Provider)
  secrets[p] = key
  return p
end

-- provider:has_key() -> whether a key is configured.
function Provider:has_key()
  local k = secrets[self]
  return k ~= nil and k ~= ""
end

-- Merges per-call timeouts over the provider's and the defaults.
local function timeouts(self, call)
  local t = {}
  for k, v in pairs(M.default_timeout) do t[k] = v end
  for _, src in ipairs({ self.timeout or {}, call or {} }) do
    for k, v in pairs(src) do t[k] = v end
  end
  return t
end

-- provider:stream(request [, opts]) -> iterator, nil, nil, response | nil, err.
-- request: {system=, messages=, tools=, max_tokens=, temperature=} (model is
-- the provider's unless given). opts.timeout overrides timeouts. The
-- iterator raises an error record when the stream fails after it began. The
-- response is the generic for's closing value: leaving the loop early
-- aborts the transfer at once.
function Provider:stream(request, opts)
  local key = secrets[self]
  local req = {}
  for k, v in pairs(request) do req[k] = v end
  req.model = req.model or self.model
  local ok, built = pcall(self.adapter.build, req, { base_url = self.base_url, api_key = key, headers = self.headers })
  if not ok then error(scrub({ message = tostring(built) }, key).message, 2) end
  local rec = M.recorder and M.recorder:begin(built, function(s) return scrub({ s = s }, key).s end)
  local resp, err = http.request {
    method = built.method, url = built.url, headers = built.headers, body = built.body,
    timeout = timeouts(self, opts and opts.timeout),
  }
  if not resp then
    err = scrub(err, key)
    if rec then rec:finish(err) end
    return nil, err
  end
  if rec then rec:response(resp.status, resp.headers) end
  local dec = self.adapter.decoder { model = req.model }
  local events = resp:events()
  local pending, finished = queue.new(), false

  local function fail(e)
    resp:close()
    finished = true
    e = scrub(e, key)
    if rec then rec:finish(e) end
    error(e, 0)
  end

  return function()
    while true do
      local ev = pending:pop()
      if ev then return ev end
      if finished then return nil end
      local got, sse = pcall(events)
      if not got then fail(sse) end
      local out, derr
      if sse then
        if rec then rec:event(sse) end
        out, derr = dec:feed(sse)
      else
        out, derr = dec:finish()
        finished = true
        resp:close()
        if rec then rec:finish() end
      end
      if not out then fail(derr) end
      -- the answer is complete at its message_end: record it now, since a
      -- caller may stop pulling here, and release the transfer
      local last = out[#out]
      if last and last.type == "message_end" and not finished then
        finished = true
        resp:close()
        if rec then rec:finish() end
      end
      pending:push_all(out)
    end
  end, nil, nil, resp
end

M.Provider = Provider
return M
