-- What a tool is (a table, checked here) and how one call of it runs (the
-- runner: argument check, timeout, retries by safety flags, result bound).
-- Tool sets (a static list, a watched folder, an MCP server's tools) are
-- built on this: lua/luagent/agent/tools/set.lua and the modules beside it.
--
-- A tool is {name=, description=, params=<JSON Schema>, read_only=,
-- idempotent=, timeout=, run=function(args, ctx) | command={argv...},
-- env=, cwd=}. Flags decide retries: a read_only or idempotent tool that times
-- out or fails transiently is retried with backoff (the policy's `tool`
-- section); a tool with neither flag never is, and if it timed out, was
-- cancelled or died while running, the run stops with `outcome_unknown`.
--
-- A command's child runs in the tool's `cwd` (default: ours) with a reduced
-- environment (lua/luagent/base/child_env.lua: no provider key), plus the
-- tool's `env`, and gets its arguments three ways: as JSON on stdin (always
-- whole), as JSON in LUAGENT_ARGS, and each top-level string, number or
-- boolean as LUAGENT_ARG_<NAME> (the name in capitals, other characters
-- than A-Z, 0-9 and _ as _; as GitHub Actions hands inputs to a step), for
-- a shell script that cannot read JSON; a variable longer than the system
-- takes (ARG_VALUE_MAX) is left out, as are two arguments whose names give
-- the same variable and those past a total (ARG_TOTAL_MAX: a quarter of
-- ARG_MAX, at most 512 KiB). What a tool returns, prints or
-- raises becomes a value of the agent here, scrubbed of every key
-- (lua/luagent/base/secrets.lua): events, history, the journal and the next
-- request only ever see it so.
local core = require "luagent.core"
local errors = require "luagent.base.errors"
local json = require "luagent.base.json"
local secrets = require "luagent.base.secrets"
local child_env = require "luagent.base.child_env"
local sandbox = require "luagent.base.sandbox"
local exec = require "luagent.base.exec"
local policies = require "luagent.model.policy"
local schema = require "luagent.agent.tools.schema"
local options = require "luagent.base.options"

local M = {}

M.NAME_PATTERN = "^[A-Za-z0-9_-]+$"
M.MAX_NAME = 64

