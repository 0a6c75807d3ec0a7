-- The Streamable HTTP transport of MCP, on luagent's own HTTP client: each
-- message is POSTed to the server's endpoint; a request's reply is a JSON
-- body or an SSE stream (carrying the server's notifications and requests
-- before the response). The session id the server gives at initialize is
-- sent back on every later message, with the negotiated protocol version.
-- A GET stream, when the server offers one, brings the notifications it
-- sends on its own (tools/list_changed); each time one opens, on_stream()
-- is called (what the server sent while none was open is lost). DELETE
-- ends the session.
local core = require "luagent.core"
local errors = require "luagent.base.errors"
local http = require "luagent.base.http"
local queue = require "luagent.base.queue"

local M = {}

local Http = {}
Http.__index = Http

M.timeout = { connect = 10, first_byte = 300, idle = 300 }

-- new{url=, headers=, max_message=, name=} -> transport.
function M.new(opts)
  return setmetatable({ url = opts.url, extra = opts.headers or {}, max_message = opts.max_message,
    name = opts.name }, Http)
end

-- The headers of a message: the user's, then the protocol's.
function Http:headers(accept)
  local h = {}
  for k, v in pairs(self.extra) do h[k:lower()] = v end
  h["content-type"] = "application/json"
  h.accept = accept
  if self.session_id then h["mcp-session-id"] = self.session_id end
  if self.version then h["mcp-protocol-version"] = self.version end
  return h
end

-- start(): a new session begins at the next initialize.
function Http:start()
  self.session_id, self.version, self.broken, self.listening = nil, nil, nil, false
  self.wake = queue.signal(true)
  return true
end

-- listen(version): the session is initialized; the GET stream may open.
function Http:listen(version)
  self.version, self.listening = version, true
  self.wake.notify()
end

-- Marks the connection broken (run() returns `err`) and returns nil, err.
function Http:fail(err)
  self.broken = self.broken or err
  if self.wake then self.wake.notify() end
  return nil, err
end

-- Hands each message of a reply to `deliver`: the body of a JSON reply, or
-- the data of each event of an SSE reply.
local function read_reply(self, resp, deliver)
  local ctype = (resp.headers["content-type"] or ""):lower()
  if ctype:find("text/event-stream", 1, true) then
    for ev in resp:events() do
      if ev.data and ev.data ~= "" then
        local ok, err = deliver(ev.data)
        if not ok then return nil, err end
      end
    end
    return true
  end
  local body = resp:body(self.max_message + 1)
  if #body > self.max_message then
    return nil, errors.new("protocol", string.format("%s sent a message longer than %d bytes (max_message)",
      self.name, self.max_message))
  end
  if body:match("^%s*$") then return true end
  if body:match("^%s*%[") then
    return nil, errors.new("protocol", self.name .. " answered with a JSON-RPC batch, which MCP does not use")
  end
  return deliver(body)
end

-- Reads a reply whole, delivering its messages: true | nil, err (a cut
-- stream, or a message deliver refused). Cancellation is raised.
function Http:read(resp)
  local ok, res, err = pcall(read_reply, self, resp, self.deliver)
  resp:close()
  if not ok then
    if errors.is_cancel(res) or not errors.is(res) then error(res, 0) end
    return nil, res
  end
  return res, err
end

-- send(text) -> true | nil, err: POSTs one message and delivers the reply's
-- messages (so it returns once a request's response came). A refused
-- connection, a 5xx or a lost session (404) breaks the connection.
function Http:send(text)
  if self.broken then return nil, self.broken end
  local resp, err = http.request { method = "POST", url = self.url, body = text,
    headers = self:headers("application/json, text/event-stream"), timeout = M.timeout,
    sse = { max_line = self.max_message, max_event = self.max_message } }
  if not resp then
    if err.kind == "http" and err.status < 500 and err.status ~= 404 then
      return nil, errors.new("protocol", string.format("%s refused a message with HTTP %d: %s", self.name,
        err.status, tostring(err.body):sub(1, 200)), { status = err.status })
    end
    err.message = string.format("%s at %s: %s", self.name, self.url, err.message)
    return self:fail(err)
  end
  self.session_id = resp.headers["mcp-session-id"] or self.session_id
  local ok, rerr = self:read(resp)
  if not ok then return self:fail(rerr) end
  return true
end

-- run(deliver) -> err: keeps the connection's listening side: a GET stream
-- for the server's own messages when it offers one; returns once the
-- connection broke (a message failed, or kill()).
function Http:run(deliver)
  self.deliver = deliver
  while not self.broken do
    if self.listening and not self.no_get then
      local resp = http.request { method = "GET", url = self.url,
        headers = self:headers("text/event-stream"), timeout = { connect = 10 },
        sse = { max_line = self.max_message, max_event = self.max_message } }
      if resp then
        if self.on_stream then self.on_stream() end
        local ok, err = self:read(resp)
        if not ok and err.kind == "protocol" then self:fail(err) end -- garbage: drop the connection
        if not self.broken then core.sleep(0.5) end -- the server ended it: open another
      else
        self.no_get = true -- none offered (405) or refused: wait for the connection to break
      end
    else
      self.wake.wait()
    end
  end
  return self.broken
end

-- kill(): ends the connection; run() returns.
function Http:kill()
  self:fail(errors.new("eof", self.name .. ": connection closed"))
end

-- close(): ends the session on the server (DELETE), best effort.
function Http:close()
  if self.session_id then
    pcall(http.fetch, { method = "DELETE", url = self.url, headers = self:headers("application/json"),
      timeout = { connect = 2, total = 5 } })
    self.session_id = nil
  end
end

return M
