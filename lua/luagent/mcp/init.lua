-- Tool sets from MCP servers: luagent.tools.mcp{command = {argv...}} (a
-- child process speaking JSON-RPC on stdio, mcp/stdio.lua) or
-- luagent.tools.mcp{url = "http://..."} (Streamable HTTP, mcp/http.lua).
-- The set does the handshake (initialize with version negotiation, then
-- notifications/initialized), lists the tools (every page), and offers
-- them as luagent tools: the same interface and events as a folder set
-- (snapshot, events_since, tools_changed), so agents take a new list
-- between turns, atomically. notifications/tools/list_changed re-lists.
--
-- A supervisor (a daemon task) keeps the connection: a server that exits,
-- writes garbage or stops answering pings is restarted with backoff; its
-- tools fail fast while it is down (a retryable error), calls in flight
-- end with a `died` error, so a read-only or idempotent tool is retried
-- and a tool with neither flag stops the run with outcome_unknown.
--
-- Flags come from the tools' annotations (readOnlyHint -> read_only,
-- idempotentHint -> idempotent; absent: false, as the MCP spec says) only
-- when the tool policy trusts this server's hints (trust_hints); the
-- policy's overrides per tool name win (policies/README.md).
--
-- Servers are real processes or sockets: under the virtual clock, time
-- runs as on the real clock while a set reads its server (host/loop.c), so
-- an open MCP set gains nothing from it; MCP sets want the real clock.
local core = require "luagent.core"
local errors = require "luagent.errors"
local json = require "luagent.json"
local queue = require "luagent.queue"
local policies = require "luagent.policy"
local tools = require "luagent.tools"
local dir = require "luagent.tools.dir"
local rpc = require "luagent.mcp.rpc"
local content = require "luagent.mcp.content"

local M = {}

-- The protocol revision asked for, and every revision this client speaks.
M.PROTOCOL = "2025-11-25"
M.SUPPORTED = { ["2025-11-25"] = true, ["2025-06-18"] = true, ["2025-03-26"] = true, ["2024-11-05"] = true }
M.MAX_PAGES = 1000
M.STABLE = 30 -- seconds up after which a restart's backoff starts over

M.defaults = {
  init_timeout = 10,         -- seconds for the handshake and the first list
  request_timeout = 30,      -- seconds for tools/list and other requests
  max_message = 4 * 1024 * 1024, -- bytes of one message from the server
  ping_interval = 30,        -- seconds between pings (false: none)
  ping_timeout = 10,         -- a ping not answered in this time restarts the server
  restart = { strategy = "exponential", base = 0.2, max = 30, jitter = 0.2 },
}

local Set = {}
Set.__index = Set
Set.__name = "luagent.McpToolSet"
Set.record = dir.Set.record
Set.snapshot = dir.Set.snapshot
Set.version = dir.Set.version

------------------------------------------------------------------------------
-- Options
------------------------------------------------------------------------------

local OPTIONS = { command = true, env = true, cwd = true, url = true, headers = true, name = true,
  prefix = true, timeout = true, policy = true, tool_policy = true, roots = true, restart = true,
  init_timeout = true, request_timeout = true, max_message = true, ping_interval = true,
  ping_timeout = true }

local function positive(v) return type(v) == "number" and v > 0 and v < math.huge end

