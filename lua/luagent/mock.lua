-- The mock provider: an HTTP/1.1 server on loopback that speaks the OpenAI
-- chat completions (and OpenRouter), Anthropic messages and OpenAI responses
-- wire formats, replays cassettes and injects faults.
--
-- The network part is thin. M.parse_request (bytes -> request) and
-- M.handle (request -> plan) are pure; a plan is a list of steps
-- {write=bytes} / {sleep=seconds} / {reset=true} / {close=true} that the
-- connection task executes with the core's TCP primitives. Specs check
-- plans without sockets.
local errors = require "luagent.errors"
local faults = require "luagent.mock.faults"
local replies = require "luagent.mock.replies"
local cassette = require "luagent.mock.cassette"

local M = {}

M.MAX_HEAD = 64 * 1024
M.MAX_BODY = 64 * 1024 * 1024

------------------------------------------------------------------------------
-- Request parsing
------------------------------------------------------------------------------

-- A parse failure answered with `status` before the connection closes.
local function bad(status, message)
  return "bad", { status = status, message = message }
end

-- Decodes a chunked body starting at `pos` in buf. Returns "ok", body, rest
-- or "more" or "bad", {status=, message=}.
local function dechunk(buf, pos)
  local parts, total = {}, 0
  while true do
    local eol = buf:find("\r\n", pos, true)
    if not eol then return "more" end
    local size = buf:sub(pos, eol - 1):match("^(%x+)[ \t]*;?.*$")
    if not size or #size > 8 then return bad(400, "malformed chunk size") end
    size = tonumber(size, 16)
    total = total + size
    if total > M.MAX_BODY then return bad(413, "request body too large") end
    if size == 0 then
      local stop = buf:find("\r\n\r\n", eol, true)
      if not stop then return "more" end
      return "ok", table.concat(parts), buf:sub(stop + 4)
    end
    local from = eol + 2
    if #buf < from + size + 1 then return "more" end
    if buf:sub(from + size, from + size + 1) ~= "\r\n" then
      return bad(400, "malformed chunk")
    end
    parts[#parts + 1] = buf:sub(from, from + size - 1)
    pos = from + size + 2
  end
end

-- Parses one HTTP/1.x request from the front of `buf`. Returns
--   "ok", request, rest   -- request = {method=, target=, path=, query=,
--                         --   version=, headers={lowercased=value}, body=,
--                         --   close=<client wants the connection closed>}
--   "more", head|nil      -- incomplete; head (the request without body) once
--                         --   the header is in, with head.need = total bytes
--                         --   needed when a Content-Length gives it and
--                         --   head.expect_continue
--   "bad", {status=, message=}
function M.parse_request(buf)
  local stop = buf:find("\r\n\r\n", 1, true)
  if not stop then
    if #buf > M.MAX_HEAD then return bad(431, "request header too large") end
    return "more"
  end
  if stop > M.MAX_HEAD then return bad(431, "request header too large") end
  local lines = {}
  for line in buf:sub(1, stop + 1):gmatch("(.-)\r\n") do lines[#lines + 1] = line end
  local method, target, version = lines[1]:match("^(%u+) (%S+) HTTP/(1%.[01])$")
  if not method then return bad(400, "malformed request line") end
  local headers = {}
  for i = 2, #lines do
    local name, value = lines[i]:match("^([%w!#$%%&'*+%-.^_`|~]+):[ \t]*(.-)[ \t]*$")
    if not name then return bad(400, "malformed header line") end
    name = name:lower()
    headers[name] = headers[name] and (headers[name] .. ", " .. value) or value
  end
  local path, query = target:match("^([^?#]*)%??([^#]*)")
  local connection = (headers.connection or ""):lower()
  local req = {
    method = method, target = target, path = path, query = query,
    version = version, headers = headers,
    close = connection:find("close", 1, true) ~= nil
      or (version == "1.0" and not connection:find("keep-alive", 1, true)),
    expect_continue = (headers.expect or ""):lower() == "100-continue",
  }
  local te, cl = headers["transfer-encoding"], headers["content-length"]
  if te then
    if te:lower() ~= "chunked" then return bad(501, "unsupported transfer-encoding: " .. te) end
    if cl then return bad(400, "both transfer-encoding and content-length") end
    local status, body, rest = dechunk(buf, stop + 4)
    if status == "ok" then req.body = body; return "ok", req, rest end
    if status == "bad" then return status, body end
    return "more", req
  end
  local len = 0
  if cl then
    if not cl:match("^%d+$") or #cl > 12 then return bad(400, "bad content-length") end
    len = math.tointeger(tonumber(cl))
    if len > M.MAX_BODY then return bad(413, "request body too large") end
  end
  req.need = stop + 3 + len
  if #buf < req.need then return "more", req end
  req.body = buf:sub(stop + 4, req.need)
  return "ok", req, buf:sub(req.need + 1)
end

------------------------------------------------------------------------------
-- Plans
------------------------------------------------------------------------------

-- Appends a write to a plan, merging it with a write just before.
local function put(plan, bytes)
  if bytes == "" then return end
  local last = plan[#plan]
  if last and last.write then last.write = last.write .. bytes
  else plan[#plan + 1] = { write = bytes } end
end

-- Appends a sleep to a plan (none for zero).
local function pause(plan, seconds)
  if seconds and seconds > 0 then plan[#plan + 1] = { sleep = seconds } end
end

-- The status line and header block of `resp`; `framing` is the
-- Content-Length or Transfer-Encoding line, `close` adds Connection: close.
local function head(resp, framing, close)
  local out = { string.format("HTTP/1.1 %d %s\r\n", resp.status,
    replies.reasons[resp.status] or "Unknown") }
  for _, h in ipairs(resp.headers or {}) do out[#out + 1] = h[1] .. ": " .. h[2] .. "\r\n" end
  out[#out + 1] = framing .. "\r\n"
  if close then out[#out + 1] = "Connection: close\r\n" end
  out[#out + 1] = "\r\n"
  return table.concat(out)
end

-- The body of a stream as pieces {data=} / {sleep=}, one piece per event,
-- paced as recorded (state.recorded_speed and recorded events) or by
-- state.ttft before the first non-opening event and 1/state.tps between
-- deltas.
local function stream_pieces(state, resp)
  local pieces, prev_t, started = {}, 0, false
  local function wait(s)
    if s and s > 0 then pieces[#pieces + 1] = { sleep = s } end
  end
  for _, e in ipairs(resp.events) do
    if resp.recorded then
      if state.recorded_speed and e.t then
        wait(e.t - prev_t)
        prev_t = math.max(prev_t, e.t)
      end
    else
      local phase = replies.phase(e)
      if not started and phase ~= "open" then
        started = true
        wait(state.ttft)
      elseif started and phase == "delta" and state.tps then
        wait(1 / state.tps)
      end
    end
    pieces[#pieces + 1] = { data = replies.sse({ e }) }
  end
  return pieces
end

-- Splits pieces after `n` body bytes: the pieces before and after.
local function split(pieces, n)
  local before, after, left = {}, {}, n
  for _, p in ipairs(pieces) do
    if p.sleep then
      if left > 0 then before[#before + 1] = p else after[#after + 1] = p end
    elseif left >= #p.data then
      before[#before + 1] = p
      left = left - #p.data
    elseif left > 0 then
      before[#before + 1] = { data = p.data:sub(1, left) }
      after[#after + 1] = { data = p.data:sub(left + 1) }
      left = 0
    else
      after[#after + 1] = p
    end
  end
  return before, after
end

-- Appends pieces to a plan, in chunked framing when `chunked`.
local function emit(plan, pieces, chunked)
  for _, p in ipairs(pieces) do
    if p.sleep then pause(plan, p.sleep)
    elseif chunked then put(plan, string.format("%x\r\n", #p.data) .. p.data .. "\r\n")
    else put(plan, p.data) end
  end
end

-- The plan that sends `resp` for `req`, with the transport faults (reset,
-- stall) and a non-stream `cut` (resp.truncate) applied.
local function respond(state, req, resp, fault)
  local kind = fault and fault.kind
  local args = fault and fault.args or {}
  local close = req.close or resp.truncate or kind == "reset"
  local plan, pieces, chunked, framing = {}, nil, resp.events ~= nil, nil
  if chunked then
    pieces = stream_pieces(state, resp)
    framing = "Transfer-Encoding: chunked"
  else
    pieces = { { data = resp.body } }
    framing = "Content-Length: " .. #resp.body
    if resp.tokens then
      pause(plan, (state.ttft or 0) + (state.tps and resp.tokens / state.tps or 0))
    end
  end
  if kind == "stall" and not args.after then pause(plan, args.secs) end
  put(plan, head(resp, framing, close))
  if resp.truncate then
    emit(plan, { { data = resp.body:sub(1, #resp.body // 2) } }, false)
    plan[#plan + 1] = { close = true }
    return plan
  end
  if kind == "reset" then
    emit(plan, (split(pieces, args.bytes)), chunked)
    plan[#plan + 1] = { reset = true }
    return plan
  end
  if kind == "stall" and args.after then
    local before, after = split(pieces, args.after)
    emit(plan, before, chunked)
    pause(plan, args.secs)
    emit(plan, after, chunked)
  else
    emit(plan, pieces, chunked)
  end
  if chunked then put(plan, "0\r\n\r\n") end
  if close then plan[#plan + 1] = { close = true } end
  return plan
end

-- A plain JSON response plan (routing errors, the request log).
local function json(req, status, body, extra)
  local headers = { { "Content-Type", replies.json_type } }
  for _, h in ipairs(extra or {}) do headers[#headers + 1] = h end
  return respond({}, req, { status = status, headers = headers, body = body })
end

-- The plan answering a request that could not be parsed; the connection
-- closes after it.
function M.bad_request_plan(failure)
  return json({ close = true }, failure.status, replies.encode(replies.object("error",
    replies.object("message", failure.message, "type", "invalid_request_error"))))
end

------------------------------------------------------------------------------
-- State
------------------------------------------------------------------------------

-- Headers with secret values masked: "Bearer sk-abc" -> "Bearer ***",
-- "sk-ant-xyz" -> "***".
function M.mask(headers)
  local out = {}
  for k, v in pairs(headers or {}) do
    if cassette.secret_headers[k] then -- the one list of secret headers
      local scheme = v:match("^(%a+) %S")
      v = scheme and (scheme .. " ***") or "***"
    end
    out[k] = v
  end
  return out
end

-- The server state that M.handle reads and updates, from start options:
-- faults=<spec string or parsed list>, seed=, cassette=<path, or a player
-- from cassette.player>, ttft=, tps=, recorded_speed=, now=<wall clock
-- function, default os.time>, on_divergence=<function(message)>,
-- script=<function(view, n, body) -> content or nil: what the model says
-- to request n (see replies.content for the shape; `tools` may list
-- several calls)>, seek=<the cassette replay may jump to the exchange a
-- request matches>.
-- Returns the state, or nil, err (kind "usage").
function M.state(opts)
  opts = opts or {}
  local list, err = opts.faults, nil
  if type(list) ~= "table" then
    list, err = faults.parse(opts.faults)
    if not list then return nil, err end
  end
  local seed = opts.seed or 0
  if math.tointeger(seed) == nil then
    return nil, errors.new("usage", "--seed must be an integer, got '" .. tostring(seed) .. "'")
  end
  local ttft, tps = opts.ttft, opts.tps
  if ttft ~= nil and (type(ttft) ~= "number" or ttft < 0) then
    return nil, errors.new("usage", "--ttft must be seconds >= 0, got '" .. tostring(ttft) .. "'")
  end
  if tps ~= nil and (type(tps) ~= "number" or tps <= 0) then
    return nil, errors.new("usage", "--tps must be a number > 0, got '" .. tostring(tps) .. "'")
  end
  local player = opts.cassette
  if type(player) == "string" then
    player, err = cassette.load(player)
    if not player then return nil, err end
  end
  -- seek: a resumed durable run starts mid-cassette; the replay jumps to
  -- the exchange its request matches
  if player and opts.seek then player.seek = true end
  return {
    faults = list, rng = faults.rng(math.tointeger(seed)), player = player,
    ttft = ttft, tps = tps, recorded_speed = opts.recorded_speed,
    now = opts.now or os.time, on_divergence = opts.on_divergence, script = opts.script,
    count = 0, log = {}, divergences = {},
  }
end

------------------------------------------------------------------------------
-- Handling
------------------------------------------------------------------------------

-- Faults that reshape the reply's events or body.
local reshaping = { cut = true, ["bad-json"] = true, ["stream-error"] = true }

-- The plan for a model request in `format`.
local function model(state, req, format, body)
  state.count = state.count + 1
  local n = state.count
  local ctx = { n = n, created = state.now(), now = state.now() }
  if type(body) ~= "table" then
    return respond(state, req, { status = 400, headers = { { "Content-Type", replies.json_type } },
      body = replies.error_body(format, 400, { message = "the request body is not a JSON object" }) })
  end
  local view = replies.view(format, body, req.body)
  local fault = faults.pick(state.faults, n, state.rng)
  local recorded
  if state.player then
    local message
    recorded, message = state.player:match(req.path, body)
    if not recorded then
      state.divergences[#state.divergences + 1] = message
      if state.on_divergence then state.on_divergence(message) end
      -- 422: a permanent client error, so no retry policy resends it
      return respond(state, req, { status = 422, headers = {
        { "Content-Type", replies.json_type }, { "x-should-retry", "false" } },
        body = replies.error_body(format, 422, { type = "cassette_divergence", message = message }) })
    end
  end
  local kind = fault and fault.kind
  if kind == "status" then return respond(state, req, replies.status_error(format, fault, ctx)) end
  if kind == "close" then return { { close = true } } end
  local resp
  if recorded and kind ~= "empty" and kind ~= "leak" then
    resp = cassette.response(recorded)
    if not fault then state.player:advance() end
  else
    -- a script (specs, examples) decides what the model says: a content
    -- {text=, tools={{id=, name=, arguments=}...}}, or nil for the canned one
    local content = state.script and kind ~= "empty" and kind ~= "leak" and state.script(view, n, body)
    resp = replies.reply(format, view, content or replies.content(view, fault, n), ctx)
  end
  if reshaping[kind] then replies.apply(format, resp, fault, view, ctx) end
  return respond(state, req, resp, fault)
end

-- The request log as JSON.
local function log_json(state)
  local O = replies.object
  local out = replies.array()
  for _, r in ipairs(state.log) do
    out[#out + 1] = O("n", r.n, "method", r.method, "path", r.path,
      "headers", r.headers, "body", r.body)
  end
  return replies.encode(out)
end

-- Answers one parsed request: logs it (except the log endpoint itself) and
-- returns the plan. Model requests are numbered from 1 for fault scopes.
function M.handle(state, req)
  if req.method == "GET" and req.path == "/__luagent/requests" then
    return json(req, 200, log_json(state))
  end
  local format = replies.formats[req.path]
  local body = req.body ~= "" and replies.decode(req.body) or nil
  local entry = { method = req.method, path = req.path, headers = M.mask(req.headers),
    body = body == nil and req.body or body }
  state.log[#state.log + 1] = entry
  if not format then
    return json(req, 404, replies.encode(replies.object("error", replies.object(
      "message", "no route for " .. req.method .. " " .. req.path, "type", "not_found_error"))))
  end
  if req.method ~= "POST" then
    return json(req, 405, replies.encode(replies.object("error", replies.object(
      "message", req.path .. " takes POST", "type", "invalid_request_error"))),
      { { "Allow", "POST" } })
  end
  entry.n = state.count + 1
  return model(state, req, format, body)
end

------------------------------------------------------------------------------
-- Serving
------------------------------------------------------------------------------

local luagent -- loaded by M.start and M.main: the pure parts do not need it

-- Reads the next request from a connection; `st` holds the bytes read
-- ahead. Returns the request, or nil (peer gone) or nil, failure (bad
-- request). Answers Expect: 100-continue.
local function read_request(conn, st)
  while true do
    local status, req, rest = M.parse_request(st.buf)
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
      parts[#parts + 1] = chunk
      have = have + #chunk
    until not need or have >= need
    st.buf = table.concat(parts)
  end
end

-- Executes a plan on a connection; true when the connection stays open
-- (else it was closed or reset here).
local function execute(conn, plan)
  for _, s in ipairs(plan) do
    if s.write then
      if not conn:write(s.write) then conn:close(); return false end
    elseif s.sleep then
      luagent.sleep(s.sleep)
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

-- One connection: requests in turn (keep-alive) until either side closes.
local function connection(server, conn)
  local st = { buf = "" }
  while true do
    local req, failure = read_request(conn, st)
    if not req then
      if not failure or execute(conn, M.bad_request_plan(failure)) then conn:close() end
      break
    end
    local ok, plan = pcall(M.handle, server.state, req)
    if not ok then
      plan = json({ close = true }, 500, replies.encode(replies.object("error",
        replies.object("message", "mock server error: " .. tostring(plan), "type", "api_error"))))
    end
    if not execute(conn, plan) then break end
  end
  server.conns[conn] = nil
end

-- Accepts connections until the listener closes, one task each.
local function accept_loop(server)
  while true do
    local conn = server.listener:accept()
    if not conn then return end
    server.conns[conn] = luagent.daemon(connection, server, conn)
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
-- tcp_listen; default luagent.core, specs pass fakes> and everything M.state
-- takes. Returns a server {url=, state=} (see the methods below), or nil,
-- err. Its tasks are daemons: they do not keep a run alive.
function M.start(opts)
  opts = opts or {}
  luagent = luagent or require "luagent"
  local tcp = opts.tcp or require "luagent.core"
  local host, port = parse_listen(opts.listen or "127.0.0.1:0")
  if not host then
    return nil, errors.new("usage", "--listen wants HOST:PORT, got '" .. tostring(opts.listen) .. "'")
  end
  local state, err = M.state(opts)
  if not state then return nil, err end
  local listener, lerr = tcp.tcp_listen(host, port)
  if not listener then return nil, lerr end
  local h, p = listener:address()
  local server = setmetatable({ state = state, listener = listener, conns = {},
    url = "http://" .. (h:find(":", 1, true) and "[" .. h .. "]" or h) .. ":" .. p }, Server)
  server.task = luagent.daemon(accept_loop, server)
  return server
end

-- What the server received: a list of {n=<model request number>, method=,
-- path=, headers=<masked>, body=<decoded JSON or text>}.
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
  self.conns = {}
end

------------------------------------------------------------------------------
-- Command line
------------------------------------------------------------------------------

-- Flags of `luagent mock`: option name -> value parser (nil for switches).
local flags = {
  listen = tostring, cassette = tostring, faults = tostring,
  seed = function(s) return math.tointeger(tonumber(s)) end,
  ttft = function(s) local n = tonumber(s); return n and n >= 0 and n or nil end,
  tps = function(s) local n = tonumber(s); return n and n > 0 and n or nil end,
  ["recorded-speed"] = false, help = false,
}

-- Parses `luagent mock` arguments into start options, or nil, err (usage).
function M.parse_args(argv)
  local opts, i = {}, 1
  while i <= #argv do
    local a = argv[i]
    local name, value = a:match("^%-%-([%w%-]+)=(.*)$")
    name = name or a:match("^%-%-([%w%-]+)$")
    if a == "-h" then name = "help" end
    if not name or flags[name] == nil then
      local what = a:sub(1, 1) == "-" and "unknown flag '" or "unexpected argument '"
      return nil, errors.new("usage", what .. a .. "'", { flag = a })
    end
    local key = name:gsub("%-", "_")
    if flags[name] then
      if value == nil then
        i = i + 1
        value = argv[i]
        if value == nil then return nil, errors.new("usage", "--" .. name .. " needs a value") end
      end
      local v = flags[name](value)
      if v == nil then
        return nil, errors.new("usage", "bad value '" .. value .. "' for --" .. name, { flag = name })
      end
      opts[key] = v
    elseif value ~= nil then
      return nil, errors.new("usage", "--" .. name .. " takes no value")
    else
      opts[key] = true
    end
    i = i + 1
  end
  return opts
end

-- Serves until cancelled (Ctrl-C): the body of `luagent mock`, in a task.
local function serve_cli(opts, out, err)
  opts.on_divergence = function(message) err:write("luagent mock: ", message, "\n") end
  local server, serr = M.start(opts)
  if not server then
    err:write("luagent mock: ", tostring(serr and serr.message or serr), "\n")
    return errors.is(serr) and serr.kind == "usage" and 2 or 1
  end
  out:write("luagent mock: listening on ", server.url, "\n")
  out:flush()
  local ok, werr = pcall(server.wait, server)
  server:close()
  if not ok then error(werr, 0) end
  return 0
end

-- `luagent mock [flags]`: serves until interrupted. Returns the exit code:
-- 2 for usage errors, 130 when interrupted. Called outside a task (as the
-- CLI does) it runs the loop itself.
function M.main(argv, out, err)
  out, err = out or io.stdout, err or io.stderr
  local opts, perr = M.parse_args(argv or {})
  if not opts then
    err:write("luagent mock: ", perr.message, "\nRun 'luagent mock --help' for usage.\n")
    return 2
  end
  if opts.help then
    out:write(require("luagent.mock.help").mock)
    return 0
  end
  luagent = luagent or require "luagent"
  if luagent.current() then return serve_cli(opts, out, err) end
  local task = luagent.spawn(serve_cli, opts, out, err)
  luagent.core.on_sigint(task)
  luagent.run()
  if luagent.core.interrupted() then return 130 end
  local ok, code = pcall(task.join, task)
  if not ok then
    err:write("luagent mock: ", tostring(code), "\n")
    return 1
  end
  return code
end

return M
