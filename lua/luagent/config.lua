-- One configuration surface for the process: what `luagent run` sets from
-- its flags, and what an embedder or a spec sets through
-- luagent.configure{...}. The settings live here and nowhere else; the
-- modules that use them read them here at the moment they need them, so a
-- change applies from the next call. Scripts read them the same way under
-- `luagent run` or a plain lua5.4 (luagent.configure() returns a copy).
--
--   policy      the policy of calls that name none: a name, a file or a
--               table (default "default"; `--policy FILE`)
--   seed        the jitter seed of calls that give none: an integer or
--               nil (`--seed N`)
--   providers   {base_urls={[kind]=url}, api_key=}: every provider made
--               without a base_url points there (the embedded mock), or
--               nil
--   record      a recorder (lua/luagent/observe/record.lua) tapping every provider
--               request (`--record FILE`), or nil
--   policy_path where bare policy names are looked for ("a/?.lua;b/?.lua");
--               nil for the default (lua/luagent/model/policy.lua)
--   options     what `luagent run` was asked for (retry_safe, seed, tools),
--               read as luagent.options; {} elsewhere
--   log_level   the threshold of the library's own lines (lua/luagent/observe/log.lua)
--   log_sink    where those lines go: function(level, line)
--   log_format  "auto" (JSON unless stderr is a terminal), "json" or
--               "text" (`--log-format`)
--   log_content message content in log lines, cut and redacted
--               (`--log-content`); default false
--   max_cost    the run's cost cap in the price table's currency
--               (`--max-cost`; lua/luagent/observe/cost.lua), or nil
--   durable     every agent of the script is durable (`--durable`)
--   journal_file the run journal's file (`--journal FILE`); nil: the
--               default (lua/luagent/agent/journal/init.lua, path)
--   run_info    what a durable run records of itself: {script=, args=,
--               options=, cwd=}; nil: the script and arguments of _G.arg
local M = {}

local settings = { policy = "default", options = {} }

-- Checks of each setting's value (nil is always fine: it clears it).
local CHECKS = {
  policy = function(v) return type(v) == "string" or type(v) == "table", "a name, a file or a table" end,
  seed = function(v) return math.tointeger(v) ~= nil, "an integer" end,
  providers = function(v)
    return type(v) == "table" and type(v.base_urls) == "table", "a table {base_urls=, api_key=}"
  end,
  record = function(v) return type(v) == "table" and type(v.begin) == "function", "a recorder (record.open)" end,
  policy_path = function(v) return type(v) == "string", "a search path string" end,
  options = function(v) return type(v) == "table", "a table" end,
  log_level = function(v) return require("luagent.observe.log").LEVELS[v] ~= nil, "debug, info, warn, error or off" end,
  log_sink = function(v) return type(v) == "function", "a function(level, line)" end,
  log_format = function(v) return v == "auto" or v == "json" or v == "text", "auto, json or text" end,
  log_content = function(v) return type(v) == "boolean", "true or false" end,
  max_cost = function(v) return type(v) == "number" and v >= 0 and v < math.huge, "a number of 0 or more" end,
  durable = function(v) return type(v) == "boolean", "true or false" end,
  journal_file = function(v) return type(v) == "string", "a file name" end,
  run_info = function(v) return type(v) == "table" and type(v.script) == "string", "a table {script=, args=, options=, cwd=}" end,
}

-- Settings that belong to another module's state: how to read and set them.
local DELEGATED = {
  log_level = {
    get = function() return require("luagent.observe.log").level() end,
    set = function(v) require("luagent.observe.log").set_level(v or "warn") end,
  },
  log_format = {
    get = function() return require("luagent.observe.log").format end,
    set = function(v) require("luagent.observe.log").set_format(v or "auto") end,
  },
  max_cost = {
    get = function() return settings.max_cost end,
    -- a cap needs the meter that counts against it
    set = function(v)
      settings.max_cost = v
      if v then require("luagent.observe.cost").start() end
    end,
  },
  log_sink = {
    get = function() return require("luagent.observe.log").sink end,
    set = function(v)
      local log = require "luagent.observe.log"
      log.sink = v or log.default_sink
    end,
  },
}

-- get(name) -> the value of one setting. An unknown name raises.
function M.get(name)
  if not CHECKS[name] then error("luagent.config: no setting '" .. tostring(name) .. "'", 2) end
  if DELEGATED[name] then return DELEGATED[name].get() end
  return settings[name]
end

-- set{name=value, ...} -> the previous values of the names given (pass
-- them back to set to restore them). `false` clears a setting (back to its
-- default). An unknown name or a bad value raises and changes nothing.
function M.set(t)
  if type(t) ~= "table" then error("luagent.configure: expects a table", 3) end
  for k, v in pairs(t) do
    local check = CHECKS[k]
    if not check then error("luagent.configure: no setting '" .. tostring(k) .. "'", 3) end
    if v ~= false then
      local ok, want = check(v)
      if not ok then
        error(string.format("luagent.configure: %s must be %s, got %s", k, want, type(v) == "string"
          and "'" .. v .. "'" or tostring(v)), 3)
      end
    end
  end
  local old = {}
  for k, v in pairs(t) do
    old[k] = M.get(k)
    if old[k] == nil then old[k] = false end
    if v == false then v = nil end
    if DELEGATED[k] then
      DELEGATED[k].set(v)
    elseif k == "policy" then
      settings[k] = v or "default"
    elseif k == "options" then
      settings[k] = v or {}
    else
      settings[k] = v
    end
  end
  return old
end

-- A shallow copy of every setting.
function M.all()
  local out = {}
  for k in pairs(CHECKS) do out[k] = M.get(k) end
  return out
end

return M
