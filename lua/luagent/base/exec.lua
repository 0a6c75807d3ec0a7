-- luagent.exec{argv = {...}}: one child process run to its end, the
-- process API tools use (a command tool's child is started the same way),
-- for Lua tools and scripts alike. argv without a shell (argv[1] looked up
-- in PATH), in a process group of its own (killed whole at the timeout,
-- when the calling task is cancelled, and when the child exits: nothing it
-- started outlives it); the environment a command tool gets
-- (lua/luagent/base/child_env.lua: a few variables of ours, no provider
-- key, then `env`); stdin given whole; stdout and stderr captured up to
-- max_output bytes each. Waiting counts as a wait: inside a Lua tool it
-- is bounded by the tool's timeout, which cancels it (the group is killed,
-- and the call returns once it is gone, within the grace).
local core = require "luagent.core"
local errors = require "luagent.base.errors"
local deadline = require "luagent.base.deadline"
local child_env = require "luagent.base.child_env"

local M = {}

M.MAX_OUTPUT = 1024 * 1024 -- bytes kept of stdout and of stderr, by default
M.GRACE = 2                -- seconds between SIGTERM and SIGKILL

---@class luagent.exec.Options
---@field argv string[] the program and its arguments (no shell; argv[1] is looked up in PATH)
---@field cwd? string the folder it runs in (default: ours)
---@field env? table<string, string|false> laid over the reduced environment (false leaves a variable out)
---@field stdin? string its whole input (default: none, an empty stdin)
---@field timeout? number seconds; past it the group is killed and exec returns a `timeout` error
---@field max_output? integer bytes kept of stdout and of stderr each (default 1 MiB)
---@field grace? number seconds between SIGTERM and SIGKILL (default 2)

---@class luagent.exec.Result
---@field code? integer the exit code (nil when a signal ended it)
---@field signal? integer the signal that ended it
---@field stdout string
---@field stderr string
---@field stdout_dropped integer bytes of stdout past max_output, left out
---@field stderr_dropped integer bytes of stderr past max_output, left out
---@field pid integer

local OPTIONS = { argv = true, cwd = true, env = true, stdin = true, timeout = true, max_output = true,
  grace = true }

local function bad(msg) error("exec: " .. msg, 3) end

local function check(o)
  if type(o) ~= "table" then bad("expects a table {argv = {...}, cwd =, env =, stdin =, timeout =, max_output =}") end
  local argv = o.argv
  if type(argv) ~= "table" or type(argv[1]) ~= "string" then bad("argv must be a non-empty list of strings") end
  for k in pairs(o) do
    if not OPTIONS[k] then bad("unknown option '" .. tostring(k) .. "'") end
  end
  for i, a in ipairs(argv) do
    if type(a) ~= "string" then bad("argv[" .. i .. "] must be a string") end
  end
  for _, k in ipairs({ "cwd", "stdin" }) do
    if o[k] ~= nil and type(o[k]) ~= "string" then bad(k .. " must be a string") end
  end
  for _, k in ipairs({ "timeout", "grace" }) do
    local v = o[k]
    if v ~= nil and not (type(v) == "number" and v >= 0 and v < math.huge and (k == "grace" or v > 0)) then
      bad(k .. " must be a number of seconds " .. (k == "grace" and ">= 0" or "> 0"))
    end
  end
  if o.max_output ~= nil and not (math.type(o.max_output) == "integer" and o.max_output >= 0) then
    bad("max_output must be a whole number of bytes >= 0")
  end
  local env, why = child_env.own(o.env)
  if o.env ~= nil and not env then bad(why) end
  return env
end

--- Runs argv to its end: the exit code or signal and what it printed, or
--- nil and an error: `process` (it could not start: the message names the
--- program and the cwd), `timeout` with which = "exec" (it ran past
--- timeout: its group was killed). A cancellation of the caller kills the
--- group too, then raises. A non-zero exit is a result, not an error.
---@param opts luagent.exec.Options
---@return luagent.exec.Result|nil result
---@return table|nil err an error record (kind "process" or "timeout")
function M.exec(opts)
  local env = check(opts)
  local r, err = M.run(opts.argv, { stdin = opts.stdin, cwd = opts.cwd, grace = opts.grace or M.GRACE,
    env = child_env.build(env), max_output = opts.max_output or M.MAX_OUTPUT, timeout = opts.timeout })
  if not r then
    if err.kind == "timeout" then
      return nil, errors.new("timeout", string.format("exec: %s ran past its timeout of %g s and was killed",
        opts.argv[1], opts.timeout), { which = "exec", seconds = opts.timeout })
    end
    return nil, err
  end
  r.killed = nil
  return r
end

-- run(argv, o) -> result | nil, err: what exec and a command tool's attempt
-- (lua/luagent/agent/tools/tool.lua) share. Spawns argv with exactly the
-- environment o.env (a full one: child_env.build's, nothing inherited),
-- o.stdin, o.cwd, o.grace and o.max_output, and waits for its end, within
-- o.timeout seconds if given. err is the spawn's `process` record (the
-- message then names the cwd), or, past the timeout, the deadline's
-- `timeout` record (which = "deadline"): the group was killed and is gone
-- (bounded by the grace), for the caller to name as its own. A
-- cancellation of the caller kills the group too, waits for it the same
-- way, then raises.
function M.run(argv, o)
  local proc, err = core.process_spawn(argv, { stdin = o.stdin, cwd = o.cwd, grace = o.grace,
    env = o.env, inherit_env = false, max_output = o.max_output })
  if not proc then
    if o.cwd then err.message = err.message .. " (in cwd '" .. o.cwd .. "')" end
    return nil, err
  end
  local ok, r
  if o.timeout then
    ok, r = pcall(deadline, o.timeout, proc.wait, proc)
  else
    ok, r = pcall(proc.wait, proc)
  end
  if not ok then
    -- the wait's cancel hook killed the group: wait until it is gone
    -- (bounded by the grace), then let go of it
    pcall(proc.wait, proc)
    proc:close()
    if errors.is(r) and r.kind == "timeout" and r.which == "deadline" then return nil, r end
    error(r, 0)
  end
  proc:close()
  return r
end

return M
