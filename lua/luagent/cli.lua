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
  help [TOPIC]             show help: run, faults

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

  -h, --help    show this help

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

function M.run(args)
  local i = 1
  while args[i] and args[i]:sub(1, 1) == "-" and args[i] ~= "-" do
    local flag = args[i]
    if flag == "-h" or flag == "--help" then
      io.write(HELP.run)
      return 0
    elseif flag == "--" then
      i = i + 1
      break
    else
      return usage_error("run: unknown flag '%s'", flag)
    end
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

  local main = core.spawn(chunk, table.unpack(script_args))
  core.on_sigint(main)
  local finished, stuck = core.run()
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
}

-- main(argv, root) -> exit code. argv[0] is the program, argv[1] the command.
function M.main(argv, root)
  M.root = root
  local cmd = argv[1]
  if cmd == nil or cmd == "-h" or cmd == "--help" then
    io.write(USAGE)
    return cmd and 0 or 2
  elseif cmd == "-V" or cmd == "--version" then
    io.write("luagent ", core.version, " (", _VERSION, ")\n")
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
