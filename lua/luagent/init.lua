-- luagent: the public Lua API. Tasks, time and errors come from the C core;
-- larger areas (http, events, log, json, agent, tools) load on first use.
local core = require "luagent.core"
local errors = require "luagent.base.errors"
local config = require "luagent.config"
local deadline = require "luagent.base.deadline"

local M = {
  version = core.version,
  core = core,
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
}

-- configure{policy=, seed=, providers=, record=, policy_path=, options=,
-- log_level=, log_sink=, log_format=, log_content=, max_cost=, ...} -> the previous values of the settings given
-- (false for those that were unset): the one configuration surface of the
-- process (lua/luagent/config.lua says what each is; false clears one).
-- configure() -> a copy of every setting. `luagent run` sets them from its
-- flags; scripts read them the same way with or without it.
function M.configure(t)
  if t == nil then return config.all() end
  return config.set(t)
end

-- daemon(fn, ...) -> task: a task that run() and `luagent run` do not wait
-- for (servers, watchers).
function M.daemon(fn, ...)
  return core.spawn(fn, ...):set_daemon(true)
end

-- deadline(seconds, fn, ...) -> fn's results, or a `timeout` error (which =
-- "deadline") when fn takes longer; see lua/luagent/base/deadline.lua.
M.deadline = deadline

-- provider("kind/model") or provider{kind=, model=, base_url=, api_key=,
-- headers=} -> a provider; see lua/luagent/model/provider.lua.
function M.provider(spec)
  return require("luagent.model.provider").new(spec)
end

-- stream{model=, messages=, system=, tools=, policy=, max_tokens=} ->
-- iterator of events, retries included; complete{...} -> the final message,
-- or nil, err. See lua/luagent/model/call.lua.
function M.stream(opts) return require("luagent.model.call").stream(opts) end
function M.complete(opts) return require("luagent.model.call").complete(opts) end

-- health([now]) -> {[endpoint] = {state=, failures=, consecutive=, trips=,
-- tokens=, cooldown_until=, open_until=, backend=}}: the shared protection
-- state; backend is "local", or "redis" when it is shared between hosts.
function M.health(now)
  return require("luagent.model.endpoint").health(now or core.now())
end

-- Areas loaded on first use. These and the fields above are the whole public
-- face: any other name raises, so a typo (`luagent.sleeep`) is found at once.
-- Test-bench modules (luagent.mock, luagent.sim) are required by name.
local LAZY = {
  http = "luagent.base.http", events = "luagent.base.bus", log = "luagent.observe.log",
  json = "luagent.base.json", agent = "luagent.agent.loop", tools = "luagent.agent.tools",
}

setmetatable(M, {
  __index = function(t, k)
    -- what `luagent run` was asked for (retry_safe, seed, tools); {} elsewhere
    if k == "options" then return config.get("options") end
    if not LAZY[k] then
      error(string.format("luagent: no public name '%s'", tostring(k)), 2)
    end
    local mod = require(LAZY[k])
    rawset(t, k, mod)
    return mod
  end,
  __newindex = function(t, k, v)
    if k == "options" then error("luagent.options is read-only: use luagent.configure{options=...}", 2) end
    rawset(t, k, v)
  end,
})

return M
