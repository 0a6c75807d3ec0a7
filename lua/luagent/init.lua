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

---The public face of luagent: `local luagent = require "luagent"`. Tasks
---and time come from the C core; calls, agents and tools belong to a
---runtime, and these functions use the default one. Any name not listed
---here raises (`luagent.sleeep` is found at once).
---@class luagent
---@field version string the library's version ("0.1.0")
---@field errors luagent.errors error records: `errors.new(kind, message, fields)`, `errors.is(v)`, `errors.kinds`
---@field spawn fun(fn: function, ...: any): luagent.Task runs `fn(...)` as a task on the event loop
---@field sleep fun(seconds: number) suspends this task (or drives the loop, outside a task); cancellable
---@field now fun(): number seconds on the loop's clock (virtual or real)
---@field run fun(): boolean, integer? runs the loop until every task that is not a daemon is done (false and the count of stuck tasks on a deadlock)
---@field current fun(): luagent.Task? the running task, or nil outside one
---@field stats fun(): table the loop's counters: tasks, timers, `busy`, `real`, `held`
---@field clock luagent.clock the loop's clock: `clock.virtual([start])`, `clock.real()`, `clock.is_virtual()`
---@field deadline fun(seconds: number, fn: function, ...: any): ... `fn(...)`'s results, or raises an error of kind `timeout` when it runs longer
---@field list_dir fun(path: string): string[]?, string? the names of a folder's regular files and links, unsorted; or nil, message
---@field options table what `luagent run` was asked for (`retry_safe`, `seed`, `tools`); `{}` elsewhere; read-only
---@field agent fun(opts: luagent.AgentOptions): luagent.Agent makes an agent of the default runtime (`luagent.agent.new(opts)` is the same)
---@field tools luagent.tools tools and tool sets: `tools.dir(path)`, `tools.mcp{...}`, `tools.static(list)`
---@field events luagent.events the default runtime's bus and the consumers a script wires itself
---@field json luagent.json JSON: `encode(v)`, `decode(text)`, `array(t)`, `null`
---@field http table the HTTP client on the loop (`http.request{...}`), the transport model calls use
---@field log luagent.log the default runtime's logger
---@field fs luagent.fs files on the loop: `fs.read(path [, {max_bytes=}])`, `fs.write(path, data [, {append=true}])`, `fs.list(path)`, `fs.stat(path)`; each returns nil and an error record naming the path on failure
---@field exec fun(opts: luagent.exec.Options): luagent.exec.Result?, table? runs a child process (argv, no shell) on the loop: its exit code, signal and captured output
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

---@class luagent.clock
---@field virtual fun(start?: number) switches to simulated time: sleeps end at once, in order, and `now()` jumps
---@field real fun() back to the real clock
---@field is_virtual fun(): boolean whether the clock is virtual

---A task: a coroutine the event loop owns (`luagent.spawn`).
---@class luagent.Task
---@field join fun(self: luagent.Task): ... waits for the task; returns its results or raises its error (with its traceback)
---@field cancel fun(self: luagent.Task, reason?: string) wakes it at once with an error of kind `cancelled`, so its `pcall` handlers and `<close>` variables run
---@field status fun(self: luagent.Task): string "ready", "running", "waiting", "done" or "failed"
---@field set_daemon fun(self: luagent.Task, on: boolean): luagent.Task a daemon is not waited for by `luagent run`

---The default runtime's event bus, and the consumers a script wires itself
---(lua/luagent/EVENTS.md).
---@class luagent.events
---@field subscribe fun(fn: fun(ev: luagent.Event), opts?: {types?: string[], annotate?: boolean|"first"}): fun() calls `fn` for every event (of `opts.types` only); returns the function that unsubscribes
---@field publish fun(ev: luagent.Event) publishes an event of your own
---@field retry_safe fun(iter: fun(): luagent.Event?): fun(): luagent.Event? holds each attempt's events until it ends: only attempts that succeeded come through
---@field retry_safe_consumer fun(sink: fun(ev: luagent.Event)): fun(ev: luagent.Event) the same for a subscriber
---@field jsonl fun(out: file*): fun(ev: luagent.Event) a subscriber writing each event as one JSON line
---@field plain fun(ev: luagent.Event): table an event as plain data (error records as their fields)
---@field to_json fun(ev: luagent.Event): string an event as one JSON text

