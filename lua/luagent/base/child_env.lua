-- The environment a child process starts with (a command tool, a stdio
-- MCP server): not ours, which holds the provider keys (*_API_KEY) and
-- whatever else the operator exported, but, as the MCP SDKs give their
-- servers, the few variables of M.INHERITED that are set here, then what
-- the tool's or server's own `env` says (NAME = value, or false to leave a
-- variable out). A key reaches a child only when its `env` gives it, and
-- a value given under a credential's name (GITHUB_TOKEN, DB_PASSWORD) is a
-- secret from then on: the child printing it does not leak it.
local secrets = require "luagent.base.secrets"

local M = {}

-- The MCP SDKs' default list (HOME, LOGNAME, PATH, SHELL, TERM, USER), the
-- locale and the time zone (so a child reads and prints text as we do) and
-- the temporary folder.
M.INHERITED = { "HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER", "LANG", "LC_ALL", "LC_CTYPE", "TZ",
  "TMPDIR" }

-- own(env) -> copy | nil, why: a tool's or server's `env` as it keeps it
-- (nil stays nil): checked to be a table of NAME = value (a string) or
-- false, copied (the caller's later edits change nothing), its
-- credentials registered as secrets.
function M.own(env)
  if env == nil then return nil end
  if type(env) ~= "table" then return nil, "env must be a table of NAME = value (or false)" end
  local out = {}
  -- read raw (next, no __pairs, no __tostring): an env may come from a
  -- tool file, whose metatables run outside any bound here
  for k, v in next, env do
    if type(k) ~= "string" or k == "" or k:find("=", 1, true) or k:find("\0", 1, true) then
      return nil, "env: bad variable name " .. (type(k) == "string" and ("%q"):format(k) or ("(a " .. type(k) .. ")"))
    end
    if type(v) ~= "string" and v ~= false then
      return nil, "env." .. k .. " must be a string (or false to leave it out)"
    end
    out[k] = v
  end
  for k, v in pairs(out) do secrets.register_credential(k, v) end
  return out
end

-- build(env) -> the whole environment of a child with this `env` (nil:
-- none of its own): the inherited variables, `env` laid over them. For
-- core.process_spawn(argv, {env = build(env), inherit_env = false}).
function M.build(env)
  local whole = {}
  for _, name in ipairs(M.INHERITED) do whole[name] = os.getenv(name) end
  for k, v in pairs(env or {}) do whole[k] = v end
  return whole
end

return M
