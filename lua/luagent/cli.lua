-- The command line: `luagent run`, `luagent help`, ... Exit codes: 0 success,
-- 1 the script failed, 2 usage error (unknown command or flag, missing file),
-- 130 interrupted.
local core = require "luagent.core"

local M = {}

local USAGE = [[
usage: luagent <command> [options] [args...]

luagent runs LLM agents written in Lua on one event loop, with retries,
backoff and a shared circuit breaker in a small C core.

commands:
  run FILE.lua [args...]   run a Lua script as the main task
  mock [options]           serve the mock provider (luagent mock --help)
  sim [options]            the contention simulation (luagent help sim)
  help [TOPIC]             show help: run, faults, sim

options:
  -h, --help               show this help
  -V, --version            show the version

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
libcurl and real sockets.

options:
  --policy FILE       retry policy for calls that name none (watched: edits
                      apply to the next attempt; a broken edit keeps the old)
  --faults SPEC       inject faults into the mock (see 'luagent help faults')
  --cassette FILE     replay this recorded run from the mock (at its
                      recorded pace; --fast replays without pauses)
  --mock              use the mock provider even when a key is set
  --seed N            seed for the mock's faults and the retry jitter
  --record FILE       save every model exchange of this run as a cassette
  --events jsonl:FILE write every event as one JSON line to FILE (created or
                      truncated; /dev/fd/N for a descriptor), away from
                      what the script prints; jsonl:- (or jsonl) writes to
                      stdout, for scripts that print nothing themselves
  --retry-safe        hold each attempt's events until it succeeds (for
                      pipes and logs); applies to --events and to scripts
                      that read luagent.options.retry_safe
  --log LEVEL         log lines on stderr, one per event worth logging and
                      per library message: debug, info (calls, tools, each
                      retry), warn (default: what needs a look), error, off;
                      LUAGENT_LOG=LEVEL does the same. With it, luagent's
                      own notes on stderr are log lines too
  --log-format F      json (default when stderr is not a terminal), text
                      (default on a terminal; NO_COLOR honoured) or auto
  --log-content       add message content (answers, tool arguments and
                      results) to log lines: cut to 2 KiB and passed through
                      the policy's redact(text) hook
  --trace             print the span tree of every agent run, with
                      durations, on stderr at the end
  --otlp FILE|URL     export spans after the OpenTelemetry GenAI conventions:
                      to FILE as OTLP JSON lines, or to an OTLP/HTTP
                      collector at URL (http://host:4318; /v1/traces is
                      added). OTEL_EXPORTER_OTLP_ENDPOINT does the same
  --cost              print the cost table (per agent, and the costliest
                      turns) on stderr at the end
  --prices FILE       a Lua file returning model prices (dollars per million
                      tokens) laid over lua/luagent/prices.lua
  --max-cost N        refuse any model call once the run has cost N dollars
  --tools DIR         load a tool set from DIR (every *.lua file returns a
                      tool or a list of tools; watched and reloaded between
                      turns) as luagent.options.tools
  -h, --help          show this help

Exit codes: 0 done; 1 the script raised an error (printed as
"luagent: FILE:LINE: message" with a traceback); 2 usage error or missing
file; 130 interrupted (the first Ctrl-C cancels the main task and lets it
clean up, a second exits at once).
]]

local function say(fmt, ...) io.stderr:write(string.format(fmt, ...), "\n") end

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

-- Options of `luagent run`: name -> true when it takes a value.
local RUN_FLAGS = {
  policy = true, faults = true, cassette = true, seed = true, record = true, events = true, log = true,
  tools = true, ["log-format"] = true, otlp = true, prices = true, ["max-cost"] = true,
  mock = false, ["retry-safe"] = false, fast = false, ["log-content"] = false, trace = false, cost = false,
}

-- Parses run's options; returns opts, index of FILE, or nil, message.
local function parse_run_args(args)
  local opts, i = {}, 1
  while args[i] and args[i]:sub(1, 1) == "-" and args[i] ~= "-" do
    local a = args[i]
    if a == "--" then return opts, i + 1 end
    if a == "-h" or a == "--help" then opts.help = true return opts, i end
    local name, value = a:match("^%-%-([%w%-]+)=(.*)$")
    name = name or a:match("^%-%-([%w%-]+)$")
    local takes = name and RUN_FLAGS[name]
    if takes == nil then return nil, string.format("run: unknown flag '%s'", a) end
    if takes and value == nil then
      i = i + 1
      value = args[i]
      if value == nil then return nil, string.format("run: flag '%s' needs a value", a) end
    elseif not takes and value ~= nil then
      return nil, string.format("run: flag '--%s' takes no value", name)
    end
    opts[name] = takes and value or true
    i = i + 1
  end
  if opts.events then
    local dest = opts.events == "jsonl" and "-" or opts.events:match("^jsonl:(.+)$")
    if not dest then
      return nil, string.format("run: --events wants 'jsonl:FILE' or 'jsonl:-', not '%s'", opts.events)
    end
    opts.events = dest
  end
  if opts.log and not require("luagent.log").LEVELS[opts.log] then
    return nil, string.format("run: --log wants debug, info, warn, error or off, not '%s'", opts.log)
  end
  local fmt = opts["log-format"]
  if fmt and fmt ~= "json" and fmt ~= "text" and fmt ~= "auto" then
    return nil, string.format("run: --log-format wants json, text or auto, not '%s'", fmt)
  end
  local cap = opts["max-cost"]
  if cap and not (tonumber(cap) and tonumber(cap) >= 0 and tonumber(cap) < math.huge) then
    return nil, string.format("run: --max-cost wants a number of dollars >= 0, not '%s'", cap)
  end
  if opts.seed and not math.tointeger(tonumber(opts.seed)) then
    return nil, string.format("run: --seed wants an integer, got '%s'", opts.seed)
  end
  return opts, i
