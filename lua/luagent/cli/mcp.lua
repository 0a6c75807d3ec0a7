-- `luagent mcp list`: a quick look at an MCP server's tools and the flags
-- luagent gives them. Exit codes: 0 listed, 1 the server failed, 2 usage.
local core = require "luagent.core"
local flags = require "luagent.cli.flags"
local secrets = require "luagent.base.secrets"
local luagent = require "luagent"
local mcp = require "luagent.agent.tools.mcp"

local M = {}

local HELP = require("luagent.cli.mcp_help").mcp

-- What it prints comes from the server (its name, its tools, its errors)
-- and is scrubbed of keys and escaped for the terminal, stdout and stderr
-- alike (host/termtext.c, line by line).
local function say(fmt, ...) io.stderr:write(core.terminal_text(secrets.text(string.format(fmt, ...)), true), "\n") end
local function out(fmt, ...) io.write(core.terminal_text(secrets.text(string.format(fmt, ...)), true)) end

local function usage_error(fmt, ...)
  say("luagent mcp: " .. fmt, ...)
  say("Run 'luagent mcp --help' for usage.")
  return 2
end

-- Flags of `mcp list`: name -> true when it takes a value.
local FLAGS = { url = true, name = true, policy = true, timeout = true, trust = false }

-- Parses list's options (from args[i]); returns opts, or nil and a message.
local function parse(args, i)
  local opts, at = flags.parse(args, FLAGS, "list", i)
  if not opts or opts.help then return opts, at end
  if args[at] then
    if args[at - 1] ~= "--" then return nil, string.format("list: the command comes after --, not '%s'", args[at]) end
    opts.command = {}
    for j = at, #args do opts.command[#opts.command + 1] = args[j] end
  end
  if opts.timeout and not (tonumber(opts.timeout) and tonumber(opts.timeout) > 0) then
    return nil, string.format("list: --timeout wants seconds > 0, not '%s'", opts.timeout)
  end
  if (opts.command == nil or #opts.command == 0) == (opts.url == nil) then
    return nil, "list: give a server: -- COMMAND [ARGS...], or --url URL"
  end
  return opts
end

-- The hints of a tool, as words.
local function hint_words(h)
  local w = {}
  if h.read_only then w[#w + 1] = "read-only" end
  if h.idempotent then w[#w + 1] = "idempotent" end
  if h.destructive and not h.read_only then w[#w + 1] = "destructive" end
  if h.open_world then w[#w + 1] = "open-world" end
  return #w > 0 and table.concat(w, " ") or "-"
end

-- Lists the tools of the server `opts` names; returns the exit code.
local function list(opts)
  local spec = { command = opts.command, url = opts.url, name = opts.name,
    init_timeout = tonumber(opts.timeout), ping_interval = false }
  if opts.trust then
    spec.tool_policy = { trust_hints = true }
  elseif opts.policy then
    spec.policy = opts.policy
  end
  -- a runtime of its own: the policy file is found and read there
  local rt = luagent.runtime {}
  local ok, set, err = pcall(mcp.open, spec, rt)
  if not ok then
    say("luagent mcp: %s", tostring(set))
    return 1
  end
  if not set then
    say("luagent mcp: %s", tostring(err and err.message or err))
    return 1
  end
  local snap, st = set:snapshot(), set:status()
  local info = st.server or {}
  out("%s %s, MCP %s, %d tool%s; hints %s\n", tostring(info.name or set.label),
    tostring(info.version or ""), tostring(st.protocol), #snap.names, #snap.names == 1 and "" or "s",
    mcp.trusted(set.policy, set.label) and "trusted"
      or "not trusted (--trust, or trust_hints in a policy, uses them)")
  local width = 4
  for _, n in ipairs(snap.names) do width = math.max(width, #n) end
  out("%-" .. width .. "s  %-21s  %s\n", "TOOL", "FLAGS", "HINTS")
  for _, n in ipairs(snap.names) do
    local t = snap.tools[n]
    local set_flags = {}
    if t.read_only then set_flags[#set_flags + 1] = "read_only" end
    if t.idempotent then set_flags[#set_flags + 1] = "idempotent" end
    out("%-" .. width .. "s  %-21s  %s\n", n, #set_flags > 0 and table.concat(set_flags, " ") or "-",
      hint_words(t.mcp.hints))
  end
  -- what the list held that is not offered (a tool luagent cannot use, a cap)
  for _, ev in ipairs(set:events_since(nil)) do
    if ev.type == "tools_reload_failed" then say("luagent mcp: %s", ev.message) end
  end
  set:close()
  return 0
end

-- main(args) -> exit code; args[1] is the subcommand.
function M.main(args)
  local sub = args[1]
  if sub == nil or sub == "-h" or sub == "--help" then
    io.write(HELP)
    return sub and 0 or 2
  end
  if sub ~= "list" then return usage_error("unknown subcommand '%s' (try 'list')", sub) end
  local opts, err = parse(args, 2)
  if not opts then return usage_error("%s", err) end
  if opts.help then
    io.write(HELP)
    return 0
  end
  local code = 1
  local main = core.spawn(function() code = list(opts) end)
  core.on_sigint(main)
  core.run()
  if main:status() == "failed" then
    local _, e = pcall(main.join, main)
    say("luagent mcp: %s", tostring(e))
    return core.interrupted() and 130 or 1
  end
  return code
end

return M
