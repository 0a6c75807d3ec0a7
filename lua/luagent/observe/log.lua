-- Logs: one structured line per event worth logging, and the library's own
-- diagnostic lines (a policy edit rejected, a hook that failed, a retry
-- announced), all with the same fields: time, level, agent, model or tool
-- and call id, trace and span id, message, and the event's own fields.
--
-- The events are the full story of a run; these lines are for people and
-- log pipelines. Each runtime owns one logger (lua/luagent/runtime.lua,
-- rt.log) with its own threshold, sink, format and content flag (the
-- runtime's log_level, log_sink, log_format and log_content settings: the
-- threshold is log_level, default `warn`, which `luagent run --log LEVEL`
-- sets and LUAGENT_LOG gives when the runtime is made), the redaction of
-- its own policy, and the trace ids of its own tracer. Lines are JSON when stderr is not a terminal (or with
-- `--log-format json`), a compact readable form on a terminal (colour
-- unless NO_COLOR is set; escape sequences and other control characters
-- from models, tools and servers written as visible escapes). Metadata is
-- always logged; message content (answers, tool arguments and results) only
-- with `--log-content`, cut to logger.content_max bytes and passed through
-- the runtime's policy's `redact(text)` hook. Every line goes through the
-- key scrubber (lua/luagent/base/secrets.lua).
local core = require "luagent.core"
local json = require "luagent.base.json"
local secrets = require "luagent.base.secrets"

local M = {}

M.LEVELS = { debug = 1, info = 2, warn = 3, error = 4, off = 5 }
local LEVELS, OFF = M.LEVELS, M.LEVELS.off

-- Where lines go unless the log_sink setting says otherwise:
-- function(level, line, record) (record is the line's fields as a table,
-- already scrubbed). This one writes the line to stderr, one write(2) per
-- line.
function M.default_sink(_, line) io.stderr:write(line .. "\n") end
local default_sink = M.default_sink

-- The bound of message content in a line, in bytes (a logger's
-- content_max starts here). Whether lines carry content at all is the
-- log_content setting (lua/luagent/config.lua).
M.CONTENT_MAX = 2048

local Logger = {}
Logger.__index = Logger
M.Logger = Logger

