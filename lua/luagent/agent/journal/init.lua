-- Durable runs: the run journal. Steps (model turns, tool calls) are
-- memoized by position: a durable agent writes each step as it completes,
-- and when its script runs again with the same run id (`luagent resume`),
-- every step already in the journal is answered from it instead of being
-- executed; the run goes live at the first step that is not there.
--
-- The journal is a consumer of the agent's events (events are the spine)
-- plus the few hooks the agent's replay (lua/luagent/agent/replay.lua)
-- needs:
--   binder:turn(...)  before a model call: the journaled turn, or nil (live)
--   binder:call(...)  before a tool call: the journaled outcome, or nil (run it)
--   binder:observe(ev) every event of the agent's stream, before the bus
--               and the caller see it, to write steps:
--     turn      when the turn's final message arrived (usage of every attempt;
--               the compacted history when a context overflow shortened it)
--     call      'started', committed BEFORE the tool runs (write-ahead), then
--               'finished' with its result, or 'unknown' (outcome_unknown)
--
-- Stores. A store is any table with these methods (journal/sqlite.lua is
-- the embedded one; a server-backed store, PostgreSQL for runs shared
-- between machines, implements the same):
--   open(path, [{readonly}]) -> store | nil, err   (module function; read-only:
--        writes nothing, the writing methods raise)
--   store:create(run) -> true | nil, err      run = {id, script, args, options, cwd, pid}
--   store:append(run_id, step) -> true | nil, err
--        step = {pos, kind = "turn"|"turn_failed"|"call", status, name,
--                call_id, input_tokens, output_tokens, cost, data}
--        one step, one transaction; a step at the same pos replaces it
--   store:update(run_id, {status, error, agents, pid}) -> true | nil, err
--   store:read(run_id) -> run{..., steps = {...}, by_pos = {[pos] = step}} | nil
--   store:list() -> runs (with turns, input_tokens, output_tokens, cost)
--   store:resolve(run_id, call_id_or_pos, {result = text} | {not_done = true})
--   store:decide(run_id, call_id_or_pos, {approved = bool, reason = text})
--        a call that waits for approval becomes approved or denied
--   store:gc(seconds, live) -> number of runs deleted (not one whose claim
--        had a heartbeat in the last `live` seconds)
--   store:claim(run_id, me, stale_after) -> claim | nil, err (err.holder)
--   store:heartbeat(run_id, me) -> true | nil, err (err.lost, err.holder)
--   store:release(run_id, me) -> true | nil, err
--   store:close()
-- `luagent runs resolve` settles a call through M.resolve, which holds
-- the run's claim while it does.
-- Claims: a run has one runner. `me` is a process ({pid, host, pid_start},
-- journal/owner.lua); claim takes the run in one transaction when it is
-- free, already me's, or its holder is gone (owner.gone), else refuses
-- naming the holder. While a store holds a run's claim, its append and
-- update of that run happen only if the claim is still its own.
-- Writing methods may suspend the calling task until the write is durable
-- (the SQLite store commits in a thread of its own); they never hold the loop.
local core = require "luagent.core"
local errors = require "luagent.base.errors"
local json = require "luagent.base.json"
local bus = require "luagent.base.bus"
local diagnostics = require "luagent.base.diagnostics"
local owner = require "luagent.agent.journal.owner"
local sqlite = require "luagent.agent.journal.sqlite"
local state = require "luagent.agent.journal.state"

local M = {}

