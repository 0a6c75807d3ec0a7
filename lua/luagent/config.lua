-- The settings of a runtime, and the one table that lists them.
--
-- Every setting of a running host is listed once, in M.SETTINGS below: its
-- name, its check, its default, the environment variable that gives it (if
-- any), the `luagent run` flag that sets it (if any) and a line of help.
-- From that table:
--   - a runtime's settings are checked (an unknown name or a bad value
--     raises, naming it): luagent.runtime{...}, luagent.configure{...},
--     rt.settings:set{...};
--   - the environment is read, in one place: when a runtime is made
--     (lua/luagent/runtime.lua calls settings:read_env); no layer reads a
--     variable of its own (an adapter's key and base-URL variables are the
--     adapter's, lua/luagent/model/providers/);
--   - `luagent run`'s flags are parsed and its help lists them
--     (lua/luagent/cli/init.lua): flags -> settings -> luagent.runtime;
--   - README.md's table of settings is generated (`make settings`) and
--     spec/settings_spec.lua checks it, so the three cannot drift.
-- The table also lists the flags of `luagent run` that are no setting of a
-- runtime (run_only: the mock, a cassette, the event file, the span tree,
-- ...): the command line acts on them itself.
--
-- Each runtime owns its values (a Settings object), read at the moment they
-- are needed, so a change applies from the next call. Module fields are no
-- settings: nothing outside a module assigns its fields (spec/settings_spec.lua
-- checks that too).
--
-- This file requires only lua/luagent/base/options.lua, which requires
-- nothing, so a plain `lua5.4` reads it (mk/settings.lua).

---The settings of a runtime (`luagent.runtime{...}`, `luagent.configure{...}`);
---README.md, "Settings", has the table with defaults, flags and variables.
---Every setting of M.SETTINGS is a field here (spec/docs_spec.lua checks).
---@class luagent.Settings
---@field policy string|table? the retry policy of calls that name none: a name, a file or a table
---@field seed integer? the seed of the retry jitter of calls that give none (and of the mock's faults)
---@field record table? a recorder (`record.open`) saving every model exchange as a cassette
---@field log_level "debug"|"info"|"warn"|"error"|"off"? the log's threshold (default warn)
---@field log_sink fun(level: string, line: string, record: table)? where log lines go (default stderr)
---@field log_format "auto"|"json"|"text"? the log lines' form
---@field log_content boolean? add message content to log lines
---@field otlp_endpoint string? the OTLP/HTTP collector spans are posted to
---@field otlp_timeout number? the bound of one post to the collector, in seconds
---@field otlp_max_queue integer? spans waiting for the collector at most
---@field otlp_batch integer? spans in one post at most
---@field otlp_headers string? headers of every post, key=value,...
---@field service_name string? service.name of the exported spans
---@field max_cost number? refuse any model call once the runtime has cost this many dollars
---@field durable boolean? journal every agent (as durable = true)
---@field journal_file string? the run journal (SQLite) of durable agents
---@field home string? luagent's home folder (the default journal is HOME/runs.db)
---@field redis_url string? share every endpoint's breaker, budget and cooldown through this Redis
---@field redis_retry_every number? seconds between reconnect attempts to a Redis that went down
---@field providers {base_urls: table<string, string>, api_key: string}? where providers made without a base URL point (the embedded mock)
---@field policy_path string? where bare policy names are looked for ("a/?.lua;b/?.lua")
---@field options table? what `luagent run` was asked for, read as `luagent.options`
---@field run_info {script: string, args: string[], options: table, cwd: string}? what a durable run records of itself
---@field retry_safe boolean? hold each attempt's events until it succeeds, in what every stream and agent of the runtime hands its caller (`--retry-safe`)
---@field tools luagent.ToolSet? a tool set every agent of the runtime gets after its own tools (`--tools DIR`)
local options = require "luagent.base.options"

local M = {}

M.LOG_LEVELS = { debug = 1, info = 2, warn = 3, error = 4, off = 5 }

------------------------------------------------------------------------------
-- Checks and parsers, shared by several entries
------------------------------------------------------------------------------

local function is_string(v) return type(v) == "string" end
local function is_nonempty(v) return type(v) == "string" and v ~= "" end
local function is_boolean(v) return type(v) == "boolean" end
local function is_table(v) return type(v) == "table" end
local function is_function(v) return type(v) == "function" end
local function is_count(v) return math.tointeger(v) ~= nil and v >= 1 end
local function is_seconds(v) return type(v) == "number" and v > 0 and v < math.huge end
local function to_integer(s) return math.tointeger(tonumber(s)) end
local function to_number(s) return tonumber(s) end

------------------------------------------------------------------------------
-- The table
------------------------------------------------------------------------------

-- Each entry:
--   name      the setting (rt.settings:get(name)); nil for a run-only flag
--   check     function(value) -> true when the value is good (nil is always
--             good: it clears the setting)
--   want      what a good value is, for messages ("an integer")
--   default   the value when unset (nil when not given)
--   shown     the default as README.md shows it, when not the value itself
--   env       the environment variable that gives it, or a list of them
--             (the first one set wins); "" counts as unset
--   env_want  what a good value of the variable is, when not `want`
--   env_bad   "ignore": a bad value of the variable is ignored with a
--             warning (OpenTelemetry's rule for its shared variables);
--             otherwise it raises when the runtime is made
--   flag      the `luagent run` flag (without "--")
--   arg       what the flag takes ("FILE"), nil for a flag without value
--   parse     function(text) -> value, for the flag's and the variable's
--             text (nil: not a good value); nil keeps the text
--   flag_want what a good flag value is, when not `want`
--   by_run    the flag's value is not the setting's: `luagent run` makes the
--             setting from it (--record FILE opens a recorder)
--   run_only  a flag of `luagent run` only, no runtime setting
--   recorded  a durable run records the flag, and `luagent resume` uses it
--   help      one line: what it is (README.md, `luagent help run`)
--   more      what `luagent help run` says after the line
M.SETTINGS = {
  { name = "policy", check = function(v) return type(v) == "string" or type(v) == "table" end,
    want = "a name, a file or a table", default = "default",
    flag = "policy", arg = "NAME|FILE", recorded = true,
    help = "retry policy for calls that name none: a bundled name (patient, yoagent, ...) or a file",
    more = "(watched: edits apply to the next attempt; a broken edit keeps the old)" },
  { flag = "faults", arg = "SPEC", run_only = true,
    help = "inject faults into the mock (see 'luagent help faults')" },
  { flag = "cassette", arg = "FILE", run_only = true, recorded = true,
    help = "replay this recorded run from the mock",
    more = "(at its recorded pace; --fast replays without pauses)" },
  { flag = "fast", run_only = true, recorded = true,
    help = "replay the cassette without its pauses" },
  { flag = "mock", run_only = true, recorded = true,
    help = "use the mock provider even when a key is set" },
  { name = "seed", check = function(v) return math.tointeger(v) ~= nil end, want = "an integer",
    flag = "seed", arg = "N", parse = to_integer, recorded = true,
    help = "seed for the retry jitter of calls that give none (and for the mock's faults)" },
  { name = "record", check = function(v) return type(v) == "table" and type(v.begin) == "function" end,
    want = "a recorder (record.open)", flag = "record", arg = "FILE", by_run = true,
    help = "save every model exchange of this run as a cassette" },
  { flag = "events", arg = "jsonl:FILE", run_only = true, flag_want = "'jsonl:FILE' or 'jsonl:-'",
    parse = function(s) return s == "jsonl" and "-" or s:match("^jsonl:(.+)$") end,
    help = "write every event as one JSON line to FILE (created or truncated; /dev/fd/N for a descriptor)",
    more = ", away from what the script prints; jsonl:- (or jsonl) writes to stdout, for scripts that print "
      .. "nothing themselves; each line leads with its time (ISO 8601 UTC, milliseconds), an agent_end line "
      .. "has the history's length and last message instead of the history" },
  { name = "retry_safe", check = is_boolean, want = "true or false", flag = "retry-safe", recorded = true,
    shown = "false",
    help = "hold each attempt's events until it succeeds (for pipes and logs)",
    more = "; applies to --events and to the events every stream and agent of the script hands it" },
  { flag = "virtual-clock", run_only = true,
    help = "run on the virtual clock: sleeps, backoff waits and timeouts complete at once, in order, "
      .. "and luagent.now() jumps (tests, demos)",
    more = "; while a reply from outside the process is awaited (a provider, Redis, a child process) time "
      .. "runs as on the real clock" },
  { name = "log_level", check = function(v) return M.LOG_LEVELS[v] ~= nil end,
    want = "debug, info, warn, error or off", default = "warn",
    env = "LUAGENT_LOG", flag = "log", arg = "LEVEL",
    help = "log lines on stderr, one per event worth logging and per library message: debug, info (calls, "
      .. "tools, each retry), warn (default: what needs a look), error, off",
    more = "; LUAGENT_LOG=LEVEL does the same. With it, luagent's own notes on stderr are log lines too" },
  { name = "log_sink", check = is_function, want = "a function(level, line)", shown = "stderr",
    help = "where the log lines go: function(level, line, record)" },
  { name = "log_format", check = function(v) return v == "auto" or v == "json" or v == "text" end,
    want = "auto, json or text", default = "auto", flag = "log-format", arg = "F",
    flag_want = "json, text or auto",
    help = "json (default when stderr is not a terminal), text (default on a terminal; NO_COLOR "
      .. "honoured) or auto" },
  { name = "log_content", check = is_boolean, want = "true or false", flag = "log-content", shown = "false",
    help = "add message content (answers, tool arguments and results) to log lines",
    more = ": cut to 2 KiB and passed through the policy's redact(text) hook" },
  { flag = "trace", run_only = true,
    help = "print the span tree of every agent run, with durations, on stderr at the end" },
  { flag = "otlp", arg = "FILE|URL", run_only = true,
    help = "export spans after the OpenTelemetry GenAI conventions: to FILE as OTLP JSON lines, or to "
      .. "an OTLP/HTTP collector at URL",
    more = "(http://host:4318; /v1/traces is added). OTEL_EXPORTER_OTLP_ENDPOINT does the same; "
      .. "OTEL_EXPORTER_OTLP_TIMEOUT bounds a post (ms, 5000)" },
  { name = "otlp_endpoint", check = function(v) return type(v) == "string" and v:match("^https?://") ~= nil end,
    want = "an http:// or https:// URL", env = { "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT" },
    env_bad = "ignore",
    help = "the OTLP/HTTP collector spans are posted to (/v1/traces is added); --otlp URL wins" },
  { name = "otlp_timeout", check = is_seconds, want = "a number of seconds > 0", default = 5,
    env_want = "a number of milliseconds > 0",
    env = { "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT" }, env_bad = "ignore",
    parse = function(s)
      local ms = tonumber(s)
      return ms and ms > 0 and ms < math.huge and ms / 1000 or nil
    end,
    help = "the bound of one post to the collector, in seconds (the variables give milliseconds)" },
  { name = "otlp_max_queue", check = is_count, want = "a whole number >= 1", default = 2048,
    env = "OTEL_BSP_MAX_QUEUE_SIZE", env_bad = "ignore", parse = to_integer,
    help = "spans waiting for the collector at most; more are dropped and counted" },
  { name = "otlp_batch", check = is_count, want = "a whole number >= 1", default = 512,
    env = "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", env_bad = "ignore", parse = to_integer,
    help = "spans in one post to the collector at most" },
  { name = "otlp_headers", check = is_string, want = "a string key=value,key=value",
    env = "OTEL_EXPORTER_OTLP_HEADERS", env_bad = "ignore",
    help = "headers of every post to the collector, key=value,... (values are scrubbed from every output)" },
  { name = "service_name", check = is_nonempty, want = "a non-empty string", default = "luagent",
    env = "OTEL_SERVICE_NAME", env_bad = "ignore",
    help = "service.name of the exported spans" },
  { flag = "cost", run_only = true,
    help = "print the cost table (per agent, and the costliest turns) on stderr at the end",
    more = "('luagent cost settle' looks up later what OpenRouter billed for each generation, failed "
      .. "attempts included)" },
  { flag = "prices", arg = "FILE", run_only = true,
    help = "a Lua file returning model prices (dollars per million tokens) laid over "
      .. "lua/luagent/observe/prices.lua" },
  { name = "max_cost", check = function(v) return type(v) == "number" and v >= 0 and v < math.huge end,
    want = "a number of 0 or more", flag = "max-cost", arg = "N", parse = to_number,
    flag_want = "a number of dollars >= 0",
    help = "refuse any model call once the run has cost N dollars (the price table's currency)" },
  { name = "tools", check = function(v) return type(v) == "table" and type(v.snapshot) == "function" end,
    want = "a tool set (luagent.tools.dir, luagent.tools.mcp, ...)", flag = "tools", arg = "DIR", by_run = true,
    recorded = true,
    help = "load a tool set from DIR and give it to every agent of the script, after its own tools",
    more = "(every *.lua file returns a tool or a list of tools; watched and reloaded between turns)" },
  { name = "durable", check = is_boolean, want = "true or false", flag = "durable", recorded = true,
    shown = "false",
    help = "journal every agent of the script (as durable = true)",
    more = ": the run id is printed at the start; after a crash or a failure, 'luagent resume RUN_ID' "
      .. "continues it" },
  { name = "journal_file", check = is_string, want = "a file name", flag = "journal", arg = "FILE",
    shown = "HOME/runs.db, else .luagent/runs.db",
    help = "the run journal (SQLite) of durable agents",
    more = "(default $LUAGENT_HOME/runs.db, else .luagent/runs.db here)" },
  { name = "home", check = is_nonempty, want = "a folder", env = "LUAGENT_HOME",
    help = "luagent's home folder, where the default journal is (HOME/runs.db)" },
  { name = "redis_url", check = function(v) return type(v) == "string" and v:match("^redis://") ~= nil end,
    want = "a URL that starts with redis://", env = "LUAGENT_REDIS_URL",
    help = "share every endpoint's breaker, retry budget and cooldown through this Redis (a policy's "
      .. "`shared` field overrides it)" },
  { name = "redis_retry_every", check = is_seconds, want = "a number of seconds > 0", default = 1,
    help = "seconds between reconnect attempts to a Redis that went down" },
  { name = "providers", check = function(v) return type(v) == "table" and type(v.base_urls) == "table" end,
    want = "a table {base_urls=, api_key=}",
    help = "{base_urls={[kind]=url}, api_key=}: where providers made without a base URL point (the "
      .. "embedded mock)" },
  { name = "policy_path", check = is_string, want = "a search path string",
    shown = "./policies, then the bundled ones",
    help = "where bare policy names are looked for (\"a/?.lua;b/?.lua\")" },
  { name = "options", check = is_table, want = "a table", shown = "{}",
    help = "what `luagent run` was asked for (retry_safe, seed, tools), read as luagent.options" },
  { name = "run_info", check = function(v) return type(v) == "table" and type(v.script) == "string" end,
    want = "a table {script=, args=, options=, cwd=}", shown = "the script and its arguments",
    help = "what a durable run records of itself: {script=, args=, options=, cwd=}" },
}

local BY_NAME, BY_FLAG, NAMES = {}, {}, {} -- NAMES: the settings' names, in the table's order
for _, e in ipairs(M.SETTINGS) do
  if e.name then BY_NAME[e.name] = e NAMES[#NAMES + 1] = e.name end
  if e.flag then BY_FLAG[e.flag] = e end
end

-- entry(name) -> the table's entry of a setting, or nil.
function M.entry(name) return BY_NAME[name] end

-- The environment variables of an entry, as a list.
local function variables(e)
  if type(e.env) == "table" then return e.env end
  return e.env and { e.env } or {}
end
M.variables = variables

-- Each setting's check: name -> function(value) -> ok, what a good value is.
M.CHECKS = {}
for name, e in pairs(BY_NAME) do
  M.CHECKS[name] = function(v) return e.check(v), e.want end
end

local function default(name)
  if name == "options" then return {} end -- a fresh table: scripts read it
  return BY_NAME[name].default
end

------------------------------------------------------------------------------
-- Settings: one runtime's values
------------------------------------------------------------------------------

local Settings = {}
Settings.__index = Settings

-- new([t [, api]]) -> settings holding the defaults, then t's values
-- (checked as set does); settings.on_change(name, value), when set, is told
-- of every change made with set.
function M.new(t, api)
  local self = setmetatable({ values = {}, sources = {}, on_change = nil }, Settings)
  for name in pairs(BY_NAME) do self.values[name] = default(name) end
  if t then self:set(t, api or "luagent.configure", 4) end
  return self
end

-- get(name) -> the value of one setting. An unknown name raises.
function Settings:get(name)
  if not BY_NAME[name] then error("luagent.config: no setting '" .. tostring(name) .. "'", 2) end
  return self.values[name]
end

-- source(name) -> where the value came from: "default", "set" (by set,
-- luagent.runtime{...}, luagent.configure{...}, a `luagent run` flag) or
-- the name of the environment variable that gave it.
function Settings:source(name)
  if not BY_NAME[name] then error("luagent.config: no setting '" .. tostring(name) .. "'", 2) end
  return self.sources[name] or "default"
end

-- What a value looks like in a message.
local function shown(v)
  return type(v) == "string" and "'" .. v .. "'" or tostring(v)
end

-- set{name=value, ...} -> the previous values of the names given (pass
-- them back to set to restore them; false for those that were unset).
-- `false` clears a setting (back to its default). An unknown name or a
-- bad value raises and changes nothing. `api` names the caller in errors;
-- `level` is error()'s, counted from here (2, the default: the line that
-- called set).
function Settings:set(t, api, level)
  api, level = api or "luagent.configure", level or 2
  if type(t) ~= "table" then error(api .. ": expects a table", level) end
  for k, v in pairs(t) do
    local e = BY_NAME[k]
    if not e then
      local near = options.nearest(k, NAMES)
      error(api .. ": no setting '" .. tostring(k) .. "'" .. (near and " (did you mean '" .. near .. "'?)" or ""), level)
    end
    if v ~= false and not e.check(v) then
      error(string.format("%s: %s must be %s, got %s", api, k, e.want, shown(v)), level)
    end
  end
  local old = {}
  for k, v in pairs(t) do
    old[k] = self.values[k]
    if old[k] == nil then old[k] = false end
    if v == false then v = default(k) end
    self.values[k] = v
    self.sources[k] = t[k] ~= false and "set" or nil
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

-- A variable's text in a message: a URL's password is not shown.
local function shown_env(text)
  return (text:gsub("^(%a[%w+.-]*://[^:/@]*:)[^@]*@", "%1***@"))
end

-- read_env([given [, getenv]]) -> the list of messages about variables
-- ignored. The starting values the environment gives, for every setting
-- that has a variable and is not in `given` (what the runtime is made
-- with, which wins). getenv(name) reads a variable (os.getenv by default).
-- A bad value of a variable of luagent's own raises, naming it; one of a
-- convention luagent shares (OpenTelemetry's) is ignored, and said. Like
-- the defaults, these values are no change: on_change is not told.
function Settings:read_env(given, getenv)
  getenv = getenv or os.getenv
  local ignored = {}
  for _, e in ipairs(M.SETTINGS) do
    if e.name and e.env and (given == nil or given[e.name] == nil) then
      for _, var in ipairs(variables(e)) do
        local text = getenv(var)
        if text and text ~= "" then
          local value = text
          if e.parse then value = e.parse(text) end
          if value ~= nil and e.check(value) then
            self.values[e.name], self.sources[e.name] = value, var
          else
            local msg = string.format("%s must be %s (got '%s')", var, e.env_want or e.want, shown_env(text))
            if e.env_bad ~= "ignore" then error(msg, 0) end
            ignored[#ignored + 1] = msg .. "; ignored"
          end
          break
        end
      end
    end
  end
  return ignored
end

------------------------------------------------------------------------------
-- The flags of `luagent run`
------------------------------------------------------------------------------

-- run_flags() -> {flag = true when it takes a value} (lua/luagent/cli/flags.lua).
function M.run_flags()
  local out = {}
  for flag, e in pairs(BY_FLAG) do out[flag] = e.arg ~= nil end
  return out
end

-- recorded_flags() -> the flags a durable run records, in the table's order.
function M.recorded_flags()
  local out = {}
  for _, e in ipairs(M.SETTINGS) do
    if e.recorded then out[#out + 1] = e.flag end
  end
  return out
end

-- from_flags(opts [, cmd]) -> settings, run; or nil, message. opts: flag ->
-- its text (true for a flag without value; a durable run's recorded flags
-- may come back as numbers and booleans). settings: the runtime settings
-- the flags give (luagent.runtime takes them); run: the run-only flags'
-- values, parsed (--events jsonl:FILE -> FILE). A bad value is a message
-- "cmd: --flag wants ..., not '...'".
function M.from_flags(opts, cmd)
  local settings, run = {}, {}
  for _, e in ipairs(M.SETTINGS) do
    local text = e.flag and opts[e.flag]
    if text ~= nil and not e.by_run then -- a by_run flag is the command line's to read
      local value = text
      if e.arg and e.parse then value = e.parse(text) end
      if e.arg and (value == nil or (e.check and not e.check(value))) then
        return nil, string.format("%s: --%s wants %s, not '%s'", cmd or "run", e.flag, e.flag_want or e.want,
          tostring(text))
      end
      if e.run_only then run[e.flag] = value else settings[e.name] = value end
    end
  end
  return settings, run
end

------------------------------------------------------------------------------
-- Texts made from the table
------------------------------------------------------------------------------

-- Words of `text` wrapped to `width`, lines after the first indented.
local function wrap(text, first, indent, width)
  local lines, line = {}, first
  for word in text:gmatch("%S+") do
    if #line + 1 + #word > width and #line > #indent then
      lines[#lines + 1] = line
      line = indent .. word
    elseif line:match("%S$") then
      line = line .. " " .. word
    else
      line = line .. word
    end
  end
  lines[#lines + 1] = line
  return table.concat(lines, "\n")
end

-- The text after a flag's help line: joined with a space unless it goes on
-- the sentence (";", ":", ",").
local function join(help, more)
  if not more then return help end
  if more:match("^[;:,]") then return help .. more end
  return help .. " " .. more
end

-- flag_lines() -> the option lines of `luagent help run`, in the table's order.
function M.flag_lines()
  local out, indent = {}, string.rep(" ", 22)
  for _, e in ipairs(M.SETTINGS) do
    if e.flag then
      local left = "--" .. e.flag .. (e.arg and " " .. e.arg or "")
      local first = "  " .. left .. string.rep(" ", math.max(1, 20 - #left))
      out[#out + 1] = wrap(join(e.help, e.more), first, indent, 77)
    end
  end
  return table.concat(out, "\n") .. "\n"
end

-- env_lines() -> the environment lines of `luagent help run`: each
-- variable (a long name on a line of its own) and its setting's help.
function M.env_lines()
  local out, indent = {}, string.rep(" ", 22)
  for _, e in ipairs(M.SETTINGS) do
    if e.name and e.env then
      local names = table.concat(variables(e), ", ")
      local text = e.name .. ": " .. e.help
      if #names > 19 then
        out[#out + 1] = "  " .. names
        out[#out + 1] = wrap(text, indent, indent, 77)
      else
        out[#out + 1] = wrap(text, "  " .. names .. string.rep(" ", 20 - #names), indent, 77)
      end
    end
  end
  return table.concat(out, "\n") .. "\n"
end

-- A cell of the Markdown table: code, with the table's bar escaped.
local function code(s) return "`" .. s:gsub("|", "\\|") .. "`" end

-- markdown() -> README.md's table of settings and flags.
function M.markdown()
  local rows = {
    "| Setting | Value | Default | `luagent run` flag | Environment | What it is |",
    "|---|---|---|---|---|---|",
  }
  for _, e in ipairs(M.SETTINGS) do
    local vars = {}
    for _, v in ipairs(variables(e)) do vars[#vars + 1] = code(v) end
    local dflt = e.shown or (e.default ~= nil and tostring(e.default)) or "none"
    rows[#rows + 1] = string.format("| %s | %s | %s | %s | %s | %s |",
      e.name and code(e.name) or "(run only)",
      e.name and (e.want:gsub("|", "\\|")) or "",
      e.name and (dflt:gsub("|", "\\|")) or "",
      e.flag and code("--" .. e.flag .. (e.arg and " " .. e.arg or "")) or "",
      table.concat(vars, ", "),
      (e.help:gsub("|", "\\|")))
  end
  return table.concat(rows, "\n") .. "\n"
end

return M
