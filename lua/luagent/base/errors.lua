-- Error records: the values that operational failures return
-- (ARCHITECTURE.md, "Errors"). A record is a plain table with a `kind` from the closed list
-- below, a `message`, and whatever fields its kind documents. Records print
-- as "kind: message" through their metatable.

---An error record: what an operational failure returns (`nil, err`) and
---what events carry as `error`. `tostring(err)` is "kind: message".
---lua/luagent/EVENTS.md, "Error records", lists every kind and its fields.
---@class luagent.Error
---@field kind string one of `errors.kinds`: "timeout", "http", "reset", "tool_error", "cost_limit", ...
---@field message string what happened, naming the thing and where
---@field retryable boolean? the error's own answer to "retry?" (a final error says false)
---@field final boolean? true on a call's final error, after its retries
---@field attempts integer? a final error's attempts
---@field reason string? why a final error stopped ("no attempts left (6)")
---@field cause luagent.Error? a final error's last attempt's own error
---@field status integer? the HTTP status, when there was one

---Error records (`luagent.errors`).
---@class luagent.errors
---@field kinds table<string, true> the closed list of kinds
local M = {}

-- The closed list of kinds. Adding one is a contract change: document it in
-- lua/luagent/EVENTS.md and freeze it with a spec.
M.kinds = {
  cancelled = true,   -- the task was cancelled (always raised, never returned)
  timeout = true,     -- a deadline fired; `which` says which one
  refused = true,     -- connection refused
  dns = true,         -- host name did not resolve
  tls = true,         -- TLS handshake or record failure
  reset = true,       -- connection reset by peer
  eof = true,         -- closed before a complete response
  truncated = true,   -- body ended before its terminator
  http = true,        -- an HTTP error status; `status`, `headers`, `body`
  protocol = true,    -- malformed framing, oversized line or event, a body that is no stream
  too_large = true,   -- the answer passed the policy's max_answer_bytes
  stream_error = true,-- the provider reported an error inside the stream
  transport = true,   -- any other transport failure (curl code in `curl_code`)
  usage = true,       -- bad input from a user: flag, file, spec
  unusable = true,    -- a 200 reply with nothing usable (empty, leaked markup)
  circuit_open = true,           -- the endpoint's breaker refused the call; `retry_at`
  retry_budget_exhausted = true, -- the endpoint's retry budget refused a retry; `tokens`
  process = true,        -- a child process could not be started
  tool_error = true,     -- a tool failed (raised, returned an error, exited non-zero); `died`
  tool_timeout = true,   -- a tool ran past its timeout and was stopped; `seconds`
  invalid_arguments = true, -- a tool call's arguments are not JSON or do not match params
  unknown_tool = true,   -- the model called a tool that is not in the agent's set
  outcome_unknown = true,-- an unflagged tool may have done its work; `tool`, `call_id`, `arguments`
  journal = true,        -- the run journal failed: cannot open, corrupt, locked, full, another process's run;
                         -- `file`, `code_name`, `corrupt`, `holder`, `lost`
  divergence = true,     -- a durable run's script no longer matches its journal; `step`
  cost_limit = true,     -- a max_cost cap refused a call before its request; `limit`, `spent`, `scope`
  fs = true,             -- a file operation failed (luagent.fs); `path`, `op`, `reason`, `code`
  guardrail = true,      -- an agent's guard raised, passed its sandbox bound or tried to wait; `guard`, `name`
  output_invalid = true, -- structured output: no answer matched the schema within its retries; `errors`, `text`, `answers`
}

-- One metatable for records made in C and in Lua, owned by the core
-- (host/errors.c): its __tostring prints "kind: message", its __name is
-- "luagent.Error". Every kind the core makes (core.error_kinds) is in the
-- list above.
local core = require "luagent.core"
local Error = core.error_metatable

-- Makes a record of `kind` with `message` and the extra `fields` (copied).
-- An unknown kind is a programming error and raises.
---Makes an error record; an unknown kind raises.
---@param kind string a kind of `errors.kinds`
---@param message? string default: the kind
---@param fields? table extra fields, copied
---@return luagent.Error
function M.new(kind, message, fields)
  if not M.kinds[kind] then
    error("errors.new: unknown error kind '" .. tostring(kind) .. "'", 2)
  end
  local e = {}
  if fields then for k, v in pairs(fields) do e[k] = v end end
  e.kind, e.message = kind, message or kind
  return setmetatable(e, Error)
end

-- True when `v` is an error record (made here or by the C core).
---Whether `v` is an error record.
---@param v any
---@return boolean
function M.is(v)
  return type(v) == "table" and type(v.kind) == "string" and M.kinds[v.kind] ~= nil
end

-- True when `v` is a cancellation. Code that catches errors with pcall
-- must raise these again: cancellation always reaches the task's top.
---Whether `v` is a cancellation (raise it again after a `pcall`).
---@param v any
---@return boolean
function M.is_cancel(v)
  return type(v) == "table" and v.kind == "cancelled"
end

M.metatable = Error
return M
