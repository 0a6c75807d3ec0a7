-- JSON-RPC 2.0 for MCP: one session per connection to a server. Requests
-- get ids and wait for their response (a timeout, or the caller's
-- cancellation, sends notifications/cancelled); incoming lines are
-- checked and dispatched: responses to their waiters, notifications and
-- the server's own requests to the handlers. A line that is not JSON-RPC
-- is refused with a `protocol` error naming what came (the owner drops
-- the connection); fail() gives every request still waiting an error.
--
-- A session talks through `send(text) -> true | nil, err` (one message,
-- no line end) given by its transport; the transport feeds what the
-- server wrote to session:deliver(text).
local errors = require "luagent.base.errors"
local json = require "luagent.base.json"
local queue = require "luagent.base.queue"
local deadline = require "luagent.base.deadline"

local M = {}

local Session = {}
Session.__index = Session

-- JSON-RPC error codes a client answers with.
M.METHOD_NOT_FOUND = -32601

-- new{send=, name=, on_notification=function(method, params),
-- on_request=function(method, params) -> result | nil, {code=, message=}}
-- -> session. `name` names the server in messages.
function M.new(opts)
  return setmetatable({
    send_raw = opts.send, name = opts.name or "MCP server", next_id = 0, pending = {},
    on_notification = opts.on_notification, on_request = opts.on_request,
    progress = {}, -- progress token -> function(params)
  }, Session)
end

-- A short, printable excerpt of what the server wrote.
local function excerpt(text)
  text = tostring(text)
  local s = text:sub(1, 80):gsub("[%c]", "?")
  if #text > 80 then s = s .. "..." end
  return ("%q"):format(s)
end

-- Sends one message (a table); nil, err when the transport cannot.
function Session:send(msg)
  if self.dead then return nil, self.dead end
  msg.jsonrpc = "2.0"
  return self.send_raw(json.encode(msg))
end

-- notify(method [, params]): a notification (no answer expected).
function Session:notify(method, params)
  return self:send { method = method, params = params }
end

-- Ends every waiting request with `err` and refuses new ones. Idempotent:
-- the first reason stays.
function Session:fail(err)
  if self.dead then return end
  self.dead = err
  for id, p in pairs(self.pending) do
    self.pending[id] = nil
    p.err = err
    p.sig.notify()
  end
end

-- request(method, params [, {timeout=, on_progress=, daemon=}]) -> result |
-- nil, err (daemon: the caller is a daemon task). An initialize given up
-- on is not announced: the spec forbids cancelling it.
-- The error is a record: the server's JSON-RPC error (kind `tool_error`,
-- `rpc_code`), the session's end, or `timeout` (which = "mcp"). A
-- cancellation of the caller sends notifications/cancelled and is raised.
function Session:request(method, params, opts)
  opts = opts or {}
  if self.dead then return nil, self.dead end
  self.next_id = self.next_id + 1
  local id = self.next_id
  local p = { sig = queue.signal(opts.daemon), method = method }
  self.pending[id] = p
  if opts.on_progress then
    params = params or {}
    params._meta = { progressToken = id }
    self.progress[id] = opts.on_progress
  end
  -- sending may wait too (over HTTP the reply comes back on the POST)
  local function exchange()
    local ok, err = self:send { id = id, method = method, params = params }
    if not ok then p.err = p.err or err return end
    while p.result == nil and p.err == nil do p.sig.wait() end
  end
  local ok, err
  if opts.timeout then
    ok, err = pcall(deadline, opts.timeout, exchange)
  else
    ok, err = pcall(exchange)
  end
  self.progress[id] = nil
  if not ok then
    local timed_out = errors.is(err) and err.kind == "timeout" and err.which == "deadline"
    if self.pending[id] and method ~= "initialize" then
      local why = type(err) == "table" and type(err.reason) == "string" and err.reason or "cancelled by the client"
      self:notify("notifications/cancelled", { requestId = id, reason = timed_out and "timed out" or why })
    end
    self.pending[id] = nil
    if not timed_out then error(err, 0) end
    return nil, errors.new("timeout", string.format("%s did not answer %s within %g s", self.name, method,
      opts.timeout), { which = "mcp", seconds = opts.timeout })
  end
  self.pending[id] = nil
  if p.err then return nil, p.err end
  return p.result
end

-- Answers a request of the server (ping, roots/list, ...).
function Session:answer_request(msg)
  local result, rerr
  if msg.method == "ping" then
    result = {}
  elseif self.on_request then
    result, rerr = self.on_request(msg.method, msg.params)
  end
  if result == nil and rerr == nil then
    rerr = { code = M.METHOD_NOT_FOUND, message = "method not found: " .. tostring(msg.method) }
  end
  if result ~= nil then
    self:send { id = msg.id, result = result }
  else
    self:send { id = msg.id, error = rerr }
  end
end

-- deliver(text) -> true | nil, err: one message the server wrote. Anything
-- that is not a JSON-RPC 2.0 message ends the session (err is a
-- `protocol` record); an empty line is skipped.
function Session:deliver(text)
  if text:match("^%s*$") then return true end
  local msg = json.decode(text)
  local function bad(why)
    return nil, errors.new("protocol", string.format("%s wrote %s: %s; the connection is dropped",
      self.name, excerpt(text), why))
  end
  if type(msg) ~= "table" then return bad("not JSON-RPC (not a JSON object)") end
  if msg.jsonrpc ~= "2.0" then return bad('not JSON-RPC 2.0 (no "jsonrpc": "2.0")') end
  if msg.method ~= nil then
    if type(msg.method) ~= "string" then return bad("method is not a string") end
    if msg.id ~= nil and msg.id ~= json.null then
      self:answer_request(msg)
    elseif msg.method == "notifications/progress" and type(msg.params) == "table" then
      local fn = self.progress[msg.params.progressToken]
      if fn then fn(msg.params) end
    elseif self.on_notification then
      self.on_notification(msg.method, msg.params)
    end
    return true
  end
  local p = self.pending[msg.id]
  if not p then return true end -- a late answer to a request given up on
  self.pending[msg.id] = nil
  if type(msg.error) == "table" then
    p.err = errors.new("tool_error", string.format("%s answered %s with error %s: %s", self.name,
      p.method, tostring(msg.error.code), tostring(msg.error.message)),
      { rpc_code = msg.error.code, data = msg.error.data })
  elseif msg.result == nil then
    return bad("a response has neither result nor error")
  else
    p.result = msg.result
  end
  p.sig.notify()
  return true
end

return M
