-- The flags of luagent's commands (`luagent run`, `mcp list`, `cost
-- settle`): one parser, in a module of its own so that each command's
-- module requires it, not the command line that dispatches to them.
local M = {}

-- parse(args, flags, cmd [, i]) -> opts, index of the first argument that
-- is not a flag (after "--" when given), or nil, message. `flags` maps a
-- name to true when it takes a value; -h/--help sets opts.help. `cmd`
-- names the command in messages.
function M.parse(args, flags, cmd, i)
  local opts = {}
  i = i or 1
  while args[i] and args[i]:sub(1, 1) == "-" and args[i] ~= "-" do
    local a = args[i]
    if a == "--" then return opts, i + 1 end
    if a == "-h" or a == "--help" then opts.help = true return opts, i end
    local name, value = a:match("^%-%-([%w%-]+)=(.*)$")
    name = name or a:match("^%-%-([%w%-]+)$")
    local takes = name and flags[name]
    if takes == nil then return nil, string.format("%s: unknown flag '%s'", cmd, a) end
    if takes and value == nil then
      i = i + 1
      value = args[i]
      if value == nil then return nil, string.format("%s: flag '%s' needs a value", cmd, a) end
    elseif not takes and value ~= nil then
      return nil, string.format("%s: flag '--%s' takes no value", cmd, name)
    end
    opts[name] = takes and value or true
    i = i + 1
  end
  return opts, i
end

return M
