-- `luagent runs`: list, show, resolve and delete durable runs; list and
-- delete sessions (`runs threads`).
local core = require "luagent.core"
local json = require "luagent.base.json"

local M = {}

M.HELP = [[
usage: luagent runs [--journal FILE]
       luagent runs show [--journal FILE] RUN_ID
       luagent runs resolve [--journal FILE] RUN_ID CALL_ID (--result JSON | --not-done)
       luagent runs approve [--journal FILE] RUN_ID CALL_ID [--reason TEXT]
       luagent runs deny [--journal FILE] RUN_ID CALL_ID [--reason TEXT]
       luagent runs gc [--journal FILE] --older-than DAYS
       luagent runs threads [--journal FILE]
       luagent runs threads rm [--journal FILE] NAME

Durable runs, from the run journal (default $LUAGENT_HOME/runs.db, else
.luagent/runs.db in the current folder; --journal FILE picks another).

  runs           one line per run, oldest first: id, script, agents, status,
                 turns journaled, tokens in/out (failed attempts included),
                 cost when known, start time (UTC), last step written.
                 Status: running, done, failed (resumable), outcome_unknown
                 (resolve, then resume), waiting (a call waits for approval:
                 approve or deny it, then resume), diverged, aborted; interrupted is
                 a run marked running whose process is gone (killed, crashed)
  runs show      the run's timeline: each step with its time, position
                 (agent#n/prompt/turn/call), status and a summary
  runs resolve   settles a call whose outcome is unknown (it started and
                 never finished; its tool has neither read_only, idempotent
                 nor check). CALL_ID is the call id in the outcome_unknown
                 error, or the step's position. --result JSON: it happened,
                 and this is its result (a JSON string is given to the model
                 as its text, anything else as JSON); --not-done: it did not
                 happen, and the next resume runs it. Refused (exit 2,
                 naming it) while another process runs the run
  runs approve   a call that waits for approval (its tool's needs_approval)
                 may run: the next 'luagent resume RUN_ID' runs it (once; an
                 approval never re-runs a call whose outcome is unknown).
                 CALL_ID is the call id 'luagent runs show' prints, or the
                 step's position; --reason TEXT is kept with the decision
  runs deny      it may not: the next resume gives the model the call's
                 error result "denied: TEXT" (--reason TEXT; default "no
                 reason given") and goes on. Both refused (exit 2, naming
                 it) for a call that does not wait, or while another
                 process runs the run
  runs gc        deletes the runs last written more than DAYS ago (a number,
                 fractions allowed), but for a run a process is running
  runs threads   the sessions (agents made with session = NAME), last saved
                 first: name, turns saved, messages in its history, last
                 saved (UTC), model, and "compacted" when a context overflow
                 compacted its history
  runs threads rm
                 deletes the session NAME: the next agent on it starts a new
                 conversation (exit 2 when there is none)

Listing and showing only read the journal (they work on a full disk or a
read-only folder); no command creates one where there is none.

Exit codes: 0 done (also a listing with no journal yet); 1 the journal cannot
be read (a damaged file is reported and left as it is); 2 usage error,
unknown run, call or session, no journal file (show, resolve, approve, deny,
gc, threads rm), or a run another process is running (resolve, approve,
deny).
]]

-- Splits --journal out of args: opts, positional, or nil, message.
local function parse(args, flags)
  local opts, pos, i = {}, {}, 1
  while i <= #args do
    local a = args[i]
    local name, value = a:match("^%-%-([%w%-]+)=(.*)$")
    name = name or a:match("^%-%-([%w%-]+)$")
    if a == "-h" then name = "help" end
    if name then
      local takes = flags[name]
      if takes == nil then return nil, "unknown flag '" .. a .. "'" end
      if takes and value == nil then
        i = i + 1
        value = args[i]
        if value == nil then return nil, "flag '--" .. name .. "' needs a value" end
      elseif not takes and value ~= nil then
        return nil, "flag '--" .. name .. "' takes no value"
      end
      opts[name] = takes and value or true
    else
      pos[#pos + 1] = a
    end
    i = i + 1
  end
  return opts, pos
end

local function fmt_time(t)
  if not t then return "-" end
  return os.date("!%Y-%m-%d %H:%M:%S", math.floor(t))
end

-- What list and show print holds a run's answers, agent names and errors
-- (a model's, a script's text): escaped for the terminal, line by line
-- (host/termtext.c).
local terminal = { write = function(_, ...)
  io.stdout:write(core.terminal_text(table.concat({ ... }), true))
end }

local function shorten(s, n)
  s = tostring(s or ""):gsub("%s+", " ")
  if #s > n then s = s:sub(1, n - 3) .. "..." end
  return s
end

-- Whether the process that last ran the run is still there.
local function alive(pid)
  if not pid then return false end
  local f = io.open("/proc/" .. pid .. "/stat")
  if f then f:close() return true end
  return false
end

local function status_of(r)
  if r.status == "running" and not alive(r.pid) then return "interrupted" end
  return r.status
end

local function list(store, out)
  local runs, err = store:list()
  if not runs then return nil, err end
  if #runs == 0 then
    out:write("no runs in ", store.path, "\n")
    return 0
  end
  out:write(string.format("%-24s %-22s %-12s %-15s %5s %15s %8s %-19s %s\n", "RUN", "SCRIPT", "AGENTS", "STATUS",
    "TURNS", "TOKENS IN/OUT", "COST", "STARTED (UTC)", "LAST STEP"))
  for _, r in ipairs(runs) do
    out:write(string.format("%-24s %-22s %-12s %-15s %5d %15s %8s %-19s %s\n", r.id, shorten(r.script, 22),
      shorten(r.agents ~= "" and r.agents or "-", 12), status_of(r), r.turns or 0,
      string.format("%d/%d", r.input_tokens or 0, r.output_tokens or 0),
      r.cost and string.format("$%.4f", r.cost) or "-", fmt_time(r.started), r.last_step or "-"))
  end
  return 0
end

local function threads(store, out)
  local list_, err = store:threads()
  if not list_ then return nil, err end
  if #list_ == 0 then
    out:write("no sessions in ", store.path, "\n")
    return 0
  end
  out:write(string.format("%-24s %5s %8s %-19s %s\n", "NAME", "TURNS", "MESSAGES", "UPDATED (UTC)", "MODEL"))
  for _, t in ipairs(list_) do
    out:write(string.format("%-24s %5d %8d %-19s %s%s\n", t.name, t.turns or 0, t.messages or 0, fmt_time(t.updated),
      t.model or "-", t.compacted and "  compacted" or ""))
  end
  return 0
end

-- One line about a step.
local function describe(s)
  local d = s.data or {}
  if s.kind == "turn" then
    local m = d.message or {}
    local names = {}
    for _, c in ipairs(m.tool_calls or {}) do names[#names + 1] = c.name end
    local u = d.total_usage or {}
    local what = #names > 0 and ("calls " .. table.concat(names, ", ")) or ("answers: " .. shorten(m.content, 60))
    return string.format("model turn: %s (tokens %d/%d, %d attempt(s))", what, u.input_tokens or 0,
      u.output_tokens or 0, d.attempts or 1)
  elseif s.kind == "turn_failed" then
    return "model turn failed: " .. shorten(d.error, 90)
  end
  local text = s.name .. " " .. shorten(d.arguments, 50)
  if s.status == "finished" then
    local how = d.resolved and " (resolved by hand)" or d.checked and " (its check found it happened)" or ""
    if d.approval then how = how .. (d.approval.approved and " (approved)" or " (denied)") end
    return text .. (d.is_error and " failed: " or " -> ") .. shorten(d.content, 60) .. how
  elseif s.status == "unknown" then
    return text .. ": outcome unknown (call " .. tostring(s.call_id) .. ")"
  elseif s.status == "not_done" then
    return text .. ": resolved as not done; runs at the next resume"
  elseif s.status == "waiting" then
    return text .. ": waits for approval (call " .. tostring(s.call_id) .. ")"
  elseif s.status == "approved" then
    return text .. ": approved; runs at the next resume"
  elseif s.status == "denied" then
    return text .. ": denied: " .. shorten(d.approval and d.approval.reason or "no reason given", 60)
      .. "; the model is told at the next resume"
  end
  return text .. ": started, never finished (call " .. tostring(s.call_id) .. ")"
end

local function show(store, id, out)
  local run, err = store:read(id)
  if not run then return nil, err, "no run '" .. id .. "' in " .. store.path end
  out:write(string.format("run %s: %s %s\n", run.id, run.script or "?", table.concat(run.args or {}, " ")))
  out:write(string.format("status %s; agents %s; started %s UTC in %s\n", status_of(run),
    run.agents ~= "" and run.agents or "-", fmt_time(run.started), run.cwd or "?"))
  if run.error then out:write("error: ", run.error, "\n") end
  for _, s in ipairs(run.steps) do
    out:write(string.format("%8.3fs  %-22s %-9s %s\n", (s.at or run.started) - run.started, s.pos, s.status,
      describe(s)))
  end
  return 0
end

-- main(args, say, usage_error) -> exit code.
function M.main(args, say, usage_error)
  local sub = args[1]
  local rest = {}
  if sub == "show" or sub == "resolve" or sub == "approve" or sub == "deny" or sub == "gc" or sub == "list"
    or sub == "threads" then
    local from = 2
    if sub == "threads" and args[2] == "rm" then sub, from = "threads rm", 3 end
    for j = from, #args do rest[#rest + 1] = args[j] end
  else
    sub = "list"
    for j = 1, #args do rest[#rest + 1] = args[j] end
  end
  local opts, pos = parse(rest, { journal = true, help = false, result = true, ["not-done"] = false,
    ["older-than"] = true, reason = true })
  if not opts then return usage_error("runs: %s", pos) end
  if opts.help then
    io.write(M.HELP)
    return 0
  end
  local journal = require "luagent.agent.journal"
  -- where the default journal is: the home setting (LUAGENT_HOME), read as
  -- a runtime reads it (a bad LUAGENT_ variable is a usage error)
  local env = require("luagent.config").new()
  local read, why = pcall(env.read_env, env)
  if not read then return usage_error("%s", tostring(why)) end
  local home = env:get("home")
  -- listing and showing write nothing (a full disk, a read-only folder);
  -- no command creates a journal: the file must be there. nil and the exit
  -- code when it cannot be opened
  local function open()
    local store, err = journal.open(opts.journal, { readonly = sub == "list" or sub == "show" or sub == "threads",
      existing = true, home = home })
    if store then return store end
    if err.missing and (sub == "list" or sub == "threads") then
      io.write(sub == "list" and "no runs: " or "no sessions: ", err.message, "\n")
      return nil, 0
    end
    say("luagent: %s%s", err.missing and ("runs " .. sub .. ": ") or "", err.missing and err.message or tostring(err))
    return nil, err.missing and 2 or 1
  end
  local want = { list = 0, show = 1, resolve = 2, approve = 2, deny = 2, gc = 0, threads = 0, ["threads rm"] = 1 }
  if #pos ~= want[sub] then
    return usage_error("runs %s: expects %s", sub, sub == "threads rm" and "NAME" or want[sub] == 1 and "RUN_ID"
      or want[sub] == 2
      and "RUN_ID CALL_ID" or "no arguments")
  end
  for name, subs in pairs { result = "resolve", ["not-done"] = "resolve", reason = "approve deny",
    ["older-than"] = "gc" } do
    if opts[name] ~= nil and not (" " .. subs .. " "):find(" " .. sub .. " ", 1, true) then
      return usage_error("runs %s: --%s is for 'runs %s'", sub, name, subs:gsub(" ", "' and 'runs "))
    end
  end
  if sub == "approve" or sub == "deny" then
    local store, failed = open()
    if not store then return failed end
    local how = { approved = sub == "approve", reason = opts.reason }
    local step, err = journal.decide(store, pos[1], pos[2], how)
    store:close()
    if not step then
      if err and err.holder then
        say("luagent: runs %s: %s", sub, err.message)
        return 2
      end
      if err and err.kind == "usage" then
        return usage_error("runs %s: %s", sub, (err.message:gsub("^deciding [^:]*: ", "")))
      end
      say("luagent: %s", tostring(err))
      return 1
    end
    io.write(string.format("%s %s (%s, call %s) of run %s; 'luagent resume %s' continues it\n",
      sub == "approve" and "approved" or "denied", step.pos, step.name, tostring(step.call_id), pos[1], pos[1]))
    return 0
  end
  if sub == "threads" or sub == "threads rm" then
    local store, failed = open()
    if not store then return failed end
    local code, err
    if sub == "threads" then
      code, err = threads(store, terminal)
    else
      local found
      found, err = store:delete_thread(pos[1])
      if found then
        io.write("deleted session ", pos[1], "\n")
        code = 0
      elseif found == false then
        store:close()
        say("luagent: runs threads rm: no session '%s' in %s", pos[1], store.path)
        return 2
      end
    end
    store:close()
    if not code then say("luagent: %s", tostring(err)) return 1 end
    return code
  end
  if sub == "gc" then
    local days = tonumber(opts["older-than"])
    if not days or days < 0 then return usage_error("runs gc: --older-than wants a number of days >= 0") end
    local store, failed = open()
    if not store then return failed end
    local n, err = store:gc(days * 86400, journal.STALE_AFTER) -- a run being run now stays
    store:close()
    if not n then say("luagent: %s", tostring(err)) return 1 end
    io.write(string.format("deleted %d run(s) older than %g day(s)\n", n, days))
    return 0
  end
  local how
  if sub == "resolve" then
    if (opts.result ~= nil) == (opts["not-done"] ~= nil) then
      return usage_error("runs resolve: give exactly one of --result JSON and --not-done")
    end
    if opts.result then
      local v, jerr = json.decode(opts.result)
      if v == nil then return usage_error("runs resolve: --result is not JSON: %s", jerr) end
      how = { result = type(v) == "string" and v or opts.result }
    else
      how = { not_done = true }
    end
  end
  local store, failed = open()
  if not store then return failed end
  local code, err, missing
  if sub == "list" then
    code, err = list(store, terminal)
  elseif sub == "show" then
    code, err, missing = show(store, pos[1], terminal)
  else
    local step
    step, err = journal.resolve(store, pos[1], pos[2], how)
    if not step and err and err.holder then -- another process runs it now
      store:close()
      say("luagent: runs resolve: %s", err.message)
      return 2
    end
    if step then
      io.write(string.format("resolved %s (%s, call %s) of run %s as %s; 'luagent resume %s' continues it\n",
        step.pos, step.name, tostring(step.call_id), pos[1], how.not_done and "not done" or "done", pos[1]))
      code = 0
    elseif err and err.kind == "usage" then
      store:close()
      return usage_error("runs resolve: %s", err.message:gsub("^resolving [^:]*: ", ""))
    end
  end
  store:close()
  if missing then return usage_error("runs show: %s", missing) end
  if not code then
    say("luagent: %s", tostring(err))
    return 1
  end
  return code
end

return M