---A tool as you write it: a table (in a tool file, a list, or an agent's
---`tools`). Exactly one of `run` and `command`.
---@class luagent.ToolDef
---@field name string [A-Za-z0-9_-]{1,64}: what the model calls
---@field description string what the model reads to choose it
---@field params table? the arguments' JSON Schema (default: an object of no declared properties); arguments are checked before the tool runs
---@field read_only boolean? it changes nothing: retried after a timeout or a transient failure
---@field idempotent boolean? running it twice does what once does: retried too
---@field timeout number? seconds (default: the policy's `tool.timeout`, 60); it really stops the tool
---@field run (fun(args: table, ctx: luagent.ToolContext): any, any)? a Lua tool: runs as a task in the sandbox; returns the result (a string, or a value sent as JSON), or nil and an error
---@field command string[]? a command tool: argv (no shell); its arguments as JSON on stdin and in `LUAGENT_ARGS`, and each top-level string, number or boolean in `LUAGENT_ARG_<NAME>` (the name in capitals, other characters as _; one too long is left out); stdout the result
---@field env table<string, string|false>? a command tool's environment over the reduced one (`false` leaves a variable out)
---@field cwd string? the folder a command tool runs in (default: ours)
---@field check (fun(args: table, ctx: luagent.ToolContext): any)? durable runs: after a crash while it ran, whether the call happened (its result) or not (nil)
---@field needs_approval (boolean|fun(args: table, ctx: luagent.ToolContext): boolean)? a human approves each call before it runs (a function decides per call, once; its answer is journaled): the run stops with `approval_required` until `agent:approve`/`agent:deny` (or `luagent runs approve`/`deny`)

---What a Lua tool's `run(args, ctx)` gets beside its arguments.
---@class luagent.ToolContext
---@field call_id string the model's id of this call
---@field agent string the agent's name
---@field tool string the tool's name
---@field attempt integer this attempt, from 1
---@field idempotency_key string the same on every attempt and every resume of a durable run (`RUN_ID:agent#1/1/t4/c1`)
---@field raw_arguments string the model's arguments as it sent them
---@field progress fun(self: luagent.ToolContext, data: any) a `tool_execution_update` event with `data`
---@field cancelled fun(self: luagent.ToolContext): boolean whether the call was cancelled (the agent aborted)

---A checked tool (`luagent.tools.new`, or a set's snapshot): the
---definition's fields, read_only and idempotent as booleans.
---@class luagent.Tool: luagent.ToolDef
---@field source string? the file it came from
local Tool = { __name = "luagent.Tool" }
Tool.__index = Tool
M.Tool = Tool

-- The fields a tool definition may have (M.check reads them; luagent.ToolDef
-- above documents them): any other raises, naming the nearest. A new field
-- is added here.
M.FIELDS = options.known { "name", "description", "params", "read_only", "idempotent", "timeout", "run",
  "command", "env", "cwd", "check", "needs_approval" }
local FIELDS = M.FIELDS.set
local FIELD_LIST = "(a tool has name, description, params, read_only, idempotent, timeout, check, "
  .. "needs_approval and run or command (with env and cwd))"

------------------------------------------------------------------------------
-- Definitions
------------------------------------------------------------------------------

-- How deep a tool's params may nest.
M.MAX_PARAMS_DEPTH = 64

-- A copy of a tool's params read with next only, so that no metamethod of
-- the definition's tables runs, now or whenever the schema is used; JSON
-- array marks (json.array) are kept. A table met twice is copied once.
-- nil and why for a table that holds itself or nests too deep.
local function raw_copy(v, depth, path, done)
  if type(v) ~= "table" then return v end
  if done[v] then return done[v] end
  if path[v] then return nil, "params hold themselves (a cycle)" end
  if depth > M.MAX_PARAMS_DEPTH then return nil, "params nest deeper than " .. M.MAX_PARAMS_DEPTH .. " levels" end
  path[v] = true
  local c = {}
  for k, x in next, v do
    local cx, why = raw_copy(x, depth + 1, path, done)
    if why then return nil, why end
    c[k] = cx
  end
  path[v] = nil
  if debug.getmetatable(v) == json.array_mt then setmetatable(c, json.array_mt) end
  done[v] = c
  return c
end

-- A value as a definition's message names it: a string quoted, nil, a
-- number or a boolean as it is, else its type (tostring would run a
-- __tostring of the definition's).
local function shown(v)
  local tv = type(v)
  if tv == "string" then return ("%q"):format(v) end
  if v == nil or tv == "number" or tv == "boolean" then return tostring(v) end
  return "a " .. tv
end

-- check(t [, source]) -> tool | nil, message (with the offending field).
-- The tool is a checked copy carrying the metatable Tool; `source` (a file)
-- is kept as tool.source. The definition is read raw (next, rawget), so a
-- metatable of its tables never runs (a tool file's may loop) and is not
-- kept.
function M.check(t, source)
  if type(t) ~= "table" then return nil, "a tool must be a table (got " .. type(t) .. ")", nil end
  local mt = debug.getmetatable(t)
  -- checked already (also by another load of this module: a host that
  -- loads the library twice, a test runner that restores package.loaded)
  if mt == Tool or (type(mt) == "table" and rawget(mt, "__name") == Tool.__name and rawget(mt, "__index") == mt) then
    return t
  end
  local f, keys = {}, {}
  for k, v in next, t do
    if type(k) ~= "string" then return nil, "unknown field " .. shown(k) .. " " .. FIELD_LIST, nil end
    f[k] = v
    keys[#keys + 1] = k
  end
  table.sort(keys)
  for _, k in ipairs(keys) do
    if not FIELDS[k] then
      return nil, "unknown field '" .. k .. "' " .. options.suggestion(k, M.FIELDS, FIELD_LIST), k
    end
  end
  local name = f.name
  if type(name) ~= "string" or #name < 1 or #name > M.MAX_NAME or not name:match(M.NAME_PATTERN) then
    return nil, "name must match [A-Za-z0-9_-]{1,64} (got " .. shown(name) .. ")", "name"
  end
  local function bad(field, msg) return nil, "tool '" .. name .. "': " .. msg, field end
  if type(f.description) ~= "string" or f.description == "" then
    return bad("description", "description must be a non-empty string")
  end
  local params, perr = { type = "object", properties = {} }, nil
  if f.params ~= nil then params, perr = raw_copy(f.params, 1, {}, {}) end
  if not params then return bad("params", perr) end
  local ok, why = schema.valid(params)
  if not ok then return bad("params", why) end
  for _, k in ipairs({ "read_only", "idempotent" }) do
    if f[k] ~= nil and type(f[k]) ~= "boolean" then return bad(k, k .. " must be true or false") end
  end
  if f.timeout ~= nil and not (type(f.timeout) == "number" and f.timeout > 0 and f.timeout < math.huge) then
    return bad("timeout", "timeout must be a number of seconds > 0")
  end
  if (f.run == nil) == (f.command == nil) then
    return bad(f.run and "run" or "command", "needs exactly one of run (a function) and command (an argv list)")
  end
  if f.check ~= nil and type(f.check) ~= "function" then
    return bad("check", "check must be a function(args, ctx) returning the result if the call happened, else nil")
  end
  local na = f.needs_approval
  if na ~= nil and type(na) ~= "boolean" and type(na) ~= "function" then
    return bad("needs_approval", "needs_approval must be true, false or a function(args, ctx) returning true or false")
  end
  local command
  if f.run ~= nil and type(f.run) ~= "function" then return bad("run", "run must be a function") end
  if f.command ~= nil then
    if type(f.command) ~= "table" or type(rawget(f.command, 1)) ~= "string" then
      return bad("command", "command must be a list of strings (argv, no shell)")
    end
    command = {}
    local i = 1
    while rawget(f.command, i) ~= nil do
      local a = rawget(f.command, i)
      if type(a) ~= "string" then return bad("command", "command[" .. i .. "] must be a string") end
      command[i] = a
      i = i + 1
    end
  end
  if f.env ~= nil and f.command == nil then
    return bad("env", "env is for a command tool (its child's environment)")
  end
  if f.cwd ~= nil and type(f.cwd) ~= "string" then return bad("cwd", "cwd must be a string (a folder)") end
  if f.cwd ~= nil and f.command == nil then
    return bad("cwd", "cwd is for a command tool (the folder its child runs in)")
  end
  local env, why_env = child_env.own(f.env)
  if f.env ~= nil and not env then return bad("env", why_env) end
  return setmetatable({
    name = name, description = f.description, params = params,
    read_only = f.read_only or false, idempotent = f.idempotent or false,
    timeout = f.timeout, run = f.run, command = command, env = env, cwd = f.cwd, source = source,
    check = f.check, needs_approval = na or nil,
  }, Tool)
end

-- new(t) -> tool; raises on a bad definition (misuse). luagent.tool{...}.
function M.new(t)
  local tool, err = M.check(t)
  if not tool then error("tool: " .. err, 2) end
  return tool
end

-- What the model is told about a tool (the request's tools entry).
function M.spec(tool)
  return { name = tool.name, description = tool.description, parameters = tool.params }
end

-- section_in_force(tool_policy, policy, cache) -> the tool section that
-- runs calls: tool_policy (a checked tool section) when given, else the
-- `tool` section of the retry policy `policy` (a name, file or table; nil:
-- the runtime's default policy), found through `cache` (a runtime's policy
-- cache, lua/luagent/model/policy.lua), else the defaults. An agent's calls
-- and an MCP set's trust in its server's hints are decided by it.
function M.section_in_force(tool_policy, policy, cache)
  if tool_policy then return tool_policy end
  local ok, holder = false, nil
  if cache then ok, holder = pcall(cache.resolve, cache, policy) end
  local p = ok and holder:get()
  if type(p) == "table" then
    local good, pol = pcall(policies.new, p)
    if good and pol and pol.tool then return pol.tool end
  end
  return policies.tool_section(nil)
end

local function fmt(s) return (string.format("%.3g", s)) end

-- first_note(noted, tool) -> true the first time that note is due for
-- this definition of the tool (and marks it said), false after. `noted` is
-- the runtime's rt.noted, weak-keyed: a Lua tool's mark hangs off its run
-- function, which the checked copies of one definition share (two agents
-- given the same plain table get a copy each; a reloaded file is a new
-- definition), and goes with it; a command tool's is its name, file and
-- argv (a file reloaded with the same argv is the same command).
function M.first_note(noted, t)
  local key = t.run or table.concat({ t.name, tostring(t.source), table.concat(t.command, "\0") }, "\0")
  local which = t.name .. "\0" .. tostring(t.source)
  local said = noted[key]
  if not said then
    said = {}
    noted[key] = said
  end
  if said[which] then return false end
  said[which] = true
  return true
end

-- unflagged_note(tool, timeout) -> the line that tells, once, what a
-- timeout (`timeout`: the tool's own, else the policy's) of a tool with
-- neither read_only nor idempotent does; nil for a flagged tool. Its set
-- says it when it loads the tool (a folder), the agent when it is given a
-- tool (lua/luagent/agent/loop.lua).
function M.unflagged_note(t, timeout)
  if t.read_only or t.idempotent then return nil end
  return string.format("luagent: tool %s%s: neither read_only nor idempotent: a timeout of %s s will stop the run "
    .. "with outcome_unknown (it is never retried: set read_only or idempotent if running it twice is safe)",
    t.name, t.source and (" (" .. t.source .. ")") or "", fmt(t.timeout or timeout))
end

------------------------------------------------------------------------------
-- Running one call
------------------------------------------------------------------------------

-- Cuts `text` to `cap` bytes (on a UTF-8 boundary) with a note saying how
-- much was left out; `total` is the full size when text is already a prefix.
function M.bound(text, cap, total)
  total = total or #text
  if not cap or total <= cap then return text end
  local cut = math.min(cap, #text)
  while cut > 0 and (text:byte(cut + 1) or 0) & 0xC0 == 0x80 do cut = cut - 1 end
  return text:sub(1, cut) .. string.format("\n[result cut: %d of %d bytes left out]", total - cut, total)
end

-- Failures that are worth another attempt of a read_only/idempotent tool.
local TRANSIENT = { tool_timeout = true, timeout = true, refused = true, dns = true, tls = true,
  reset = true, eof = true, truncated = true, transport = true, stream_error = true }

local function transient(err)
  if type(err) ~= "table" then return false end
  if err.retryable ~= nil then return err.retryable == true end
  if err.died then return true end
  if err.kind == "http" then return err.status == 429 or (tonumber(err.status) or 0) >= 500 end
  return TRANSIENT[err.kind] or false
end

-- A tool's result as text: strings as they are, nil as nothing, anything
-- else as JSON (raises for what JSON cannot carry: NaN, a table that
-- refers to itself, a function).
local function as_text(v)
  if v == nil then return "" end
  if type(v) == "string" then return v end
  return json.encode(v)
end

-- Whether v is a record errors.new made (its metatable, read past any
-- __metatable field), so its fields can be read raw.
local function is_record(v)
  return type(v) == "table" and debug.getmetatable(v) == errors.metatable
end

-- An error value a tool raised or returned, made plain inside its box:
-- {kind=, message=, fields=} for a record (a table with a kind luagent
-- knows: its fields as a plain, bounded copy), else {message=}.
local function error_fields(e)
  local msg = tostring(type(e) == "table" and e.message or e)
  -- a raised string may carry a traceback: the model gets the message alone
  msg = msg:gsub("\nstack traceback:\n.*$", "")
  if errors.is(e) and e.kind ~= "cancelled" then
    return { kind = e.kind, message = msg, fields = sandbox.plain(e) }
  end
  return { message = msg }
end

-- What runs in a Lua tool's box: the call of `fn` (run or check), then its
-- outcome made plain there too, so that metamethods, NaN and cycles meet
-- the tool's bounds: "text", text | "none" (it returned nothing: a check
-- saying the call did not happen) | "error", error_fields | "unsendable",
-- why. A cancellation is raised again: it must reach the task's top.
local function inside(fn, args, ctx)
  local res = table.pack(pcall(fn, args, ctx))
  if not res[1] then
    local e = res[2]
    if is_record(e) and rawget(e, "kind") == "cancelled" then error(e, 0) end
    return "error", error_fields(e)
  end
  if res[2] == nil then
    if res[3] ~= nil then return "error", error_fields(res[3]) end
    return "none"
  end
  local ok, text = pcall(as_text, res[2])
  if not ok then return "unsendable", tostring(text) end
  return "text", text
end

local function tool_timeout(name, seconds, stuck)
  return errors.new("tool_timeout", name .. " timed out after " .. fmt(seconds) .. " s",
    { seconds = seconds, stuck = stuck })
end

-- Runs fn(args, ctx) (a tool's run or check, named `name` in messages) in
-- the sandbox as a task (sandbox.run): its timeout the wall bound, the
-- policy's grace and max_memory. Returns text | nil (nothing returned) |
-- nil, err; raises a cancellation of the caller.
local function run_bounded(name, fn, args, ctx, timeout, policy)
  local ok, how, v = sandbox.run(inside, { fn, args, ctx, n = 3 }, { wall = timeout,
    grace = policy.grace or 2, memory = policy.max_memory or 0 })
  if ok then
    if how == "text" then return v end
    if how == "none" then return nil end
    if how == "unsendable" then
      return nil, errors.new("tool_error", name .. " returned a result that cannot be sent to the model: " .. v)
    end
    if v.kind then return nil, errors.new(v.kind, v.message, v.fields) end
    return nil, errors.new("tool_error", name .. " failed: " .. v.message)
  end
  local stop = v
  if stop == "deadline" then return nil, tool_timeout(name, timeout) end
  if stop == "time" then return nil, tool_timeout(name, timeout, true) end
  if stop then return nil, errors.new("tool_error", name .. " failed: " .. how) end
  -- only a cancellation from elsewhere (the tool's own task) gets here
  return nil, errors.new("tool_error", name .. " failed: " .. tostring(errors.is(how) and how.message or how))
end

-- One attempt of a Lua tool, in the sandbox. Returns text | nil, err.
local function lua_attempt(tool, args, ctx, timeout, policy)
  local text, err = run_bounded(tool.name, tool.run, args, ctx, timeout, policy)
  if err then return nil, err end
  return text or ""
end

-- A captured stream that was cut (`dropped` bytes past the cap) without its
-- end that may be the start of a key, so the cut cannot split a key past
-- the scrubber; returns it and the bytes dropped in all.
local function uncut(s, dropped)
  local n = dropped > 0 and secrets.tail(s) or 0
  if n == 0 then return s, dropped end
  return s:sub(1, -n - 1), dropped + n
end

-- One attempt of a command tool (luagent.base.exec.run, as luagent.exec):
-- a child process in its own group, the
-- arguments as JSON on stdin (the model's text when it holds exactly the
-- checked value: json.decode_strict, no key twice, every number finite;
-- else the checked value encoded), the reduced environment and the tool's
-- env. On timeout or cancel its group gets SIGTERM, then SIGKILL after the
-- grace, and the attempt ends only once it is gone. Its streams are read a
-- key's length past the result bound, so a key across the bound is seen
-- whole.
-- The longest "NAME=value" the system takes in an environment
-- (Linux's MAX_ARG_STRLEN, 32 pages): a longer one fails the spawn.
M.ARG_VALUE_MAX = 128 * 1024 - 1

-- What all of them together may take: a quarter of what the system takes
-- for a child's argv and environment (ARG_MAX, 2 MiB on Linux by default;
-- past it the spawn fails, E2BIG, though stdin alone would do), at most
-- 512 KiB; the rest is left to argv, the reduced environment and the
-- tool's env.
M.ARG_TOTAL_MAX = math.min(512 * 1024, (core.arg_max() or 512 * 1024 * 4) // 4)

-- The variables a command's child gets its arguments in: LUAGENT_ARGS
-- (the JSON it reads on stdin) and LUAGENT_ARG_<NAME> for each top-level
-- string, number or boolean; laid over `env` (the tool's own cannot hide
-- them). One longer than ARG_VALUE_MAX is left out; so is one past the
-- total of ARG_TOTAL_MAX: LUAGENT_ARGS first, then the others in name
-- order, each while it fits in what is left.
local function argument_variables(env, input, args)
  local left = M.ARG_TOTAL_MAX
  local function put(name, value)
    local size = #name + 2 + #value -- "NAME=value" and its NUL
    if size - 1 > M.ARG_VALUE_MAX or size > left or value:find("\0", 1, true) then return end
    env[name] = value
    left = left - size
  end
  put("LUAGENT_ARGS", input)
  local vars, clash, names = {}, {}, {}
  for k, v in pairs(args) do
    local tv = type(v)
    if type(k) == "string" and (tv == "string" or tv == "number" or tv == "boolean") then
      local name = "LUAGENT_ARG_" .. k:upper():gsub("[^A-Z0-9_]", "_")
      local text = tv == "string" and v or tv == "boolean" and tostring(v)
        or math.type(v) == "integer" and string.format("%d", v) or string.format("%.17g", v)
      if vars[name] then clash[name] = true else names[#names + 1] = name end
      vars[name] = text
    end
  end
  table.sort(names)
  for _, name in ipairs(names) do
    if not clash[name] then put(name, vars[name]) end
  end
  return env
end

local function command_attempt(tool, args, ctx, timeout, policy)
  local raw = ctx.raw_arguments
  local input = type(raw) == "string" and type(json.decode_strict(raw)) == "table" and raw or json.encode(args)
  local r, err = exec.run(tool.command, { stdin = input, grace = policy.grace, cwd = tool.cwd, timeout = timeout,
    env = argument_variables(child_env.build(tool.env), input, args),
    max_output = policy.max_result_bytes + secrets.margin + 1 })
  if not r then
    if err.kind == "timeout" then
      return nil, tool_timeout(tool.name, timeout)
    end
    return nil, err, false
  end
  local stderr = uncut(r.stderr, r.stderr_dropped)
  if r.signal then
    return nil, errors.new("tool_error", string.format("%s died of signal %d%s", tool.name, r.signal,
      stderr ~= "" and (": " .. stderr) or ""), { died = true, signal = r.signal })
  end
  if r.code ~= 0 then
    return nil, errors.new("tool_error", string.format("%s exited with code %d%s", tool.name, r.code,
      stderr ~= "" and (": " .. stderr:gsub("%s+$", "")) or ""),
      { exit_code = r.code, retryable = r.code == 75 }) -- EX_TEMPFAIL: try again
  end
  local stdout, dropped = uncut(r.stdout, r.stdout_dropped)
  return stdout, nil, dropped
end

-- What one attempt gave (text, err, dropped) as the agent may keep it:
-- scrubbed of every key, once, here.
local function scrubbed(text, err, dropped)
  return secrets.scrub(text), secrets.scrub(err), dropped
end

-- One run of a tool's check (see check_outcome): text | nil | nil, err.
local function check_attempt(tool, call, opts)
  local policy = opts.policy or {}
  local timeout = tool.timeout or policy.timeout or 30
  local ctx = { call_id = call.id, agent = opts.agent, tool = tool.name, attempt = 0, checking = true,
    idempotency_key = opts.idempotency_key, raw_arguments = call.raw_arguments,
    progress = function() end, cancelled = function() return false end }
  return run_bounded(tool.name .. " check", tool.check, call.arguments or {}, ctx, timeout, policy)
end

-- check_outcome(tool, call, opts) -> text | nil | nil, err: asks the tool's
-- check(args, ctx) whether a call whose outcome is unknown (a durable run
-- stopped while it ran) happened: its result as text if it did, nil if it
-- did not, nil and an error record when the check failed. Same bounds as
-- an attempt (the sandbox, the timeout), scrubbed as one; opts as for
-- execute.
function M.check_outcome(tool, call, opts)
  local text, err = scrubbed(check_attempt(tool, call, opts))
  -- what a check found stands for the call's result: bounded as one
  local cap = opts.policy and opts.policy.max_result_bytes
  if text then text = M.bound(text, cap) end
  return text, err
end

-- needs_approval(tool, call, opts) -> boolean | nil, err: whether this
-- call waits for a human's decision before it runs: the tool's
-- needs_approval, a function evaluated once per call in the sandbox (as a
-- check is; opts as for execute). A call whose arguments are not valid
-- needs none: it fails without running. A function that fails or answers
-- something other than true or false is an error (the call does not run).
function M.needs_approval(tool, call, opts)
  local na = tool and tool.needs_approval
  if not na then return false end
  if call.arguments == nil or call.error or not schema.check(tool.params, call.arguments) then return false end
  if na == true then return true end
  local policy = opts.policy or {}
  local ctx = { call_id = call.id, agent = opts.agent, tool = tool.name, attempt = 0,
    idempotency_key = opts.idempotency_key, raw_arguments = call.raw_arguments,
    progress = function() end, cancelled = function() return false end }
  local text, err = run_bounded(tool.name .. " needs_approval", na, call.arguments, ctx,
    tool.timeout or policy.timeout or 30, policy)
  if err then return nil, secrets.scrub(err) end
  if text == "true" then return true end
  if text == "false" or text == nil then return false end
  return nil, errors.new("tool_error", tool.name .. " needs_approval must return true or false (got "
    .. secrets.scrub(text):sub(1, 40) .. ")")
end

-- The record that stops a run when an unflagged tool may have acted.
local function outcome_unknown(tool, call, why, cause)
  return errors.new("outcome_unknown", string.format(
    "%s (call %s, arguments %s) %s; it has neither read_only nor idempotent, so it may have done "
    .. "its work and is not run again", tool.name, tostring(call.id), call.raw_arguments
      or json.encode(call.arguments or {}), why),
    { tool = tool.name, call_id = call.id, arguments = call.arguments, cause = cause })
end

-- execute(tool, call, opts) -> outcome. Runs one tool call to its end:
--   call = {id=, name=, arguments=<table or nil>, raw_arguments=, error=}
--   opts = {agent=<name>, policy=<tool section>, emit=function(event),
--           rng=<backoff rng>, idempotency_key=, aborted=function()->reason}
--   outcome = {content=<text for the model>, is_error=, error=<record>,
--              attempts=, duration=, unknown=<outcome_unknown>, cancelled=}
-- Never raises for the tool's failures; a cancellation of the calling task
-- ends the call (the outcome says so) and is not raised.
function M.execute(tool, call, opts)
  local t0 = core.now()
  local policy = opts.policy
  local emit = opts.emit or function() end
  local attempts = 0
  local function done(o)
    o.attempts, o.duration = attempts, core.now() - t0
    if o.error and not o.content then o.content = o.error.message end
    return o
  end
  if call.arguments == nil or call.error then
    local e = errors.new("invalid_arguments", "invalid arguments for " .. tool.name .. ": "
      .. tostring(call.error or "not a JSON object"))
    return done { is_error = true, error = e }
  end
  local ok, why = schema.check(tool.params, call.arguments)
  if not ok then
    return done { is_error = true, error = errors.new("invalid_arguments",
      "invalid arguments for " .. tool.name .. ": " .. why) }
  end
  local flagged = tool.read_only or tool.idempotent
  local max_attempts = flagged and policy.max_retries + 1 or 1
  local timeout = tool.timeout or policy.timeout
  local cancelled = false
  local ctx = {
    call_id = call.id, agent = opts.agent, tool = tool.name, attempt = 0,
    idempotency_key = opts.idempotency_key or (tostring(opts.agent) .. ":" .. tostring(call.id)),
    raw_arguments = call.raw_arguments,
  }
  -- ctx:progress(data): a tool_execution_update event for this call. data
  -- comes from the tool: copied plain (sandbox.plain: read raw, bounded;
  -- the tool's own table, which may hold its token, is left as it was, and
  -- the event does not change as the tool goes on), then scrubbed as its
  -- result is. Called from the tool's task, so the copy runs in its box.
  function ctx.progress(_, data)
    emit { type = "tool_execution_update", call_id = call.id, name = tool.name,
      data = secrets.scrub(sandbox.plain(data)) }
  end
  -- ctx:cancelled() -> whether the call was cancelled (the agent aborted).
  function ctx.cancelled() return cancelled or (opts.aborted and opts.aborted() ~= nil) or false end
  while true do
    attempts = attempts + 1
    ctx.attempt = attempts
    local run_ok, text, err, dropped = pcall(tool.command and command_attempt or lua_attempt,
      tool, call.arguments, ctx, timeout, policy)
    if run_ok then text, err, dropped = scrubbed(text, err, dropped) end
    if not run_ok then
      -- the calling task was cancelled (the agent aborted): the tool was stopped
      cancelled = true
      local e = errors.is(text) and text or errors.new("tool_error", tostring(text))
      if not errors.is_cancel(e) then error(text, 0) end -- a bug in the runner itself
      if flagged then
        return done { is_error = true, cancelled = true, error = e,
          content = tool.name .. " was cancelled: " .. tostring(e.message) }
      end
      local u = outcome_unknown(tool, call, "was cancelled while running", e)
      return done { is_error = true, cancelled = true, unknown = true, error = u }
    end
    if text then
      return done { content = M.bound(text, policy.max_result_bytes, #text + (dropped or 0)) }
    end
    local uncertain = err.kind == "tool_timeout" or err.died
    if not flagged and uncertain then
      local u = outcome_unknown(tool, call, err.kind == "tool_timeout" and ("timed out after " .. fmt(timeout) .. " s")
        or "died without a result", err)
      return done { is_error = true, unknown = true, error = u, content = err.message }
    end
    if not (flagged and transient(err)) or attempts >= max_attempts then
      return done { is_error = true, error = err }
    end
    local b = policy.backoff
    local delay = core.backoff_delay(b.strategy, attempts, b, opts.rng or math.random())
    emit { type = "tool_retry", call_id = call.id, name = tool.name, attempt = attempts,
           max_attempts = max_attempts, error = err, error_message = tostring(err), delay = delay,
           delay_ms = math.floor(delay * 1000 + 0.5) }
    local slept, serr = pcall(core.sleep, delay)
    if not slept then
      if not errors.is_cancel(serr) then error(serr, 0) end
      cancelled = true
      return done { is_error = true, cancelled = true, error = serr,
        content = tool.name .. " was cancelled before its retry" }
    end
  end
end

return M