-- Checks the options of open(); raises (misuse) naming the option.
local function check_options(o)
  local function bad(msg) error("tools.mcp: " .. msg, 4) end
  if type(o) ~= "table" then bad("expects a table {command = {argv...}} or {url = \"http://...\"}") end
  for k in pairs(o) do
    if not OPTIONS[k] then bad("unknown option '" .. tostring(k) .. "'") end
  end
  if (o.command == nil) == (o.url == nil) then bad("needs exactly one of command (an argv list) and url") end
  if o.command ~= nil then
    if type(o.command) ~= "table" or #o.command == 0 then bad("command must be a non-empty list of strings") end
    for i, a in ipairs(o.command) do
      if type(a) ~= "string" then bad("command[" .. i .. "] must be a string") end
    end
  end
  if o.url ~= nil and (type(o.url) ~= "string" or not o.url:match("^https?://")) then
    bad("url must be an http:// or https:// address")
  end
  for _, k in ipairs({ "env", "headers", "restart", "roots" }) do
    if o[k] ~= nil and type(o[k]) ~= "table" then bad(k .. " must be a table") end
  end
  for _, k in ipairs({ "cwd", "name", "prefix" }) do
    if o[k] ~= nil and type(o[k]) ~= "string" then bad(k .. " must be a string") end
  end
  if o.prefix and not o.prefix:match("^[A-Za-z0-9_-]*$") then bad("prefix must match [A-Za-z0-9_-]*") end
  for _, k in ipairs({ "timeout", "init_timeout", "request_timeout", "max_message", "ping_timeout" }) do
    if o[k] ~= nil and not positive(o[k]) then bad(k .. " must be a number > 0") end
  end
  if o.ping_interval ~= nil and o.ping_interval ~= false and not positive(o.ping_interval) then
    bad("ping_interval must be a number of seconds > 0, or false")
  end
end

-- The tool section deciding trust and overrides: tool_policy (a tool
-- section), else the `tool` section of policy (a name, file or table),
-- else the default policy's.
local function tool_policy(o)
  local agent = require "luagent.agent"
  local t
  if o.tool_policy ~= nil then
    local err
    t, err = policies.check_tool_section(o.tool_policy, "tools.mcp tool_policy")
    if not t then error(err.message, 4) end
  end
  return agent.Agent.current_tool_policy({ tool_policy = t, policy = o.policy })
end

-- The name the server goes by in messages and in trust_hints.
local function label_of(o)
  if o.name then return o.name end
  if o.url then return o.url end
  return table.concat(o.command, " ")
end

------------------------------------------------------------------------------
-- Tools
------------------------------------------------------------------------------

-- A JSON array decoded as an empty table encodes as {}; the schema's lists
-- that may be empty are marked again.
local function fix_schema(s, depth)
  if type(s) ~= "table" or depth > 32 then return s end
  for _, k in ipairs({ "required", "enum" }) do
    if type(s[k]) == "table" and next(s[k]) == nil then s[k] = json.array() end
  end
  if s.type == "array" and type(s.default) == "table" and next(s.default) == nil then s.default = json.array() end
  for _, k in ipairs({ "properties", "patternProperties", "$defs", "definitions" }) do
    if type(s[k]) == "table" then
      for _, sub in pairs(s[k]) do fix_schema(sub, depth + 1) end
    end
  end
  for _, k in ipairs({ "items", "additionalProperties" }) do fix_schema(s[k], depth + 1) end
  for _, k in ipairs({ "anyOf", "oneOf", "allOf" }) do
    if type(s[k]) == "table" then for _, sub in ipairs(s[k]) do fix_schema(sub, depth + 1) end end
  end
  return s
end

-- trusted(policy, label): whether the tool policy trusts the hints of the
-- server called `label`.
function M.trusted(policy, label)
  local t = policy.trust_hints
  if t == true then return true end
  if type(t) == "table" then
    for _, n in ipairs(t) do if n == label then return true end end
  end
  return false
end

-- flags(annotations, name, policy, label) -> read_only, idempotent, hints:
-- the spec's defaults for absent hints, hints used only when trusted,
-- overrides for the tool's name last.
function M.flags(ann, name, policy, label)
  ann = type(ann) == "table" and ann or {}
  local hints = { read_only = ann.readOnlyHint == true, idempotent = ann.idempotentHint == true,
    destructive = ann.destructiveHint ~= false, open_world = ann.openWorldHint ~= false }
  local trust = M.trusted(policy, label)
  local ro, idem = trust and hints.read_only, trust and hints.idempotent
  local o = (policy.overrides or {})[name]
  if o then
    if o.read_only ~= nil then ro = o.read_only end
    if o.idempotent ~= nil then idem = o.idempotent end
  end
  return ro, idem, hints, trust
