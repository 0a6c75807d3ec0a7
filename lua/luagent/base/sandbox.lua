-- Running user Lua (policy files and hooks, tool files, Lua tools) so that
-- it can neither freeze the host nor exhaust its memory: every call gets a
-- bound in wall time, memory and instructions, and one that passes a bound
-- is stopped and reported with file:line. host/sandbox.c does the bounding
-- and says why it is done in the host's own state; this module adds what
-- user code may see (env, tool_env), what it is given (plain, bounded
-- copies: plain), the call that may not wait (call: policy files, hooks,
-- tool files) and the task that may (run: Lua tools); and it reads the
-- files user code comes in (read_file: policy and tool files, and
-- cassettes alike).
--
--   local ok, a, b = sandbox.call(fn, { x, y }, { wall = 0.1, memory = 32 * 2^20,
--                                                 instructions = 1e5 })
--   -- ok false: a is "file:line: message"
local core = require "luagent.core"
local errors = require "luagent.base.errors"

local M = {}

-- The bounds of a call that gives none: 0.1 s of wall time, 32 MiB of net
-- allocation, 1,000,000 Lua instructions.
M.defaults = { wall = 0.1, memory = 32 * 1024 * 1024, instructions = 1000000 }

-- How much of its input a hook is given (plain): strings are cut to
-- max_string bytes, tables to max_depth levels and max_items entries in all.
M.input = { max_string = 64 * 1024, max_depth = 8, max_items = 10000 }

local function copy(t, except)
  local c = {}
  for k, v in next, t do
    if not (except and except[k]) then c[k] = v end
  end
  return c
end

-- The string and table libraries of sandboxed code: Lua's, with the
-- functions whose time is not bounded by what they allocate replaced
-- (host/sandbox.c: find, match, gmatch, gsub, rep, move).
local STRING = copy(string)
for name, fn in pairs(core.bounded_string) do STRING[name] = fn end
local TABLE = copy(table)
for name, fn in pairs(core.bounded_table) do TABLE[name] = fn end

-- A fresh environment for user code: pure functions and copies of the pure
-- libraries. Left out: io, os (but time/clock/date/difftime), require, load,
-- dofile, debug, coroutine, package, print (stdout may carry JSON events),
-- collectgarbage, getmetatable (it reaches the shared string metatable),
-- setmetatable (a metamethod would run later, outside every bound: __gc at
-- any collection, __index or __pairs when the host reads a result) and
-- math.randomseed (host state). `extra` adds fields.
function M.env(extra)
  local env = {
    assert = assert, error = error, ipairs = ipairs, next = next,
    pairs = pairs, pcall = pcall, xpcall = xpcall, select = select,
    tonumber = tonumber, tostring = tostring, type = type,
    rawequal = rawequal, rawget = rawget, rawlen = rawlen, rawset = rawset,
    string = copy(STRING), table = copy(TABLE), utf8 = copy(utf8),
    math = copy(math, { randomseed = true }),
    os = { time = os.time, clock = os.clock, date = os.date, difftime = os.difftime },
  }
  env._G = env
  for k, v in pairs(extra or {}) do env[k] = v end
  return env
end

-- What a tool file's environment leaves out of the host's globals, and the
-- modules its require refuses (M.tool_env).
local TOOL_HIDDEN = { debug = true }
local TOOL_REFUSED = { debug = true, _G = true }

-- The host's module loader as a tool file gets it (`load_module`: the
-- global require as the file loads; a loader handed to user code, not a
-- dependency of this module), with the names of TOOL_REFUSED refused.
local function refusing(load_module)
  return function(name)
    if TOOL_REFUSED[name] then
      error("require: a tool file may not load '" .. name .. "' (it reaches past the file's bounds)", 2)
    end
    return load_module(name)
  end
end

-- A fresh environment for a tool file (lua/luagent/agent/tools/dir.lua). A tool
-- does real work, so it sees the host's globals (io, os, require, ...), as
-- they are when the file loads; globals it sets stay its own. Left out is
-- what would carry its code past its bounds: debug (debug.sethook() takes
-- the count hook away; require "debug" and require "_G" are refused too),
-- and setmetatable refuses a metatable with __gc (a finalizer runs at some
-- later collection, where no hook runs: outside every bound); load,
-- loadfile and dofile give a chunk this environment unless told another.
-- This keeps a careless file within its bounds; it is no wall against one
-- that hunts for the debug library (package.loaded holds it): tool files
-- are code the operator put there.
function M.tool_env()
  local env = {}
  for k, v in next, _G do
    if not TOOL_HIDDEN[k] then env[k] = v end
  end
  env._G = env
  env.require = refusing(env.require)
  function env.setmetatable(t, mt)
    if type(mt) == "table" and rawget(mt, "__gc") ~= nil then
      error("setmetatable: a tool file may not set a __gc (a finalizer runs outside every bound)", 2)
    end
    return setmetatable(t, mt)
  end
  function env.load(chunk, name, mode, ...)
    if select("#", ...) == 0 then return load(chunk, name, mode, env) end
    return load(chunk, name, mode, ...)
  end
  function env.loadfile(path, mode, ...)
    if select("#", ...) == 0 then return loadfile(path, mode, env) end
    return loadfile(path, mode, ...)
  end
  function env.dofile(path)
    local chunk = assert(loadfile(path, "bt", env))
    return chunk()
  end
  return env
