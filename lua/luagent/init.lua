-- luagent: the public Lua API, an explicit list of names. Tasks and time
-- come from the C core; everything of a running host belongs to a runtime
-- (lua/luagent/runtime.lua). The face keeps a default runtime, made on
-- first use, so a script that never names one works unchanged:
-- luagent.stream{...} is luagent.default_runtime():stream{...}.
--
-- This is a composition root: the runtime and the larger areas (http,
-- events, log, json, agent, tools) load on first use, for start-up time.
local core = require "luagent.core"
local errors = require "luagent.base.errors"
local deadline = require "luagent.base.deadline"

local M = {
  version = core.version,
  errors = errors,
  spawn = core.spawn,    -- spawn(fn, ...) -> task
  sleep = core.sleep,    -- sleep(seconds), cancellable
  now = core.now,        -- seconds on the loop's clock
  run = core.run,        -- run the loop until all non-daemon tasks are done
  current = core.current,
  stats = core.stats,
  clock = {
    virtual = core.clock_virtual, -- virtual([start]): time jumps when idle
    real = core.clock_real,
    is_virtual = core.clock_is_virtual,
  },
  -- deadline(seconds, fn, ...) -> fn's results, or raises `timeout`
  -- (lua/luagent/base/deadline.lua)
  deadline = deadline,
  -- list_dir(path) -> {names of the folder's regular files and links,
  -- unsorted}, or nil, message (host/watch.c)
  list_dir = core.list_dir,
}

local default -- the default runtime

-- runtime{...} -> a new runtime with these settings (lua/luagent/config.lua
-- lists them): its own bus, policy, endpoints, cost cap and log sink.
function M.runtime(settings)
  return require("luagent.runtime").new(settings)
end

-- default_runtime([rt]) -> the default runtime, made on first use; with rt,
-- rt becomes the default (what `luagent run` does with the runtime it
-- builds from its flags) and the previous default is returned.
function M.default_runtime(rt)
  if rt ~= nil then
    if getmetatable(rt) ~= require("luagent.runtime").Runtime then
      error("default_runtime: expects a runtime (luagent.runtime{...})", 2)
    end
    local was = default
    default = rt
    return was
  end
  if not default then default = require("luagent.runtime").new() end
  return default
end
local rt = M.default_runtime

-- configure{policy=, seed=, providers=, record=, policy_path=, options=,
-- log_level=, log_sink=, log_format=, log_content=, max_cost=, ...} -> the
-- previous values of the settings given (false for those that were unset):
-- the settings of the default runtime (lua/luagent/config.lua says what each
-- is; false clears one). configure() -> a copy of every setting.
function M.configure(t) return rt():configure(t) end

-- daemon(fn, ...) -> task: a task that run() and `luagent run` do not wait
-- for (servers, watchers).
function M.daemon(fn, ...)
  return core.spawn(fn, ...):set_daemon(true)
end

-- provider("kind/model") or provider{kind=, model=, base_url=, api_key=,
-- headers=} -> a provider; see lua/luagent/model/provider.lua.
function M.provider(spec) return rt():provider(spec) end

-- stream{model=, messages=, system=, tools=, policy=, max_tokens=} ->
-- iterator of events, retries included; complete{...} -> the final message,
-- or nil, err. See lua/luagent/model/call.lua.
function M.stream(opts) return rt():stream(opts) end
function M.complete(opts) return rt():complete(opts) end

-- health([now]) -> {[endpoint] = {state=, failures=, consecutive=, trips=,
-- tokens=, cooldown_until=, open_until=, backend=}}: the shared protection
-- state; backend is "local", or "redis" when it is shared between hosts.
function M.health(now) return rt():health(now or core.now()) end

-- subscribe(fn [, types]) -> unsubscribe function: the default runtime's events.
function M.subscribe(fn, types) return rt():subscribe(fn, types) end

-- Areas made on first use: name -> a function building the area's face.
local AREAS = {
  http = function() return require "luagent.base.http" end,
  json = function() return require "luagent.base.json" end,
  -- files on the loop: read, write, list, stat (lua/luagent/base/fs.lua)
  fs = function() return require "luagent.base.fs" end,
  -- exec{argv=, cwd=, env=, stdin=, timeout=, max_output=} -> {code=,
  -- signal=, stdout=, stderr=} | nil, err: one child process run to its
  -- end (lua/luagent/base/exec.lua)
  exec = function() return require("luagent.base.exec").exec end,
  -- the default runtime's logger: write(level, msg [, fields]),
  -- enabled(level), level(), library(line); where lines go and at which
  -- level is luagent.configure{log_sink=, log_level=, ...}
  log = function()
    local log = require "luagent.observe.log"
    return {
      LEVELS = log.LEVELS, duration = log.duration,
      write = function(level, msg, fields) return rt().log:write(level, msg, fields) end,
      enabled = function(level) return rt().log:enabled(level) end,
      level = function() return rt().log:level() end,
      library = function(line) return rt().log:library(line) end,
    }
  end,
  -- the tools layer; an MCP set belongs to the default runtime
  tools = function()
    local tools = require "luagent.agent.tools"
    local face = setmetatable({}, { __index = tools })
    face.mcp = function(opts) return tools.mcp(opts, rt()) end
    -- a folder's notes go to the default runtime's log
    face.dir = function(path, opts) return tools.dir(path, opts, rt()) end
    return face
  end,
  -- agent{...} -> an agent of the default runtime (lua/luagent/agent/loop.lua)
  agent = function()
    local loop = require "luagent.agent.loop"
    return setmetatable({ Agent = loop.Agent, defaults = loop.defaults,
      new = function(opts) return rt():agent(opts) end },
      { __call = function(_, opts) return rt():agent(opts) end })
  end,
  -- the default runtime's bus, and the consumers a script wires itself
  events = function()
    local bus = require "luagent.base.bus"
    local jsonl = require "luagent.observe.jsonl"
    local retry_safe = require "luagent.observe.retry_safe"
    return {
      subscribe = function(fn, opts) return rt().bus:subscribe(fn, opts) end,
      publish = function(ev) return rt().bus:publish(ev) end,
      plain = bus.plain, to_json = bus.to_json, jsonl = jsonl.jsonl,
      retry_safe = function(iter) return retry_safe.retry_safe(iter, rt().diag) end,
      retry_safe_filter = function(sink) return retry_safe.retry_safe_filter(sink, rt().diag) end,
      retry_safe_consumer = function(sink) return retry_safe.retry_safe_consumer(sink, rt().diag) end,
    }
  end,
}

-- These and the fields above are the whole public face: any other name
-- raises, so a typo (`luagent.sleeep`) is found at once. Test-bench modules
-- (luagent.mock, luagent.sim) are required by name.
setmetatable(M, {
  __index = function(t, k)
    -- what `luagent run` was asked for (retry_safe, seed, tools); {} elsewhere
    if k == "options" then return rt().settings:get("options") end
    local make = AREAS[k]
    if not make then
      error(string.format("luagent: no public name '%s'", tostring(k)), 2)
    end
    local area = make()
    rawset(t, k, area)
    return area
  end,
  __newindex = function(t, k, v)
    if k == "options" then error("luagent.options is read-only: use luagent.configure{options=...}", 2) end
    rawset(t, k, v)
  end,
})

return M
