-- The runtime: the owner of a running host's state, as a lua_State owns an
-- interpreter's. Its settings, event bus, diagnostics, secrets, endpoints,
-- policy cache and watchers, meters, call numbering, journal and watched
-- tool sets hang off it, never off module upvalues: two runtimes in one
-- process (two embedders, two tenants of a server) share nothing but the
-- loop and what they share on purpose (Redis, a journal database).
--
-- This is a composition root: it is the one place besides the face and the
-- CLI that wires observers (lua/luagent/observe/) to the call layer.
local config = require "luagent.config"
local bus = require "luagent.base.bus"
local diagnostics = require "luagent.base.diagnostics"
local registry = require "luagent.model.endpoint.registry"
local policy = require "luagent.model.policy"
local call = require "luagent.model.call"
local provider = require "luagent.model.provider"
local agent = require "luagent.agent.loop"
local log = require "luagent.observe.log"
local cost = require "luagent.observe.cost"

local M = {}

local Runtime = {}
Runtime.__index = Runtime
M.Runtime = Runtime

-- What a settings change means for the observers it configures.
local function apply(rt, name, value)
  if name == "log_level" then log.set_level(value or "warn")
  elseif name == "log_format" then log.set_format(value or "auto")
  elseif name == "log_sink" then log.sink = value or log.default_sink
  elseif name == "log_content" then log.content = value or false
  elseif name == "max_cost" and value then rt:meter("cost")
  end
end

-- new([settings]) -> a runtime. `settings` are those lua/luagent/config.lua
-- lists (policy=, seed=, providers=, log_level=, log_sink=, max_cost=, ...);
-- a bad one raises, naming it. Settings not given start from their
-- environment variable (LUAGENT_LOG, LUAGENT_REDIS_URL, OTEL_..., as the
-- table says), else their default.
function M.new(settings)
  if settings ~= nil and type(settings) ~= "table" then error("luagent.runtime: expects a table", 2) end
  local rt = setmetatable({
    calls = 0,          -- numbers this runtime's calls: events carry `call`
    admission = {},     -- function(call opts) -> nil | error record, before every attempt
    decorators = {},    -- function(call, attempt, opts) -> headers to add, or nil
    meters = {},        -- name -> what rt:meter started
    toolsets = {},      -- tool sets to close with the runtime
    closers = {},       -- functions rt:close() runs, last added first
  }, Runtime)
  rt.diag = diagnostics.new(function(level, msg, fields, about)
    -- a line repeating an event the log writes itself is left out
    if about and log.logging_events() then return end
    log.write(level, msg, fields)
  end)
  rt.bus = bus.new { diag = rt.diag }
  rt.settings = config.new(nil)
  -- the one place the environment is read (lua/luagent/config.lua lists
  -- each setting's variable); what `settings` gives wins, and a bad
  -- LUAGENT_ variable raises, naming it
  local ignored = rt.settings:read_env(settings)
  rt.settings.on_change = function(name, value) apply(rt, name, value) end
  if settings then rt.settings:set(settings, "luagent.runtime", 3) end
  for _, msg in ipairs(ignored) do rt.diag:write("warn", msg) end
  rt.endpoints = registry.new(rt.diag, rt.settings)
  rt.policies = policy.cache(rt.settings, rt.diag)
  -- tracing's request decorator: a policy with traceparent = true sends
  -- W3C Trace Context (lua/luagent/observe/trace.lua, loaded when asked)
  rt.decorators[1] = function(c)
    if c.policy.traceparent then return require("luagent.observe.trace").headers(c.id, c.attempt, c.opts) end
  end
  log.redact = function(text) return rt.policies:redact(text) end
  return rt
end

-- rt:configure{...} -> the previous values of the settings given;
-- rt:configure() -> a copy of every setting.
function Runtime:configure(t)
  if t == nil then return self.settings:all() end
  return self.settings:set(t, "luagent.configure", 4)
end

-- rt:provider("kind/model" | {kind=, model=, ...}) -> a provider of this runtime.
function Runtime:provider(spec) return provider.new(self, spec) end

-- rt:stream{...} -> iterator of events; rt:complete{...} -> message | nil, err
-- (lua/luagent/model/call.lua).
function Runtime:stream(opts) return call.stream(self, opts) end
function Runtime:complete(opts) return call.complete(self, opts) end

-- rt:agent{...} -> an agent of this runtime (lua/luagent/agent/loop.lua).
function Runtime:agent(opts) return agent.new(self, opts) end

-- rt:subscribe(fn [, types]) -> unsubscribe function: fn(event) for every
-- event of this runtime's calls and agents (of `types` only, when given).
function Runtime:subscribe(fn, types)
  if types ~= nil and type(types) ~= "table" then error("subscribe: types must be a list of event types", 2) end
  return self.bus:subscribe(fn, types and { types = types })
end

-- rt:health([now]) -> the protection state of this runtime's endpoints
-- (lua/luagent/model/endpoint/init.lua, health).
function Runtime:health(now) return self.endpoints:health(now) end

-- rt:meter(name) -> the meter, started once: "cost" (the cap of max_cost,
-- the cost table). Agents with max_cost ask for it.
function Runtime:meter(name)
  if name ~= "cost" then error("meter: no meter named '" .. tostring(name) .. "'", 2) end
  cost.start(self) -- once: a meter already counting goes on
  if not self.meters[name] then
    self.meters[name] = cost
    self.closers[#self.closers + 1] = function() cost.stop(self) end
  end
  return cost
end

-- rt:on_close(fn): fn runs when the runtime closes (an observer's flush).
function Runtime:on_close(fn)
  if type(fn) ~= "function" then error("on_close: expects a function", 2) end
  self.closers[#self.closers + 1] = fn
end

-- rt:own(set) -> set: a tool set this runtime closes when it closes.
function Runtime:own(set)
  self.toolsets[#self.toolsets + 1] = set
  return set
end

-- rt:close(): stops the runtime's watchers, closes its tool sets, runs its
-- closers (exporters flush, Redis writes finish, the journal closes).
-- Closing twice is harmless.
function Runtime:close()
  if self.closed then return end
  self.closed = true
  for i = #self.toolsets, 1, -1 do
    local set = self.toolsets[i]
    if set.close then pcall(set.close, set) end
  end
  for i = #self.closers, 1, -1 do
    local ok, err = pcall(self.closers[i])
    if not ok then self.diag:write("warn", "runtime close: " .. tostring(err)) end
  end
  self.policies:close()
  self.endpoints:close()
end

return M
