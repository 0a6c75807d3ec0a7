-- Structured output: `output = {schema =, name =, retries =, strict =}` on
-- an agent (agent/loop.lua) or a call (`luagent.complete`, M.complete
-- here). The call layer sends it the provider's native way (each adapter:
-- request.output); what comes back is decoded (a fenced ```json block
-- unwrapped) and checked with the schema checker (agent/tools/schema.lua).
-- An answer that does not match gets a message back naming each wrong
-- field and what was expected (an `output_retry` event), at most `retries`
-- times; then the run or call fails with an error of kind output_invalid
-- (`errors`, `text`, `answers`). EVENTS.md, "Structured output".
local errors = require "luagent.base.errors"
local json = require "luagent.base.json"
local schema = require "luagent.agent.tools.schema"
local retry = require "luagent.model.call"
local add_usage = require("luagent.base.usage").add

local M = {}

M.defaults = { name = "output", retries = 2 }

-- The option's fields, in one place: any other key is refused.
M.keys = { "name", "retries", "schema", "strict" }
local KNOWN = {}
for _, k in ipairs(M.keys) do KNOWN[k] = true end

-- The option's fields: luagent.OutputOptions (agent/loop.lua).

-- check(spec, who [, level]) -> the output option completed with its
-- defaults; raises on misuse, the message starting with `who`.
function M.check(spec, who, level)
  level = (level or 1) + 1
  if type(spec) ~= "table" then
    error(who .. ": output must be a table {schema =, name =, retries =, strict =}", level)
  end
  for k in pairs(spec) do
    if not KNOWN[k] then
      error(string.format("%s: output: unknown option %s (known: %s)", who,
        type(k) == "string" and "'" .. k .. "'" or tostring(k), table.concat(M.keys, ", ")), level)
    end
  end
  local ok, why = schema.valid(spec.schema, "output.schema")
  if not ok then error(who .. ": " .. why, level) end
  local name = spec.name
  if name ~= nil and not (type(name) == "string" and #name <= 64 and name:match("^[%w_%-]+$")) then
    error(who .. ": output.name must be a string of letters, digits, _ and - (at most 64)", level)
  end
  local retries = spec.retries
  if retries ~= nil and not (math.type(retries) == "integer" and retries >= 0) then
    error(who .. ": output.retries must be an integer >= 0", level)
  end
  if spec.strict ~= nil and type(spec.strict) ~= "boolean" then
    error(who .. ": output.strict must be true or false", level)
  end
  return { schema = spec.schema, name = name or M.defaults.name, retries = retries or M.defaults.retries,
    strict = spec.strict }
end

-- The JSON text of an answer: trimmed, a fenced block unwrapped.
local function json_text(text)
  local t = text:match("^%s*(.-)%s*$")
  return t:match("^```[%w_-]*[ \t]*\r?\n(.-)\r?\n?```$") or t
end

-- read(spec, message) -> the decoded value, or nil and the list of what is
-- wrong ("output.city: expected string, got integer").
function M.read(spec, message)
  local text = type(message) == "table" and message.content or nil
  if type(text) ~= "string" or not text:find("%S") then
    return nil, { "output: the answer is empty (expected a JSON value of the schema)" }
  end
  local v, err = json.decode_strict(json_text(text), "output")
  if v == nil then return nil, { "output: not JSON (" .. tostring(err) .. ")" } end
  v = json.integerize(v)
  local errs = schema.errors(spec.schema, v, "output")
  if errs[1] then return nil, errs end
  return v
end

-- The message that asks the model again, naming what is wrong.
function M.retry_text(errs)
  return "Your answer does not match the output schema:\n- " .. table.concat(errs, "\n- ")
    .. "\nAnswer again with only the JSON value, matching the schema."
end

-- The output_invalid error after `answers` answers, the last `text`.
function M.failure(errs, text, answers)
  return errors.new("output_invalid", string.format("the answer does not match the output schema after %d answer%s: %s",
    answers, answers == 1 and "" or "s", table.concat(errs, "; ")), { errors = errs, text = text, answers = answers })
end

-- The output_retry event of retry `attempt` (from 1).
function M.retry_event(spec, attempt, errs, text)
  return { type = "output_retry", attempt = attempt, max_retries = spec.retries, errors = errs, retry_message = text }
end

-- complete(rt, opts) -> the final message with .output (the decoded
-- value), or nil and an error: a call's, or output_invalid once every
-- answer failed the schema. An answer cut at its token limit (stop_reason
-- "length") is returned at once, .output nil unless it decodes. Each retry is a call of its own, the answer and
-- the message naming what was wrong added to the messages sent;
-- total_usage and attempts sum every call's.
function M.complete(rt, opts)
  local spec = M.check(opts.output, "complete", 2) -- the user called rt:complete (a tail call)
  local messages = {}
  for i, m in ipairs(opts.messages or {}) do messages[i] = m end
  local call_opts = {}
  for k, v in pairs(opts) do call_opts[k] = v end
  call_opts.output, call_opts.messages = spec, messages
  local total, attempts = nil, 0
  for answer = 1, spec.retries + 1 do
    local msg, err = retry.complete(rt, call_opts, 3)
    if not msg then return nil, err end
    total = add_usage(total, msg.total_usage)
    attempts = attempts + (msg.attempts or 0)
    local value, errs = M.read(spec, msg)
    -- an answer cut at its token limit is not sent back (as an agent's run
    -- ends): the message, stop_reason "length", .output only when it decodes
    if value ~= nil or msg.stop_reason == "length" then
      msg.output, msg.total_usage, msg.attempts = value, total, attempts
      return msg
    end
    if answer > spec.retries then return nil, M.failure(errs, msg.content, answer) end
    local text = M.retry_text(errs)
    rt.bus:publish(M.retry_event(spec, answer, errs, text))
    messages[#messages + 1] = { role = "assistant", content = msg.content or "" }
    messages[#messages + 1] = { role = "user", content = text }
  end
end

return M
