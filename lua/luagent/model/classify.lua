-- The error classifier: decides whether a failed model call is worth another
-- attempt. classify(err, ctx, policy) applies seven ordered rules; the first
-- that matches decides:
--
--   1. The caller's own cancellation or deadline: never retried.
--   2. The error's own answer (a boolean `retryable` on the record: a final
--      error, a custom adapter's or a tool's), then the policy's classify
--      hooks, in order (a hook may return nil to defer).
--   3. HTTP statuses (429 always rate_limited, whatever the body).
--   4. In-stream errors, by their structured type/code/status only.
--   5. Transport failures and per-attempt timeouts: retried.
--   6. Unusable replies (empty, or only leaked tool-call markup): retried
--      while ctx.attempt <= policy.unusable_retries.
--   7. Anything else: permanent.
--
-- The decision is {class=, retryable=, retry_after=, reason=}: `class` names
-- the kind of failure (the list is M.classes), `retry_after` is the server's
-- requested wait in seconds (retryable decisions only, nil when none) and
-- `reason` is a short text that names the rule.
local core = require "luagent.core"
local cjson = require "cjson.safe"
local policies = require "luagent.model.policy"
local registry = require "luagent.model.provider"

local M = {}

-- Every class the default rules produce, and whether it is retryable when a
-- hook names the class without saying `retryable`.
M.classes = {
  rate_limited = true,      -- 429, or a structured in-stream rate limit
  overloaded = true,        -- 503, 529, or an in-stream overload
  server = true,            -- 408, 409, 500, 502, 504 (other 5xx: not retried)
  transport = true,         -- the connection failed; the request may be fine
  timeout = true,           -- an attempt's own timeout (attempt, idle, ...)
  payment = false,          -- 402; retried only for an in-flight budget
  auth = false,             -- 401, 403
  context_overflow = false, -- the request is too long: compact, do not resend
  client = false,           -- any other 4xx: the request is wrong
  unusable = false,         -- a 200 with nothing usable in it
  cancelled = false,        -- the caller cancelled
  deadline = false,         -- the caller's deadline passed
  transient = true,         -- the error said retryable = true and named no class
  permanent = false,        -- nothing above matched, or the error said retryable = false
}

-- Rule 1: timeouts whose `which` is the caller's deadline. Every other
-- `which` (attempt, idle, first_byte, connect) is one attempt's timeout.
M.caller_deadlines = { deadline = true, total_deadline = true }

-- Rule 3: statuses retried as server errors. 429, 503, 529 and 402 have
-- rules of their own.
M.retry_statuses = { [408] = true, [409] = true, [500] = true, [502] = true, [504] = true }

-- Rules 3 and 4: phrases that mean the request exceeds the model's context
-- (matched lowercased, anywhere in the body or message): these, no one
-- format's, and every registered wire format's (its adapter's
-- overflow_phrases, lua/luagent/model/provider.lua). Every format's apply
-- to every error: a proxy relays its upstream's words.
M.overflow_phrases = {
  "context length exceeded",
  "too many tokens",
  "token limit exceeded",
}

-- Rule 4: structured in-stream values (type, code or status, lowercased):
-- these, no one format's, and those a wire format classes so (its
-- adapter's stream_errors). Free text is never read for these: a message
-- can mention a rate limit without being one.
M.stream_rate_limited = { too_many_requests = true, rate_limit = true }
M.stream_overloaded = { unavailable = true, ["503"] = true, ["529"] = true }

-- Rules 3 and 4: what the registered wire formats add to the lists above,
-- and (rule 3) the limit sources of a 402 that refuses only for the
-- requests in flight, which is retried.
local wire = registry.wire

-- Rule 5: error kinds that mean the connection failed, not the request.
-- `protocol` (malformed framing, an oversized line or event) is not here: a
-- server that sends a malformed stream sends it again, so it is permanent
-- (as in yoagent); a policy hook can decide otherwise.
M.transport_kinds = { refused = true, reset = true, dns = true, tls = true, eof = true, truncated = true }

-- Rule 5: curl codes that mean the connection failed, whatever kind the
-- record has (lua/luagent/base/http.lua names kinds from curl's facts): a
-- connect that failed other than by a refusal (kind `transport`: a host or
-- network unreachable), and HTTP/2's framing and stream errors (kind
-- `protocol`: an edge resetting a stream, RST_STREAM, or the connection;
-- the request may be fine on the next). Any other curl code of kind
-- `transport` (a malformed URL, an unsupported protocol...) fails the same
-- way again.
M.transient_curl_codes = {
  [7] = "couldn't connect", [16] = "HTTP/2 framing", [92] = "HTTP/2 stream",
}

