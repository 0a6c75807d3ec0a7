-- `luagent mock`: its flags, and serving until interrupted.
local core = require "luagent.core"
local errors = require "luagent.base.errors"
local mserver = require "luagent.mock.server"
local help = require "luagent.mock.help"

local M = {}

-- Flags of `luagent mock`: option name -> value parser (nil for switches).
local flags = {
  listen = tostring, cassette = tostring, faults = tostring,
  seed = function(s) return math.tointeger(tonumber(s)) end,
  ttft = function(s) local n = tonumber(s); return n and n >= 0 and n or nil end,
  tps = function(s) local n = tonumber(s); return n and n > 0 and n or nil end,
  ["generation-delay"] = function(s) local n = tonumber(s); return n and n >= 0 and n or nil end,
  ["recorded-speed"] = false, help = false,
}

-- Parses `luagent mock` arguments into start options, or nil, err (usage).
function M.parse_args(argv)
  local opts, i = {}, 1
  while i <= #argv do
    local a = argv[i]
    local name, value = a:match("^%-%-([%w%-]+)=(.*)$")
    name = name or a:match("^%-%-([%w%-]+)$")
    if a == "-h" then name = "help" end
    if not name or flags[name] == nil then
      local what = a:sub(1, 1) == "-" and "unknown flag '" or "unexpected argument '"
      return nil, errors.new("usage", what .. a .. "'", { flag = a })
    end
    local key = name:gsub("%-", "_")
    if flags[name] then
      if value == nil then
        i = i + 1
        value = argv[i]
        if value == nil then return nil, errors.new("usage", "--" .. name .. " needs a value") end
      end
      local v = flags[name](value)
      if v == nil then
        return nil, errors.new("usage", "bad value '" .. value .. "' for --" .. name, { flag = name })
      end
      opts[key] = v
    elseif value ~= nil then
      return nil, errors.new("usage", "--" .. name .. " takes no value")
    else
      opts[key] = true
    end
    i = i + 1
  end
  return opts
end

-- Serves until cancelled (Ctrl-C): the body of `luagent mock`, in a task.
local function serve_cli(opts, out, err)
  opts.on_divergence = function(message) err:write("luagent mock: ", message, "\n") end
  local server, serr = mserver.start(opts)
  if not server then
    err:write("luagent mock: ", tostring(serr and serr.message or serr), "\n")
    return errors.is(serr) and serr.kind == "usage" and 2 or 1
  end
  out:write("luagent mock: listening on ", server.url, "\n")
  out:flush()
  local ok, werr = pcall(server.wait, server)
  server:close()
  if not ok then error(werr, 0) end
  return 0
end

-- `luagent mock [flags]`: serves until interrupted. Returns the exit code:
-- 2 for usage errors, 128 + the signal when stopped (130 SIGINT, 143
-- SIGTERM). Called outside a task (as the CLI does) it runs the loop itself.
function M.main(argv, out, err)
  out, err = out or io.stdout, err or io.stderr
  local opts, perr = M.parse_args(argv or {})
  if not opts then
    err:write("luagent mock: ", perr.message, "\nRun 'luagent mock --help' for usage.\n")
    return 2
  end
  if opts.help then
    out:write(help.mock)
    return 0
  end
  if core.current() then return serve_cli(opts, out, err) end
  local task = core.spawn(serve_cli, opts, out, err)
  core.on_sigint(task)
  core.run()
  local stopped, sig = core.interrupted()
  if stopped then return 128 + sig end
  local ok, code = pcall(task.join, task)
  if not ok then
    err:write("luagent mock: ", tostring(code), "\n")
    return 1
  end
  return code
end

return M