end

-- A luagent tool for the server's tool `t` (a tools/list entry), or nil and
-- why it cannot be offered.
function Set:make_tool(t)
  if type(t) ~= "table" or type(t.name) ~= "string" or t.name == "" then
    return nil, "a tool without a name: " .. json.encode(t):sub(1, 120)
  end
  local name = (self.prefix or "") .. t.name:gsub("[^A-Za-z0-9_-]", "_")
  if #name > tools.MAX_NAME then name = name:sub(1, tools.MAX_NAME) end
  local ro, idem, hints, trust = M.flags(t.annotations, name, self.policy, self.label)
  local description = type(t.description) == "string" and t.description ~= "" and t.description
    or type(t.title) == "string" and t.title ~= "" and t.title or ("the tool " .. t.name .. " of " .. self.label)
  local params = type(t.inputSchema) == "table" and fix_schema(t.inputSchema, 0) or { type = "object" }
  local remote = t.name
  local tool, why = tools.check({ name = name, description = description, params = params,
    read_only = ro, idempotent = idem, timeout = self.timeout,
    run = function(args, ctx) return self:call(remote, args, ctx) end })
  if not tool then return nil, why end
  tool.mcp = { server = self.label, name = remote, hints = hints, trusted = trust,
    fingerprint = json.encode { description, params, ro, idem, remote } }
  return tool
end

-- list(session) -> {name = tool} | nil, err: every page of tools/list.
-- A tool that cannot be offered (or whose name another has) is reported
-- as a tools_reload_failed event and left out.
function Set:list(session, timeout)
  local map, cursor, pages = {}, nil, 0
  local old = self.snap.tools
  repeat
    pages = pages + 1
    if pages > M.MAX_PAGES then
      return nil, errors.new("protocol", self.label .. ": tools/list gave more than " .. M.MAX_PAGES .. " pages")
    end
    local res, err = session:request("tools/list", cursor and { cursor = cursor } or json.object(),
      { timeout = timeout or self.request_timeout })
    if not res then return nil, err end
    if type(res) ~= "table" or type(res.tools) ~= "table" then
      return nil, errors.new("protocol", self.label .. ": tools/list answered without a list of tools")
    end
    for _, t in ipairs(res.tools) do
      local tool, why = self:make_tool(t)
      if tool and map[tool.name] then tool, why = nil, "tool name '" .. tool.name .. "' is given twice" end
      if tool then
        local prev = old[tool.name]
        if prev and prev.mcp and prev.mcp.fingerprint == tool.mcp.fingerprint then tool = prev end
        map[tool.name] = tool
      else
        self:record { type = "tools_reload_failed", file = self.label, server = self.label,
          message = self.label .. ": " .. tostring(why) }
      end
    end
    cursor = res.nextCursor
    if cursor == json.null then cursor = nil end
  until cursor == nil
  return map
end

-- Re-lists the tools after list_changed (coalesced: one at a time, once
-- more if another notice came meanwhile) and publishes what changed.
function Set:relist()
  if self.relisting then self.relist_again = true return end
  self.relisting = true
  local task = core.spawn(function()
    local ok, err = pcall(function()
      repeat
        self.relist_again = false
        local session = self.session
        if self.state ~= "ready" or not session then break end
        local map, lerr = self:list(session)
        if map then
          dir.publish(self, map)
        else
          self:record { type = "tools_reload_failed", file = self.label, server = self.label,
            message = self.label .. ": re-listing the tools failed: " .. tostring(lerr) }
        end
      until not self.relist_again
    end)
    self.relisting = false
    local ws = self.relist_waiters
    self.relist_waiters = {}
    for _, w in ipairs(ws) do w.notify() end
    if not ok then error(err, 0) end
  end)
  task:set_daemon(true)
