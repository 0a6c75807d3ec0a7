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
-- Keys: a stdio server gets the reduced environment of every child (no
-- provider key; lua/luagent/base/child_env.lua) plus `env`; the credentials of
-- a URL (?key=, user info) and of its headers (Authorization, ...) are
-- registered as secrets; the server's tool definitions and what the set
-- reports of a connection (open's error, status().last_error,
-- tools_reload_failed) are scrubbed, and its tools' results and errors
-- are, as every tool's (lua/luagent/agent/tools/tool.lua).
--
-- What a server sends is bounded: one message by max_message; the
-- handshake as a whole by init_timeout and a re-list by request_timeout;
-- the tools taken by max_tools and by max_message bytes of definitions; a
-- tool whose schema cannot be encoded is left out; any of these, and any
-- error in the handshake or a re-list, is reported (nil, err to open(), or
-- a tools_reload_failed event), never left hanging.
--
-- Servers are real processes or sockets: under the virtual clock, time
-- runs as on the real clock while a set reads its server (host/loop.c), so
-- an open MCP set gains nothing from it; MCP sets want the real clock.
local core = require "luagent.core"
local errors = require "luagent.base.errors"
local options = require "luagent.base.options"
local json = require "luagent.base.json"
local queue = require "luagent.base.queue"
local policies = require "luagent.model.policy"
local secrets = require "luagent.base.secrets"
local child_env = require "luagent.base.child_env"
local tool = require "luagent.agent.tools.tool"
local set = require "luagent.agent.tools.set"
local rpc = require "luagent.agent.tools.mcp.rpc"
local content = require "luagent.agent.tools.mcp.content"
local stdio = require "luagent.agent.tools.mcp.stdio"
local http = require "luagent.agent.tools.mcp.http"

local M = {}

