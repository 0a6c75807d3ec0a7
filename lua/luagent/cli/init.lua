-- The command line: `luagent run`, `luagent help`, ... Exit codes: 0 success,
-- 1 the script failed, 2 usage error (unknown command or flag, missing file;
-- a run another process runs), 3 a durable run stopped on outcome_unknown,
-- 74 an output file could not be written (--events, --otlp FILE), 130
-- interrupted (SIGINT), 143 terminated (SIGTERM).
local core = require "luagent.core"
local luagent = require "luagent"
local config = require "luagent.config"
local secrets = require "luagent.base.secrets"
local outfile = require "luagent.base.outfile"
local flags = require "luagent.cli.flags"
local provider = require "luagent.model.provider"
local policy = require "luagent.model.policy"

local M = {}

local USAGE = [[
usage: luagent <command> [options] [args...]

luagent runs LLM agents written in Lua on one event loop, with retries,
backoff and a shared circuit breaker in a small C core.

commands:
  run FILE.lua [args...]   run a Lua script as the main task
  chat [options]           chat with a model in the terminal: streaming, tools,
                           /save, /cost (luagent chat --help)
  mock [options]           serve the mock provider (luagent mock --help)
  sim [options]            the contention simulation (luagent help sim)
  resume RUN_ID            continue a durable run where it stopped
  runs [SUBCOMMAND]        list, inspect, settle, approve and delete durable
                           runs; sessions (luagent runs --help)
  cost settle RUN_ID       look up what each OpenRouter generation of a run
                           cost, failed attempts included (luagent help cost)
  mcp list -- CMD [ARGS]   an MCP server's tools and their flags (luagent mcp --help)
  help [TOPIC]             show help: run, resume, runs, cost, faults, sim;
                           the guide's pages: start (getting started),
                           agent, tools, events, policy, config, durable,
                           mcp, chat, observability

options:
  -h, --help               show this help
  -V, --version            show the version

exit codes: 0 done; 1 the script failed; 2 usage error, missing file, or a
durable run another process is running; 3 a durable run stopped on
outcome_unknown (settle it with 'luagent runs resolve', then resume); 74
an output file (--events, --otlp FILE) could not be written; 130
interrupted (Ctrl-C); 143 terminated (SIGTERM).

Run 'luagent help run' for the options of a command.
]]

local HELP = {}

HELP.run = [[
usage: luagent run [options] FILE.lua [args...]

Runs FILE.lua as the main task on the event loop, with `arg` set as `lua`
does (arg[0] = FILE.lua, arg[1..] = args), and waits for every task it
spawned (daemon tasks excepted).

The embedded default: when no provider key is set (OPENAI_API_KEY,
ANTHROPIC_API_KEY, OPENROUTER_API_KEY) and there is a cassette (--cassette,
or FILE.cassette.jsonl beside the script), or when --mock, --faults or
--cassette is given, luagent starts its mock provider on loopback in this process, points
every provider at it, and says so on stderr. Traffic still goes through
libcurl and real sockets. Without a key, the mock or a cassette, a model
with no base URL (the model's base_url, or its kind's *_BASE_URL) stops
the script before any request, naming the variable to set (exit 2).

options:
]] .. config.flag_lines() .. [[
  -h, --help          show this help

environment (each variable gives the runtime setting named first; a flag
wins over its variable; README.md lists every setting):
]] .. config.env_lines() .. [[

Exit codes: 0 done; 1 the script raised an error (printed as
"luagent: FILE:LINE: message" with a traceback); 2 usage error or missing
file, or a usage error the script raised (a model without a key, a policy
name found nowhere); 3 the script's durable run stopped on outcome_unknown (a tool with no
safety flag may have done its work: 'luagent runs resolve', then 'luagent
resume'), whether or not the script raised it (unless it ends with os.exit;
a run that is not durable leaves its exit code to its script); 130
interrupted (the first Ctrl-C cancels the main task and lets it clean up,
even while its Lua is busy; a second exits at once); 143 the same for
SIGTERM (a graceful stop: the call in flight ends with an aborted event and
is still recorded); 74 the script went well but an output file (--events,
--otlp FILE) could not be written (a full disk: said once on stderr, naming
the file, through the log, so not with --log off; the run went on without
it).
]]