end

-- The run's default policy as it is now (it may be reloaded), or nil.
local function current_policy()
  local retry = require "luagent.retry"
  local spec = retry.default_policy
  local policies = require "luagent.policy"
  local path = type(spec) == "string" and policies.find(spec)
  if not path then return nil end
  local ok, loader = pcall(retry.policy_file, path)
  return ok and loader:get() or nil
end

-- Sets up logs, traces and cost (the bus's observers) as the options ask;
-- returns their cleanup (exports, the tree, the cost table), or nil and an
-- exit code after reporting the problem.
local function observe(opts, usage_error)
  local log = require "luagent.log"
  local events = require "luagent.events"
  local trace = require "luagent.trace"
  local cost = require "luagent.cost"
  if opts["log-format"] then log.set_format(opts["log-format"]) end
  log.content = opts["log-content"] or false
  -- the policy's redact(text) hook, run under the hook limits
  log.redact = function(text)
    local p = current_policy()
    if not (p and p.redact) then return text end
    local policies = require "luagent.policy"
    local ok, out = policies.run_limited(p.redact, policies.limits.hook, text)
    if not ok then error(out, 0) end
    return out
  end
  if opts.prices then
    local ok, err = cost.load_prices(opts.prices)
    if not ok then return nil, usage_error("run: --prices: %s", err) end
  end
  cost.run_limit = opts["max-cost"] and tonumber(opts["max-cost"])
  -- --otlp FILE and a collector (--otlp URL, or the OTEL_ variables) may go together
  local file = opts.otlp and not opts.otlp:match("^https?://") and opts.otlp or nil
  local url = not file and opts.otlp or os.getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    or os.getenv("OTEL_EXPORTER_OTLP_ENDPOINT")
  if url == "" then url = nil end
  -- spans are built when asked for, or when log lines at info carry their ids
  if opts.trace or file or url or log.enabled("info") then
    local ok, err = trace.start { tree = opts.trace, file = file, url = url,
      max_queue = math.tointeger(tonumber(os.getenv("OTEL_BSP_MAX_QUEUE_SIZE") or "")),
      batch = math.tointeger(tonumber(os.getenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE") or "")) }
    if not ok then return nil, usage_error("run: --otlp: %s", err) end
  end
  if opts.cost or opts.prices or opts["max-cost"] then cost.start() end
  -- `--log off` asked for silence: no consumer at all
  local unsubscribe = opts.log ~= "off" and events.subscribe(log.consumer(), { types = log.TYPES })
  log.events_logged = unsubscribe and true or false
  return function()
    if unsubscribe then unsubscribe() end
    log.events_logged = false
    trace.stop(opts.trace and io.stderr or nil)
    if opts.cost then io.stderr:write(table.concat(cost.report(), "\n"), "\n") end
    cost.stop()
  end
end

local function any_key()
  for _, name in ipairs({ "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENROUTER_API_KEY" }) do
    local v = os.getenv(name)
    if v and v ~= "" then return true end
  end
  return false
end

-- Sets up what the options ask for before the script runs: the embedded
-- mock, recording, event output, the default policy. Returns a cleanup
-- function, or nil and an exit code after reporting the problem.
local function prepare(opts, file)
  local luagent = require "luagent"
  local retry = require "luagent.retry"
  local provider = require "luagent.provider"
  local events = require "luagent.events"
  local seed = opts.seed and math.tointeger(tonumber(opts.seed))
  local log = require "luagent.log"
  if opts.log then log.set_level(opts.log) end
  -- with a log level asked for, luagent's own notes are log lines too
  local explicit_log = opts.log or os.getenv("LUAGENT_LOG")
  local function note(fmt, ...)
    if explicit_log then log.write("info", (string.format(fmt, ...):gsub("^luagent: ", ""))) else say(fmt, ...) end
  end
  luagent.options = { retry_safe = opts["retry-safe"] or false, seed = seed }
  local cleanups = {}
  local events_out = io.stdout -- --events jsonl:FILE, opened before anything starts
  if opts.events and opts.events ~= "-" then
    local f, err = io.open(opts.events, "w")
    if not f then
      return nil, usage_error("run: --events: cannot open '%s': %s", opts.events, (err:gsub("^[^:]*: ", "")))
    end
    events_out = f
    cleanups[#cleanups + 1] = function() f:close() end
  end
  if opts.policy then
    local fh = io.open(opts.policy, "r")
    if not fh then return nil, usage_error("run: cannot open policy '%s'", opts.policy) end
    fh:close()
    local ok, err = pcall(retry.policy_file, opts.policy)
    if not ok then
      say("luagent: %s", tostring(type(err) == "table" and err.message or err))
      return nil, 1
    end
    retry.default_policy = opts.policy
  end
  if seed then retry.default_seed = seed end
  -- before the mock starts, so a bad --prices or --otlp leaves nothing behind
  local obs, code = observe(opts, usage_error)
  if not obs then
    for i = #cleanups, 1, -1 do cleanups[i]() end
    return nil, code
  end
  table.insert(cleanups, 1, obs) -- runs last: after the script's own files and the mock are closed
  if opts.tools then
    local set, err = require("luagent.tools").dir(opts.tools)
    if not set then return nil, usage_error("run: --tools: %s", err.message) end
    luagent.options.tools = set
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
    local srv, err = mock.start { cassette = cassette, faults = opts.faults, seed = seed or 0,
                                  recorded_speed = cassette ~= nil and not opts.fast }
    if not srv then
      if err and err.kind == "usage" then return nil, usage_error("run: %s", err.message) end
      say("luagent: %s", tostring(err))
      return nil, 1
    end
    provider.embedded = { url = srv.url, api_key = "mock-key" }
    local what = {}
    if cassette then what[#what + 1] = "replaying " .. cassette end
    if opts.faults then what[#what + 1] = "faults " .. opts.faults end
    note("luagent: %s: using the embedded mock provider at %s%s",
      any_key() and "as asked" or "no API key set", srv.url,
      #what > 0 and " (" .. table.concat(what, ", ") .. ")" or "")
    cleanups[#cleanups + 1] = function()
      for _, d in ipairs(srv:divergences()) do log.write("warn", "cassette divergence: " .. d) end
      srv:close()
    end
  end
  if opts.record then
    local rec, err = require("luagent.record").open(opts.record)
    if not rec then return nil, usage_error("run: %s", err) end
    provider.recorder = rec
    cleanups[#cleanups + 1] = function()
      rec:close()
      note("luagent: recorded %d exchange(s) to %s", rec.count, opts.record)
    end
  end
  if opts.events then
    local sink = events.jsonl(events_out)
    if opts["retry-safe"] then sink = events.retry_safe_consumer(sink) end
    cleanups[#cleanups + 1] = events.subscribe(sink)
  end
  return function()
    for i = #cleanups, 1, -1 do cleanups[i]() end
  end
end

function M.run(args)
  local opts, i = parse_run_args(args)
  if not opts then return usage_error("%s", i) end
  if opts.help then
    io.write(HELP.run)
    return 0
  end
  local file = args[i]
  if not file then return usage_error("run: missing FILE.lua") end
  local fh, open_err = io.open(file, "r")
  if not fh then return usage_error("run: cannot open '%s': %s", file, open_err:gsub("^[^:]*: ", "")) end
  fh:close()
  local chunk, load_err = loadfile(file, "t")
  if not chunk then
    say("luagent: %s", load_err)
    return 1
  end
  local script_args = { [0] = file, [-1] = args[0] }
  for j = i + 1, #args do script_args[#script_args + 1] = args[j] end
  _G.arg = script_args

  local cleanup, code = prepare(opts, file)
  if not cleanup then return code end
  local main = core.spawn(chunk, table.unpack(script_args))
  core.on_sigint(main)
  local finished, stuck = core.run()
  cleanup()
  if main:status() == "failed" then
    local _, err = pcall(main.join, main)
    if core.interrupted() and type(err) == "table" and err.kind == "cancelled" then
      say("luagent: interrupted")
      return 130
    end
    say("luagent: %s", describe_error(err))
    return 1
  end
  if not finished then
    say("luagent: deadlock: %d task(s) wait on something that can never happen", stuck)
    return 1
  end
  return core.interrupted() and 130 or 0
end

-- Topics beyond the built-in ones live with their area (e.g. faults).
local function help(topic)
  if not topic then
    io.write(USAGE)
    return 0
  end
  if HELP[topic] then
    io.write(HELP[topic])
    return 0
  end
  local ok, text = pcall(require, "luagent." .. topic .. ".help")
  if not ok then ok, text = pcall(require, "luagent.mock.help") end
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
}

-- main(argv, root) -> exit code. argv[0] is the program, argv[1] the command.
function M.main(argv, root)
  M.root = root
  if root then
    local policy = require "luagent.policy"
    policy.path = "policies/?.lua;" .. root .. "/policies/?.lua"
  end
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