-- The runner of a run refreshes its claim's heartbeat every HEARTBEAT
-- seconds (a timer on the loop's clock). A claim held on another host,
-- whose process cannot be looked at, is taken over once its heartbeat is
-- STALE_AFTER seconds old; on this host, once its process is gone.
-- (`luagent help resume` and README.md say these numbers.)
M.HEARTBEAT = 10
M.STALE_AFTER = 60

------------------------------------------------------------------------------
-- The journal of a runtime
------------------------------------------------------------------------------

-- A runtime's journal (rt.journal): lua/luagent/agent/journal/state.lua.
M.Journal = state.Journal
M.new = state.new -- new() -> the journal of a new runtime

-- use(rt, run [, {close_store = true}]): makes `run` the durable run of
-- runtime rt (`luagent resume` does; nil forgets it). The run it replaces
-- lets its claim go, or, when `run` continues the same run, hands it on.
-- close_store: the runtime closes the run's store when it closes (else
-- the store stays its opener's to close).
function M.use(rt, run, opts)
  local j = rt.journal
  local was = j.run
  if was and was ~= run then
    if run and run.id == was.id and run.store == was.store then was:hand_on() else was:release() end
  end
  j.run = run
  if run then run.diag = rt.diag end -- its notes go to rt's log
  if run and opts and opts.close_store then j:own(run.store) end
end

------------------------------------------------------------------------------
-- Where the journal is
------------------------------------------------------------------------------

-- path([flag [, home]]) -> the journal file: --journal FILE, else
-- HOME/runs.db (home: the runtime's home setting, LUAGENT_HOME), else
-- .luagent/runs.db in the current folder.
function M.path(flag, home)
  if flag and flag ~= "" then return flag end
  if home and home ~= "" then return (home:gsub("/+$", "")) .. "/runs.db" end
  return ".luagent/runs.db"
end

local function exists(path)
  local f = io.open(path, "r")
  if f then f:close() return true end
  return false
end

-- open([path], [opts]) -> store | nil, err: the SQLite store at path
-- (M.path(nil, opts.home) when nil: opts.home is the home setting). Where
-- runs start, the default folder (.luagent, HOME) is created; the folder of an explicit --journal FILE must
-- exist. opts.existing: the file must be there already (resume, resolve,
-- gc: nothing is created); opts.readonly: the same, and nothing is written
-- (`luagent runs`, `runs show`). A missing file is err.missing = true.
function M.open(path, opts)
  opts = opts or {}
  local explicit = path ~= nil
  path = M.path(path, opts.home)
  if opts.existing or opts.readonly then
    if not exists(path) then
      return nil, errors.new("usage", string.format("no journal at '%s': no durable run was started with it "
        .. "(--journal FILE or LUAGENT_HOME names another)", path), { file = path, missing = true })
    end
    return sqlite.open(path, { readonly = opts.readonly })
  end
  local dir = path:match("^(.*)/[^/]*$")
  if dir and dir ~= "" and not exists(dir) then
    if explicit and not opts.mkdir then
      return nil, errors.new("journal", "cannot open journal '" .. path .. "': folder '" .. dir .. "' does not exist",
        { file = path })
    end
    os.execute("mkdir -p '" .. dir:gsub("'", "'\\''") .. "'")
  end
  return sqlite.open(path)
end

------------------------------------------------------------------------------
-- Runs
------------------------------------------------------------------------------

-- new_id() -> a run id that sorts by its start time:
-- "YYYYMMDD-HHMMSS-mmm-xxxx" (UTC; milliseconds; 16 random bits).
function M.new_id(now)
  now = now or os.time()
  local s = math.floor(now)
  return string.format("%s-%03d-%04x", os.date("!%Y%m%d-%H%M%S", s), math.floor((now - s) * 1000),
    math.random(0, 0xffff))
end

-- This process's id (Linux: /proc/self/stat).
local function pid()
  local f = io.open("/proc/self/stat")
  if not f then return nil end
  local n = f:read("n")
  f:close()
  return math.tointeger(n)
end
M.pid = pid

local Run = {}
Run.__index = Run

-- Where a run's notes go (run.diag) before a runtime has it (`luagent
-- resume` claims the run before it makes its runtime): stderr, as is.
-- current() and use() give the run its runtime's diagnostics (rt.diag),
-- whose log decides where they go (its log_sink; stderr by default).
local STDERR = diagnostics.new(function(_, msg) io.stderr:write(msg, "\n") end)

-- A line of the run's: at warn (a claim lost, a step not written), or a
-- note (what the run is called, who had it before).
local function warn(run, msg) (run.diag or STDERR):write("warn", msg) end
local function note(run, msg) (run.diag or STDERR):write("note", msg) end

-- Refreshes the run's claim every M.HEARTBEAT seconds, until it is let go
-- (the task is cancelled) or lost (another process took it over).
local function heartbeat(run)
  while true do
    -- in the background: a deadlocked script is still reported as one
    core.sleep(M.HEARTBEAT, "background")
    local ok, err = run.store:heartbeat(run.id, run.owner)
    if not ok and err and err.lost then
      run.lost = err
      warn(run, "luagent: " .. tostring(err) .. "; this process writes no more of it")
      return
    end
    -- another failure (a full disk): the next beat tries again
  end
end

-- Claims `run` for this process and starts its heartbeat: run | nil, err
-- (err.holder: the process that runs it).
local function claim(run, quiet)
  local me = owner.this()
  local c, err = run.store:claim(run.id, me, M.STALE_AFTER)
  if not c then return nil, err end
  run.owner = me
  if c.taken_from and not quiet then
    note(run, string.format("luagent: run %s was claimed by %s: %s; this process takes it over", run.id,
      owner.describe(c.taken_from), c.why))
  end
  run.beat = core.spawn(heartbeat, run)
  run.beat:set_daemon(true)
  return run
end

-- start(store, {script=, args=, options=, cwd=} [, diag]) -> run | nil, err:
-- a new run in the store, claimed by this process, said (to diag, else
-- stderr) unless quiet.
function M.start(store, info, diag)
  local run = setmetatable({ store = store, id = M.new_id(store:now()), resumed = false,
    by_pos = {}, agent_count = {}, agents = {}, diag = diag }, Run)
  local ok, err = store:create { id = run.id, script = info.script, args = info.args, options = info.options,
    cwd = info.cwd, pid = pid() }
  if not ok then return nil, err end
  ok, err = claim(run, true)
  if not ok then return nil, err end
  if not info.quiet then
    note(run, string.format("luagent: durable run %s (journal %s; 'luagent resume %s' continues it)",
      run.id, store.path or "?", run.id))
  end
  return run
end

-- resume(store, id) -> run | nil, err: the run as journaled, to continue,
-- claimed by this process. Refused (err.holder) while another process runs
-- it; the claim of a process that is gone is taken over (said on stderr).
function M.resume(store, id)
  local run = setmetatable({ store = store, id = id, resumed = true, agent_count = {}, agents = {} }, Run)
  -- claimed first, then read: the runner it is claimed from may write more,
  -- or finish it, until the claim is ours
  local ok, err = claim(run)
  if not ok then return nil, err end
  local rec
  rec, err = store:read(id)
  if not rec then
    run:release() -- (a claim of a run that is not there goes with it)
    return nil, err or errors.new("usage", "no run '" .. id .. "' in journal " .. tostring(store.path))
  end
  run.record, run.by_pos = rec, rec.by_pos
  store:update(id, { status = "running", pid = pid() })
  return run
end

-- resolve(store, run_id, call_id, how) -> step | nil, err: settles a call
-- whose outcome is unknown (`luagent runs resolve`) while holding the
-- run's claim, so a run another process is running is refused (err.holder)
-- instead of changed under it; the claim is let go after.
function M.resolve(store, run_id, call_id, how)
  local me = owner.this()
  local c, err = store:claim(run_id, me, M.STALE_AFTER)
  if not c then return nil, err end
  local step, rerr = store:resolve(run_id, call_id, how)
  store:release(run_id, me)
  return step, rerr
end

-- decide(store, run_id, call_id, {approved =, reason =}) -> step | nil,
-- err: approves or denies a call that waits for approval (`luagent runs
-- approve`/`deny`), holding the run's claim as resolve does; the next
-- resume runs it (approved) or gives the model `denied: <reason>`.
function M.decide(store, run_id, call_id, how)
  local me = owner.this()
  local c, err = store:claim(run_id, me, M.STALE_AFTER)
  if not c then return nil, err end
  local step, derr = store:decide(run_id, call_id, how)
  store:release(run_id, me)
  return step, derr
end

-- run:hand_on(): stops this run's heartbeat, keeping its claim (another
-- run object of this process continues the same run).
function Run:hand_on()
  if self.beat then self.beat:cancel("handed on") end
  self.beat, self.owner = nil, nil
end

-- run:release() -> true | nil, err: the run ends in this process: its
-- heartbeat stops and its claim is let go. Idempotent.
function Run:release()
  local me = self.owner
  self:hand_on()
  if not me or self.lost then return true end
  return self.store:release(self.id, me)
end

-- current(rt) -> run | nil, err: the durable run of runtime rt; the
-- first time (a durable agent in a script started without --durable, or
-- `luagent run --durable`), a new one in the journal its settings name,
-- for the script and its arguments. The store it opens is the runtime's.
function M.current(rt)
  local j = rt.journal
  if j.run then return j.run end
  if j.open_error then return nil, j.open_error end
  local settings = rt.settings
  local store, err = M.open(settings:get("journal_file"), { home = settings:get("home") })
  local run
  if store then
    local info = settings:get("run_info")
    if not info then
      local args = {}
      for i, a in ipairs(_G.arg or {}) do args[i] = a end
      info = { script = _G.arg and _G.arg[0], args = args, options = {}, cwd = os.getenv("PWD") }
    end
    run, err = M.start(store, info, rt.diag)
    if run then j:own(store) else store:close() end
  end
  j.run, j.open_error = run, err
  return run, err
end

-- run:status(status, err): the run's status at the end of an agent's run.
function Run:status(status, err)
  self.last_status = status
  -- kept for the exit code: the run cannot go on until the call is settled
  if status == "outcome_unknown" then self.stopped_unknown = err or true end
  self.store:update(self.id, { status = status, error = err and tostring(err) or nil,
    agents = table.concat(self.agents, ",") })
end

------------------------------------------------------------------------------
-- An agent's binding to the run
------------------------------------------------------------------------------

local Binder = {}
Binder.__index = Binder
M.Binder = Binder

-- A call's step while it waits for a decision or has one, before it starts.
local APPROVAL = { waiting = true, approved = true, denied = true }

-- bind(agent) -> binder | nil, err: the agent's place in the durable run
-- of its runtime (agent.rt). Agents of one name are numbered in the order
-- they first run (name#1, name#2, ...), so positions are stable when the
-- script is.
function M.bind(agent)
  local run, err = M.current(agent.rt)
  if not run then return nil, err end
  local n = (run.agent_count[agent.name] or 0) + 1
  run.agent_count[agent.name] = n
  if n == 1 then
    run.agents[#run.agents + 1] = agent.name
    run.store:update(run.id, { agents = table.concat(run.agents, ",") })
  end
  return setmetatable({ run = run, key = agent.name .. "#" .. n, prompts = 0, agent = agent.name }, Binder)
end

-- bind_under(parent, pos, name) -> the binding of a sub-agent's run
-- (luagent.tools.agent) under its parent's call at `pos`: its steps are
-- `pos/name/1/t1`, `pos/name/1/t1/c1`, ...; its end does not set the
-- run's status (its parent's does).
function M.bind_under(parent, pos, name)
  return setmetatable({ run = parent.run, key = pos .. "/" .. name, prompts = 0, agent = name, nested = true },
    Binder)
end

-- binder:begin([same]): a new prompt (agent:prompt or :continue) of the
-- agent; same: a continue that finishes the turn the last one stopped in
-- for approvals (its positions stay).
function Binder:begin(same)
  if same and self.prefix then
    self.failed = nil
    return
  end
  self.prompts = self.prompts + 1
  self.prefix = self.key .. "/" .. self.prompts
  self.cur_turn, self.covered, self.failed = 0, 0, nil
end

function Binder:turn_pos(turn) return self.prefix .. "/t" .. turn end
function Binder:call_pos(turn, i) return self.prefix .. "/t" .. turn .. "/c" .. i end

-- The idempotency key of call i of a turn: stable across resumes.
function Binder:idempotency_key(turn, i)
  return self.run.id .. ":" .. self:call_pos(turn, i)
end

-- The failure that stops the agent's run: a write that failed, or the
-- run's claim lost to another process.
function Binder:broken()
  if not self.failed and self.run.lost then self.failed = self.run.lost end
  return self.failed
end

-- Writes a step; a failure is kept (binder.failed) and stops the run.
function Binder:write(step)
  if self:broken() then return false end
  local ok, err = self.run.store:append(self.run.id, step)
  if not ok then
    self.failed = err
    warn(self.run, "luagent: " .. tostring(err))
    return false
  end
  self.run.by_pos[step.pos] = step
  return true
end

-- Plain data of a value for the journal (records become their fields).
local plain = bus.plain

local function shorten(s, n)
  s = tostring(s)
  if #s > n then s = s:sub(1, n - 3) .. "..." end
  return s
end

-- A divergence record naming the step.
local function diverged(pos, what)
  return errors.new("divergence", "the script no longer matches journal step " .. pos .. ": " .. what
    .. " (resume the script that made the run, or start a new run)", { step = pos })
end

-- The messages sent since the last turn, as canonical JSON texts.
local function delta(messages, from)
  local out = {}
  for i = from + 1, #messages do out[#out + 1] = json.encode(plain(messages[i])) end
  return out
end


-- Rebuilds a journaled message: tool calls get their arguments from the
-- raw text the model sent (JSON loses empty arrays), decoded by the rule
-- the adapters decode them by (json.decode_strict): text they refused
-- stays refused, with the same message.
local function restore_message(m)
  for _, c in ipairs(m.tool_calls or {}) do
    if type(c.raw_arguments) == "string" and c.raw_arguments ~= "" then
      local args, err = json.decode_strict(c.raw_arguments, "arguments")
      if args == nil then c.arguments, c.error = nil, c.error or err
      elseif type(args) == "table" then c.arguments = json.integerize(args) end
    end
  end
  return m
end
M.restore_message = restore_message -- (sessions rebuild their saved messages by it)

-- binder:turn(turn, messages, system) -> nil (go live) | record | nil, err.
-- A journaled turn is checked against what the script sends now (the
-- messages added since the last turn, the system prompt): a difference is
-- a divergence naming the step.
function Binder:turn(turn, messages, system)
  if self:broken() then return nil, self.failed end
  self.cur_turn = turn
  local pos = self:turn_pos(turn)
  local sent = delta(messages, self.covered)
  self.request = { system = system, messages = sent, from = self.covered }
  self.compacted = nil
  self.covered = #messages + 1 -- the assistant message comes next
  local step = self.run.resumed and self.run.by_pos[pos]
  if not step or step.status ~= "finished" then return nil end
  local d = step.data or {}
  local req = d.request or {}
  if json.encode(req.system or json.null) ~= json.encode(system or json.null) then
    return nil, diverged(pos, "the system prompt differs")
  end
  local was = req.messages or {}
  for i = 1, math.max(#was, #sent) do
    if was[i] ~= sent[i] then
      return nil, diverged(pos, string.format("message %d sent to the model differs: journal %s, script %s",
        (req.from or 0) + i, shorten(was[i] or "nothing", 100), shorten(sent[i] or "nothing", 100)))
    end
  end
  local msg = restore_message(d.message)
  local compacted = d.compacted
  if type(compacted) == "table" and type(compacted.messages) == "table" then
    for _, m in ipairs(compacted.messages) do restore_message(m) end
    self.covered = #compacted.messages + 1
  else
    compacted = nil
  end
  return { message = msg, usage = d.usage, total_usage = d.total_usage, attempts = d.attempts,
           stop_reason = d.stop_reason, compacted = compacted }
end

-- The divergence of a journaled call step from the call the script makes
-- now (another tool, other arguments), or nil.
local function call_diverged(pos, step, call)
  local d = step.data or {}
  local args_now = call.raw_arguments or json.encode(call.arguments or {})
  if step.name ~= call.name or (d.arguments ~= nil and d.arguments ~= args_now) then
    return diverged(pos, string.format("the journal has %s %s, the script calls %s %s", tostring(step.name),
      shorten(d.arguments or "", 80), tostring(call.name), shorten(args_now, 80)))
  end
end

-- binder:approval(turn, i, call) -> nil | {waiting} | {decision} |
-- {settled} | nil, err: what the journal says of call i's approval
-- (agent/replay.lua, replay:approval).
function Binder:approval(turn, i, call)
  if self:broken() then return nil, self.failed end
  local pos = self:call_pos(turn, i)
  local step = self.run.resumed and self.run.by_pos[pos]
  if not step then return nil end
  local derr = call_diverged(pos, step, call)
  if derr then return nil, derr end
  if step.status == "waiting" then return { waiting = true } end
  local a = step.data and step.data.approval
  if step.status == "approved" or step.status == "denied" then
    return { decision = { approved = step.status == "approved", reason = a and a.reason, replayed = true } }
  end
  if step.status == "not_done" then return nil end
  return { settled = true }
end

-- binder:call(turn, i, call, tool, check) -> nil (run it) |
-- {outcome=} (answered: journal, resolution or check) |
-- {unknown=<outcome_unknown record>} | nil, err (divergence, journal).
-- `check(tool, call, ctx)` runs the tool's check function.
function Binder:call(turn, i, call, tool, check)
  if self:broken() then return nil, self.failed end
  local pos = self:call_pos(turn, i)
  local step = self.run.resumed and self.run.by_pos[pos]
  if not step or step.status == "not_done" or APPROVAL[step.status] then return nil end
  local d = step.data or {}
  local args_now = call.raw_arguments or json.encode(call.arguments or {})
  if step.name ~= call.name or (d.arguments ~= nil and d.arguments ~= args_now) then
    return nil, diverged(pos, string.format("the journal has %s %s, the script calls %s %s", tostring(step.name),
      shorten(d.arguments or "", 80), tostring(call.name), shorten(args_now, 80)))
  end
  if step.status == "finished" then
    local e = d.error and errors.new(d.error.kind or "tool_error", d.error.message or d.content or "")
    return { outcome = { content = d.content or "", is_error = d.is_error or false, error = e,
      attempts = d.attempts or 0, duration = 0 }, resolved = d.resolved }
  end
  -- started, never finished: it may have run. A sub-agent runs again: its
  -- own steps, journaled under this call's position, are answered from
  -- the journal (its turns are not sent again), the rest goes live
  if tool and (tool.read_only or tool.idempotent or tool.subagent) then return nil end
  if tool and tool.check then
    local text, err = check(tool, call)
    if err then
      return { unknown = errors.new("outcome_unknown", string.format("%s (call %s, step %s) started before the "
        .. "run stopped and its check failed: %s", call.name, tostring(call.id), pos, tostring(err)),
        { tool = call.name, call_id = call.id, arguments = call.arguments, step = pos, cause = err }) }
    end
    if text ~= nil then return { outcome = { content = text, is_error = false, attempts = 0, duration = 0 },
      checked = true } end
    return nil -- check says it did not happen: run it
  end
  return { unknown = errors.new("outcome_unknown", string.format("%s (call %s, step %s, arguments %s) started "
    .. "before the run stopped and may have done its work; it has neither read_only, idempotent nor check: "
    .. "settle it with 'luagent runs resolve %s %s --result JSON' or '--not-done', then resume",
    call.name, tostring(call.id), pos, shorten(args_now, 80), self.run.id, tostring(call.id)),
    { tool = call.name, call_id = call.id, arguments = call.arguments, step = pos }) }
end

-- Token counts of a usage table.
local function tokens(u)
  if type(u) ~= "table" then return nil, nil end
  return tonumber(u.input_tokens), tonumber(u.output_tokens)
end

-- The run's status for an agent_end.
local function end_status(ev)
  if ev.stop_reason == "aborted" then return "aborted" end
  if ev.stop_reason == "approval_required" then return "waiting" end
  if ev.stop_reason ~= "error" then return "done" end
  local kind = ev.error and ev.error.kind
  if kind == "outcome_unknown" then return "outcome_unknown" end
  if kind == "divergence" then return "diverged" end
  return "failed"
end

-- binder:observe(ev): the journal as a consumer of the agent's events.
-- Replayed events are not written again.
function Binder:observe(ev)
  if ev.replayed then return end
  local t = ev.type
  if t == "context_compacted" then
    -- the agent's history is this list from now on: the turn keeps it (a
    -- resume rebuilds it) and the next turn's messages are counted from it
    self.compacted = { attempt = ev.attempt, messages = plain(ev.messages) }
    self.covered = #ev.messages + 1
  elseif (t == "message_end" and ev.final) or t == "call_aborted" then
    local pos = self:turn_pos(self.cur_turn)
    local inp, out = tokens(ev.total_usage)
    -- OpenRouter's generation ids, every attempt's: `luagent cost settle`
    -- looks their cost up later (a cut stream reported no usage)
    local gen = ev.provider_kind == "openrouter" and ev.response_ids and plain(ev.response_ids) or nil
    local endpoint = gen and ev.endpoint or nil
    if t == "message_end" and ev.stop_reason ~= "error" and ev.stop_reason ~= "aborted" and ev.message then
      self:write { pos = pos, kind = "turn", status = "finished", input_tokens = inp, output_tokens = out,
        cost = ev.total_usage and tonumber(ev.total_usage.cost),
        data = { message = plain(ev.message), usage = plain(ev.usage), total_usage = plain(ev.total_usage),
                 attempts = ev.attempts, stop_reason = ev.stop_reason, request = self.request,
                 compacted = self.compacted, generation_ids = gen, endpoint = endpoint } }
    elseif ev.total_usage or gen then
      -- a failed turn still cost its attempts' tokens
      self:write { pos = string.format("%s/failed-%08x", pos, math.random(0, 0x7fffffff)), kind = "turn_failed",
        status = "failed", input_tokens = inp, output_tokens = out,
        data = { error = ev.error and tostring(ev.error), attempts = ev.attempts, generation_ids = gen,
                 endpoint = endpoint } }
    end
  elseif t == "approval_requested" or t == "approval_decided" then
    -- the request, then the decision: both before the tool starts
    local i = ev.index
    if not i then return end
    local pos = self:call_pos(self.cur_turn, i)
    local was = self.run.by_pos[pos]
    local data = { arguments = ev.raw_arguments or (was and was.data and was.data.arguments)
      or json.encode(ev.arguments or {}), needs_approval = true, approval_id = ev.approval_id }
    local status = "waiting"
    if t == "approval_decided" then
      status = ev.approved and "approved" or "denied"
      data.approval = { approved = ev.approved, reason = ev.reason }
    end
    self:write { pos = pos, kind = "call", status = status, name = ev.name, call_id = ev.call_id, data = data }
  elseif t == "tool_execution_start" then
    local i = ev.index
    if not i or ev.denied then return end -- a denied call does not run: its step stays denied until its end
    local pos = self:call_pos(self.cur_turn, i)
    local was = self.run.by_pos[pos]
    self:write { pos = pos, kind = "call", status = "started", name = ev.name,
      call_id = ev.call_id, data = { arguments = ev.raw_arguments or json.encode(ev.arguments or {}),
        approval = was and was.data and was.data.approval } }
  elseif t == "tool_execution_end" then
    local pos = ev.index and self:call_pos(self.cur_turn, ev.index)
    local step = pos and self.run.by_pos[pos]
    if not step then return end
    local e = ev.error
    local data = { arguments = step.data and step.data.arguments, approval = step.data and step.data.approval }
    local status
    if e and e.kind == "cancelled" then
      return -- the agent was aborted while it ran: it stays started
    elseif e and e.kind == "outcome_unknown" then
      status, data.error = "unknown", tostring(e)
    else
      status = "finished"
      data.content = ev.result or (e and e.message) or ""
      data.is_error = e ~= nil
      data.error = e and { kind = e.kind, message = e.message } or nil
      data.attempts = ev.attempts
      data.checked = ev.checked
    end
    self:write { pos = pos, kind = "call", status = status, name = ev.name, call_id = ev.call_id, data = data }
  elseif t == "agent_end" then
    if self.nested then return end -- a sub-agent's: its parent's end tells the run's status
    self.run.waiting = ev.stop_reason == "approval_required" and ev.approvals or nil
    self.run:status(end_status(ev), ev.error or self.failed)
  end
end

return M
