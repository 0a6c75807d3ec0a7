-- The runtime: the owner of a running host's state, as a lua_State owns an
-- interpreter's. Its settings, event bus, diagnostics, endpoints, policy
-- cache and watchers, observers (its logger rt.log, its tracer
-- rt.tracer while it traces, its meters), call numbering, journal and
-- watched tool sets hang off it, never off module upvalues: two runtimes in one
-- process (two embedders, two tenants of a server) share nothing but the
-- loop and what they share on purpose (Redis, a journal database; the
-- registered keys, lua/luagent/base/secrets.lua, are the process's, so a
-- key any runtime knows is scrubbed from every output).
--
-- This is a composition root: it is the one place besides the face and the
-- CLI that wires observers (lua/luagent/observe/) to the call layer.
local core = require "luagent.core"
local config = require "luagent.config"
local bus = require "luagent.base.bus"
local diagnostics = require "luagent.base.diagnostics"
local registry = require "luagent.model.endpoint.registry"
local policy = require "luagent.model.policy"
local journal_state = require "luagent.agent.journal.state"
local log = require "luagent.observe.log"
local retry_safe = require "luagent.observe.retry_safe"
-- Loaded when first asked for, for start-up time and for the heap every
-- garbage collection walks (a host that only serves, or only streams, does
-- not carry the agent layer, MCP, SQLite or the price table): the call
-- layer (rt:stream, rt:complete, rt:provider), the agent layer (rt:agent),
-- the cost meter (rt:meter) and the tracer (rt:trace).
local function call() return require "luagent.model.call" end
local function provider() return require "luagent.model.provider" end
local function agent() return require "luagent.agent.loop" end
local function output() return require "luagent.agent.output" end
local function cost() return require "luagent.observe.cost" end

local M = {}

---A runtime: the owner of a running host's state (settings, event bus,
---endpoints and their breakers, policy files, log, tracer, cost meter,
---journal, tool sets). Two runtimes share nothing but the loop.
---@class luagent.Runtime
---@field settings table its settings object (`settings:get(name)`, `settings:set{...}`)
---@field closed boolean? true once `rt:close()` ran
local Runtime = {}
Runtime.__index = Runtime
M.Runtime = Runtime

-- What a settings change means for the observers it configures: its
-- own logger's, and the cost meter that holds a cap.
local function apply(rt, name, value)
  if name == "log_level" then rt.log:set_level(value or "warn")
  elseif name == "log_format" then rt.log:set_format(value or "auto")
  elseif name == "log_sink" then rt.log:set_sink(value)
  elseif name == "log_content" then rt.log:set_content(value)
  elseif name == "max_cost" and value and not rt.closed then rt:meter("cost")
  end
end