-- new(rt) -> the logger of runtime rt: its threshold, sink, format and
-- content flag as rt.settings has them now (the log_level setting: the
-- runtime's read_env put LUAGENT_LOG there); the runtime applies later
-- changes (set_level, set_format, set_sink, set_content); content goes through the
-- redact hook of rt's policy (rt.policies:redact). Nothing is logged from
-- events until start().
function M.new(rt)
  if type(rt) ~= "table" or not rt.settings or not rt.bus then error("log.new: expects a runtime", 2) end
  local settings = rt.settings
  return setmetatable({
    rt = rt,
    threshold = LEVELS[settings:get("log_level") or "warn"] or LEVELS.warn,
    sink = settings:get("log_sink") or default_sink,
    format = settings:get("log_format") or "auto",
    content = settings:get("log_content") or false,
    content_max = M.CONTENT_MAX,
    -- content's redaction: the hook of the runtime's policy
    redact = function(text) return rt.policies:redact(text) end,
    -- function(ev) -> trace_id, span_id of the span an event belongs to:
    -- the runtime's tracer's (lua/luagent/observe/trace.lua), while it traces
    context = nil,
    is_json = nil, colour = nil, -- decided at the first line
    reported = false,            -- a failing redact hook is reported once
    unsubscribe = nil,           -- the consumer's, while lines are made from events
  }, Logger)
end

-- Sets the threshold by name; raises for a name not in M.LEVELS.
function Logger:set_level(name)
  local n = LEVELS[name]
  if not n then error("log.set_level: unknown level '" .. tostring(name) .. "' (debug, info, warn, error, off)", 2) end
  self.threshold = n
end

-- The threshold's name.
function Logger:level()
  for name, n in pairs(LEVELS) do if n == self.threshold then return name end end
end

-- Whether a line at `level` would be written.
function Logger:enabled(level)
  local t = self.threshold
  return LEVELS[level] >= t and t < OFF
end

-- Sets where lines go: function(level, line, record); nil: stderr.
function Logger:set_sink(fn) self.sink = fn or default_sink end

-- Sets whether lines carry message content.
function Logger:set_content(on) self.content = on or false end

-- Sets the trace context lines take their ids from: function(ev) ->
-- trace_id, span_id (a tracer's), or nil for none.
function Logger:set_context(fn) self.context = fn end

------------------------------------------------------------------------------
-- Formatting one line
------------------------------------------------------------------------------

-- "2026-12-01T01:01:02.752Z": UTC to the millisecond (host/timetext.c).
local iso_time = core.iso_time

local function clock_time(t)
  local s = math.floor(t)
  return os.date("%H:%M:%S", s) .. string.format(".%03d", math.floor((t - s) * 1000))
end

-- Decides a logger's form (JSON or text, colour or not) at its first line.
local function decide(self)
  local tty = core.isatty and core.isatty(2) or false
  if self.format == "json" then self.is_json = true
  elseif self.format == "text" then self.is_json = false
  else self.is_json = not tty end
  local nc = os.getenv("NO_COLOR")
  self.colour = not self.is_json and tty and not (nc and nc ~= "")
end

-- Sets the format ("auto", "json", "text"); raises for another name.
function Logger:set_format(name)
  if name ~= "auto" and name ~= "json" and name ~= "text" then
    error("log.set_format: unknown format '" .. tostring(name) .. "' (auto, json, text)", 2)
  end
  self.format, self.is_json = name, nil
end

local COLOUR = { debug = "\27[2m", info = "\27[36m", warn = "\27[33m", error = "\27[31m" }
-- The fields every line leads with, in this order (the rest follow sorted).
local HEAD = { "time", "level", "agent", "model", "tool", "call", "call_id", "trace_id", "span_id", "msg" }
local IS_HEAD = {}
for _, k in ipairs(HEAD) do IS_HEAD[k] = true end

-- A field's value in the text form: quoted when it has spaces, quotes or
-- '=' (its quotes and backslashes escaped; control characters are the
-- whole line's business, below).
local function text_value(v)
  if type(v) == "table" then return json.encode(v) end
  local s = tostring(v)
  if type(v) == "string" and (s == "" or s:find("[%s\"=]")) then return '"' .. s:gsub('[\\"]', "\\%0") .. '"' end
  return s
end

-- Text a terminal would act on (an escape sequence, a control character, a
-- bidi override), escaped (host/termtext.c): what follows a line's time
-- and level comes from models, tools and servers.
local terminal_text = core.terminal_text

-- A field's value that is no string, number or boolean, as JSON.
local function encode_value(v) return json.encode(v, { nonfinite = "null" }) end

-- The line for `record` in the logger's format; with `clear`, the JSON
-- form empties the record as it reads it (the consumer fills it again).
local function render(self, record, epoch, clear)
  local is_json = self.is_json
  if is_json == nil then
    decide(self)
    is_json = self.is_json
  end
  if is_json then
    -- the leading fields in order, then the rest sorted, written in C
    -- (host/jsonw.c) into one string: a line per call must stay cheap
    return core.json_fields(record, HEAD, encode_value, clear)
  end
  local who = {}
  if record.agent then who[#who + 1] = record.agent end
  if record.model then who[#who + 1] = record.model end
  if record.tool then who[#who + 1] = record.tool end
  if record.call then who[#who + 1] = "#" .. record.call end
  if record.call_id then who[#who + 1] = record.call_id end
  local lvl = string.format("%-5s", record.level:upper())
  if self.colour then lvl = COLOUR[record.level] .. lvl .. "\27[0m" end -- (the only escape a line keeps)
  local out = {}
  if #who > 0 then out[1] = table.concat(who, " ") end
  out[#out + 1] = record.msg
  local rest = {}
  for k in pairs(record) do
    if not IS_HEAD[k] and k ~= "event" then rest[#rest + 1] = k end
  end
  table.sort(rest)
  local kv = {}
  for _, k in ipairs(rest) do kv[#kv + 1] = k .. "=" .. text_value(record[k]) end
  if #kv > 0 then out[#out + 1] = table.concat(kv, " ") end
  return clock_time(epoch) .. "  " .. lvl .. "  " .. terminal_text(table.concat(out, "  "))
end

-- Empties a record for the next line (its slots stay).
local function empty(record)
  for k in pairs(record) do record[k] = nil end
end

-- Writes the line of `record` (the caller's to give away) at `level`.
-- The line is scrubbed whole; the record's strings only when a sink other
-- than the default will see them. With the default sink and `reuse`, the
-- record is left empty, for the caller to fill again; returns whether it
-- was.
local function emit(self, level, msg, record, reuse)
  local epoch = core.wall()
  record.time = iso_time(epoch)
  record.level, record.msg = level, msg
  local sink = self.sink
  local default = sink == default_sink
  if not default then secrets.scrub(record) end
  local clear = reuse and default
  sink(level, secrets.text(render(self, record, epoch, clear)), record)
  if clear and not self.is_json then
    empty(record) -- (the text form reads it in Lua)
  end
  return clear
end

-- logger:write(level, msg [, fields]): one line at `level` when the
-- threshold lets it through: {time, level, msg, ...fields}, scrubbed of
-- every key.
function Logger:write(level, msg, fields)
  if not self:enabled(level) then return end
  local record = {}
  for k, v in pairs(fields or {}) do record[k] = v end
  emit(self, level, msg, record)
end

-- logger:library(line): a diagnostic line in the form older code wrote to
-- stderr ("luagent: ..."), logged at warn without the prefix. The library
-- itself writes through its runtime's diagnostics (rt.diag).
function Logger:library(line)
  self:write("warn", (tostring(line):gsub("^luagent: ", "")))
end

------------------------------------------------------------------------------
-- Content: cut, redacted, scrubbed
------------------------------------------------------------------------------

-- logger:content_text(text) -> the text as a log line may carry it: cut
-- to logger.content_max bytes, passed through the redact hook of the
-- runtime's policy (lua/luagent/model/policy.lua, redact), scrubbed of keys.
function Logger:content_text(text)
  text = tostring(text)
  local max = self.content_max
  local more = #text > max
  local cut = secrets.cut(more and text:sub(1, max + secrets.margin) or text, max, more)
  if more then cut = cut .. string.format("...[%d bytes]", #text) end
  do
    local ok, red = pcall(self.redact, cut)
    if not ok or type(red) ~= "string" then
      if not self.reported then
        self.reported = true
        self:write("warn", "the policy's redact hook failed; content is left out of the log: "
          .. tostring(ok and ("it returned a " .. type(red)) or red))
      end
      return "[redact failed]"
    end
    cut = red
  end
  return secrets.text(cut)
end

------------------------------------------------------------------------------
-- The event consumer
------------------------------------------------------------------------------

-- The field names of a usage's counts, per prefix ("" or "total_"): made
-- once, not joined again for every line.
local USAGE_KEYS = {}
for _, prefix in ipairs({ "", "total_" }) do
  USAGE_KEYS[prefix] = { input = prefix .. "input_tokens", output = prefix .. "output_tokens",
    cache_read = prefix .. "cache_read_tokens", cache_write = prefix .. "cache_write_tokens" }
end

-- Copies a usage table's token counts into a line's fields.
local function usage_fields(r, u, prefix)
  if type(u) ~= "table" then return end
  local k = USAGE_KEYS[prefix]
  r[k.input] = u.input_tokens
  r[k.output] = u.output_tokens
  if (u.cache_read_tokens or 0) > 0 then r[k.cache_read] = u.cache_read_tokens end
  if (u.cache_write_tokens or 0) > 0 then r[k.cache_write] = u.cache_write_tokens end
end

-- Seconds rounded to the microsecond, as a line's `duration`.
local function micros(d) return math.floor(d * 1e6 + 0.5) / 1e6 end

-- An error record as text ("kind: message"), or nil.
local function err_text(e)
  if e == nil then return nil end
  return tostring(e)
end

-- duration(seconds) -> "37.968s" (to the millisecond), "1.3ms" (to a
-- tenth of one), "191µs"; "?" for no number or no finite one. Written in C
-- (host/timetext.c): a traced call writes three.
local duration_text = core.duration_text
function M.duration(d)
  if type(d) ~= "number" then return "?" end
  return duration_text(d)
end
local secs = M.duration

-- Per event type: function(ev, fields, logger) -> level, message. Fields
-- hold the event's metadata; types not listed (deltas) are never logged.
local EVENTS = {
  agent_start = function(ev, r)
    r.history = ev.history
    return "info", "agent started"
  end,
  agent_end = function(ev, r, log)
    r.stop_reason, r.turns, r.reason, r.error = ev.stop_reason, ev.turns, ev.reason, err_text(ev.error)
    usage_fields(r, ev.usage, "")
    if ev.cost then r.cost = ev.cost.total; r.cost_unpriced = ev.cost.unpriced end
    if log.content and ev.messages and #ev.messages > 0 then
      local last = ev.messages[#ev.messages]
      if last.role == "assistant" then r.content = log:content_text(last.content or "") end
    end
    return ev.stop_reason == "error" and "error" or "info", "agent ended: " .. tostring(ev.stop_reason)
  end,
  turn_start = function(ev, r) r.turn = ev.turn return "debug", "turn started" end,
  turn_end = function(ev, r)
    r.turn = ev.turn
    r.tool_results = ev.tool_results and #ev.tool_results or 0
    return "debug", "turn ended"
  end,
  message_start = function(ev, r)
    r.provider, r.response_model, r.response_id = ev.provider, ev.model, ev.id
    return "debug", "answer started"
  end,
  usage = function(ev, r) usage_fields(r, ev, "") return "debug", "usage reported" end,
  stream_reset = function(ev, r) r.attempt = ev.attempt return "debug", "partial answer reset for a retry" end,
  message_end = function(ev, r, log)
    r.stop_reason, r.raw_stop_reason = ev.stop_reason, ev.raw_stop_reason
    usage_fields(r, ev.usage, "")
    if not ev.final then
      r.error = err_text(ev.error)
      return "debug", ev.error_message or "answer ended"
    end
    r.attempts, r.status = ev.attempts, ev.status
    usage_fields(r, ev.total_usage, "total_")
    if ev.started then r.duration = micros(core.now() - ev.started) end
    if ev.stop_reason == "error" then
      r.error, r.reason = err_text(ev.error), ev.reason
      return "warn", "model call failed after " .. tostring(ev.attempts) .. " attempt(s)"
    elseif ev.stop_reason == "aborted" then
      return "info", "model call aborted"
    end
    if log.content and ev.message then r.content = log:content_text(ev.message.content or "") end
    return "info", "model call done in " .. secs(r.duration)
  end,
  call_aborted = function(ev, r) r.attempts = ev.attempts return "info", "model call aborted" end,
  provider_retry = function(ev, r)
    r.attempt, r.max_attempts, r.delay_ms, r.class, r.source, r.status =
      ev.attempt, ev.max_attempts, ev.delay_ms, ev.class, ev.source, ev.status
    usage_fields(r, ev.usage, "")
    return "info", string.format("provider error (attempt %d/%d), retrying in %.2fs: %s",
      ev.attempt, ev.max_attempts, (ev.delay_ms or 0) / 1000, tostring(ev.error))
  end,
  model_fallback = function(ev, r)
    r.attempt, r.class, r.status, r.from, r.to, r.reason = ev.attempt, ev.class, ev.status, ev.from, ev.to, ev.reason
    r.error = err_text(ev.error)
    usage_fields(r, ev.usage, "")
    return "warn", string.format("model %s failed for good (%s), falling back to %s: %s",
      tostring(ev.from), tostring(ev.reason), tostring(ev.to), tostring(ev.error and ev.error.cause or ev.error))
  end,
  context_compacted = function(ev, r)
    r.attempt, r.before, r.after = ev.attempt, ev.before, ev.after
    return "info", "context compacted"
  end,
  circuit_open = function(ev, r)
    r.endpoint, r.trips = ev.endpoint, ev.trips
    return "warn", "circuit opened"
  end,
  circuit_half_open = function(ev, r) r.endpoint = ev.endpoint return "info", "circuit half open" end,
  circuit_close = function(ev, r) r.endpoint = ev.endpoint return "info", "circuit closed" end,
  retry_budget_exhausted = function(ev, r)
    r.endpoint, r.tokens = ev.endpoint, ev.tokens
    return "warn", "retry budget exhausted"
  end,
  cooldown = function(ev, r) r.endpoint = ev.endpoint return "info", "endpoint cooling down" end,
  call_waiting = function(ev, r)
    r.endpoint, r.reason, r.wait_ms = ev.endpoint, ev.reason, ev.wait_ms
    return "info", string.format(ev.reason == "cooldown" and "call held by the endpoint's cooldown for %.2fs"
      or "call waiting for the endpoint's half-open probe, at most %.2fs", (ev.wait_ms or 0) / 1000)
  end,
  tool_execution_start = function(ev, r, log)
    if log.content and ev.arguments then r.content = log:content_text(json.encode(ev.arguments)) end
    return "info", "tool call started"
  end,
  tool_execution_update = function(_, _) return "debug", "tool progress" end,
  approval_requested = function(ev, r, log)
    r.approval_id = ev.approval_id
    if log.content and ev.arguments then r.content = log:content_text(json.encode(ev.arguments)) end
    return "info", "tool call waits for approval"
  end,
  approval_decided = function(ev, r)
    r.approval_id, r.approved, r.reason = ev.approval_id, ev.approved, ev.reason
    return "info", ev.approved and "tool call approved" or "tool call denied"
  end,
  tool_retry = function(ev, r)
    r.attempt, r.max_attempts, r.delay_ms = ev.attempt, ev.max_attempts, ev.delay_ms
    return "info", string.format("tool failed (attempt %d/%d), retrying in %.2fs: %s", ev.attempt,
      ev.max_attempts, (ev.delay_ms or 0) / 1000, tostring(ev.error))
  end,
  tool_execution_end = function(ev, r, log)
    r.attempts = ev.attempts
    r.duration = ev.duration and micros(ev.duration)
    if ev.error then
      r.error = err_text(ev.error)
      if log.content then r.content = log:content_text(ev.error.message or "") end
      return "info", "tool call failed"
    end
    if log.content and ev.result then r.content = log:content_text(ev.result) end
    return "info", "tool call done in " .. secs(ev.duration)
  end,
  tools_changed = function(ev, r)
    r.version = ev.version
    r.added, r.removed, r.changed = ev.added, ev.removed, ev.changed
    return "info", "tools changed"
  end,
  -- what is wrong may quote the answer: its texts only with content logging
  output_retry = function(ev, r, log)
    r.attempt, r.max_retries = ev.attempt, ev.max_retries
    r.error_count = type(ev.errors) == "table" and #ev.errors or nil
    if log.content and type(ev.errors) == "table" then r.errors = log:content_text(table.concat(ev.errors, "; ")) end
    return "info", "the answer does not match the output schema; asking again"
  end,
  tools_reload_failed = function(ev, r)
    r.file, r.line = ev.file, ev.line
    return "warn", "tool file failed to load: " .. tostring(ev.message)
  end,
}
-- The highest level each type may be logged at: what cannot pass the
-- threshold is rejected before any work.
local MOST = {
  agent_start = "info", agent_end = "error", turn_start = "debug", turn_end = "debug",
  message_start = "debug", usage = "debug", stream_reset = "debug", message_end = "warn",
  call_aborted = "info", provider_retry = "info", model_fallback = "warn", context_compacted = "info",
  circuit_open = "warn",
  circuit_half_open = "info", circuit_close = "info", retry_budget_exhausted = "warn", cooldown = "info", call_waiting = "info",
  tool_execution_start = "info", tool_execution_update = "debug", tool_retry = "info",
  tool_execution_end = "info", tools_changed = "info", tools_reload_failed = "warn", output_retry = "info",
  approval_requested = "info", approval_decided = "info",
}

-- The event types the consumer logs (events.subscribe's `types`).
M.TYPES = {}
for t in pairs(MOST) do M.TYPES[#M.TYPES + 1] = t end
table.sort(M.TYPES)

-- The highest level of each type, as a number.
local MOST_LEVEL = {}
for t, level in pairs(MOST) do MOST_LEVEL[t] = LEVELS[level] end

-- logger:consumer() -> a bus consumer writing one line per event worth
-- logging (lua/luagent/base/bus.lua); subscribe it for M.TYPES. Deltas are
-- never logged.
function Logger:consumer()
  local models = {} -- call -> model, for the events that do not name it
  -- A record no sink kept (the default sink makes its line and lets it
  -- go), emptied (as its JSON line was written, or here when no line was
  -- due): the next line fills the same table, its keys mostly the same and
  -- their slots still there, instead of a new one per call.
  local spare
  return function(ev)
    local t = ev.type
    local most, threshold = MOST_LEVEL[t], self.threshold
    if not most or most < threshold or threshold >= OFF then
      if ev.final and ev.call then models[ev.call] = nil end
      return
    end
    local r = spare
    if r then
      spare = nil
      r.event, r.agent = t, ev.agent
    else
      -- sized for a call's line at once (the fields given nil here are set
      -- below or by EVENTS[t]; a table grown field by field rehashes 5 times)
      r = { event = t, agent = ev.agent, model = nil, call = nil, trace_id = nil, span_id = nil,
        stop_reason = nil, raw_stop_reason = nil, input_tokens = nil, output_tokens = nil, attempts = nil,
        status = nil, total_input_tokens = nil, total_output_tokens = nil, duration = nil, time = nil,
        level = nil, msg = nil }
    end
    if ev.call then
      if ev.request_model then models[ev.call] = ev.request_model
      elseif t == "message_start" and ev.model and not models[ev.call] then models[ev.call] = ev.model end
      r.model, r.call = models[ev.call], ev.call
      if ev.final then models[ev.call] = nil end
      -- the call's next events are the next model's
      if t == "model_fallback" and ev.to then models[ev.call] = ev.to:match("^[^/]+/(.+)$") or ev.to end
    elseif ev.call_id then
      r.tool, r.call_id = ev.name, ev.call_id
    end
    local level, msg = EVENTS[t](ev, r, self)
    if LEVELS[level] < self.threshold then
      empty(r)
      spare = r
      return
    end
    -- the trace and span ids of the span the event belongs to, while the
    -- runtime traces (its tracer's context)
    local context = self.context
    if context then r.trace_id, r.span_id = context(ev) end
    if emit(self, level, msg, r, true) then spare = r end
  end
end

-- logger:start(): subscribes a consumer (once) to the runtime's bus:
-- events become log lines.
function Logger:start()
  if not self.unsubscribe then self.unsubscribe = self.rt.bus:subscribe(self:consumer(), { types = M.TYPES }) end
end

-- logger:stop(): unsubscribes it.
function Logger:stop()
  if self.unsubscribe then self.unsubscribe() end
  self.unsubscribe = nil
end

-- Whether events become log lines (the retry loop then leaves its own
-- line for a retry to the provider_retry event's).
function Logger:logging_events() return self.unsubscribe ~= nil end

return M