-- Rule 6: leaked tool-call markup, as {open, close}; close nil means "to the
-- end of the text".
M.leaked_markup = {
  { "<tool_call>", "</tool_call>" },                  -- Hermes, Qwen
  { "<tool_calls>", "</tool_calls>" },
  { "<function_calls>", "</function_calls>" },        -- Anthropic's old XML
  { "<function=", "</function>" },                    -- Llama 3.1, Qwen3-Coder
  { "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>" }, -- Kimi
  { "<|tool_call_begin|>", "<|tool_call_end|>" },
  { "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>" }, -- DeepSeek
  { "[TOOL_CALLS]", nil },                            -- Mistral
  { "<|python_tag|>", nil },                          -- Llama 3.x
}

local DEFAULT_POLICY = assert(policies.new({}, "built-in rules"))

------------------------------------------------------------------------------
-- Helpers
------------------------------------------------------------------------------

local function decision(class, retryable, reason)
  return { class = class, retryable = retryable, reason = reason }
end

-- Sends a message to ctx.report, or to ctx.diag (the runtime's
-- diagnostics, lua/luagent/base/diagnostics.lua) at warn.
local function report(ctx, msg)
  if ctx.report then
    ctx.report(msg)
  elseif ctx.diag then
    ctx.diag:write("warn", msg)
  end
end

-- The body as text for phrase matching: a string as is, a decoded table
-- re-encoded, anything else "".
local function body_text(body)
  if type(body) == "string" then return body end
  if type(body) == "table" then return cjson.encode(body) or "" end
  return ""
end

local function is_overflow(text)
  text = text:lower()
  for _, list in ipairs({ M.overflow_phrases, wire.overflow_phrases }) do
    for _, phrase in ipairs(list) do
      if text:find(phrase, 1, true) then return true end
    end
  end
  return false
end

-- limit_source from a 402 body: OpenRouter puts it in error.metadata; the
-- top level and error itself are read too.
local function limit_source(body)
  if type(body) == "string" then body = cjson.decode(body) end
  if type(body) ~= "table" then return nil end
  local e = type(body.error) == "table" and body.error or {}
  local meta = type(e.metadata) == "table" and e.metadata or {}
  local top = type(body.metadata) == "table" and body.metadata or {}
  return meta.limit_source or e.limit_source or body.limit_source or top.limit_source
end

