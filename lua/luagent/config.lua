-- The settings of a runtime: what `luagent run` sets from its flags and an
-- embedder or a spec through luagent.runtime{...} or luagent.configure{...}.
-- This file owns the list of settings and their checks; each runtime owns
-- its values (a Settings object, lua/luagent/runtime.lua), read at the
-- moment they are needed, so a change applies from the next call.
--
--   policy      the policy of calls that name none: a name, a file or a
--               table (default "default"; `--policy FILE`)
--   seed        the jitter seed of calls that give none: an integer or
--               nil (`--seed N`)
--   providers   {base_urls={[kind]=url}, api_key=}: every provider made
--               without a base_url points there (the embedded mock), or
--               nil
--   record      a recorder (lua/luagent/observe/record.lua) tapping every
--               provider request (`--record FILE`), or nil
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

M.LOG_LEVELS = { debug = 1, info = 2, warn = 3, error = 4, off = 5 }

-- Each setting's check (nil is always fine: it clears it) and default.
M.CHECKS = {
  policy = function(v) return type(v) == "string" or type(v) == "table", "a name, a file or a table" end,
  seed = function(v) return math.tointeger(v) ~= nil, "an integer" end,
  providers = function(v)
    return type(v) == "table" and type(v.base_urls) == "table", "a table {base_urls=, api_key=}"
  end,
  record = function(v) return type(v) == "table" and type(v.begin) == "function", "a recorder (record.open)" end,
  policy_path = function(v) return type(v) == "string", "a search path string" end,
  options = function(v) return type(v) == "table", "a table" end,
  log_level = function(v) return M.LOG_LEVELS[v] ~= nil, "debug, info, warn, error or off" end,
  log_sink = function(v) return type(v) == "function", "a function(level, line)" end,
  log_format = function(v) return v == "auto" or v == "json" or v == "text", "auto, json or text" end,
  log_content = function(v) return type(v) == "boolean", "true or false" end,
  max_cost = function(v) return type(v) == "number" and v >= 0 and v < math.huge, "a number of 0 or more" end,
  durable = function(v) return type(v) == "boolean", "true or false" end,
  journal_file = function(v) return type(v) == "string", "a file name" end,
  run_info = function(v) return type(v) == "table" and type(v.script) == "string", "a table {script=, args=, options=, cwd=}" end,
}

-- The value a setting has when unset (nil for those not listed).
local DEFAULTS = { policy = "default", log_level = "warn", log_format = "auto" }
local function default(name)
  if name == "options" then return {} end
  return DEFAULTS[name]
end

local Settings = {}
Settings.__index = Settings

-- new([t [, api]]) -> settings holding t's values (checked as set does);
-- settings.on_change(name, value), when set, is told of every change.
function M.new(t, api)
  local self = setmetatable({ values = {}, on_change = nil }, Settings)
  for name in pairs(M.CHECKS) do self.values[name] = default(name) end
  if t then self:set(t, api or "luagent.configure", 4) end
  return self
end

-- get(name) -> the value of one setting. An unknown name raises.
function Settings:get(name)
  if not M.CHECKS[name] then error("luagent.config: no setting '" .. tostring(name) .. "'", 2) end
  return self.values[name]
end

-- set{name=value, ...} -> the previous values of the names given (pass
-- them back to set to restore them; false for those that were unset).
-- `false` clears a setting (back to its default). An unknown name or a
-- bad value raises and changes nothing. `api` names the caller in errors.
function Settings:set(t, api, level)
  api, level = api or "luagent.configure", level or 3
  if type(t) ~= "table" then error(api .. ": expects a table", level) end
  for k, v in pairs(t) do
    local check = M.CHECKS[k]
    if not check then error(api .. ": no setting '" .. tostring(k) .. "'", level) end
    if v ~= false then
      local ok, want = check(v)
      if not ok then
        error(string.format("%s: %s must be %s, got %s", api, k, want, type(v) == "string"
          and "'" .. v .. "'" or tostring(v)), level)
      end
    end
  end
  local old = {}
  for k, v in pairs(t) do
    old[k] = self.values[k]
    if old[k] == nil then old[k] = false end
    if v == false then v = default(k) end
    self.values[k] = v
    if self.on_change then self.on_change(k, v) end
  end
  return old
end

-- A shallow copy of every setting.
function Settings:all()
  local out = {}
  for k, v in pairs(self.values) do out[k] = v end
  return out
end

return M
