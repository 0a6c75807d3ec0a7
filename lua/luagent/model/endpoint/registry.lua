-- A runtime's endpoints (lua/luagent/runtime.lua owns one registry): key ->
-- endpoint, each in process (lua/luagent/model/endpoint/init.lua) or shared
-- through Redis (lua/luagent/model/endpoint/redis.lua). Two runtimes have
-- two registries; they share an endpoint's state only through Redis, when
-- both are told to.
local errors = require "luagent.base.errors"
local endpoint = require "luagent.model.endpoint"
local redis = require "luagent.model.endpoint.redis"

local M = {}

local Registry = {}
Registry.__index = Registry

-- new(diag [, settings]) -> an empty registry; its Redis connections' lines
-- (down, back) go to diag (lua/luagent/base/diagnostics.lua). `settings`
-- are its runtime's (redis_url, redis_retry_every: lua/luagent/config.lua);
-- without them, endpoints are shared only when their options say so.
function M.new(diag, settings)
  return setmetatable({ endpoints = {}, settings = settings, pool = redis.pool(diag, settings) }, Registry)
end

-- registry:get(key [, opts]) -> the endpoint for `key`, created on first
-- use from `opts` ({breaker=<see core.breaker>, budget=<see
-- core.retry_budget>, cooldown={jitter=}, shared={redis=, prefix=,
-- timeout=}}; false for breaker or budget means none); later calls return
-- the same endpoint and ignore `opts`. With `shared` (or, when opts.shared
-- is nil, the redis_url setting, LUAGENT_REDIS_URL) the state lives in Redis and is shared
-- with every host using the same server and prefix; shared = false keeps it
-- local. A bad option raises, naming the field, and registers nothing.
function Registry:get(key, opts)
  if type(key) ~= "string" or key == "" then error("endpoint.get: key must be a non-empty string", 2) end
  local ep = self.endpoints[key]
  if ep then return ep end
  local jitter = endpoint.check_opts(opts)
  local shared = opts and opts.shared
  local url = self.settings and self.settings:get("redis_url")
  if shared == nil and url then
    local ok, why = redis.parse_url(url)
    if not ok then
      -- named as it was given: the variable, or the setting
      local source = self.settings:source("redis_url")
      local shown = url:gsub("^(redis://[^:/@]*:)[^@]*@", "%1***@") -- no password in a message
      error(errors.new("usage", (source == "set" and "redis_url" or source) .. " must be " .. why
        .. " (got '" .. shown .. "')"), 0)
    end
    shared = { redis = url }
  end
  ep = endpoint.new_local(key, opts, jitter)
  if shared then ep = redis.new(ep, opts, shared, self.pool) end
  self.endpoints[key] = ep
  return ep
end

-- registry:health([now]) -> a snapshot of every endpoint, as a fresh table
-- the caller owns (state "none" and no counts without a breaker, no tokens
-- without a budget): {[key] = {state=, failures=, consecutive=, calls=,
-- trips=, probe_out=, open_until= (nil while closed), tokens=, max_tokens=,
-- cooldown_until= (nil when none was set), backend= ("local", or "redis"
-- while the state is served by Redis; a Redis endpoint that fell back says
-- "local" and fallback=true)}}. The breaker's state is read at `now`;
-- without it, at the latest time each endpoint was given (an open time
-- that ended since then still reads "open").
function Registry:health(now)
  if now ~= nil and (type(now) ~= "number" or now ~= now) then
    error("endpoint.health: now must be a number or nil", 2)
  end
  local out = {}
  for key, ep in pairs(self.endpoints) do out[key] = ep:snapshot(now) end
  return out
end

-- registry:reset(): forgets every endpoint (specs; an embedder starting over).
function Registry:reset()
  self.endpoints = {}
  redis.close_pool(self.pool)
end

-- registry:close(): finishes its Redis writes (lua/luagent/model/endpoint/
-- redis.lua, flush_pool: bounded by each connection's timeout), then
-- forgets every endpoint and closes its connections; the runtime closes.
function Registry:close()
  redis.flush_pool(self.pool)
  self:reset()
end

return M