-- Whether `status` is in a retry_statuses list (numbers, or "5xx" classes).
local function listed(list, status)
  for _, s in ipairs(list) do
    if s == status or (type(s) == "string" and tonumber(s:sub(1, 1)) == status // 100) then
      return true
    end
  end
  return false
end

local function header(headers, name)
  return type(headers) == "table" and headers[name] or nil
end

-- A structured in-stream field, lowercased; numbers become strings ("503").
local function field(v)
  if type(v) == "number" then return tostring(math.tointeger(v) or v) end
  if type(v) == "string" then return v:lower() end
  return nil
end

-- A hook's answer as a decision: nil (defer), a class name, or a table
-- {class=, retryable=, retry_after=, reason=}, read raw. Returns nil and
-- what was wrong with anything else, or with a retry_after that is not a
-- number of seconds from 0 to policy.MAX_SECONDS (math.huge would make the
-- retry loop's sleep raise).
local function from_hook(res, where)
  local reason = "rule 2: classify hook at " .. where
  if type(res) == "string" then
    if #res > 64 then return nil, "a class name longer than 64 bytes" end
    return decision(res, M.classes[res] == true, reason)
  end
  local class = type(res) == "table" and rawget(res, "class")
  if type(class) ~= "string" or #class > 64 then
    return nil, "a " .. type(res) .. " (expected nil, a class name or {class=, retryable=})"
  end
  local retryable, retry_after, why = rawget(res, "retryable"), rawget(res, "retry_after"), rawget(res, "reason")
  if retryable ~= nil and type(retryable) ~= "boolean" then
    return nil, "a non-boolean retryable"
  end
  if retry_after ~= nil and not (type(retry_after) == "number" and retry_after >= 0
      and retry_after <= policies.MAX_SECONDS) then
    return nil, ("a retry_after that is not a number of seconds from 0 to %d (got %s)")
      :format(policies.MAX_SECONDS, tostring(retry_after))
  end
  if type(why) == "string" then reason = reason .. ": " .. why:sub(1, 200) end
  local d = decision(class, retryable, reason)
  if d.retryable == nil then d.retryable = M.classes[class] == true end
  d.retry_after = retry_after
  return d
end

------------------------------------------------------------------------------
-- The rules
------------------------------------------------------------------------------

-- Rule 1: the caller cancelled, or the caller's deadline passed (told by the
-- error's `which`, or by ctx.deadline_expired when the caller knows better).
local function caller_stopped(err, ctx)
  if ctx.cancelled or err.kind == "cancelled" then
    return decision("cancelled", false, "rule 1: cancelled by the caller")
  end
  if err.kind == "timeout" and M.caller_deadlines[err.which] then
    return decision("deadline", false, "rule 1: the caller's deadline (" .. err.which .. ")")
  end
  if ctx.deadline_expired then
    return decision("deadline", false, "rule 1: the caller's deadline has passed")
  end
end

-- Rule 2, first: the error answers for itself. A record whose `retryable`
-- is false (a call's final error, a refusal of the endpoint, a custom
-- adapter's or a tool's verdict) is permanent; one whose `retryable` is true
-- is retried, with its own `class` when it names a known one.
local function error_decides(err)
  if err.retryable == false then
    local why = type(err.reason) == "string" and (": " .. err.reason) or ""
    return decision("permanent", false, "rule 2: the error says it is not retryable" .. why)
  end
  if err.retryable == true then
    local class = type(err.class) == "string" and M.classes[err.class] ~= nil and err.class or "transient"
    return decision(class, true, "rule 2: the error says it is retryable")
  end
end

-- Rule 2: the policy's hooks in order. A hook that errors, runs past the
-- instruction limit or answers nonsense is reported and counts as "defer".
local function hooks_decide(err, ctx, policy)
  for _, hook in ipairs(policy.classify) do
    local info = debug.getinfo(hook, "S")
    local file = info.source:sub(1, 1) == "@" and info.source:sub(2) or info.short_src
    local where = file .. ":" .. info.linedefined
    local ok, res = policies.run_limited(hook, policies.limits.hook, err, ctx)
    if not ok then
      report(ctx, res .. " (classify hook ignored: the default rules apply)")
    elseif res ~= nil then
      local d, what = from_hook(res, where)
      if d then return d end
      report(ctx, where .. ": classify hook returned " .. what .. " (ignored)")
    end
  end
end

-- Rule 3: an HTTP status. retry_statuses and x-should-retry then adjust
-- `retryable`, except for a context overflow, which is never resent.
local function http_decides(err, policy)
  local status = math.tointeger(err.status)
  if err.kind ~= "http" or not status then return nil end
  local s = "HTTP " .. status
  local d
  if status == 429 then
    d = decision("rate_limited", true, "rule 3: " .. s .. " is always rate_limited")
  elseif status == 503 or status == 529 then
    d = decision("overloaded", true, "rule 3: " .. s .. " overloaded")
  elseif status == 402 then
    local source = limit_source(err.body)
    if wire.in_flight_sources[source] then
      d = decision("payment", true, "rule 3: " .. s .. " in-flight budget (" .. source .. ")")
    else
      d = decision("payment", false, "rule 3: " .. s .. " payment required")
    end
  elseif status == 401 or status == 403 then
    d = decision("auth", false, "rule 3: " .. s .. " auth")
  elseif (status == 400 or status == 413) and is_overflow(body_text(err.body)) then
    return decision("context_overflow", false, "rule 3: " .. s .. " context overflow")
  elseif M.retry_statuses[status] then
    d = decision("server", true, "rule 3: " .. s .. " server error")
  elseif status >= 500 then
    d = decision("server", false, "rule 3: " .. s .. " is not a retried server error")
  else
    d = decision("client", false, "rule 3: " .. s .. " client error")
  end
  if policy.retry_statuses then
    local yes = listed(policy.retry_statuses, status)
    if yes ~= d.retryable then
      d.retryable = yes
      d.reason = d.reason .. (yes and "; listed" or "; not listed") .. " in retry_statuses"
    end
  end
  local should = header(err.headers, "x-should-retry")
  if policy.honor_x_should_retry and (should == "true" or should == "false") then
    d.retryable = should == "true"
    d.reason = d.reason .. "; x-should-retry: " .. should
  end
  return d
end

-- Rule 4: an error event inside the stream. Rate limits and overloads come
-- from structured fields only and are checked before any overflow phrase
-- (Azure's no_capacity message reads like an overflow).
local function stream_decides(err)
  if err.kind ~= "stream_error" then return nil end
  local values = { field(err.type), field(err.code), field(err.status) }
  for i = 1, 3 do
    local v = values[i]
    if v and (M.stream_rate_limited[v] or wire.stream_errors[v] == "rate_limited") then
      return decision("rate_limited", true, "rule 4: in-stream " .. v)
    end
  end
  for i = 1, 3 do
    local v = values[i]
    if v and (M.stream_overloaded[v] or wire.stream_errors[v] == "overloaded") then
      return decision("overloaded", true, "rule 4: in-stream " .. v)
    end
  end
  local text = table.concat({ tostring(err.message or ""), values[1] or "", values[2] or "" }, " ")
  if is_overflow(text) then
    return decision("context_overflow", false, "rule 4: in-stream context overflow")
  end
end

-- Rule 5: the connection failed, or one attempt timed out.
local function transport_decides(err)
  local kind = err.kind
  if M.transport_kinds[kind] then
    return decision("transport", true, "rule 5: transport failure (" .. kind .. ")")
  end
  if kind == "timeout" then
    return decision("timeout", true, "rule 5: " .. tostring(err.which or "attempt") .. " timeout")
  end
  local what = M.transient_curl_codes[err.curl_code]
  if what then
    return decision("transport", true, "rule 5: transport failure (curl: " .. what .. ")")
  end
end

-- Rule 6: an unusable reply, marked by kind or class "unusable" or by
-- unusable=true. Retried while ctx.attempt (the attempt that just failed,
-- from 1) is at most policy.unusable_retries: axon retries once, on the
-- first attempt only.
local function unusable_decides(err, ctx, policy)
  if not (err.kind == "unusable" or err.class == "unusable" or err.unusable == true) then
    return nil
  end
  local attempt = ctx.attempt or 1
  if attempt <= policy.unusable_retries then
    return decision("unusable", true, "rule 6: unusable reply, retried (attempt " .. attempt .. ")")
  end
  return decision("unusable", false, "rule 6: unusable reply, not retried after attempt " .. attempt)
end

------------------------------------------------------------------------------
-- Public API
------------------------------------------------------------------------------

-- Classifies `err` (an error record from luagent.errors, or anything else)
-- under `policy` (a policy from luagent.policy, or a table policy.new
-- accepts; nil: the built-in rules; an invalid table raises).
-- ctx: attempt (the attempt that failed, from 1), cancelled and
-- deadline_expired (the caller's state), now_epoch (wall clock, for
-- Retry-After dates; default now), report(msg) (where hook failures go;
-- default stderr). ctx is passed to the hooks as is.
function M.classify(err, ctx, policy)
  ctx = ctx or {}
  if policy == nil then
    policy = DEFAULT_POLICY
  else
    local p, perr = policies.new(policy)
    if not p then error("classify: " .. perr.message, 2) end
    policy = p
  end
  if type(err) ~= "table" then err = { message = tostring(err) } end
  local d = caller_stopped(err, ctx)
    or error_decides(err)
    or hooks_decide(err, ctx, policy)
    or http_decides(err, policy)
    or stream_decides(err)
    or transport_decides(err)
    or unusable_decides(err, ctx, policy)
    or decision("permanent", false, "rule 7: no rule matched (" .. tostring(err.kind) .. ")")
  if d.retryable and d.retry_after == nil then
    if type(err.headers) == "table" then
      d.retry_after = core.parse_retry_after(err.headers, ctx.now_epoch)
    end
    if d.retry_after == nil and type(err.retry_after) == "number" and err.retry_after >= 0 then
      d.retry_after = err.retry_after
    end
  end
  return d
end

-- Removes every block of leaked markup from `text`; returns what is left and
-- whether anything was removed. One forward scan per kind of markup, the
-- kept pieces joined once: linear in the text (a reply of 80,000 leaked
-- blocks is 2 MB, and cutting them one at a time copied it 80,000 times).
local function strip_markup(text)
  local found = false
  for _, pair in ipairs(M.leaked_markup) do
    local open, close = pair[1], pair[2]
    local kept, pos = {}, 1
    while true do
      local i, j = text:find(open, pos, true)
      if not i then break end
      kept[#kept + 1] = text:sub(pos, i - 1)
      found = true
      local k = close and select(2, text:find(close, j + 1, true))
      if not k then pos = #text + 1 break end
      pos = k + 1
    end
    if pos > 1 then
      kept[#kept + 1] = text:sub(pos)
      text = table.concat(kept)
    end
  end
  return text, found
end

-- Whether an assistant message is unusable: no tool calls and either no
-- text at all or only leaked tool-call markup. Returns true and why, or false.
function M.unusable(message)
  if type(message) ~= "table" then return true, "no message" end
  if type(message.tool_calls) == "table" and #message.tool_calls > 0 then return false end
  local text = message.content
  if type(text) ~= "string" or not text:find("%S") then return true, "empty reply" end
  local rest, found = strip_markup(text)
  if found and not rest:find("%S") then return true, "only leaked tool-call markup" end
  return false
end

return M