-- A traceparent with ids of its own, which no span keeps (a runtime that
-- does not trace, when a policy asks for the header).
local function fresh_traceparent()
  return { traceparent = "00-" .. core.random_id(32) .. "-" .. core.random_id(16) .. "-01" }
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
    decorators = {},    -- function(call) -> headers to add to the attempt's request, or nil
    -- function(iter) -> iter laid over the iterator of events a stream or
    -- an agent's prompt hands its caller (the retry-safe filter)
    event_filters = {},
    -- a definition's run function (or a command's text) -> {[name\0file] = true}:
    -- its unflagged note was said (tools.first_note); weak: gone with it
    noted = setmetatable({}, { __mode = "k" }),
    meters = {},        -- name -> what rt:meter started
    tracer = nil,       -- what rt:trace started, while it traces
    toolsets = setmetatable({}, { __mode = "k" }), -- set -> true: tool sets to close with the runtime
    agents = setmetatable({}, { __mode = "k" }),   -- agent -> true while it runs (agent/loop.lua)
    closers = {},       -- functions rt:close() runs, last added first
    journal = journal_state.new(), -- its durable run and the journal stores it closes
  }, Runtime)
  -- the library's own lines go to this runtime's logger (its log_sink, at
  -- its log_level)
  rt.diag = diagnostics.new(function(level, msg, fields, about)
    local logger = rt.log
    -- a line repeating an event the log writes itself is left out
    if about and logger:logging_events() then return end
    if level == "note" then
      -- a note for the person running the host (a durable run's id): as
      -- is on stderr, unless this runtime's log was set up (a sink, a
      -- level asked for): then a log line at info
      local s = rt.settings
      if s:get("log_sink") == nil and s:source("log_level") == "default" then
        io.stderr:write(msg, "\n")
        return
      end
      level = "info"
    end
    logger:write(level, msg, fields)
  end)
  rt.bus = bus.new { diag = rt.diag }
  rt.settings = config.new(nil)
  -- the one place the environment is read (lua/luagent/config.lua lists
  -- each setting's variable); what `settings` gives wins, and a bad
  -- LUAGENT_ variable raises, naming it
  local ignored = rt.settings:read_env(settings)
  -- made before the settings are applied (they configure it); its content
  -- goes through this runtime's policy's redact hook
  rt.log = log.new(rt)
  rt.settings.on_change = function(name, value) apply(rt, name, value) end
  if settings then rt.settings:set(settings, "luagent.runtime", 3) end
  for _, msg in ipairs(ignored) do rt.diag:write("warn", msg) end
  rt.endpoints = registry.new(rt.diag, rt.settings)
  rt.policies = policy.cache(rt.settings, rt.diag)
  -- the retry_safe setting (--retry-safe): what a script's streams and
  -- agents hand it holds each attempt's events until the attempt succeeds,
  -- whether or not the script reads luagent.options
  rt.event_filters[1] = function(iter)
    if rt.settings:get("retry_safe") then return retry_safe.retry_safe(iter, rt.diag) end
    return iter
  end
  -- tracing's request decorator: a policy with traceparent = true sends
  -- W3C Trace Context, naming the attempt's span while this runtime traces
  rt.decorators[1] = function(c)
    if c.policy.traceparent then
      local tracer = rt.tracer
      if tracer then return tracer:headers(c.id, c.attempt, c.opts) end
      return fresh_traceparent()
    end
  end
  return rt
end

-- A closed runtime answers nothing more: its admission (the cost cap),
-- watchers and observers are gone, so a call, agent or observer made now
-- would run unguarded, and nothing would close what it started.
local function open(rt)
  if rt.closed then error("runtime: closed", 3) end
  return rt
end

-- rt:configure{...} -> the previous values of the settings given;
-- rt:configure() -> a copy of every setting.
---Sets settings; returns the previous values of those given. With no
---argument, a copy of every setting.
---@param t? luagent.Settings
---@return luagent.Settings
function Runtime:configure(t)
  if t == nil then return self.settings:all() end
  -- not a tail call, so level 3 (set, here, the caller) names the line
  -- that called configure; luagent.configure tail-calls this, leaving no
  -- frame of its own
  local old = self.settings:set(t, "luagent.configure", 3)
  return old
end

-- rt:provider("kind/model" | {kind=, model=, ...}) -> a provider of this runtime.
---A provider of this runtime (see `luagent.provider`).
---@param spec string|luagent.ProviderSpec
---@return luagent.Provider
function Runtime:provider(spec) return provider().new(open(self), spec) end

-- rt:stream{...} -> iterator of events; rt:complete{...} -> message | nil, err
-- (lua/luagent/model/call.lua).
---One model call of this runtime, as an iterator of its events.
---@param opts luagent.StreamOptions
---@return fun(): luagent.Event? iterator
function Runtime:stream(opts)
  -- structured output checked as an agent's and complete's are (a bad schema raises here)
  if type(opts) == "table" and opts.output ~= nil then output().check(opts.output, "stream", 2) end
  return call().stream(open(self), opts, self.event_filters)
end
---One model call of this runtime: its final message, or nil and the final error.
---@param opts luagent.StreamOptions
---@return luagent.Message? message
---@return luagent.Error? err
function Runtime:complete(opts)
  -- structured output: the answer checked, asked again when it does not match
  if type(opts) == "table" and opts.output ~= nil then return output().complete(open(self), opts) end
  return call().complete(open(self), opts)
end

-- rt:agent{...} -> an agent of this runtime (lua/luagent/agent/loop.lua).
---Makes an agent of this runtime.
---@param opts luagent.AgentOptions
---@return luagent.Agent
function Runtime:agent(opts) return agent().new(open(self), opts) end

-- rt:subscribe(fn [, types]) -> unsubscribe function: fn(event) for every
-- event of this runtime's calls and agents (of `types` only, when given).
---Calls `fn(ev)` for every event of this runtime (of `types` only).
---@param fn fun(ev: luagent.Event)
---@param types? string[]
---@return fun() unsubscribe
function Runtime:subscribe(fn, types)
  open(self)
  if types ~= nil and type(types) ~= "table" then error("subscribe: types must be a list of event types", 2) end
  return self.bus:subscribe(fn, types and { types = types })
end

-- rt:health([now]) -> the protection state of this runtime's endpoints
-- (lua/luagent/model/endpoint/init.lua, health).
---The protection state of this runtime's endpoints (see `luagent.health`).
---@param now? number
---@return table<string, table>
function Runtime:health(now) return self.endpoints:health(now) end

-- rt:meter(name) -> the runtime's meter, made once and started (again,
-- if it was stopped): "cost" (lua/luagent/observe/cost.lua: the cap of
-- max_cost, the cost table, its own prices). Agents with max_cost ask for
-- it.
---The runtime's cost meter, made once and started: `meter:report()` is
---the cost table's lines.
---@param name "cost"
---@return table meter
function Runtime:meter(name)
  open(self)
  if name ~= "cost" then error("meter: no meter named '" .. tostring(name) .. "'", 2) end
  local m = self.meters[name]
  if not m then
    m = cost().new(self)
    self.meters[name] = m
  end
  m:start() -- once: a meter already counting goes on
  return m