HELP.resume = [[
usage: luagent resume [options] RUN_ID

Continues a durable run (luagent run --durable, or agents made with
durable = true) where it stopped: runs the run's script again, in the
folder it started in, with its arguments and the options it was run with
(--policy, --cassette, --mock, --seed, --fast, --tools, --retry-safe;
options given here win; --faults, --events, --record and --log are this
invocation's own). Steps memoized by position:

  - finished model turns and tool calls are answered from the journal: no
    request, no tool run; their events carry replayed = true;
  - a tool call that started and never finished runs again if the tool is
    read_only or idempotent; else the tool's check(args, ctx) decides (a
    result: it happened; nil: it runs); else the run stops again with
    outcome_unknown until 'luagent runs resolve' settles it;
  - a tool call that waits for approval (its tool's needs_approval) runs
    once 'luagent runs approve' approved it; denied ('luagent runs deny'),
    the model gets its error result "denied: REASON"; undecided, the run
    stops again with approval_required (status waiting);
  - a script that no longer matches its journal (other messages, another
    tool or other arguments at the same position) stops with a divergence
    error naming the step.

A run has one runner at a time: the process that runs it (luagent run, or
resume) holds its claim in the journal, refreshes it every 10 s and lets
it go when the run ends. A resume of a run another process holds is
refused, naming it (pid@host, since when); the claim of a process that is
gone (on this host: its pid no longer runs; on another: no heartbeat for
60 s) is taken over.

options: those of 'luagent run' (see 'luagent help run'), and
  --journal FILE      the run journal (default $LUAGENT_HOME/runs.db, else
                      .luagent/runs.db here; it must exist: resume creates
                      none)

Exit codes as for run (3: the run stopped on outcome_unknown again); 2 also
when the run is not in the journal, there is no journal file, or another
process is running the run.
]]

-- `luagent runs` keeps its help with its code, loaded when asked for
setmetatable(HELP, { __index = function(_, topic)
  if topic == "runs" then return require("luagent.cli.runs").HELP end
  if topic == "cost" then return require("luagent.cli.cost").HELP end
end })

-- Every line luagent prints on stderr (errors, the script's own top-level
-- error with its traceback, which may carry a tool's, a model's or a
-- server's text) is scrubbed of keys and escaped for the terminal.
local function say(fmt, ...)
  io.stderr:write(core.terminal_text(secrets.text(string.format(fmt, ...)), true), "\n")
end

-- The exit status of a run that went well but could not write all its
-- outputs (--events, --otlp FILE: a full disk): sysexits.h's EX_IOERR.
local EXIT_OUTPUT = 74

local function usage_error(fmt, ...)
  say("luagent: " .. fmt, ...)
  say("Run 'luagent --help' for usage.")
  return 2
end

-- Formats a failed task's error: "message" plus its traceback.
local function describe_error(err)
  if type(err) == "table" then
    local text = tostring(err)
    if err.traceback then text = text .. "\n" .. err.traceback end
    return text
  end
  return tostring(err)
end

-- Options of `luagent run`: name -> true when it takes a value. Every
-- flag is listed, with its setting, in lua/luagent/config.lua.
local RUN_FLAGS = config.run_flags()

-- Parses run's options; returns opts (flag -> its text; a run-only flag's
-- value parsed: --events jsonl:FILE -> FILE), index of FILE, the runtime
-- settings the flags give; or nil, message.
local function parse_run_args(args)
  local opts, i = flags.parse(args, RUN_FLAGS, "run")
  if not opts or opts.help then return opts, i end
  local settings, run = config.from_flags(opts, "run")
  if not settings then return nil, run end
  for flag, value in pairs(run) do opts[flag] = value end
  return opts, i, settings
end

-- Sets up logs, traces and cost (the runtime's observers) as the options
-- ask; returns their cleanup, or nil and an exit code after reporting the
-- problem. The cleanup writes what the run prints at its end and answers
-- whether the files went well: the tracer stops (its exports flushed, the
-- --trace tree to stderr), then the --cost table; true, or nil and the
-- message of an output file that could not be written. Stopping the log
-- and the meter is rt:close()'s.
local function observe(rt, opts, usage_error)
  -- a bad --prices file is found before anything starts or opens a file
  local prices
  if opts.prices then
    local err
    prices, err = require("luagent.observe.cost").read_prices(opts.prices)
    if not prices then return nil, usage_error("run: --prices: %s", err) end
  end
  -- --otlp FILE and a collector (--otlp URL, else the otlp_endpoint
  -- setting: the OTEL_ variables) may go together
  local file = opts.otlp and not opts.otlp:match("^https?://") and opts.otlp or nil
  local url = not file and opts.otlp or rt.settings:get("otlp_endpoint")
  -- spans are built when asked for, or when log lines at info carry their
  -- ids; the tracer (and the meter) are made only then (start-up time)
  local tracer
  if opts.trace or file or url or rt.log:enabled("info") then
    -- the queue's bound, a post's spans and its time bound are the
    -- runtime's settings (otlp_max_queue, otlp_batch, otlp_timeout), which
    -- the tracer reads
    local err
    tracer, err = rt:trace { tree = opts.trace, file = file, url = url }
    if not tracer then return nil, usage_error("run: --otlp: %s", err) end
  end
  -- the meter annotates first (its bus subscription says so), so agent_end
  -- carries its cost when the tracer makes the span of it
  local meter
  if opts.cost or prices or opts["max-cost"] then
    meter = rt:meter("cost")
    if prices then assert(meter:set_prices(prices, opts.prices)) end
  end
  rt.settings:set { max_cost = opts["max-cost"] and tonumber(opts["max-cost"]) or false }
  -- `--log off` asked for silence: no consumer at all
  if opts.log ~= "off" then rt.log:start() end
  return function()
    local ok, err = true, nil
    if tracer then ok, err = tracer:stop(opts.trace and io.stderr or nil) end
    if meter and opts.cost then io.stderr:write(table.concat(meter:report(), "\n"), "\n") end
    return ok, err
  end
end

-- Whether a key variable of any registered provider kind is set.
local function any_key()
  for _, name in ipairs(provider.key_variables()) do
    local v = os.getenv(name)
    if v and v ~= "" then return true end
  end
  return false
end

-- Sets up what the options ask for before the script runs: the embedded
-- mock, recording, event output, the default policy. Returns a cleanup
-- function (it answers true, or nil and a message when an output file,
-- --events or --otlp, could not be written: reported once when it
-- happened), or nil and an exit code after reporting the problem.
local function prepare(rt, opts, file)
  local jsonl = require "luagent.observe.jsonl"
  local retry_safe = require "luagent.observe.retry_safe"
  local seed = rt.settings:get("seed")
  local log = rt.log
  -- with a log level asked for (--log, LUAGENT_LOG), luagent's own notes are log lines too
  local explicit_log = rt.settings:source("log_level") ~= "default"
  local function note(fmt, ...)
    if explicit_log then log:write("info", (string.format(fmt, ...):gsub("^luagent: ", ""))) else say(fmt, ...) end
  end
  local options = rt.settings:get("options") -- --tools adds its set below
  local cleanups = {}
  local failure -- the first output file that could not be written
  local function output(ok, err)
    if not ok then failure = failure or err end
  end
  local events_out -- --events jsonl:FILE, opened before anything starts
  if opts.events == "-" then
    events_out = outfile.wrap(io.stdout, "stdout")
  elseif opts.events then
    local err
    events_out, err = outfile.open(opts.events)
    if not events_out then
      return nil, usage_error("run: --events: cannot open '%s': %s", opts.events, (err:gsub("^[^:]*: ", "")))
    end
  end
  if events_out then cleanups[#cleanups + 1] = function() output(events_out:close()) end end
  if opts.policy then
    -- a name (`patient`) is looked up as a script's policy = "patient" is
    -- (here, then the bundled ones); a file is a file
    local path = policy.find(opts.policy, rt.policies:search_path())
    if not path then
      return nil, usage_error("run: --policy: %s", policy.unknown_name(opts.policy, rt.policies:search_path()))
    end
    local fh = io.open(path, "r")
    if not fh then return nil, usage_error("run: cannot open policy '%s'", opts.policy) end
    fh:close()
    -- the runtime's policy already (from the flag); loaded now, so a broken one stops the run
    local ok, err = pcall(rt.policies.resolve, rt.policies, opts.policy, 1, "run")
    if not ok then
      say("luagent: %s", tostring(type(err) == "table" and err.message or err))
      return nil, 1
    end
  end
  -- before the mock starts, so a bad --prices or --otlp leaves nothing behind
  local obs, code = observe(rt, opts, usage_error)
  if not obs then
    for i = #cleanups, 1, -1 do cleanups[i]() end
    return nil, code
  end
  -- runs last: after the script's own files and the mock are closed
  table.insert(cleanups, 1, function() output(obs()) end)
  if opts.tools then
    -- every agent of the script gets it (the tools setting); a script
    -- may still read it as luagent.options.tools
    local set, err = require("luagent.agent.tools").dir(opts.tools, nil, rt)
    if not set then return nil, usage_error("run: --tools: %s", err.message) end
    options.tools = set
    rt.settings:set { tools = set }
    cleanups[#cleanups + 1] = function() set:close() end
  end
  local cassette = opts.cassette
  if not cassette then
    local own = file:gsub("%.lua$", "") .. ".cassette.jsonl"
    local fh = io.open(own, "r")
    if fh then fh:close() cassette = own end
  end
  -- an explicit cassette or fault spec means the mock, key or not
  local use_mock = opts.mock or opts.faults or opts.cassette or (not any_key() and cassette)
  if opts.cassette then
    local fh = io.open(opts.cassette, "r")
    if not fh then return nil, usage_error("run: cannot open cassette '%s'", opts.cassette) end
    fh:close()
  end
  if use_mock then
    local mock = require "luagent.mock"
    -- a replay streams at its recorded pace, as the live run did
    -- a resumed run starts mid-cassette: the replay finds the exchange
    local srv, err = mock.start { cassette = cassette, faults = opts.faults, seed = seed or 0,
                                  recorded_speed = cassette ~= nil and not opts.fast, seek = opts.resuming }
    if not srv then
      if err and err.kind == "usage" then return nil, usage_error("run: %s", err.message) end
      say("luagent: %s", tostring(err))
      return nil, 1
    end
    rt.settings:set { providers = { base_urls = srv.base_urls, api_key = "mock-key" } }
    local what = {}
    if cassette then what[#what + 1] = "replaying " .. cassette end
    if opts.faults then what[#what + 1] = "faults " .. opts.faults end
    note("luagent: %s: using the embedded mock provider at %s%s",
      any_key() and "as asked" or "no API key set", srv.url,
      #what > 0 and " (" .. table.concat(what, ", ") .. ")" or "")
    cleanups[#cleanups + 1] = function()
      for _, d in ipairs(srv:divergences()) do log:write("warn", "cassette divergence: " .. d) end
      srv:close()
    end
  end
  if opts.record then
    local rec, err = require("luagent.observe.record").open(opts.record)
    if not rec then return nil, usage_error("run: %s", err) end
    rt.settings:set { record = rec }
    cleanups[#cleanups + 1] = function()
      rec:close()
      note("luagent: recorded %d exchange(s) to %s", rec.count, opts.record)
    end
  end
  if opts.events then
    -- the retry-safe filter sits between the bus and the writer: its lines
    -- keep the times their events were published
    local filter = opts["retry-safe"] and function(sink) return retry_safe.retry_safe_consumer(sink, rt.diag) end
    local sink = jsonl.jsonl(events_out, { filter = filter or nil })
    cleanups[#cleanups + 1] = rt.bus:subscribe(sink)
  end
  return function()
    for i = #cleanups, 1, -1 do cleanups[i]() end
    if failure then return nil, failure end
    return true
  end
end

-- The exit code of a durable run whose agent stopped on outcome_unknown:
-- a tool with no safety flag may have done its work, so resuming again
-- stops again; someone has to settle the call (`luagent runs resolve`).
M.EXIT_OUTCOME_UNKNOWN = 3

-- The durable run of the runtime ends: its status (unless an agent wrote
-- one) and its claim let go, so the next resume need not wait. Returns the
-- run (nil when there is none).
local function end_run(rt, failed)
  local run = rt.journal.run
  if not run then return nil end
  if failed ~= nil and not run.last_status then run:status(failed and "failed" or "done") end
  run:release()
  return run
end

-- Runs FILE (already checked to load) with its arguments under the
-- options, and ends its durable run. Returns the exit code.
local function run_script(rt, opts, file, chunk, script_args)
  _G.arg = script_args

  if opts["virtual-clock"] then core.clock_virtual() end
  local cleanup, code = prepare(rt, opts, file)
  if not cleanup then -- a usage error: the run did not start well
    end_run(rt, true)
    return code
  end
  -- a script that ends with os.exit still gets its exports, tree and cost
  -- table written, the mock closed and its run's claim let go; and the
  -- state is closed, as at a normal end, so what it holds is let go (a
  -- child still running has its process group killed)
  local exit, cleaned, written = os.exit, false, true
  local function clean()
    if cleaned then return written end
    cleaned = true
    written = cleanup()
    return written
  end
  os.exit = function(status)
    -- a tool (or hook) is code of the run, not its owner: it fails instead
    if core.sandbox_running() then error("os.exit: not allowed in a tool (sandboxed code)", 2) end
    local ok, done = pcall(clean)
    if not ok then say("luagent: while exiting: %s", tostring(done)) end
    local ended, err = pcall(end_run, rt)
    if not ended then say("luagent: while exiting: %s", tostring(err)) end
    -- after the run's end is written: its claim goes with the journal
    local closed, why = pcall(rt.close, rt)
    if not closed then say("luagent: while exiting: %s", tostring(why)) end
    -- a success whose outputs could not all be written is none
    if ok and not done and (status == nil or status == true or status == 0) then status = EXIT_OUTPUT end
    return exit(status, true)
  end
  local main = core.spawn(chunk, table.unpack(script_args))
  core.on_sigint(main)
  local finished, stuck = core.run()
  os.exit = exit
  local outputs_written = clean()
  -- a script that failed, or whose tasks deadlocked, did not end its run
  -- well
  local ok, ended = pcall(end_run, rt, not finished or main:status() ~= "done")
  if not ok then say("luagent: while ending the run: %s", tostring(ended)) end
  local run = ok and ended or nil
  local unknown = run and run.stopped_unknown and M.EXIT_OUTCOME_UNKNOWN
  if main:status() == "failed" then
    local _, err = pcall(main.join, main)
    local stopped, sig = core.interrupted()
    if stopped and type(err) == "table" and err.kind == "cancelled" then
      say(sig == 15 and "luagent: terminated" or "luagent: interrupted")
      return 128 + sig
    end
    -- a usage error the script raised (a provider without a key, a
    -- policy name found nowhere) is the user's to fix: exit 2, without the
    -- library's traceback when the message says the script's line already
    if type(err) == "table" and err.kind == "usage" and type(err.message) == "string" then
      if err.message:match("^[^\n]-:%d+: ") then
        say("luagent: %s", err.message)
      else
        say("luagent: %s", describe_error(err))
      end
      return unknown or 2
    end
    say("luagent: %s", describe_error(err))
    return unknown or 1
  end
  if not finished then
    say("luagent: deadlock: %d task(s) wait on something that can never happen", stuck)
    return 1
  end
  local stopped, sig = core.interrupted()
  if stopped then return 128 + sig end
  if unknown then
    say("luagent: run %s stopped on outcome_unknown (exit %d): settle the call with 'luagent runs resolve', "
      .. "then resume", run.id, unknown)
    return unknown
  end
  if run and run.last_status == "waiting" and run.waiting then
    for _, w in ipairs(run.waiting) do
      say("luagent: run %s waits for approval of %s (call %s): 'luagent runs approve %s %s' or 'luagent runs deny "
        .. "%s %s --reason TEXT', then 'luagent resume %s'", run.id, w.name, tostring(w.call_id), run.id,
        tostring(w.call_id), run.id, tostring(w.call_id), run.id)
    end
  end
  return outputs_written and 0 or EXIT_OUTPUT
end

-- run_script, then the runtime closes (its watchers, Redis writes, log,
-- meters and journal): after the run's end, so its final status (and exit
-- 3) is written before its claim goes.
local function execute(rt, opts, file, chunk, script_args)
  local code = run_script(rt, opts, file, chunk, script_args)
  local ok, err = pcall(rt.close, rt)
  if not ok then say("luagent: while closing: %s", tostring(err)) end
  return code
end

-- Loads FILE as a chunk: chunk, or nil and the exit code after saying why.
local function load_script(file, cmd)
  local fh, open_err = io.open(file, "r")
  if not fh then return nil, usage_error("%s: cannot open '%s': %s", cmd, file, open_err:gsub("^[^:]*: ", "")) end
  fh:close()
  local chunk, load_err = loadfile(file, "t")
  if not chunk then
    say("luagent: %s", load_err)
    return nil, 1
  end
  return chunk
end

-- The journal of a run to resume: the store, or nil and the exit code (2:
-- there is no journal file; nothing is created).
local function open_journal(opts, home)
  local journal = require "luagent.agent.journal"
  local store, err = journal.open(opts.journal, { existing = true, home = home })
  if not store then
    say("luagent: %s%s", err.missing and "resume: " or "", tostring(err.missing and err.message or err))
    return nil, err.missing and 2 or 1
  end
  return store
end

-- Options of `luagent run` a durable run records, for `luagent resume`
-- (faults, events, recording and logging belong to one invocation):
-- those lua/luagent/config.lua marks recorded.
local RECORDED = config.recorded_flags()

-- Parses the options of run or resume: opts, index of the first other
-- argument, the settings they give; or nil, exit code (usage error, or
-- --help shown).
local function parse_or_help(args, cmd)
  local opts, i, settings = parse_run_args(args)
  if not opts then return nil, usage_error("%s", (i:gsub("^run:", cmd .. ":"))) end
  if opts.help then
    io.write(HELP[cmd])
    return nil, 0
  end
  return opts, i, settings
end

-- The runtime of `luagent run` and `luagent resume`: flags -> settings ->
-- luagent.runtime(settings), the constructor an embedder calls, made the
-- default runtime, which the script's luagent.stream{...} and
-- luagent.agent{...} use. `settings` are those the flags give; to them
-- the command line adds what the script reads as luagent.options and
-- where bare policy names are looked for (here, then beside the
-- executable). Returns the runtime, or nil and the exit code after saying
-- why (a bad environment variable: LUAGENT_LOG, LUAGENT_REDIS_URL, ...).
local function host_runtime(opts, settings)
  settings.options = { retry_safe = opts["retry-safe"] or false, seed = settings.seed }
  settings.policy_path = M.root and ("policies/?.lua;" .. M.root .. "/policies/?.lua") or nil
  local ok, rt = pcall(luagent.runtime, settings)
  if not ok then return nil, usage_error("%s", tostring(rt)) end
  luagent.default_runtime(rt)
  return rt
end

function M.run(args)
  local opts, i, settings = parse_or_help(args, "run")
  if not opts then return i end
  local file = args[i]
  if not file then return usage_error("run: missing FILE.lua") end
  local chunk, code = load_script(file, "run")
  if not chunk then return code end
  local script_args = { [0] = file, [-1] = args[0] }
  for j = i + 1, #args do script_args[#script_args + 1] = args[j] end
  local rt
  rt, code = host_runtime(opts, settings)
  if not rt then return code end
  -- what a durable run records of itself, whichever starts it: --durable,
  -- or the first agent made with durable = true (then resume keeps --mock)
  local recorded = {}
  for _, k in ipairs(RECORDED) do recorded[k] = opts[k] end
  local list = {}
  for j = 1, #script_args do list[j] = script_args[j] end
  rt.settings:set { run_info = { script = file, args = list, options = recorded, cwd = os.getenv("PWD") } }
  if opts.durable or opts.journal then
    local journal = require "luagent.agent.journal"
    -- --journal alone: the run starts with the first durable agent
    rt.settings:set { journal_file = opts.journal or false, durable = opts.durable or false }
    if opts.durable then
      local run, err = journal.current(rt)
      if not run then
        say("luagent: %s", tostring(err))
        rt:close()
        return 1
      end
    end
  end
  return execute(rt, opts, file, chunk, script_args)
end

-- `luagent resume [options] RUN_ID`: the run's script again, with its
-- arguments, recorded options (those given here win) and run id.
function M.resume(args)
  local opts, i, settings = parse_or_help(args, "resume")
  if not opts then return i end
  local id = args[i]
  if not id then return usage_error("resume: missing RUN_ID ('luagent runs' lists them)") end
  if args[i + 1] then return usage_error("resume: unexpected argument '%s'", args[i + 1]) end
  local journal = require "luagent.agent.journal"
  -- the journal is found before the runtime is made: the home setting
  -- (LUAGENT_HOME) read as the runtime will read it
  local env = config.new()
  local read, why = pcall(env.read_env, env, settings)
  if not read then return usage_error("%s", tostring(why)) end
  local store, code = open_journal(opts, env:get("home"))
  if not store then return code end
  local run, err = journal.resume(store, id)
  if not run then
    store:close()
    if err and err.kind == "usage" then return usage_error("resume: %s", err.message) end
    say("luagent: %s%s", err and err.holder and "resume: " or "", err and err.holder and err.message or tostring(err))
    return err and err.holder and 2 or 1 -- another process runs it
  end
  local rec = run.record
  local here = os.getenv("PWD")
  if rec.cwd and here and rec.cwd ~= here then
    run:release()
    store:close()
    return usage_error("resume: run %s started in %s; resume it from there", id, rec.cwd)
  end
  for k, v in pairs(rec.options or {}) do
    if opts[k] == nil then opts[k] = v end
  end
  -- the recorded flags give settings as the flags given here do; these win
  local recorded, why = config.from_flags(rec.options or {}, "resume")
  if not recorded then
    run:release()
    return usage_error("%s", why)
  end
  for k, v in pairs(recorded) do
    if settings[k] == nil then settings[k] = v end
  end
  opts.resuming = true
  local chunk
  chunk, code = load_script(rec.script, "resume")
  if not chunk then
    run:release()
    return code
  end
  local script_args = { [0] = rec.script, [-1] = args[0] }
  for j, a in ipairs(rec.args or {}) do script_args[j] = a end
  local rt
  rt, code = host_runtime(opts, settings)
  if not rt then
    run:release()
    return code
  end
  journal.use(rt, run, { close_store = true })
  rt.settings:set { durable = rec.options and rec.options.durable or false }
  say("luagent: resuming run %s (%s; %d step(s) in the journal%s)", id, rec.script, #rec.steps,
    rec.status == "done" and "; it had finished: every step replays" or "")
  return execute(rt, opts, rec.script, chunk, script_args)
end

-- The guide's pages `luagent help TOPIC` prints: docs/guide/TOPIC.md (and
-- the getting-started page as "start"), the same Markdown a reader sees.
local GUIDE = { agent = "guide/agent.md", tools = "guide/tools.md", events = "guide/events.md",
  policy = "guide/policy.md", config = "guide/config.md", durable = "guide/durable.md",
  mcp = "guide/mcp.md", chat = "guide/chat.md", observability = "guide/observability.md",
  start = "getting-started.md" }

-- Where the docs are: ROOT/docs (a checkout; `make install` puts them in
-- PREFIX/share/luagent/docs), then docs/ beside the library's own
-- init.lua (the rock installs them as luagent/docs in its Lua tree).
local function docs_dirs()
  local dirs = {}
  if M.root then dirs[#dirs + 1] = M.root .. "/docs" end
  local init = package.searchpath("luagent", package.path)
  local lib = init and init:match("^(.*)/init%.lua$")
  if lib then dirs[#dirs + 1] = lib .. "/docs" end
  return dirs
end

-- Prints a guide page; the exit code (2 when the page is not installed,
-- naming where it was looked for).
local function guide(topic)
  local dirs = docs_dirs()
  for _, dir in ipairs(dirs) do
    local fh = io.open(dir .. "/" .. GUIDE[topic], "rb")
    if fh then
      io.write(fh:read("a"))
      fh:close()
      return 0
    end
  end
  local looked = {}
  for i, dir in ipairs(dirs) do looked[i] = dir .. "/" .. GUIDE[topic] end
  return usage_error("help: the page of '%s' is not installed (looked for %s)", topic,
    #looked > 0 and table.concat(looked, ", ") or GUIDE[topic])
end

-- Topics beyond the built-in ones live with their area; the guide's pages
-- are docs/; the rest (faults, the mock's own topics) are the mock's.
local function help(topic)
  if not topic then
    io.write(USAGE)
    return 0
  end
  if GUIDE[topic] then return guide(topic) end
  if HELP[topic] then
    io.write(HELP[topic])
    return 0
  end
  local module = ({ sim = "luagent.sim.help", mcp = "luagent.cli.mcp_help" })[topic]
  local ok, text = pcall(require, module or "luagent.mock.help")
  if ok and type(text) == "table" and text[topic] then
    io.write(text[topic])
    return 0
  end
  return usage_error("help: unknown topic '%s'", topic)
end

local COMMANDS = {
  run = M.run,
  help = function(args) return help(args[1]) end,
  mock = function(args) return require("luagent.mock").main(args) end,
  sim = function(args) return require("luagent.sim").main(args) end,
  resume = function(args) return M.resume(args) end,
  runs = function(args) return require("luagent.cli.runs").main(args, say, usage_error) end,
  cost = function(args) return require("luagent.cli.cost").main(args, say, usage_error) end,
  mcp = function(args) return require("luagent.cli.mcp").main(args) end,
  -- the chat's mock is started here: only the command line reaches the bench
  chat = function(args)
    local home = config.new()
    local read = pcall(home.read_env, home, {})
    local dir = read and home:get("home") or nil
    local user = os.getenv("HOME")
    return require("luagent.cli.chat").main(args, { say = say, usage_error = usage_error, root = M.root,
      start_mock = function(opts) return require("luagent.mock").start(opts) end,
      history_file = dir and (dir .. "/chat_history") or (user and user ~= "" and user .. "/.luagent_history")
        or nil })
  end,
}

-- main(argv, root) -> exit code. argv[0] is the program, argv[1] the command.
function M.main(argv, root)
  M.root = root
  local cmd = argv[1]
  if cmd == nil or cmd == "-h" or cmd == "--help" then
    io.write(USAGE)
    return cmd and 0 or 2
  elseif cmd == "-V" or cmd == "--version" then
    io.write(string.format("luagent %s (%s, libcurl %s, libuv %s)\n",
      core.version, core.lua_release, core.curl_version, core.uv_version))
    return 0
  end
  local handler = COMMANDS[cmd]
  if not handler then
    if cmd:sub(1, 1) == "-" then return usage_error("unknown flag '%s'", cmd) end
    return usage_error("unknown command '%s'", cmd)
  end
  local args = { [0] = argv[0] }
  for j = 2, #argv do args[#args + 1] = argv[j] end
  return handler(args)
end

return M
