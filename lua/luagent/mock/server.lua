-- The mock provider's server: a listener on loopback, one task per
-- connection reading requests (lua/luagent/mock/request.lua), answering
-- each with its plan (lua/luagent/mock/route.lua) on the core's TCP
-- primitives. Its tasks are daemons.
local core = require "luagent.core"
local errors = require "luagent.base.errors"
local replies = require "luagent.mock.replies"
local request = require "luagent.mock.request"
local plan = require "luagent.mock.plan"
local mstate = require "luagent.mock.state"
local route = require "luagent.mock.route"

local M = {}

-- The seconds a connection may take to send its next whole request (slow
-- or idle clients are dropped, so they cannot hold descriptors and memory
-- for good).
M.IDLE_TIMEOUT = 60

-- A task that the run does not wait for.
local function daemon(fn, ...)
  return core.spawn(fn, ...):set_daemon(true)
end

-- Reads the next request from a connection; `st` holds the bytes read
-- ahead. Returns the request, or nil (peer gone) or nil, failure (bad
-- request). Answers Expect: 100-continue.
local function read_request(conn, st)
  while true do
    local status, req, rest = request.parse(st.buf)
    if status == "ok" then
      st.buf, st.continued = rest, false
      return req
    end
    if status == "bad" then return nil, req end
    if req and req.expect_continue and not st.continued then
      st.continued = true
      if not conn:write("HTTP/1.1 100 Continue\r\n\r\n") then return nil end
    end
    local need = req and req.need
    local parts, have = { st.buf }, #st.buf
    repeat
      local chunk = conn:read()
      if not chunk then return nil end
      st.partial = true
      parts[#parts + 1] = chunk
      have = have + #chunk
    until not need or have >= need
    st.buf = table.concat(parts)
  end
end

-- Executes a plan on a connection; true when the connection stays open
-- (else it was closed or reset here).
local function execute(conn, steps)
  for _, s in ipairs(steps) do
    if s.write then
      if not conn:write(s.write) then conn:close(); return false end
    elseif s.sleep then
      core.sleep(s.sleep)
    elseif s.reset then
      conn:reset()
      return false
    elseif s.close then
      conn:close()
      return false
    end
  end
  return true
end

-- One connection: requests in turn (keep-alive) until either side closes,
-- or until the client takes longer than the idle timeout to send its next
-- whole request (a request begun is answered 408 first).
local function connection(server, conn)
  local st = { buf = "" }
  while true do
    st.partial = st.buf ~= ""
    -- the idle timer cancels this task's read when it fires; the server's
    -- close cancels the timer (so no timer outlives the server)
    local me, expired = core.current(), false
    local timer = daemon(function()
      core.sleep(server.idle_timeout)
      expired = true
      me:cancel("idle timeout")
    end)
    server.timers[conn] = timer
    local ok, req, failure = pcall(read_request, conn, st)
    timer:cancel()
    server.timers[conn] = nil
    if ok and expired then -- it fired as the request completed: the cancel is still due
      conn:close()
      break
    elseif not ok then
      if not expired then
        conn:close()
        server.conns[conn] = nil
        error(req, 0) -- cancelled: the server is closing
      end
      req, failure = nil, st.partial and { status = 408, message = "the request did not"
        .. " arrive within " .. server.idle_timeout .. " s" } or nil
    end
    if not req then
      if not failure or execute(conn, plan.bad_request_plan(failure)) then conn:close() end
      break
    end
    local ok, steps = pcall(route.handle, server.state, req)
    if not ok then
      steps = plan.json({ close = true }, 500, replies.encode(replies.object("error",
        replies.object("message", "mock server error: " .. tostring(steps), "type", "api_error"))))
    end
    if not execute(conn, steps) then break end
  end
  server.conns[conn] = nil
end

-- Accepts connections until the listener closes, one task each.
local function accept_loop(server)
  while true do
    local conn = server.listener:accept()
    if not conn then return end
    server.conns[conn] = daemon(connection, server, conn)
  end
end

-- Splits "host:port", "[v6]:port", ":port" or "port" (host 127.0.0.1).
local function parse_listen(s)
  local host, port = s:match("^%[(.*)%]:(%d+)$")
  if not host then host, port = s:match("^([^:]*):(%d+)$") end
  if not host then port = s:match("^(%d+)$"); host = "" end
  port = port and math.tointeger(tonumber(port))
  if not port or port > 65535 then return nil end
  return host ~= "" and host or "127.0.0.1", port
end

local Server = {}
Server.__index = Server

-- Starts the mock provider. opts: listen="127.0.0.1:0", tcp=<what provides
-- tcp_listen; default luagent.core, specs pass fakes>, idle_timeout=<seconds,
-- default M.IDLE_TIMEOUT> and everything mock.state takes (log_max=,
-- log_bytes= size the request log window). Returns a server {url=, base_urls=
-- <provider kind -> base URL>, state=} (see the methods below), or nil,
-- err. Its tasks are daemons: they do not keep a run alive.
function M.start(opts)
  opts = opts or {}
  local tcp = opts.tcp or core
  local host, port = parse_listen(opts.listen or "127.0.0.1:0")
  if not host then
    return nil, errors.new("usage", "--listen wants HOST:PORT, got '" .. tostring(opts.listen) .. "'")
  end
  local state, err = mstate.state(opts)
  if not state then return nil, err end
  -- tcp_listen raises for an address it cannot use: here that is the user's --listen
  local ok, listener, lerr = pcall(tcp.tcp_listen, host, port)
  if not ok then return nil, errors.new("usage", tostring(listener)) end
  if not listener then return nil, lerr end
  local h, p = listener:address()
  local server = setmetatable({ state = state, listener = listener, conns = {}, timers = {},
    idle_timeout = opts.idle_timeout or M.IDLE_TIMEOUT,
    url = "http://" .. (h:find(":", 1, true) and "[" .. h .. "]" or h) .. ":" .. p }, Server)
  server.base_urls = route.base_urls(server.url)
  server.task = daemon(accept_loop, server)
  return server
end

-- What the server received: a list of {n=<model request number>, method=,
-- path=, headers=<masked>, body=<decoded JSON or text>}, the latest
-- mock.LOG_MAX requests at most (a window; see mock.LOG_BYTES).
function Server:requests()
  return self.state.log
end

-- Divergences from the cassette so far, as messages.
function Server:divergences()
  return self.state.divergences
end

-- Waits until the server is closed. Raises if the accept loop failed or the
-- waiting task is cancelled.
function Server:wait()
  local ok, err = pcall(self.task.join, self.task)
  if not ok and not self.closed then error(err, 0) end
end

-- Stops accepting and drops open connections. Idempotent. The accept task
-- is cancelled before the listener closes, so it ends as cancelled whatever
-- a closed listener does to a pending accept.
function Server:close()
  if self.closed then return end
  self.closed = true
  self.task:cancel("mock server closed")
  self.listener:close()
  for conn, task in pairs(self.conns) do
    task:cancel("mock server closed")
    conn:close()
  end
  for _, timer in pairs(self.timers) do timer:cancel("mock server closed") end
  self.conns, self.timers = {}, {}
end


return M
