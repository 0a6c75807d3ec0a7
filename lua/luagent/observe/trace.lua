-- Traces: a tracer a runtime owns (lua/luagent/runtime.lua, rt:trace{...}):
-- a consumer of the runtime's event bus that turns a run's events into
-- spans after the OpenTelemetry GenAI semantic conventions:
--
--   invoke_agent {agent}          INTERNAL, one per agent run
--     chat {model}                CLIENT, one per model call
--       attempt N                 CLIENT, one per attempt (HTTP request)
--     execute_tool {tool}         INTERNAL, one per tool call
--       attempt N                 INTERNAL, one per tool attempt
--
-- A model call made outside an agent is a trace of its own (chat at the
-- root). Spans are built from the events alone (their times: the events'
-- `started` / `attempt_started` fields and the moment each event is
-- published); the retry loop and the agent loop do not know about them.
-- Each tracer holds its own spans, exporters and printed tree: two
-- runtimes trace apart.
--
-- When a trace's root span ends, the trace goes to the tracer's exporters:
-- a file of OTLP JSON lines (one TracesData object per line: hex ids,
-- 64-bit integers as strings), an OTLP/HTTP JSON collector (batched, on
-- the loop, from a bounded queue; each post bounded in time and in what it
-- reads of the reply, only a 2xx a success; a collector that fails is
-- logged once per kind of failure, through the runtime's diagnostics, and
-- never slows the run), and the tree printed by `luagent run --trace` at
-- the end.
local core = require "luagent.core"
local json = require "luagent.base.json"
local secrets = require "luagent.base.secrets"
local queue = require "luagent.base.queue"
local outfile = require "luagent.base.outfile"
local errors = require "luagent.base.errors"
local http = require "luagent.base.http"

local M = {}

M.KIND = { INTERNAL = 1, SERVER = 2, CLIENT = 3 }
M.STATUS = { UNSET = 0, OK = 1, ERROR = 2 }

local Tracer = {}
Tracer.__index = Tracer
M.Tracer = Tracer

------------------------------------------------------------------------------
-- Ids
------------------------------------------------------------------------------

-- A random id of `n` hex digits (16 or 32), never all zeros, from the
-- core's own generator (host/ids.c): a script that seeds math.random with
-- a constant still gets ids of its own on every run.
local hex_id = core.random_id
M.hex_id = hex_id

------------------------------------------------------------------------------
-- Spans
------------------------------------------------------------------------------

-- A span is a plain table: name, kind, parent (a span), start, stop,
-- trace_id, span_id, status, status_message, delay (the wait after an
-- attempt), cut (the body bytes an attempt whose stream was cut had
-- received: cut_bytes below), children (nil until one is made), attempt (an attempt's
-- number), response_model and response_id (a chat span's, from its
-- answer's start), fallback_from (a chat span's: the models its call fell
-- back from) and fallback_to (an attempt's: the model its call fell back
-- to after it), and its attributes as one
-- list of names and values, attrs = {k1, v1, k2, v2, ...}, with nattrs the
-- slots in use; a pair whose value is nil is no attribute (host/jsonw.c
-- leaves it out). A list, not a map: a call sets some twenty attributes,
-- and storing into an array costs a fraction of inserting new keys into a
-- hash. Each attribute is set once.