end

-- A plain, bounded copy of v for user code: tables without metatables (read
-- raw), strings cut to M.input.max_string, at most M.input.max_depth levels
-- and M.input.max_items entries; functions, userdata and threads are left
-- out. A table seen twice is copied once.
function M.plain(v)
  local lim = M.input
  local items, seen = 0, {}
  local function cp(x, depth)
    local tx = type(x)
    if tx == "string" then
      return #x > lim.max_string and x:sub(1, lim.max_string) or x
    elseif tx == "number" or tx == "boolean" then
      return x
    elseif tx ~= "table" or depth > lim.max_depth then
      return nil
    end
    if seen[x] then return seen[x] end
    local c = {}
    seen[x] = c
    local k, val = next(x)
    while k ~= nil and items < lim.max_items do
      items = items + 1
      local ck = (type(k) == "string" or type(k) == "number" or type(k) == "boolean") and cp(k, depth + 1)
      if ck ~= nil then rawset(c, ck, cp(val, depth + 1)) end
      k, val = next(x, k)
    end
    return c
  end
  return cp(v, 1)
end

-- "file:line: " of a stack level (from debug.getinfo with "Sl"), or "".
local function position(info)
  if not info or info.currentline < 0 then return "" end
  local src = info.source:sub(1, 1) == "@" and info.source:sub(2) or info.short_src
  return src .. ":" .. info.currentline .. ": "
end

-- The message of an error value, with the failing position added from the
-- dead coroutine's stack when the message has none (error("x", 0), tables).
local function error_message(co, e)
  local msg = type(e) == "string" and e
    or (type(e) == "table" and type(rawget(e, "message")) == "string" and rawget(e, "message"))
    or ("error object is a " .. type(e) .. " value")
  if msg:match("^[^\n]-:%d+:") then return msg end
  for level = 0, 50 do
    local info = debug.getinfo(co, level, "Sl")
    if not info then break end
    if info.currentline >= 0 then return position(info) .. msg end
  end
  return msg
end