end

-- The server said its list changed: re-list now, or after the handshake.
function Set:list_changed()
  if self.state == "ready" then self:relist() else self.relist_pending = true end
end

-- events_since(cursor) -> events, cursor: as a folder set's; a re-list
-- under way (a list_changed came) is waited for, so the turn that starts
-- next sees the list the server announced.
function Set:events_since(cursor)
  while self.relisting do
    local s = queue.signal()
    self.relist_waiters[#self.relist_waiters + 1] = s
    s.wait()
  end
  return dir.Set.events_since(self, cursor)
end

------------------------------------------------------------------------------
-- Calls
------------------------------------------------------------------------------

-- Wakes every task waiting for the server's state to change.
function Set:wake_all()
  local ws = self.waiters
  self.waiters = {}
  for _, s in ipairs(ws) do s.notify() end
end

-- The session of a ready server; waits while it starts; nil and a
-- retryable error while it is down (fail fast) or once the set closed.
function Set:ready_session()
  while self.state == "starting" do
    local s = queue.signal()
    self.waiters[#self.waiters + 1] = s
    s.wait()
  end
  if self.state == "ready" then return self.session end
  if self.state == "closed" then
    return nil, errors.new("tool_error", self.label .. ": the tool set is closed", { retryable = false })
  end
  local wait = self.restart_at and math.max(0, self.restart_at - core.now()) or 0
  return nil, errors.new("tool_error", string.format("%s is down (%s); restarting in %.2g s", self.label,
    tostring(self.last_error and self.last_error.message or "not started"), wait), { retryable = true })
end

-- call(remote_name, args, ctx) -> text | nil, err: one tools/call.
function Set:call(remote, args, ctx)
  local session, err = self:ready_session()
  if not session then return nil, err end
  local arguments = args
  local raw = ctx and ctx.raw_arguments
  if type(raw) == "string" and type(json.decode(raw)) == "table" then arguments = json.raw(raw) end
  local res, rerr = session:request("tools/call", { name = remote, arguments = arguments }, {
    on_progress = ctx and function(p)
      ctx:progress { progress = p.progress, total = p.total, message = p.message }
    end })
  if not res then
    if rerr.rpc_code == nil then -- no answer: the call may have run
      return nil, errors.new("tool_error", string.format("%s got no answer: %s", remote, rerr.message),
        { died = true, cause = rerr })
    end
    return nil, errors.new("tool_error", string.format("%s failed: %s", remote, rerr.message),
      { retryable = false, rpc_code = rerr.rpc_code })
  end
  if type(res) ~= "table" then
    return nil, errors.new("tool_error", remote .. ": the server answered tools/call with no result object")
  end
  local text = content.text(res)
  if res.isError == true then
    return nil, errors.new("tool_error", string.format("%s failed: %s", remote, text ~= "" and text or "an error"),
      { retryable = false })
  end
  return text
end

------------------------------------------------------------------------------
-- The connection and its supervisor
------------------------------------------------------------------------------

-- What the client answers the server's own requests with (roots/list).
function Set:on_request(method)
  if method == "roots/list" and self.roots then
    local out = json.array()
    for _, r in ipairs(self.roots) do
      local path = tostring(r)
      out[#out + 1] = { uri = "file://" .. path, name = path:match("([^/]+)/*$") or path }
    end
    return { roots = out }
  end
  return nil
end

-- initialize, its version check, notifications/initialized, then the
-- first list. true | nil, err.
function Set:handshake(session)
  local caps = json.object()
  if self.roots then caps = { roots = { listChanged = false } } end
  local res, err = session:request("initialize", {
    protocolVersion = M.PROTOCOL, capabilities = caps,
    clientInfo = { name = "luagent", version = tostring(core.version) },
  }, { timeout = self.init_timeout })
  if not res then
    if err.kind == "timeout" then
      err = errors.new("timeout", string.format("%s did not answer initialize within %g s%s", self.label,
        self.init_timeout, self:stderr_note()), { which = "mcp" })
    end
    return nil, err
  end
  if type(res) ~= "table" or type(res.protocolVersion) ~= "string" then
    return nil, errors.new("protocol", self.label .. ": the answer to initialize has no protocolVersion")
  end
  if not M.SUPPORTED[res.protocolVersion] then
    local list = {}
    for v in pairs(M.SUPPORTED) do list[#list + 1] = v end
    table.sort(list)
    return nil, errors.new("protocol", string.format("%s speaks MCP %s; luagent speaks %s", self.label,
      res.protocolVersion, table.concat(list, ", ")))
  end
  self.server_info = type(res.serverInfo) == "table" and res.serverInfo or {}
  self.protocol = res.protocolVersion
  self.instructions = type(res.instructions) == "string" and res.instructions or nil
  if self.transport.listen then self.transport:listen(res.protocolVersion) end
  session:notify("notifications/initialized")
  local map, lerr = self:list(session, self.init_timeout)
  if not map then return nil, lerr end
  dir.publish(self, map)
  return true
end

-- " (stderr: ...)" with the tail of a stdio server's stderr, or "".
function Set:stderr_note()
  local t = self.transport.stderr_tail and self.transport:stderr_tail() or ""
  return t ~= "" and (" (stderr: " .. t .. ")") or ""
end

-- Pings the server every ping_interval; one not answered within
-- ping_timeout kills the connection (the supervisor restarts it).
function Set:pinger(session)
  local task = core.spawn(function()
    while session == self.session and not session.dead do
      core.sleep(self.ping_interval)
      local answered = false
      local p = core.spawn(function()
        pcall(function() answered = session:request("ping", nil, { daemon = true }) ~= nil end)
      end)
      p:set_daemon(true)
      core.sleep(self.ping_timeout)
      if session ~= self.session or session.dead then break end
      if not answered then
        p:cancel("ping timed out")
        self.cause = errors.new("timeout", string.format("%s did not answer a ping within %g s", self.label,
          self.ping_timeout), { which = "mcp" })
        self.transport:kill()
        break
      end
    end
  end)
  task:set_daemon(true)
  return task
end

-- One connection, from start to end: returns why it ended (a record).
function Set:cycle()
  local t = self.transport
  self.state, self.cause = "starting", nil
  self:wake_all()
  local started, err = t:start()
  if not started then return err end
  local session = rpc.new { name = self.label, send = function(text) return t:send(text) end,
    on_request = function(method, params) return self:on_request(method, params) end,
    on_notification = function(method)
      if method == "notifications/tools/list_changed" then self:list_changed() end
    end }
  -- a notice sent while no GET stream was open is lost: one is re-listed for
  t.on_stream = function() self:list_changed() end
  self.session = session
  local hs = core.spawn(function()
    local hok, herr = self:handshake(session)
    if hok then
      self.state, self.ready_at = "ready", core.now()
      if self.ping_interval then self.ping_task = self:pinger(session) end
      if self.relist_pending then self.relist_pending = false self:relist() end
    else
      self.cause = herr
      t:kill()
    end
    self:wake_all()
  end)
  hs:set_daemon(true)
  local ok, why = pcall(t.run, t, function(line) return session:deliver(line) end)
  hs:cancel("connection ended")
  if self.ping_task then self.ping_task:cancel("connection ended") self.ping_task = nil end
  if not ok then -- the set closed (or a bug): what this connection started ends here
    session:fail(errors.new("tool_error", self.label .. ": the tool set is closed", { died = true }))
    error(why, 0)
  end
  why = self.cause or session.dead or why
  self.state, self.last_error = "down", why
  session:fail(errors.new("tool_error", string.format("%s stopped while the call ran: %s", self.label,
    tostring(why and why.message or why)), { died = true, cause = why }))
  t:close()
  return why
end

-- The supervisor (a daemon task): connects, and after the connection ended
-- restarts it with backoff, until the set closes. The first connection's
-- failure ends it: open() reports it.
function Set:supervise()
  while not self.closed do
    local why = self:cycle()
    if self.closed then break end
    self.state, self.last_error = "down", why
    self:wake_all()
    if not self.opened then break end
    -- a connection that lasted starts the backoff over; a crash loop does not
    if self.ready_at and core.now() - self.ready_at >= M.STABLE then self.failures = 0 end
    self.ready_at = nil
    self.failures = (self.failures or 0) + 1
    self.restarts = self.restarts + 1
    local b = self.restart
    local delay = core.backoff_delay(b.strategy, self.failures, b, math.random())
    self.restart_at = core.now() + delay
    self:record { type = "tools_reload_failed", file = self.label, server = self.label,
      message = string.format("%s: %s; restarting in %.2g s", self.label, tostring(why and why.message or why), delay) }
    core.sleep(delay)
  end
end

------------------------------------------------------------------------------
-- Opening and closing
------------------------------------------------------------------------------

-- open(opts) -> set | nil, err. Raises for bad options; returns nil and
-- the first connection's failure (with the server's stderr when it has
-- some). See the header and README.md for the options.
function M.open(o)
  check_options(o)
  local d = M.defaults
  local label = label_of(o)
  local max_message = o.max_message or d.max_message
  local transport
  if o.command then
    transport = require("luagent.mcp.stdio").new { command = o.command, env = o.env, cwd = o.cwd,
      max_message = max_message, name = label }
  else
    transport = require("luagent.mcp.http").new { url = o.url, headers = o.headers,
      max_message = max_message, name = label }
  end
  local restart = policies.tool_section({ backoff = o.restart or d.restart }).backoff
  local self = setmetatable({
    label = label, prefix = o.prefix, timeout = o.timeout, roots = o.roots, policy = tool_policy(o),
    transport = transport, init_timeout = o.init_timeout or d.init_timeout,
    request_timeout = o.request_timeout or d.request_timeout,
    ping_interval = o.ping_interval == nil and d.ping_interval or o.ping_interval,
    ping_timeout = o.ping_timeout or d.ping_timeout, restart = restart,
    snap = { version = 0, tools = {}, names = {} }, log = {}, seq = 0, waiters = {}, relist_waiters = {},
    state = "starting", restarts = 0, opened = false,
  }, Set)
  self.task = core.spawn(function() self:supervise() end)
  self.task:set_daemon(true)
  while self.state == "starting" do
    local s = queue.signal()
    self.waiters[#self.waiters + 1] = s
    s.wait()
  end
  if self.state ~= "ready" then
    local err = self.last_error or errors.new("eof", label .. " ended before the handshake")
    self:close()
    return nil, err
  end
  self.opened = true
  return self
end

-- status() -> {state=, server=, protocol=, restarts=, last_error=}.
function Set:status()
  return { state = self.state, server = self.server_info, protocol = self.protocol,
    restarts = self.restarts, last_error = self.last_error }
end

-- Stops the server and the supervisor (waiting for it to end). The last
-- snapshot stays; its tools fail with "closed".
function Set:close()
  if self.closed then return end
  self.closed = true
  local task = self.task
  self.task = nil
  if task then
    task:cancel("tool set closed")
    if task ~= core.current() then pcall(task.join, task) end -- its connection's tasks end with it
  end
  if self.ping_task then self.ping_task:cancel("tool set closed") self.ping_task = nil end
  if self.session then
    self.session:fail(errors.new("tool_error", self.label .. ": the tool set is closed", { died = true }))
  end
  self.transport:kill()
  self.transport:close()
  self.state = "closed"
  self:wake_all()
end
Set.__close = Set.close

M.Set = Set
return M