-- The protocol revision asked for, and every revision this client speaks.
M.PROTOCOL = "2025-11-25"
M.SUPPORTED = { ["2025-11-25"] = true, ["2025-06-18"] = true, ["2025-03-26"] = true, ["2024-11-05"] = true }
M.MAX_PAGES = 1000
M.STABLE = 30 -- seconds up after which a restart's backoff starts over
-- Tables within tables an inputSchema may nest: a request wraps the schema
-- in a few more, and the encoder stops at 200 (a cycle's guard).
M.MAX_SCHEMA_DEPTH = 64
-- Re-lists back to back while list_changed keeps coming during each: past
-- this the last list is kept until the next notice (a server announcing a
-- change on every read would keep luagent listing for ever).
M.MAX_RELISTS = 3

M.defaults = {
  init_timeout = 10,         -- seconds for the handshake and the first list
  request_timeout = 30,      -- seconds for a request, and for a whole re-list
  max_message = 4 * 1024 * 1024, -- bytes of one message from the server; also the bound of the
                             -- tools' definitions taken, and of what waits unread for a stdio server
  max_tools = 1000,          -- tools taken from one server (every model request carries them all)
  ping_interval = 30,        -- seconds between pings (false: none)
  ping_timeout = 10,         -- a ping not answered in this time restarts the server
  restart = { strategy = "exponential", base = 0.2, max = 30, jitter = 0.2 },
}

---What `luagent.tools.mcp{...}` takes: exactly one of `command` and `url`.
---@class luagent.McpOptions
---@field command string[]? the server as a command (argv, no shell), speaking newline-delimited JSON-RPC on stdio
---@field env table<string, string|false>? the command's environment over the reduced one
---@field cwd string? the command's folder
---@field url string? the server's Streamable HTTP address
---@field headers table<string, string>? headers of every HTTP request (credentials are scrubbed from every output)
---@field name string? your name for the server: in reports, and what `trust_hints` matches
---@field prefix string? put before every tool name the model sees
---@field timeout number? each tool call's timeout, in seconds
---@field policy string|table? a policy whose `tool` section gives `trust_hints` and `overrides`
---@field tool_policy table? a tool section (`trust_hints`, `overrides`) for this set
---@field roots string[]? folders answered to `roots/list`
---@field restart {strategy: string?, base: number?, max: number?, multiplier: number?, jitter: number?}? the backoff of restarts
---@field init_timeout number? seconds for the handshake and the first list (10)
---@field request_timeout number? seconds for a request and a whole re-list (30)
---@field ping_interval number|false? seconds between pings (30)
---@field ping_timeout number? a ping not answered in this time restarts the server (10)
---@field max_message integer? bytes of one message from the server (4 MiB)
---@field max_tools integer? tools taken from one server (1000)

-- An MCP server's set: a tool set (set.lua) that keeps a connection.
---An MCP server's tool set.
---@class luagent.McpSet: luagent.ToolSet
local Set = set.class("luagent.McpToolSet")

------------------------------------------------------------------------------
-- Options
------------------------------------------------------------------------------

-- The options `luagent.tools.mcp{...}` takes (open reads them;
-- luagent.McpOptions above documents them), and those of its restart
-- backoff: any other raises, naming the nearest. A new one is added here.
M.OPTIONS = options.known { "command", "env", "cwd", "url", "headers", "name", "prefix", "timeout", "policy",
  "tool_policy", "roots", "restart", "init_timeout", "request_timeout", "ping_interval", "ping_timeout",
  "max_message", "max_tools" }
M.RESTART = options.known { "strategy", "base", "max", "multiplier", "jitter" }

local function positive(v) return type(v) == "number" and v > 0 and v < math.huge end

-- Checks the options of open(); raises (misuse) naming the option.
local function check_options(o)
  local function bad(msg) error("tools.mcp: " .. msg, 4) end
  if type(o) ~= "table" then bad("expects a table {command = {argv...}} or {url = \"http://...\"}") end
  options.check(o, M.OPTIONS, "tools.mcp", 3)
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
  if o.restart ~= nil then options.check(o.restart, M.RESTART, "tools.mcp restart", 3) end
  if o.env ~= nil and o.url then bad("env is for a server started as a command") end
  for _, k in ipairs({ "cwd", "name", "prefix" }) do
    if o[k] ~= nil and type(o[k]) ~= "string" then bad(k .. " must be a string") end
  end
  if o.prefix and not o.prefix:match("^[A-Za-z0-9_-]*$") then bad("prefix must match [A-Za-z0-9_-]*") end
  for _, k in ipairs({ "timeout", "init_timeout", "request_timeout", "max_message", "ping_timeout", "max_tools" }) do
    if o[k] ~= nil and not positive(o[k]) then bad(k .. " must be a number > 0") end
  end
  if o.ping_interval ~= nil and o.ping_interval ~= false and not positive(o.ping_interval) then
    bad("ping_interval must be a number of seconds > 0, or false")
  end
end

-- The tool section deciding trust and overrides: tool_policy (a tool
-- section), else the `tool` section of policy (a name, file or table),
-- else the default policy's.
local function tool_policy(o, rt)
  local t
  if o.tool_policy ~= nil then
    local err
    t, err = policies.check_tool_section(o.tool_policy, "tools.mcp tool_policy")
    if not t then error(err.message, 3) end
  end
  return tool.section_in_force(t, o.policy, rt and rt.policies)
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

-- Why the decoded inputSchema `s` cannot be offered, or nil: a number JSON
-- cannot carry (1e999 decodes as infinity) would make every request that
-- carries the tool fail to encode, and so would nesting past the encoder's
-- bound. Walks at most MAX_SCHEMA_DEPTH levels.
local function schema_problem(s, depth, path)
  if depth > M.MAX_SCHEMA_DEPTH then
    return "is nested more than " .. M.MAX_SCHEMA_DEPTH .. " levels deep"
  end
  for k, v in pairs(s) do
    local at = path == "" and tostring(k) or (path .. "." .. tostring(k))
    if type(v) == "number" and (v ~= v or v == math.huge or v == -math.huge) then
      return "holds a number JSON cannot carry (1e999, NaN or Infinity) at " .. at
    elseif type(v) == "table" then
      local why = schema_problem(v, depth + 1, at)
      if why then return why end
    end
  end
end

-- A short excerpt of a tools/list entry for messages (never raises).
local function entry_excerpt(t)
  local ok, text = pcall(json.encode, t, { nonfinite = "null" })
  return ok and text:sub(1, 120) or tostring(t)
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

-- flags_for(tool, policy) -> read_only, idempotent of an MCP tool (made by
-- make_tool) as an agent whose tool section is `policy` runs it: the
-- server's hints when the set or `policy` trusts the server, then the
-- set's overrides for the tool, then `policy`'s (the agent's win).
function M.flags_for(t, policy)
  local m = t.mcp
  local trust = m.trusted or M.trusted(policy, m.server)
  local ro, idem = trust and m.hints.read_only or false, trust and m.hints.idempotent or false
  for _, o in ipairs({ m.overrides or false, (policy.overrides or {})[t.name] or false }) do
    if o then
      if o.read_only ~= nil then ro = o.read_only end
      if o.idempotent ~= nil then idem = o.idempotent end
    end
  end
  return ro, idem
end

-- A luagent tool for the server's tool `t` (a tools/list entry), or nil and
-- why it cannot be offered.
function Set:make_tool(t)
  -- its description and schema go with every model request: scrubbed
  secrets.scrub(t)
  if type(t) ~= "table" or type(t.name) ~= "string" or t.name == "" then
    return nil, "a tool without a name: " .. entry_excerpt(t)
  end
  if type(t.inputSchema) == "table" then
    local problem = schema_problem(t.inputSchema, 1, "")
    if problem then return nil, "tool '" .. t.name .. "' is left out: its inputSchema " .. problem end
  end
  local name = (self.prefix or "") .. t.name:gsub("[^A-Za-z0-9_-]", "_")
  if #name > tool.MAX_NAME then name = name:sub(1, tool.MAX_NAME) end
  local ro, idem, hints, trust = M.flags(t.annotations, name, self.policy, self.label)
  local description = type(t.description) == "string" and t.description ~= "" and t.description
    or type(t.title) == "string" and t.title ~= "" and t.title or ("the tool " .. t.name .. " of " .. secrets.text(self.label))
  local params = type(t.inputSchema) == "table" and fix_schema(t.inputSchema, 0) or { type = "object" }
  local remote = t.name
  local checked, why = tool.check({ name = name, description = description, params = params,
    read_only = ro, idempotent = idem, timeout = self.timeout,
    run = function(args, ctx) return self:call(remote, args, ctx) end })
  if not checked then return nil, why end
  local encoded, fingerprint = pcall(json.encode, { description, params, ro, idem, remote })
  if not encoded then return nil, "tool '" .. t.name .. "' is left out: " .. tostring(fingerprint) end
  checked.mcp = { server = self.label, name = remote, hints = hints, trusted = trust, fingerprint = fingerprint,
    overrides = (self.policy.overrides or {})[name] }
  return checked
end

-- Reports that a tool (`name`, when one) of the server's list is left out.
function Set:report(message, name)
  self:record { type = "tools_reload_failed", file = self.label, server = self.label, tool = name,
    message = self.label .. ": " .. message }
end

-- Reports that a cap stopped the listing at entry `i` of the page `entries`.
function Set:report_cap(cap, offered, entries, i)
  local names = {}
  for j = i, #entries do
    local t = entries[j]
    names[#names + 1] = type(t) == "table" and type(t.name) == "string" and t.name or "?"
  end
  local shown = table.concat(names, ", ", 1, math.min(5, #names))
  if #names > 5 then shown = string.format("%s and %d more", shown, #names - 5) end
  self:report(string.format("%s; the first %d are offered, these and any on later pages are left out: %s",
    cap, offered, shown))
end

-- list(session, deadline) -> {name = tool} | nil, err: every page of
-- tools/list, all of them before `deadline` (core.now() time). A tool that
-- cannot be offered (or whose name another has) is reported as a
-- tools_reload_failed event and left out; past max_tools tools, or
-- max_message bytes of their definitions (what every model request
-- carries), the rest are reported and no further page is asked for.
function Set:list(session, deadline)
  local map, cursor, pages, count, bytes = {}, nil, 0, 0, 0
  local old = self.snap.tools
  repeat
    pages = pages + 1
    if pages > M.MAX_PAGES then
      return nil, errors.new("protocol", self.label .. ": tools/list gave more than " .. M.MAX_PAGES .. " pages")
    end
    local left = deadline - core.now()
    if left <= 0 then
      return nil, errors.new("timeout", string.format("%s did not list its tools in time (%d pages read)",
        self.label, pages - 1), { which = "mcp" })
    end
    local res, err = session:request("tools/list", cursor and { cursor = cursor } or json.object(),
      { timeout = left })
    if not res then return nil, err end
    if type(res) ~= "table" or type(res.tools) ~= "table" then
      return nil, errors.new("protocol", self.label .. ": tools/list answered without a list of tools")
    end
    for i, t in ipairs(res.tools) do
      if count >= self.max_tools then
        self:report_cap(string.format("more than %d tools (max_tools)", self.max_tools), count, res.tools, i)
        return map
      end
      local made, why = self:make_tool(t)
      if made and map[made.name] then made, why = nil, "tool name '" .. made.name .. "' is given twice" end
      if made then
        bytes = bytes + #made.mcp.fingerprint
        if bytes > self.max_message then
          self:report_cap(string.format("the tools' definitions pass %d bytes (max_message)", self.max_message),
            count, res.tools, i)
          return map
        end
        local prev = old[made.name]
        if prev and prev.mcp and prev.mcp.fingerprint == made.mcp.fingerprint then made = prev end
        map[made.name] = made
        count = count + 1
      else
        self:report(tostring(why), type(t) == "table" and type(t.name) == "string" and t.name or nil)
      end
    end
    cursor = res.nextCursor
    if cursor == json.null then cursor = nil end
  until cursor == nil
  return map
end

-- Wakes the tasks waiting in events_since for a re-list.
function Set:wake_relist_waiters()
  local ws = self.relist_waiters
  self.relist_waiters = {}
  for _, w in ipairs(ws) do w.notify() end
end

-- The text of a raised error, for a report.
local function raised_text(err)
  if errors.is(err) then return err.message end
  return tostring(err)
end

-- Re-lists the tools after list_changed and publishes what changed: one
-- re-list at a time; once more if another notice came meanwhile, at most
-- MAX_RELISTS times in a row. Each round records the notices it covers
-- (`listed`), so events_since waits for the round it needs, not for a
-- server that keeps announcing.
function Set:relist()
  if self.relisting then return end
  self.relisting = true
  local task = core.spawn(function()
    local ok, err = pcall(function()
      for round = 1, M.MAX_RELISTS do
        local session = self.session
        if self.state ~= "ready" or not session then break end
        local covers = self.notices
        local map, lerr = self:list(session, core.now() + self.request_timeout)
        if map then
          self:publish(map)
        else
          self:report("re-listing the tools failed: " .. tostring(lerr and lerr.message or lerr))
        end
        self.listed = covers
        self:wake_relist_waiters()
        if self.notices == covers then break end
        if round == M.MAX_RELISTS then
          self:report(string.format("the list changed again during each of %d re-lists in a row; "
            .. "the last list is kept until the next notice", M.MAX_RELISTS))
        end
      end
    end)
    self.relisting = false
    self.relist_task = nil
    self.listed = self.notices
    self:wake_relist_waiters()
    if not ok then
      if errors.is_cancel(err) then error(err, 0) end
      self:report("re-listing the tools failed: " .. raised_text(err))
    end
  end)
  task:set_daemon(true)
  if self.relisting then self.relist_task = task end -- still running: close() stops it
end

-- The server said its list changed: re-list now, or after the handshake.
function Set:list_changed()
  self.notices = self.notices + 1
  if self.state == "ready" then self:relist() else self.relist_pending = true end
end

-- events_since(cursor) -> events, cursor: as a folder set's; the re-list
-- that covers the notices heard so far is waited for (each is bounded by
-- request_timeout), so the turn that starts next sees the list the server
-- announced; notices that come while it waits are not.
function Set:events_since(cursor)
  local wanted = self.notices
  while self.relisting and self.listed < wanted do
    local s = queue.signal()
    self.relist_waiters[#self.relist_waiters + 1] = s
    s.wait()
  end
  return set.Set.events_since(self, cursor)
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
  -- the model's text only when it holds exactly the checked value
  if type(raw) == "string" and type(json.decode_strict(raw)) == "table" then arguments = json.raw(raw) end
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
-- first list, all within init_timeout. true | nil, err.
function Set:handshake(session)
  local deadline = core.now() + self.init_timeout
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
  local map, lerr = self:list(session, deadline)
  if not map then return nil, lerr end
  self:publish(map)
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
  if not started then return secrets.scrub(err) end
  local session = rpc.new { name = self.label, send = function(text) return t:send(text) end,
    on_request = function(method, params) return self:on_request(method, params) end,
    on_notification = function(method)
      if method == "notifications/tools/list_changed" then self:list_changed() end
    end }
  -- a notice sent while no GET stream was open is lost: one is re-listed for
  t.on_stream = function() self:list_changed() end
  self.session = session
  local hs = core.spawn(function()
    -- whatever goes wrong in it, the opener is woken with the reason
    local ran, hok, herr = pcall(self.handshake, self, session)
    if not ran then
      if errors.is_cancel(hok) then error(hok, 0) end
      hok, herr = nil, errors.new("protocol", self.label .. ": the handshake failed: " .. raised_text(hok))
    end
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
  if not ok then
    if errors.is_cancel(why) or self.closed then -- the set closed: what this connection started ends here
      session:fail(errors.new("tool_error", self.label .. ": the tool set is closed", { died = true }))
      error(why, 0)
    end
    -- anything else raised while reading ends this connection like a
    -- failure (the opener is woken, a set that was open restarts it)
    why = errors.new("protocol", self.label .. ": the connection failed: " .. raised_text(why))
    t:kill()
  end
  -- what the server said or echoed may hold a key: the set reports it scrubbed
  why = secrets.scrub(self.cause or session.dead or why)
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

-- open(opts [, rt]) -> set | nil, err. Raises for bad options; returns nil
-- and the first connection's failure (with the server's stderr when it has
-- some). See the header and README.md for the options. `rt`, the runtime
-- the set serves (lua/luagent/runtime.lua), gives the default policy and
-- owns the set (closes it when it closes). Called by a tail call
-- (tools.mcp), so its misuse errors name the caller's line.
function M.open(o, rt)
  check_options(o)
  local env, why = child_env.own(o.env)
  if o.env ~= nil and not env then error("tools.mcp: " .. why, 2) end
  secrets.register_url(o.url)
  for name, value in pairs(o.headers or {}) do secrets.register_credential(name, value) end
  local d = M.defaults
  local label = label_of(o)
  local max_message = o.max_message or d.max_message
  local transport
  if o.command then
    transport = stdio.new { command = o.command, env = env, cwd = o.cwd,
      max_message = max_message, name = label }
  else
    transport = http.new { url = o.url, headers = o.headers,
      max_message = max_message, name = label }
  end
  local restart = policies.tool_section({ backoff = o.restart or d.restart }).backoff
  local self = set.new(Set, {
    label = label, prefix = o.prefix, timeout = o.timeout, roots = o.roots, policy = tool_policy(o, rt),
    transport = transport, init_timeout = o.init_timeout or d.init_timeout,
    request_timeout = o.request_timeout or d.request_timeout,
    ping_interval = o.ping_interval == nil and d.ping_interval or o.ping_interval,
    ping_timeout = o.ping_timeout or d.ping_timeout, restart = restart,
    max_tools = o.max_tools or d.max_tools, max_message = max_message, notices = 0, listed = 0,
    waiters = {}, relist_waiters = {}, state = "starting", restarts = 0, opened = false,
  })
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
  if rt then rt:own(self) end -- closed with its runtime
  return self
end

-- status() -> {state=, server=, protocol=, restarts=, last_error=}.
---The connection's state.
---@return {state: string, server: table?, protocol: string?, restarts: integer, last_error: luagent.Error?}
function Set:status()
  return { state = self.state, server = self.server_info, protocol = self.protocol,
    restarts = self.restarts, last_error = self.last_error }
end

-- Stops the server and the supervisor (waiting for it to end). The last
-- snapshot stays; its tools fail with "closed".
---Stops the server and its supervisor; the last snapshot stays, its tools
---fail with "closed".
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
  if self.relist_task then self.relist_task:cancel("tool set closed") self.relist_task = nil end
  if self.session then
    self.session:fail(errors.new("tool_error", self.label .. ": the tool set is closed", { died = true }))
  end
  self.transport:kill()
  self.transport:close()
  self.state = "closed"
  self:wake_all()
end

M.Set = Set
return M