-- Calls fn(table.unpack(args)) within `limits` ({wall=, memory=,
-- instructions=}; a field left out takes M.defaults'; who= names the code
-- in messages, "user code" by default). Returns true and
-- fn's results, or false and a message starting with "file:line:" when the
-- position is known: an error, a bound passed (it is stopped at once and
-- pcall cannot catch that), or an attempt to wait (fn may not yield). The
-- host's string and table libraries hold the bounded functions while fn
-- runs (host/sandbox.c). A call may run inside another's bounds (a tool
-- whose code calls a policy hook).
function M.call(fn, args, limits)
  limits = limits or {}
  local d = M.defaults
  local box = core.sandbox {
    wall = limits.wall or d.wall, memory = limits.memory or d.memory,
    instructions = limits.instructions or d.instructions,
  }
  local co = coroutine.create(fn)
  args = args or {}
  local res = table.pack(pcall(box.resume, box, co, table.unpack(args, 1, args.n or #args)))
  if not res[1] then error(res[2], 0) end -- misuse: too many arguments
  res = table.pack(table.unpack(res, 2, res.n))
  if not res[1] then
    local msg = res[3] or error_message(co, res[2])
    coroutine.close(co)
    return false, msg
  end
  if coroutine.status(co) == "suspended" then
    local where = position(debug.getinfo(co, 1, "Sl"))
    coroutine.close(co)
    return false, where .. (limits.who or "user code") .. " may not wait (it yielded)"
  end
  return true, table.unpack(res, 2, res.n)
end

-- Whether a task has ended (done or failed).
local function ended(task)
  local st = task:status()
  return st == "done" or st == "failed"
end

-- Cancels every task that still runs under `box` (`task` with `reason`,
-- the others with none); returns those others.
local function cancel_all(box, task, reason)
  local others = {}
  for _, t in ipairs(core.boxed_tasks(box)) do
    if t == task then
      t:cancel(reason)
    else
      t:cancel()
      others[#others + 1] = t
    end
  end
  return others
end

-- Stops `box` and wakes its tasks to meet the stop: they end at once.
local function stop_all(box, task, reason)
  box:stop()
  cancel_all(box, task, reason)
end

-- The watchdog of a task M.run started: at `wall` on the loop's clock (or
-- when woken early: the caller was cancelled) the task and its helpers are
-- cancelled and its box's wall bound set to `grace` from now; if the task
-- still runs `grace` later, the box is stopped and its tasks woken to meet
-- the stop. It waits for the task's end, so no timer of it outlives the
-- task.
local function watch(task, box, wall, grace, reason)
  pcall(core.sleep, wall)
  if ended(task) then return end
  box:deadline(grace)
  cancel_all(box, task, reason)
  local stopper = core.spawn(function()
    core.sleep(grace)
    stop_all(box, task, reason)
  end)
  stopper:set_sandbox(nil)
  pcall(task.join, task)
  stopper:cancel()
end

-- Ends the helpers of a task M.run started once the task ended: those
-- still running under its box are cancelled, so their handlers run, and
-- stopped if they still run `grace` later; returns once they all ended. A
-- cancellation of the caller meanwhile stops them at once and is raised.
local function end_helpers(box, grace)
  local left = cancel_all(box)
  if #left == 0 then return end
  local stopper = core.spawn(function()
    core.sleep(grace)
    stop_all(box)
  end)
  stopper:set_sandbox(nil)
  while #left > 0 do -- and those their handlers start
    for _, t in ipairs(left) do
      local ok, err = pcall(t.join, t)
      if not ok and not ended(t) then
        stopper:cancel()
        stop_all(box)
        error(err, 0)
      end
    end
    left = cancel_all(box)
  end
  stopper:cancel()
end

-- run(fn, args, limits) -> true, fn's results | false, err, stop. Runs
-- fn(table.unpack(args)) as a task of its own, which may wait (Lua tools),
-- under a box: limits = {wall=, memory=, instructions=, grace=}: wall, in
-- seconds, is required; memory bounds the net growth of the heap over the
-- task's life, its waits included (what it allocates and keeps, and what
-- its helpers do); grace is 2 s unless given. The wall bound holds on
-- the wall clock while the task computes (the count hook, the bounded
-- matcher), and on the loop's clock while it waits: then the task is
-- cancelled, as a command's process group gets SIGTERM, so its handlers
-- run; if it still runs `grace` seconds later (it caught the cancellation,
-- or computes on), its box is stopped: every instruction raises and no
-- wait is allowed. Tasks it spawns share its box (daemons do not) and end
-- with it: once fn's task ended, those still running are cancelled (their
-- handlers run), stopped if they still run `grace` later, and run returns
-- when they are gone.
--
-- fn's results and what it raises are read as they are (the caller hands
-- a fn that makes them plain inside the box: tools.lua). ok false: `stop`
-- says why: "deadline" (it ended on the cancellation; err is a `timeout`
-- record, which = "deadline"), "time", "memory" or "instructions" (its box
-- stopped it; err is "file:line: ... limit ... exceeded"), or nil (err is
-- what fn raised). A cancellation of the caller cancels the task (which is
-- stopped past the grace) and is raised.
function M.run(fn, args, limits)
  local wall, grace = limits.wall, limits.grace or 2
  if type(wall) ~= "number" or not (wall > 0) then error("sandbox.run: limits.wall must be seconds > 0", 2) end
  local box = core.sandbox { wall = wall, memory = limits.memory or 0, instructions = limits.instructions or 0 }
  local task = core.spawn(fn, table.unpack(args, 1, args.n or #args))
  task:set_sandbox(box)
  local expired = {}
  local watchdog = core.spawn(watch, task, box, wall, grace, expired)
  watchdog:set_sandbox(nil) -- the host's: it must outlive a stopped caller's box
  local res = table.pack(pcall(task.join, task))
  if not ended(task) then -- the caller was cancelled while it waited
    cancel_all(box)
    watchdog:cancel() -- it stops them past the grace
    error(res[2], 0)
  end
  watchdog:cancel()
  end_helpers(box, grace)
  if res[1] then return true, table.unpack(res, 2, res.n) end
  local stop, why = box:stopped()
  if stop then return false, why, stop end
  local err = res[2]
  if errors.is_cancel(err) and err.reason == expired then
    return false, errors.new("timeout", string.format("deadline of %g s exceeded", wall),
      { which = "deadline", seconds = wall }), "deadline"
  end
  return false, err
end

-- read_file(path [, max_bytes]) -> the whole file at `path`, bytes as they
-- are, or nil and a message naming it as io's do ("path: No such file or
-- directory", "path: Is a directory": a folder opens but cannot be read).
-- With max_bytes, only a regular file (links followed) of at most that many
-- bytes is read, and opening never waits (core.read_file: a FIFO or a
-- device named like a user file cannot hold the loop); a third value then
-- says why not: "missing", "not_regular", "too_large", "changed" (it grew
-- or shrank while read: never returned cut) or "unreadable".
function M.read_file(path, max_bytes)
  if max_bytes then
    local text, err = core.read_file(path, max_bytes)
    if not text then return nil, err.message, err.reason end
    return text
  end
  local f, err = io.open(path, "rb")
  if not f then return nil, err end
  local text, rerr = f:read("a")
  f:close()
  if not text then return nil, path .. ": " .. tostring(rerr) end
  return text
end

return M