---An event: a table with a `type` and the fields of that type
---(lua/luagent/EVENTS.md lists every type).
---@class luagent.Event
---@field type string "text_delta", "provider_retry", "message_end", "tool_execution_end", "agent_end", ...
---@field agent string? the agent's name (events of an agent and of its model calls)
---@field agent_id string? the agent's own id
---@field call integer? the number of the model call (events of a call)
---@field final boolean? true on the one final event of a call
---@field error luagent.Error? the error of a failed attempt, call, tool or run

---@class luagent.json
---@field encode fun(v: any): string JSON text of a value (an empty table is `{}`; `json.array(t)` marks one as `[]`)
---@field decode fun(text: string): any the value of JSON text; raises on invalid JSON
---@field array fun(t?: table): table marks a table as a JSON array
---@field null any the JSON null

---@class luagent.log
---@field write fun(level: "debug"|"info"|"warn"|"error", msg: string, fields?: table) writes a log line of your own
---@field enabled fun(level: string): boolean whether lines at `level` are written
---@field level fun(): string the threshold

local default -- the default runtime

-- runtime{...} -> a new runtime with these settings (lua/luagent/config.lua
-- lists them): its own bus, policy, endpoints, cost cap and log sink.
---Makes a runtime: a host's state of its own (settings, event bus,
---endpoints and their breakers, log, cost meter, journal).
---@param settings? luagent.Settings the settings (README.md, "Settings"); a bad one raises, naming it
---@return luagent.Runtime
function M.runtime(settings)
  return require("luagent.runtime").new(settings)
end

-- default_runtime([rt]) -> the default runtime, made on first use; with rt,
-- rt becomes the default (what `luagent run` does with the runtime it
-- builds from its flags) and the previous default is returned.
---The default runtime, made on first use; with `rt`, makes `rt` the default.
---@param rt? luagent.Runtime the new default
---@return luagent.Runtime runtime the default (with `rt`: the previous one)
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
---Sets settings of the default runtime; returns the previous values of
---those given (pass them back to restore; `false` clears one). With no
---argument, returns a copy of every setting. An unknown name or a bad
---value raises, naming it.
---@param t? luagent.Settings
---@return luagent.Settings
function M.configure(t) return rt():configure(t) end

-- daemon(fn, ...) -> task: a task that run() and `luagent run` do not wait
-- for (servers, watchers).
---Spawns a task that `luagent run` does not wait for.
---@param fn function
---@param ... any its arguments
---@return luagent.Task
function M.daemon(fn, ...)
  return core.spawn(fn, ...):set_daemon(true)
end

-- provider("kind/model") or provider{kind=, model=, base_url=, api_key=,
-- headers=} -> a provider; see lua/luagent/model/provider.lua.
---Makes a provider: a model at an endpoint, with its key. Its key and
---base URL come from the kind's variables (`OPENAI_API_KEY`,
---`OPENAI_BASE_URL`, ...) unless given.
---@param spec string|luagent.ProviderSpec "kind/model" (`"openai/gpt-4o-mini"`), or a table
---@return luagent.Provider
function M.provider(spec) return rt():provider(spec) end

-- stream{model=, messages=, system=, tools=, policy=, max_tokens=} ->
-- iterator of events, retries included; complete{...} -> the final message,
-- or nil, err. See lua/luagent/model/call.lua.
---One model call, retries included, as an iterator of its events; the
---last one has `final = true`.
---@param opts luagent.StreamOptions
---@return fun(): luagent.Event? iterator
function M.stream(opts) return rt():stream(opts) end
---One model call, retries included: its final assistant message, or nil
---and the final error.
---@param opts luagent.StreamOptions
---@return luagent.Message? message
---@return luagent.Error? err
function M.complete(opts) return rt():complete(opts) end

-- health([now]) -> {[endpoint] = {state=, failures=, consecutive=, trips=,
-- tokens=, cooldown_until=, open_until=, backend=}}: the shared protection
-- state; backend is "local", or "redis" when it is shared between hosts.
---The protection state of the default runtime's endpoints.
---@param now? number a time on the loop's clock (default now)
---@return table<string, {state: string, failures: integer, consecutive: integer, trips: integer, tokens: number, cooldown_until: number?, open_until: number?, backend: string}>
function M.health(now) return rt():health(now or core.now()) end

-- subscribe(fn [, types]) -> unsubscribe function: the default runtime's events.
---Calls `fn(ev)` for every event of the default runtime (of `types` only,
---when given). `fn` runs inside the publisher: keep it quick (a wait there
---holds the call that published).
---@param fn fun(ev: luagent.Event)
---@param types? string[] the event types wanted
---@return fun() unsubscribe
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