end

-- rt:trace([opts]) -> the runtime's tracer | nil, message: made on first
-- use (lua/luagent/observe/trace.lua, loaded then: start-up time), with the
-- exporters opts asks for added ({tree=, file=, url=, headers=, max_queue=,
-- batch=, timeout=}). While it traces, this runtime's log lines carry its
-- trace and span ids and a policy's traceparent names its spans.
-- tracer:stop([out]) ends it (rt:close() does, if nothing did); the next
-- rt:trace makes a new one.
---Starts tracing (or adds exporters): spans after the OpenTelemetry GenAI
---conventions.
---@param opts? {tree: boolean?, file: string?, url: string?, headers: table?}
---@return table? tracer
---@return string? err
function Runtime:trace(opts)
  open(self)
  if opts ~= nil and type(opts) ~= "table" then error("trace: expects a table of options", 2) end
  local tracer = self.tracer
  if tracer then
    local ok, err = tracer:export(opts)
    if not ok then return nil, err end
    return tracer
  end
  local err
  tracer, err = require("luagent.observe.trace").new(self, opts)
  if not tracer then return nil, err end
  self.tracer = tracer
  self.log:set_context(tracer.context_of)
  tracer.on_stop = function()
    if self.tracer ~= tracer then return end
    self.tracer = nil
    self.log:set_context(nil)
  end
  return tracer
end

-- rt:on_close(fn): fn runs when the runtime closes (an observer's flush).
---Runs `fn` when the runtime closes.
---@param fn fun()
function Runtime:on_close(fn)
  if type(fn) ~= "function" then error("on_close: expects a function", 2) end
  self.closers[#self.closers + 1] = fn
end

-- rt:own(set) -> set: a tool set this runtime closes when it closes.
-- Weak: a set its opener closed and dropped is not kept alive.
function Runtime:own(set)
  self.toolsets[set] = true
  return set
end

-- Runs fn(...) for rt:close(), a failure written to the runtime's log.
local function closing(rt, fn, ...)
  local ok, err = pcall(fn, ...)
  if not ok then rt.diag:write("warn", "runtime close: " .. tostring(err)) end
end

-- rt:close(): aborts its running agents and waits for their runs to end
-- (each ends with agent_end "aborted"), closes its tool sets, runs its
-- closers, stops its observers (the tracer's exporters flush, within a
-- second, and its files close; the cost meter stops, its table still
-- readable; the log stops making lines of events), stops its watchers,
-- finishes its Redis writes, and closes its journal last: its run's claim
-- is let go after the rest. Closing twice is harmless; a closed runtime's
-- methods raise "runtime: closed".
---Closes the runtime: aborts its agents and waits for them, closes its
---tool sets, flushes its tracer, stops its meter, log and watchers, and
---lets its durable run go. Twice is harmless.
function Runtime:close()
  if self.closed then return end
  self.closed = true
  local running = {}
  for a in pairs(self.agents) do running[#running + 1] = a end
  for _, a in ipairs(running) do closing(self, a.abort, a, "the runtime closed") end
  -- a wait drives the loop, so this works outside a task too; an agent
  -- closing its own runtime (from a tool) is not waited for
  local here = core.current()
  for _, a in ipairs(running) do
    local task = a.task
    if task and task ~= here then pcall(task.join, task) end
  end
  local sets = {}
  for set in pairs(self.toolsets) do sets[#sets + 1] = set end
  for _, set in ipairs(sets) do
    if set.close then pcall(set.close, set) end
  end
  for i = #self.closers, 1, -1 do closing(self, self.closers[i]) end
  if self.tracer then closing(self, self.tracer.stop, self.tracer, nil, 1) end
  for _, m in pairs(self.meters) do closing(self, m.stop, m) end
  self.log:stop()
  self.policies:close()
  self.endpoints:close()
  closing(self, self.journal.close, self.journal)
end

return M