-- new_span(name, kind, parent, start [, many]) -> span: a child of
-- `parent` (a span) or a root with a new trace id. Its attribute list has
-- room for a chat or agent span's attributes when `many`, for an
-- attempt's or a tool call's otherwise (it grows past either).
local function new_span(name, kind, parent, start, many)
  local attrs
  if many then
    -- 32 slots (a chat span fills 30): 512 bytes, as large as the pool
    -- of small blocks serves (host/main.c), not a malloc
    attrs = { nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil,
              nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil }
  else
    attrs = { nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil,
              nil, nil, nil, nil, nil, nil, nil, nil }
  end
  local s = {
    name = name, kind = kind, parent = parent, start = start or core.now(),
    trace_id = parent and parent.trace_id or hex_id(32), span_id = hex_id(16),
    attrs = attrs, nattrs = 0, children = nil, status = M.STATUS.UNSET, stop = nil, status_message = nil,
    delay = nil, attempt = nil, response_model = nil, response_id = nil, cut = nil,
    fallback_from = nil, fallback_to = nil,
  }
  if parent then
    local kids = parent.children
    if kids then kids[#kids + 1] = s else parent.children = { s } end
  end
  return s
end

local NO_CHILDREN = {} -- a leaf's children, read only

-- set(span, key, value): adds an attribute (a nil value: none).
local function set(s, k, v)
  local n = s.nattrs
  local attrs = s.attrs
  attrs[n + 1], attrs[n + 2] = k, v
  s.nattrs = n + 2
end

-- set4(span, k1, v1, ..., k4, v4): adds up to four attributes in one call
-- (the pairs left out, and those with a nil value, are none).
local function set4(s, k1, v1, k2, v2, k3, v3, k4, v4)
  local n = s.nattrs
  local a = s.attrs
  a[n + 1], a[n + 2], a[n + 3], a[n + 4], a[n + 5], a[n + 6], a[n + 7], a[n + 8] = k1, v1, k2, v2, k3, v3, k4, v4
  s.nattrs = n + 8
end

-- get(span, key) -> the attribute's value, or nil.
local function get(s, k)
  local attrs = s.attrs
  for i = 1, s.nattrs, 2 do
    if attrs[i] == k then return attrs[i + 1] end
  end
end

-- fail(span, type, message): an error status with its message, and
-- `error.type`.
local function fail(s, etype, message)
  s.status, s.status_message = M.STATUS.ERROR, message and secrets.text(tostring(message))
  set(s, "error.type", etype)
end

-- finish(span [, t]): ends the span at t (default now), once.
local function finish(s, t)
  if not s.stop then s.stop = t or core.now() end
end

-- Every span of the tree under `root`, parents before children.
local function flatten(root, out)
  out = out or {}
  out[#out + 1] = root
  for _, c in ipairs(root.children or NO_CHILDREN) do flatten(c, out) end
  return out
end


-- The TracesData text after the spans (one resource, one scope).
local RESOURCE_TAIL = "]}]}]}"

-- The TracesData text before the spans, for a service name.
local function resource_head(service_name)
  local b = { '{"resourceSpans":[{"resource":{"attributes":[' }
  for i, kv in ipairs({ { "service.name", service_name }, { "telemetry.sdk.name", "luagent" },
                        { "telemetry.sdk.language", "lua" }, { "telemetry.sdk.version", core.version } }) do
    b[#b + 1] = (i > 1 and "," or "") .. '{"key":"' .. kv[1] .. '","value":{"stringValue":'
      .. json.quote(kv[2]) .. "}}"
  end
  b[#b + 1] = ']},"scopeSpans":[{"scope":{"name":"luagent","version":' .. json.quote(core.version) .. '},"spans":['
  return table.concat(b)
end

------------------------------------------------------------------------------
-- Building spans from events
------------------------------------------------------------------------------

-- The gen_ai.usage.* attributes of a usage table.
local function usage_attrs(span, u)
  if type(u) ~= "table" then return end
  set4(span, "gen_ai.usage.input_tokens", u.input_tokens, "gen_ai.usage.output_tokens", u.output_tokens,
    "gen_ai.usage.cache_read.input_tokens", u.cache_read_tokens,
    "gen_ai.usage.cache_creation.input_tokens", u.cache_write_tokens)
end

-- once(make, bound) -> f(key): make(key), made once per key for the
-- first `bound` keys and kept; past them, made at each call (a run has a
-- few of each; a server's odd values cannot grow the table).
local function once(make, bound)
  local made, n = {}, 0
  return function(key)
    local v = made[key]
    if v == nil then
      v = make(key)
      if n < bound and key == key then made[key], n = v, n + 1 end -- (NaN is no key)
    end
    return v
  end
end

-- error.type of a failure: the classifier's class, else the error's kind.
local function error_type(err, class)
  if type(err) ~= "table" then return class or "error" end
  return err.class or class or err.kind or "error"
end

-- Kinds of a failure that can be a stream cut mid-answer (EVENTS.md,
-- "Transport failures"): the connection reset or closed, the body ended
-- before its terminator, an HTTP/2 stream reset (protocol, from curl).
local CUT_KINDS = { reset = true, eof = true, truncated = true, transport = true, protocol = true }

-- cut_bytes(err, status) -> the body bytes received, when `err` (an
-- attempt's error) is a stream cut after a 2xx status: a transport failure
-- in the body, or a body that ended before its terminator; else nil.
-- (transport and protocol only from the transport, which sets curl_code:
-- a decoder's protocol error, bad JSON, is no cut.)
local function cut_bytes(err, status)
  if type(err) ~= "table" or type(err.bytes) ~= "number" or not CUT_KINDS[err.kind] then return nil end
  if (err.kind == "transport" or err.kind == "protocol") and not (err.curl_code and err.curl_code ~= 0) then
    return nil
  end
  if err.phase ~= nil and err.phase ~= "body" then return nil end
  if type(status) == "number" and (status < 200 or status >= 300) then return nil end
  return err.bytes
end

-- A tool call's key: its agent and call id.
local function tool_key(ev) return tostring(ev.agent_id or ev.agent) .. "\0" .. tostring(ev.call_id) end

-- The event types spans are built from.
local TYPES = { "agent_start", "agent_end", "message_start", "provider_retry", "model_fallback", "message_end",
  "call_aborted",
  "tool_execution_start", "tool_retry", "tool_execution_end" }

-- builder(sinks) -> consume(ev), context(ev), headers(call, attempt,
-- opts), end_open(): a tracer's span builder, its state in the closures'
-- upvalues (a field lookup per span access costs on the event path); a
-- trace whose root ends goes to each function of the list `sinks`.
local function builder(sinks)
  local runs = {}   -- agent_id -> invoke_agent span
  local calls = {}  -- call -> chat span (its children: the attempts)
  local tools = {}  -- agent_id .. "\0" .. call_id -> {span=, n= (attempts so far), next_start=}

  -- The span that just ended, per kind (r: agent run, c: call, t: tool), so
  -- that consumers of the same event running after this one (its log line)
  -- still find its ids. One each: they run in the same publish.
  local recent, recent_key = {}, {}
  local function ended(kind, key, span) recent[kind], recent_key[kind] = span, key end
  local function just_ended(kind, key)
    return recent_key[kind] == key and recent[kind] or nil
  end

  -- A trace's root ended: every sink gets the tree.
  local function root_done(root)
    for _, sink in ipairs(sinks) do sink(root) end
  end

  -- Span names: "attempt N" per N, "chat MODEL" per model.
  local attempt_name = once(function(n) return "attempt " .. n end, 64)
  local chat_name = once(function(model) return "chat " .. model end, 256)

  -- gen_ai.response.finish_reasons: one list per reason (a span's
  -- attributes are never changed after they are set).
  local finish_list = once(function(reason) return json.array { reason } end, 64)
  local function finish_reasons(reason)
    if reason == nil then return json.array {} end
    return finish_list(reason)
  end

  -- The chat span of call `id` (made on first sight).
  local function call_of(id, agent_id, t)
    local s = calls[id]
    if s then return s end
    local parent = agent_id and runs[agent_id]
    s = new_span("chat", M.KIND.CLIENT, parent, t, true)
    set(s, "gen_ai.operation.name", "chat")
    calls[id] = s
    return s
  end

  -- The span of attempt `n` of chat span `c` (made on first sight).
  local function attempt_of(c, n, t)
    local kids = c.children
    if kids then
      for i = #kids, 1, -1 do
        if kids[i].attempt == n then return kids[i] end
      end
    end
    local a = new_span(attempt_name(n), M.KIND.CLIENT, c, t)
    a.attempt = n
    set(a, "http.request.method", "POST")
    if n > 1 then set(a, "http.request.resend_count", n - 1) end
    return a
  end

  -- {host, port} of a base URL (parsed once per URL), or nil.
  local servers = {} -- base URL -> {host, port}
  local function server_of(url)
    if type(url) ~= "string" then return nil end
    local hp = servers[url]
    if not hp then
      local host, port = url:match("^%a[%w+.-]*://%[?([^/%]]+)%]?:(%d+)")
      if not host then host = url:match("^%a[%w+.-]*://([^/:]+)") end
      hp = { host, math.tointeger(tonumber(port)) or (url:match("^https") and 443 or 80) }
      servers[url] = hp
    end
    return hp
  end

  local H = {} -- per event type

  function H.agent_start(ev, now)
    -- a sub-agent's run nests under its parent's execute_tool span
    local under = ev.parent_call_id ~= nil and tools[tostring(ev.parent_agent_id) .. "\0" .. tostring(ev.parent_call_id)]
    -- (a handoff's target: under the run it was handed over from)
    local parent = under and under.span or (ev.parent_agent_id ~= nil and runs[ev.parent_agent_id]) or nil
    local s = new_span("invoke_agent " .. tostring(ev.agent), M.KIND.INTERNAL, parent, now, true)
    set(s, "gen_ai.operation.name", "invoke_agent")
    set(s, "gen_ai.agent.name", ev.agent)
    set(s, "gen_ai.agent.id", ev.agent_id)
    runs[ev.agent_id or ev.agent] = s
  end

  function H.agent_end(ev, now)
    local key = ev.agent_id or ev.agent
    local s = runs[key]
    if not s then return end
    runs[key] = nil
    ended("r", key, s)
    usage_attrs(s, ev.usage)
    set(s, "luagent.stop_reason", ev.stop_reason)
    set(s, "luagent.turns", ev.turns)
    if ev.cost and ev.cost.total then set(s, "luagent.cost", ev.cost.total) end
    if ev.stop_reason == "error" then fail(s, error_type(ev.error), ev.error and ev.error.message or ev.reason) end
    finish(s, now)
    if not s.parent then root_done(s) end
  end

  -- A model call's events carry its number; an answer a resumed run replays
  -- from its journal has none (no request was made): it is no span.
  function H.message_start(ev, now)
    if ev.call == nil then return end
    local s = call_of(ev.call, ev.agent_id, now)
    s.response_model, s.response_id = ev.model, ev.id
  end

  function H.provider_retry(ev, now)
    if ev.call == nil then return end
    local c = call_of(ev.call, ev.agent_id, ev.started or now)
    local a = attempt_of(c, ev.attempt, ev.attempt_started or now)
    a.start = ev.attempt_started or a.start
    set(a, "http.response.status_code", ev.status)
    set(a, "luagent.retry.delay_ms", ev.delay_ms)
    set(a, "luagent.retry.source", ev.source)
    usage_attrs(a, ev.usage)
    fail(a, ev.class or "error", ev.error)
    a.cut = cut_bytes(ev.error, ev.status)
    a.delay = ev.delay_ms and ev.delay_ms / 1000
    finish(a, now)
  end

  -- The call gave a model up for the next (EVENTS.md, model_fallback): the
  -- model's last attempt ends here when it failed (a refusal before any
  -- attempt has none), naming its model and the next; the chat span keeps
  -- what it fell back from, for its luagent.fallback.from.
  function H.model_fallback(ev, now)
    if ev.call == nil then return end
    local c = call_of(ev.call, ev.agent_id, ev.started or now)
    local from = c.fallback_from
    if from then from[#from + 1] = ev.from else c.fallback_from = json.array { ev.from } end
    if not ev.attempt then return end
    local a = attempt_of(c, ev.attempt, ev.attempt_started or now)
    a.start = ev.attempt_started or a.start
    set4(a, "http.response.status_code", ev.status, "gen_ai.request.model", ev.request_model,
      "luagent.fallback.to", ev.to)
    usage_attrs(a, ev.usage)
    -- the attempt's own error, as a retried attempt's (provider_retry)
    fail(a, ev.class or "error", ev.error and (ev.error.cause or ev.error))
    a.cut = cut_bytes(ev.error and ev.error.cause or ev.error, ev.status)
    a.fallback_to = ev.to
    finish(a, now)
  end

  -- The call's final event (message_end final, or call_aborted).
  local function call_end(ev, now)
    if ev.call == nil then return end
    local s = call_of(ev.call, ev.agent_id, ev.started or now)
    calls[ev.call] = nil
    ended("c", ev.call, s)
    if ev.started then s.start = ev.started end
    local n = ev.attempts or 0
    -- the last attempt, unless provider_retry ended it already (the retry
    -- it announced was then refused: budget, breaker, deadline, a gate)
    local kids = s.children
    local last = kids and kids[#kids]
    if n > 0 and not (last and last.attempt == n and last.stop) then
      local a = attempt_of(s, n, ev.attempt_started or now)
      if ev.attempt_started then a.start = ev.attempt_started end
      set(a, "http.response.status_code", ev.status)
      usage_attrs(a, ev.usage)
      if ev.stop_reason == "error" then
        fail(a, error_type(ev.error and ev.error.cause or ev.error), ev.error and ev.error.message)
        a.cut = cut_bytes(ev.error and ev.error.cause or ev.error, ev.status)
      elseif ev.stop_reason == "aborted" then
        fail(a, "cancelled", "aborted")
      end
      finish(a, now)
    end
    s.name = chat_name(tostring(ev.request_model or s.response_model or ""))
    local answered = ev.stop_reason ~= "error" and ev.stop_reason ~= "aborted"
    -- the call names its provider as its adapter says (EVENTS.md, provider_name)
    set4(s, "gen_ai.provider.name", ev.provider_name or ev.provider_kind,
      "gen_ai.request.model", ev.request_model,
      "gen_ai.response.model", answered and s.response_model or nil,
      "gen_ai.response.id", answered and s.response_id or nil)
    usage_attrs(s, ev.total_usage)
    local hp = server_of(ev.endpoint)
    set4(s, "gen_ai.response.finish_reasons", finish_reasons(ev.raw_stop_reason or ev.stop_reason),
      "server.address", hp and hp[1], "server.port", hp and hp[2], "luagent.call", ev.call)
    set(s, "luagent.attempts", n)
    if s.fallback_from then set(s, "luagent.fallback.from", s.fallback_from) end
    set(s, "gen_ai.output.type", ev.output_type) -- "json": structured output
    if ev.stop_reason == "error" then
      fail(s, error_type(ev.error), ev.error and ev.error.message)
    elseif ev.stop_reason == "aborted" then
      fail(s, "cancelled", "aborted")
    end
    finish(s, now)
    if not s.parent then root_done(s) end
  end

  function H.message_end(ev, now)
    if ev.final then call_end(ev, now) end
  end
  H.call_aborted = call_end

  function H.tool_execution_start(ev, now)
    local parent = runs[ev.agent_id or ev.agent]
    local s = new_span("execute_tool " .. tostring(ev.name), M.KIND.INTERNAL, parent, now)
    set(s, "gen_ai.operation.name", "execute_tool")
    set(s, "gen_ai.tool.name", ev.name)
    set(s, "gen_ai.tool.call.id", ev.call_id)
    set(s, "gen_ai.tool.type", "function")
    tools[tool_key(ev)] = { span = s, n = 0, next_start = now }
  end

  -- Ends the next attempt of tool call `t` now: from the end of the wait
  -- before it, with its error and the wait after it, if any.
  local function tool_attempt(t, now, err, delay)
    t.n = t.n + 1
    -- the attempt began after the wait (delay_ms is rounded: never past now)
    local a = new_span(attempt_name(t.n), M.KIND.INTERNAL, t.span, math.min(t.next_start, now))
    a.attempt = t.n
    if err then fail(a, err.kind or "tool_error", err.message or err) end
    if delay then
      set(a, "luagent.retry.delay_ms", math.floor(delay * 1000 + 0.5))
      a.delay = delay
    end
    finish(a, now)
    t.next_start = now + (delay or 0)
  end

  function H.tool_retry(ev, now)
    local t = tools[tool_key(ev)]
    if not t then return end
    local kind = tostring(ev.error):match("^([%w_]+):") or "tool_error"
    tool_attempt(t, now, { kind = kind, message = ev.error }, (ev.delay_ms or 0) / 1000)
  end

  function H.tool_execution_end(ev, now)
    local key = tool_key(ev)
    local t = tools[key]
    if not t then return end
    tools[key] = nil
    ended("t", key, t.span)
    if (ev.attempts or 0) > t.n then tool_attempt(t, now, ev.error) end
    if ev.error then fail(t.span, ev.error.kind or "tool_error", ev.error.message) end
    finish(t.span, now)
    if not t.span.parent then root_done(t.span) end
  end

  -- The bus consumer.
  local function consume(ev)
    local h = H[ev.type]
    if h then h(ev, core.now()) end
  end

  -- context(ev) -> trace_id, span_id of the span an event belongs to (for
  -- log lines), or nil.
  local function context(ev)
    local s
    if ev.call then
      s = calls[ev.call] or just_ended("c", ev.call)
    elseif ev.call_id then
      local t = tools[tool_key(ev)]
      s = t and t.span or just_ended("t", tool_key(ev))
    end
    local key = ev.agent_id or ev.agent
    s = s or (key and (runs[key] or just_ended("r", key)))
    if s then return s.trace_id, s.span_id end
  end

  -- headers(call, attempt, opts) -> {traceparent = ...} for an attempt's
  -- request (W3C Trace Context): the attempt's own span is the parent.
  local function headers(call, attempt, opts)
    local c = call_of(call, opts and opts.agent_id, core.now())
    local a = attempt_of(c, attempt, core.now())
    return { traceparent = "00-" .. a.trace_id .. "-" .. a.span_id .. "-01" }
  end

  -- end_open(): the agent runs still open (a run cut short) end now and
  -- go to the sinks.
  local function end_open()
    for key, s in pairs(runs) do
      finish(s)
      runs[key] = nil
      root_done(s)
    end
  end

  return consume, context, headers, end_open
end

------------------------------------------------------------------------------
-- The tree, for `luagent run --trace`
------------------------------------------------------------------------------

-- duration(seconds) -> "37.968s", "1.3ms", "191µs" (host/timetext.c, as the
-- log writes them); "?" for no number
local duration_text = core.duration_text
function M.duration(d)
  if type(d) ~= "number" then return "?" end
  return duration_text(d)
end
local terminal_text = core.terminal_text

-- A tree line's indent per depth (deeper ones are made as needed).
local INDENT = {}
for depth = 0, 15 do INDENT[depth] = string.rep("  ", depth) end

-- Children in start order (ties: by span id).
local function by_start(a, b)
  if a.start ~= b.start then return a.start < b.start end
  return a.span_id < b.span_id
end

-- Hands emit(line) each line of the tree under `root`: each span with its
-- duration, children indented in start order; attempts say their status
-- or error and the wait after (http_note(status) -> "HTTP 503"; a stream
-- cut mid-answer: "stream cut after N bytes"; another failure of a 2xx
-- answer: "HTTP 200 <error.type>"). Lines are not scrubbed.
local function tree_lines(root, emit, depth, http_note)
  local d = (root.stop or root.start) - root.start
  local head = (INDENT[depth] or string.rep("  ", depth)) .. root.name .. " " .. M.duration(d)
  local tool = false
  if root.attempt then
    local status = get(root, "http.response.status_code")
    local note = status and http_note(status)
    if root.status == M.STATUS.ERROR then
      local first = note or root.status_message or get(root, "error.type")
      if root.cut then
        -- a 200 whose stream was cut mid-answer is no "HTTP 200"
        first = "stream cut after " .. root.cut .. " bytes"
      elseif note and status >= 200 and status < 300 then
        -- an answer that failed otherwise (an error event in the stream)
        first = note .. " " .. tostring(get(root, "error.type") or "error")
      end
      local more = root.delay and ("retried after " .. M.duration(root.delay))
        or root.fallback_to and ("fell back to " .. root.fallback_to) or "failed"
      note = first and (first .. ", " .. more) or more
    end
    emit(note and (head .. "  " .. note) or head)
  else
    tool = get(root, "gen_ai.operation.name") == "execute_tool"
    if root.status == M.STATUS.ERROR then head = head .. "  error: " .. tostring(get(root, "error.type")) end
    if root.fallback_from then head = head .. "  after " .. table.concat(root.fallback_from, ", ") end
    emit(head)
  end
  local kids = root.children or NO_CHILDREN
  -- a tool call that ran once, fine: its one attempt says nothing more
  if tool and #kids == 1 and kids[1].status ~= M.STATUS.ERROR then return end
  if #kids > 1 then
    kids = table.move(kids, 1, #kids, 1, {})
    table.sort(kids, by_start)
  end
  for _, c in ipairs(kids) do tree_lines(c, emit, depth + 1, http_note) end
end

------------------------------------------------------------------------------
-- Exporters
------------------------------------------------------------------------------

-- How long a file exporter's line stays open, in seconds, as the
-- OpenTelemetry SDK's batch span processor waits: the spans of the traces
-- that finish within it of the first go out as one TracesData line, or
-- sooner once a batch of them waits (the exporter's `batch` option: the
-- runtime's otlp_batch setting, OTEL_BSP_MAX_EXPORT_BATCH_SIZE, which the
-- SDK's processor applies to every exporter, a file's too).
M.FILE_DELAY = 1

-- How many finished traces wait to be turned into text together (the
-- OTLP file's JSON, the --trace tree's lines). Run back to back, the
-- writer's code and branches stay warm: one at a time, between the
-- chunks of a streaming run, it cost twice as much. A trace is written as
-- it is when its batch is turned into text: an event that still changes
-- it after its root ended (a call ending after its agent run) shows. The
-- default of an exporter's `render_batch` option.
M.RENDER_BATCH = 32

-- The spans of the tree under `s`.
local function count_spans(s)
  local n, kids = 1, s.children
  if kids then
    for i = 1, #kids do n = n + count_spans(kids[i]) end
  end
  return n
end

-- tracer:file_exporter(path [, opts]) -> sink, close | nil, message:
-- TracesData lines of finished traces, a line ending M.FILE_DELAY seconds
-- after its first trace or once opts.batch spans wait (default: the
-- runtime's otlp_batch setting); close() ends the line that is open and
-- closes the file: true, or nil and the message of a write that failed.
-- Finished traces wait, opts.render_batch at most (M.RENDER_BATCH), and are
-- turned into JSON together (one string, scrubbed); the texts wait until
-- opts.chunk bytes of them (M.FILE_CHUNK) are there and go out together: little
-- of a batch stays in the Lua heap, where every object kept makes each
-- collection of a streaming run longer, and a text larger than stdio's
-- 4 KiB buffer goes to the file in one write (glibc ignores the size
-- setvbuf asks for). A line is whole in the file once its batch ends (its
-- tail and a flush); until then the file may end inside it. A write that
-- fails (a full disk) is logged once (the runtime's diagnostics); the file
-- then takes no more (lua/luagent/base/outfile.lua) and later traces are
-- dropped unrendered.
M.FILE_CHUNK = 16384
function Tracer:file_exporter(path, opts)
  opts = opts or {}
  local tracer = self
  local batch = opts.batch or tracer.rt.settings:get("otlp_batch")
  local render_batch, chunk = opts.render_batch or M.RENDER_BATCH, opts.chunk or M.FILE_CHUNK
  local out, err = outfile.open(path)
  if not out then return nil, err end
  local spans, timer = 0, nil -- spans in the open line; its batch's timer
  local roots = {}            -- finished traces of the open line, not yet text
  local opened = false        -- whether the open line's head is written
  local texts, bytes = {}, 0  -- what waits to be written, and its size
  local told = false          -- whether a failed write was logged
  -- logs the file's first failure, once (ok: what a write answered)
  local function check(ok, message)
    if ok or told then return end
    told = true
    tracer.diag:write("warn", "trace: the OTLP file export failed: " .. tostring(message) .. "; later spans are not written")
  end
  local function write_out()
    if bytes == 0 then return end
    local pieces = texts
    texts, bytes = {}, 0
    check(out:write(table.unpack(pieces))) -- (each piece as it is: no joined copy)
  end
  local function add(text)
    texts[#texts + 1] = text
    bytes = bytes + #text
    if bytes >= chunk then write_out() end
  end
  local function render()
    if roots[1] == nil then return end
    local batch = roots -- taken first: a batch that fails to render is not tried again
    roots = {}
    if out.error then return end -- nowhere to go
    local text = secrets.text((core.otlp_traces(batch, tracer.offset)))
    add(opened and "," or tracer.head)
    opened = true
    add(text)
  end
  local function end_line()
    if timer then timer:cancel() end -- the line ends before its delay
    timer = nil
    if spans == 0 then return end
    spans = 0
    -- what rendered before a batch that fails still ends its line
    local ok, err = pcall(render)
    if opened then -- (not when every trace of the line failed to render)
      add(RESOURCE_TAIL .. "\n")
      write_out()
      check(out:flush())
      opened = false
    end
    if not ok then error(err, 0) end
  end
  return function(root)
    if out.error then return end -- the file failed: the trace is dropped
    roots[#roots + 1] = root
    spans = spans + count_spans(root)
    if spans >= batch then return end_line() end
    if #roots >= render_batch then render() end
    if not timer then
      timer = core.spawn(function()
        core.sleep(M.FILE_DELAY)
        timer = nil
        end_line()
      end)
      timer:set_daemon(true)
    end
  end, function()
    local ok, err = pcall(end_line)
    local closed, message = out:close()
    check(closed, message)
    if not ok then error(err, 0) end
    return closed, message
  end
end

-- The URL spans are posted to: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT as is,
-- else a base URL (OTEL_EXPORTER_OTLP_ENDPOINT, --otlp URL) plus
-- /v1/traces unless it already ends so.
function M.traces_url(base)
  if base:match("/v1/traces/?$") then return base end
  return (base:gsub("/+$", "")) .. "/v1/traces"
end

-- "k1=v1,k2=v2" (OTEL_EXPORTER_OTLP_HEADERS) -> headers; values are
-- registered as secrets (they are usually a collector's credentials).
local function parse_headers(text)
  local h = {}
  for pair in (text or ""):gmatch("[^,]+") do
    local k, v = pair:match("^%s*([^=]-)%s*=%s*(.-)%s*$")
    if k and k ~= "" then
      v = v:gsub("%%(%x%x)", function(x) return string.char(tonumber(x, 16)) end)
      h[k:lower()] = v
      secrets.register(v)
    end
  end
  return h
end

-- What is read of a collector's reply: its status says whether the spans
-- were taken, and the start of its body, why not. A reply that never ends
-- (a broken proxy streaming forever) is read no further: once held whole,
-- it took gigabytes and stalled the run.
M.REPLY_MAX = 4096
-- How many kinds of failure (an HTTP status, a transport kind) an exporter
-- reports, each once: a collector failing every batch says so once per
-- kind, not per batch.
M.REPORTED_KINDS = 16

-- post_once(x, body, total) -> true | nil, kind, message: one POST of
-- `body` to the exporter's collector within `total` seconds. Only a 2xx
-- status is a success: a redirect (3xx, not followed) or an error status
-- is a failure of kind "HTTP <status>", its message the reply's first
-- bytes; a transport failure (refused, a timeout) is of its error's kind.
-- At most M.REPLY_MAX bytes of the reply are read.
local function post_once(x, body, total)
  local resp, err = http.request { method = "POST", url = x.url, headers = x.headers, body = body,
    timeout = { connect = math.min(2, total), total = total }, http_errors = false, max_buffer = M.REPLY_MAX }
  if not resp then return nil, err.kind or "transport", tostring(err) end
  local reply <close> = resp
  local ok, text = pcall(resp.body, resp, M.REPLY_MAX)
  if not ok then
    if not errors.is(text) or errors.is_cancel(text) then error(text, 0) end
    return nil, text.kind, tostring(text)
  end
  local status = resp.status
  if status >= 200 and status < 300 then return true end
  local why = string.format("HTTP %d", status)
  local location = status >= 300 and status < 400 and resp.headers.location
  if location then why = why .. ", a redirect to " .. location .. ", not followed" end
  text = text:gsub("%s+", " "):sub(1, 200)
  if text ~= "" and text ~= " " then why = why .. ": " .. text end
  return nil, string.format("HTTP %d", status), why
end

-- tracer:http_exporter{url=, max_queue=, batch=, timeout=, headers=} ->
-- exporter with .sink(root), .flush(seconds) and the counts sent, dropped,
-- failures.
-- Spans wait in a bounded queue; one sender task at a time posts them in
-- batches, each post bounded by `timeout` seconds (the connection by 2 of
-- them) and by what it reads of the reply
-- (M.REPLY_MAX); a batch that fails (a status that is not 2xx, no answer
-- in time) is dropped and counted, each kind of failure logged once, and
-- the run goes on at its own pace. Failures are logged through the
-- runtime's diagnostics. What opts does not give is the runtime's setting:
-- otlp_max_queue, otlp_batch, otlp_timeout, otlp_headers.
function Tracer:http_exporter(opts)
  local tracer, diag, settings = self, self.diag, self.rt.settings
  local x = {
    url = opts.url, max_queue = opts.max_queue or settings:get("otlp_max_queue"),
    batch = opts.batch or settings:get("otlp_batch"), timeout = opts.timeout or settings:get("otlp_timeout"),
    queue = queue.new(), sent = 0, dropped = 0, failures = 0,
    headers = parse_headers(opts.headers or settings:get("otlp_headers")),
    reported = {}, kinds = 0, -- the kinds of failure logged
  }
  x.headers["content-type"] = "application/json"

  -- Logs a failure of `kind` the first time (up to M.REPORTED_KINDS kinds).
  local function report(kind, message)
    if x.reported[kind] or x.kinds >= M.REPORTED_KINDS then return end
    x.reported[kind], x.kinds = true, x.kinds + 1
    diag:write("warn", "OTLP export to " .. x.url .. " failed (" .. message
      .. "); its spans are dropped and counted, the run goes on")
  end

  -- Posts one batch within `total` seconds; a failure drops it (counted)
  -- and is logged the first time of its kind.
  local function post(spans, total)
    x.inflight = #spans
    local ran, ok, kind, message = pcall(post_once, x, tracer:traces_data(spans), total)
    x.inflight = 0
    if not ran then
      if errors.is_cancel(ok) then error(ok, 0) end
      kind, message = "error", tostring(ok) -- (a raise: the sender goes on)
    elseif ok then
      x.sent = x.sent + #spans
      return true
    end
    x.failures = x.failures + 1
    x.dropped = x.dropped + #spans
    report(kind, message)
    return false
  end

  -- The next batch off the queue, or nil when it is empty.
  local function take()
    local n = math.min(x.batch, x.queue:len())
    if n <= 0 then return nil end
    local spans = {}
    for i = 1, n do spans[i] = x.queue:pop() end
    return spans
  end

  -- The sender task: posts batches until the queue is empty.
  local function sender()
    while true do
      local spans = take()
      if not spans then break end
      post(spans, x.timeout)
    end
    x.task = nil
  end

  -- sink(root): queues a finished trace's spans (over the bound: dropped,
  -- counted) and starts the sender when none runs.
  function x.sink(root)
    for _, s in ipairs(flatten(root)) do
      if x.queue:len() >= x.max_queue then
        x.dropped = x.dropped + 1
        x.overflow = (x.overflow or 0) + 1
      else
        x.queue:push(s)
      end
    end
    if not x.task then
      x.task = core.spawn(sender)
      x.task:set_daemon(true)
    end
  end

  -- flush(seconds): at the end of a run, posts what is left, bounded in
  -- time (a sender still running keeps its batch; a failed collector gets
  -- one more short try).
  function x.flush(seconds)
    local function body()
      local limit = core.now() + seconds
      while x.task and core.now() < limit do core.sleep(0.01) end
      while true do
        local left = limit - core.now()
        if left <= 0.05 then break end
        local spans = take()
        if not spans then break end
        post(spans, math.min(x.timeout, left))
      end
    end
    if core.current() then
      body() -- called from a task: wait here
    else
      core.spawn(body):join() -- drives the loop until this flush is done, not every task
    end
    if x.task then
      -- a post still waiting on the collector: its spans are lost too
      x.task:cancel()
      x.dropped = x.dropped + (x.inflight or 0)
      if not next(x.reported) then
        x.reported.unanswered = true
        diag:write("warn", string.format("OTLP export to %s: the collector did not answer (the run's end waited %g s)",
          x.url, seconds))
      end
    end
    local lost = x.queue:len()
    if lost > 0 then x.dropped = x.dropped + lost end
    if x.dropped > 0 then
      diag:write("warn", string.format("OTLP export to %s: %d span(s) sent, %d dropped (%d over the queue bound of %d)",
        x.url, x.sent, x.dropped, x.overflow or 0, x.max_queue))
    end
  end
  return x
end

------------------------------------------------------------------------------
-- The tracer: making, exporting, stopping
------------------------------------------------------------------------------

-- The spans' OTLP JSON objects (written in C, host/jsonw.c),
-- comma-separated: a piece of a TracesData spans array.
function Tracer:spans_json(spans)
  local b, offset = {}, self.offset
  for i, s in ipairs(spans) do b[i] = core.otlp_span(s, offset) end
  return table.concat(b, ",")
end

-- TracesData JSON text for a list of spans, scrubbed of keys.
function Tracer:traces_data(spans)
  return secrets.text(self.head .. self:spans_json(spans) .. RESOURCE_TAIL)
end

-- new(rt [, opts]) -> tracer | nil, message: a tracer of runtime rt, its
-- span builder subscribed to rt's bus, with the exporters opts asks for
-- (tracer:export); its warnings go to rt.diag. With no exporter, spans
-- still give log lines their ids (the runtime hands tracer.context_of to
-- its logger) and requests their traceparent (tracer:headers). nil and a
-- message, and nothing subscribed, when an exporter cannot be opened.
-- Spans name their service opts.service_name, else the runtime's
-- service_name setting (OTEL_SERVICE_NAME).
function M.new(rt, opts)
  if type(rt) ~= "table" or not rt.bus or not rt.diag or not rt.settings then
    error("trace.new: expects a runtime", 2)
  end
  local self = setmetatable({
    rt = rt, diag = rt.diag,
    offset = core.wall() - core.now(), -- epoch seconds minus loop-clock seconds, fixed as tracing starts
    service_name = opts and opts.service_name or rt.settings:get("service_name"),
    sinks = {},       -- function(root): called when a trace's root ends
    exporters = {},   -- the OTLP/HTTP exporters, flushed at stop
    closers = {},     -- what stop runs: files closed, the tree's last batch rendered
    printed = nil,    -- the tree's text so far, when asked for
    running = true,
    on_stop = nil,    -- function(tracer), told once when the tracer stops (the runtime's)
  }, Tracer)
  self.head = resource_head(self.service_name)
  local consume, context, headers, end_open = builder(self.sinks)
  self.context_of, self.headers_of, self.end_open = context, headers, end_open
  local ok, err = self:export(opts)
  if not ok then return nil, err end
  -- an annotator: it runs before the log lines that use its ids
  self.unsubscribe = rt.bus:subscribe(consume, { annotate = true, types = TYPES })
  return self
end

-- tracer:export{tree=bool, file=path, url=base URL, headers="k=v,..",
-- max_queue=, batch=, timeout=, render_batch=, file_chunk=} -> true | nil,
-- message: adds the exporters asked for (the tree at most once). `batch`
-- bounds the spans of a post and of a file's line alike; what is not given
-- is the runtime's setting (otlp_batch, ...) or the module's constant
-- (M.RENDER_BATCH, M.FILE_CHUNK).
function Tracer:export(opts)
  opts = opts or {}
  if not self.running then error("trace: this tracer is stopped", 2) end
  local sinks = self.sinks
  if opts.file then
    local sink, close = self:file_exporter(opts.file, { batch = opts.batch, render_batch = opts.render_batch,
      chunk = opts.file_chunk })
    if not sink then return nil, "cannot open '" .. opts.file .. "': " .. tostring(close) end
    sinks[#sinks + 1] = sink
    self.closers[#self.closers + 1] = close
  end
  if opts.url then
    local x = self:http_exporter { url = M.traces_url(opts.url), headers = opts.headers, max_queue = opts.max_queue,
      batch = opts.batch, timeout = opts.timeout }
    sinks[#sinks + 1] = x.sink
    self.exporters[#self.exporters + 1] = x
  end
  if opts.tree and not self.printed then
    -- kept as text, in a temporary file (the spans can go, and a long
    -- run's tree does not grow the Lua heap); in memory if there is none
    local printed = io.tmpfile() or { write = function(buf, ...) for _, text in ipairs({ ... }) do buf[#buf + 1] = text end end }
    self.printed = printed
    local http_note = once(function(status) return "HTTP " .. status end, 64) -- "HTTP 503", per status
    -- names, models and messages come from models, tools and servers:
    -- escaped for the terminal the tree is printed on (host/termtext.c)
    local function emit(line) printed:write(terminal_text(secrets.text(line)), "\n") end
    local roots = {} -- finished traces whose tree lines are not yet in `printed`
    local render_batch = opts.render_batch or M.RENDER_BATCH
    local function render()
      local batch = roots -- taken first, as the file exporter's
      roots = {}
      for i = 1, #batch do tree_lines(batch[i], emit, 0, http_note) end
    end
    sinks[#sinks + 1] = function(root)
      roots[#roots + 1] = root
      if #roots >= render_batch then render() end
    end
    self.closers[#self.closers + 1] = render
  end
  return true
end

-- tracer:tree_text() -> the tree's text so far (every finished trace, with
-- render_batch = 1; those still in a batch are not in it), "" when the tree
-- is not asked for: `luagent chat`'s /trace reads it while it runs.
function Tracer:tree_text()
  local printed = self.printed
  if not printed then return "" end
  if io.type(printed) ~= "file" then return table.concat(printed) end
  printed:flush()
  local at = printed:seek("cur")
  printed:seek("set")
  local text = printed:read("a") or ""
  printed:seek("set", at)
  return text
end

-- tracer:context(ev) -> trace_id, span_id of the span an event belongs to
-- (for log lines), or nil. (tracer.context_of is the same, as a function.)
function Tracer:context(ev) return self.context_of(ev) end

-- tracer:headers(call, attempt, opts) -> {traceparent = ...} for an
-- attempt's request (W3C Trace Context): the attempt's own span is the
-- parent.
function Tracer:headers(call, attempt, opts) return self.headers_of(call, attempt, opts) end

-- tracer:stop([out [, flush_seconds]]) -> true | nil, message: ends
-- tracing: spans still open (a run cut short) end now, the collectors get
-- what is queued (within flush_seconds, default 1), files close and the tree
-- of every trace is written to `out` (a file, when `--trace`). nil and a
-- message when the OTLP file could not be written (logged once when it
-- happened). Stopping twice is harmless; a stopped tracer takes no more
-- exporters.
function Tracer:stop(out, flush_seconds)
  if not self.running then return true end
  self.running = false
  self.end_open()
  for _, x in ipairs(self.exporters) do x.flush(flush_seconds or 1) end
  local failure
  for _, close in ipairs(self.closers) do
    local ok, closed, message = pcall(close) -- one that fails must not keep the others or the tree
    if not ok then self.diag:write("warn", "trace: an exporter failed at the end: " .. secrets.text(tostring(closed))) end
    if ok and closed == nil and message then failure = failure or message end
  end
  local printed = self.printed
  if printed and out then
    if io.type(printed) == "file" then
      printed:seek("set")
      for text in function() return printed:read(65536) end do out:write(text) end
    else
      out:write(table.concat(printed))
    end
  end
  if io.type(printed) == "file" then printed:close() end
  self.unsubscribe()
  self.printed, self.exporters, self.closers = nil, {}, {}
  if self.on_stop then self.on_stop(self) end
  if failure then return nil, failure end
  return true
end

return M
