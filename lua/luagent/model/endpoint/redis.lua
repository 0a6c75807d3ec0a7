-- The endpoint state shared between hosts through Redis: the same interface
-- as the in-process state (lua/luagent/model/endpoint/init.lua), so neither the retry
-- loop nor the agent loop knows which backend serves them.
--
-- Every transition is one server-side Lua script, loaded with SCRIPT LOAD
-- when the connection is made and run with EVALSHA, so it is atomic across
-- hosts: `admit` (the budget check, the end of the open time, handing out
-- the one half-open probe), `record` (spend or earn a budget token, count a
-- failure, trip, close), `replay` (the results a host counted while Redis
-- could not serve, in order) and `cooldown` (extend the cooldown). Times inside
-- the scripts come from Redis's TIME, one clock for every host; replies
-- carry durations ("open for 3.2 s more"), which each host turns into times
-- on its own clock.
--
-- Cost: each reply carries the shared state back, and the host keeps it.
-- `record` is one round trip. `admit` of a first attempt answers from the
-- kept state while it says closed with no failure since the last success
-- and is younger than M.fresh seconds (a healthy provider), and any admit
-- refuses from it while it says open and not yet due (or, for a retry, the
-- budget spent); it asks Redis otherwise (a retry always). So while
-- failures accumulate every admission is exact across hosts, and a host
-- learns of a trip made elsewhere after a success it saw at its next reply
-- or within M.fresh seconds. An admission that must ask while another
-- task of this host is asking already waits for that reply instead, and
-- answers from the state it brought (one admission in flight per endpoint
-- and host). A probe's slot
-- released and a cooldown set are sent without waiting. So a first attempt
-- to a healthy provider costs one waited round trip (two at the edges: a
-- retry, the probe, failures accumulating, a stale view), and a streamed
-- chunk none.
--
-- Start-up: the connection is made when the endpoint is; the first
-- admission (and any use before the connection is up) waits for that
-- attempt, each of its steps bounded by `timeout`, and then asks Redis, so
-- a breaker another host left open refuses the first call.
--
-- Redis down or slow: a command that has no reply within `timeout` (0.25 s
-- by default; see host/redis.c), a connection that fails, or an error
-- reply, switches the endpoint to its local state at once (the in-process
-- endpoint it wraps) and logs one warning; a daemon task reconnects (at
-- once, then every redis_retry_every seconds, a setting of the runtime:
-- lua/luagent/config.lua), and when Redis is back it logs
-- again and the shared state serves from the next attempt. The results
-- counted locally meanwhile (the latest M.max_unshared) are written to
-- Redis first, in order, by one script (`replay`), before the connection
-- serves anyone: a trip made while the connection was not up reaches the
-- other hosts.
-- This fails open to local protection, not closed: Redis being unreachable
-- says nothing about the provider, and refusing every call would make Redis
-- a single point of failure for the whole fleet, while each host's own
-- breaker and budget still bound its load as they do without sharing.
local core = require "luagent.core"
local errors = require "luagent.base.errors"
local endpoint = require "luagent.model.endpoint"

local M = {}

M.default_timeout = 0.25 -- seconds for a connect or a command
M.default_prefix = "luagent:"
M.fresh = 0.5            -- seconds a kept "closed" view answers admit
M.max_waits = 3          -- replies an admission waits on before it asks itself
M.ttl = 86400            -- seconds an endpoint's key lives after its last write
M.max_unshared = 256     -- results kept to write once Redis serves (the latest)
M.probe_poll = 0.25      -- seconds a call waiting for the probe waits before asking again
                         -- (another host's probe wakes no one here)

------------------------------------------------------------------------------
-- The scripts
------------------------------------------------------------------------------

-- Shared by every script: the time, the config (ARGV[1..12]), the state
-- (one hash per endpoint), and the breaker's arithmetic, after host/breaker.c
-- and host/budget.c (tokens in thousandths).
local PRELUDE = [=[
local K = KEYS[1]
local A = ARGV
local tm = redis.call('TIME')
local now = tonumber(tm[1]) + tonumber(tm[2]) / 1000000
local has_br = A[1] == '1'
local c_cons, c_ppm, c_win, c_min = tonumber(A[2]), tonumber(A[3]), tonumber(A[4]), tonumber(A[5])
local c_for, c_max, c_grow, c_pto = tonumber(A[6]), tonumber(A[7]), tonumber(A[8]), tonumber(A[9])
local b_max, b_ratio, ttl = tonumber(A[10]), tonumber(A[11]), tonumber(A[12])
local raw = redis.call('HGETALL', K)
local h = {}
for i = 1, #raw, 2 do h[raw[i]] = raw[i + 1] end
local st, ou, tr, co = tonumber(h.st or '0'), tonumber(h.ou or '0'), tonumber(h.tr or '0'), tonumber(h.co or '0')
local po, pd, ca, fa = tonumber(h.po or '0'), tonumber(h.pd or '0'), tonumber(h.ca or '0'), tonumber(h.fa or '0')
local hd, rg, tk, cd = tonumber(h.hd or '0'), h.rg or '', tonumber(h.tk or A[10]), tonumber(h.cd or '0')
local function f(x) return string.format('%.6f', x) end
local function save()
  redis.call('HSET', K, 'st', st, 'ou', f(ou), 'tr', tr, 'co', co, 'po', po, 'pd', f(pd),
    'ca', ca, 'fa', fa, 'hd', hd, 'rg', rg, 'tk', tk, 'cd', f(cd))
  redis.call('EXPIRE', K, ttl)
end
local function settle()
  if st == 1 and now >= ou then st = 2; po = 0; return true end
  return false
end
local NAMES = { [0] = 'closed', [1] = 'open', [2] = 'half_open' }
local function view()
  local s = st
  if s == 1 and now >= ou then s = 2 end
  return { has_br and NAMES[s] or 'none', f(ou - now), tr, fa, co, ca,
           (s == 2 and po == 1) and 1 or 0, tk, f(cd - now), f(pd - now) }
end
local function trip()
  if tr < 1000000 then tr = tr + 1 end
  local t = c_for * c_grow ^ (tr > 1 and tr - 1 or 0)
  if t > c_max then t = c_max end
  st, ou, po = 1, now + t, 0
end
-- One result that counts (ok, or a counted failure) on the state: the
-- transition it made ('open' | 'half_open' | 'close' | '') and 1 when
-- retries just stopped (the budget fell to half).
local function count(ok, was_probe)
  local moved, exhausted = '', 0
  if b_max > 0 then
    if ok then
      tk = math.min(b_max, tk + b_ratio)
    else
      local before = 2 * tk > b_max
      tk = tk > 1000 and tk - 1000 or 0
      if before and not (2 * tk > b_max) then exhausted = 1 end
    end
  end
  if has_br then
    local half = settle()
    if st == 0 then
      if c_win > 0 then
        if #rg ~= c_win then rg, ca, fa, hd = string.rep('0', c_win), 0, 0, 0 end
        if ca == c_win then
          if rg:sub(hd + 1, hd + 1) == '1' then fa = fa - 1 end
        else
          ca = ca + 1
        end
        if not ok then fa = fa + 1 end
        rg = rg:sub(1, hd) .. (ok and '0' or '1') .. rg:sub(hd + 2)
        hd = (hd + 1) % c_win
      end
      if ok then
        co = 0
      else
        if co < 1000000 then co = co + 1 end
        if (c_cons > 0 and co >= c_cons) or (c_win > 0 and ca >= c_min and fa * 1000000 >= c_ppm * ca) then
          trip(); moved = 'open'
        end
      end
    elseif st == 2 and was_probe then
      if ok then
        st, ou, tr, co, po, pd, ca, fa, hd, rg = 0, 0, 0, 0, 0, 0, 0, 0, 0, ''
        moved = 'close'
      else
        trip(); moved = 'open'
      end
    elseif half then
      moved = 'half_open'
    end
  end
  return moved, exhausted
end
]=]

local SCRIPTS = {
  -- ARGV[13] = '1' for a retry. -> {verdict, seconds, moved, view}:
  -- verdict 'allow' | 'probe' | 'refuse' (seconds: until the next probe is
  -- due) | 'budget' (a retry the budget refused); moved 1 when this call saw
  -- the open time end.
  admit = PRELUDE .. [=[
if A[13] == '1' and b_max > 0 and not (2 * tk > b_max) then return { 'budget', '0', 0, view() } end
if not has_br then return { 'allow', '0', 0, view() } end
local moved = settle()
local verdict, wait = 'allow', 0
if st == 1 then
  verdict, wait = 'refuse', ou - now
elseif st == 2 then
  if po == 1 and now < pd then
    verdict, wait = 'refuse', pd - now
  else
    po, pd, verdict = 1, now + c_pto, 'probe'
  end
end
if moved or verdict == 'probe' then save() end
return { verdict, f(wait), moved and 1 or 0, view() }
]=],
  -- ARGV[13] ok, [14] counted ('1'/'0'), [15] was_probe ('1', '0', '?' for
  -- "if a probe is out, this is it"). -> {moved ('open' | 'half_open' |
  -- 'close' | ''), 1 when retries just stopped, view}.
  record = PRELUDE .. [=[
local ok, counted, wp = A[13] == '1', A[14] == '1', A[15]
local was_probe
if not has_br then was_probe = false
elseif wp == '?' then was_probe = st == 2 and po == 1
else was_probe = wp == '1' end
if not ok and not counted then
  if was_probe and po == 1 then po = 0; save() end
  return { '', 0, view() }
end
local moved, exhausted = count(ok, was_probe)
save()
return { moved, exhausted, view() }
]=],
  -- ARGV[13] = the results a host counted on its local state while Redis
  -- could not serve, oldest first ('1' ok, '0' a counted failure), counted
  -- here in order as results of no probe. -> view.
  replay = PRELUDE .. [=[
local results = A[13]
for i = 1, #results do count(results:sub(i, i) == '1', false) end
save()
return view()
]=],
  -- ARGV[13] = seconds from now. -> 1 when it extended the cooldown, else 0.
  cooldown = PRELUDE .. [=[
local u = now + tonumber(A[13])
if u <= cd then return 0 end
redis.call('HSET', K, 'cd', f(u))
redis.call('EXPIRE', K, ttl)
return 1
]=],
}

------------------------------------------------------------------------------
-- URLs
------------------------------------------------------------------------------

-- "redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]" -> {host=, port=, db=,
-- user=, password=, shown=}; or nil, why. HOST is a name (looked up
-- without blocking, host/redis.c) or a numeric address (IPv6 in brackets);
-- PORT 6379 and DB 0 when left out. `shown` is the URL with the password
-- masked, for log lines and health().
function M.parse_url(url)
  if type(url) ~= "string" then return nil, "a redis://HOST:PORT/DB URL" end
  local rest = url:match("^redis://(.+)$")
  if not rest then return nil, "a URL that starts with redis://" end
  local cred, after = rest:match("^(.*)@([^@]*)$")
  local user, password
  if cred then
    rest = after
    user, password = cred:match("^([^:]*):(.*)$")
    if not user then return nil, "USER:PASSWORD before the @ of the URL" end
  end
  local host, tail = rest:match("^%[([%x:.]+)%](.*)$")
  if not host then host, tail = rest:match("^([^:/]+)(.*)$") end
  if not host then return nil, "a URL with a host (redis://HOST:PORT/DB)" end
  local port, db = tail:match("^:(%d+)/?(%d*)$")
  if not port then port, db = 6379, tail:match("^/?(%d*)$") end
  if not db then return nil, "a URL of the form redis://HOST:PORT/DB" end
  port, db = tonumber(port), tonumber(db ~= "" and db or "0")
  if port < 1 or port > 65535 then return nil, "a port from 1 to 65535" end
  if not host:find(":") and not host:match("^[%w][%w%.%-_]*$") then
    return nil, "a host name or a numeric address as host (got '" .. host .. "')"
  end
  local shown = cred and ("redis://" .. user .. ":***@" .. rest) or url
  return { host = host, port = port, db = db, user = user ~= "" and user or nil,
           password = password, shown = shown }
end

------------------------------------------------------------------------------
-- Connections: one per URL, shared by every endpoint of a pool (a
-- runtime's registry owns one: lua/luagent/model/endpoint/registry.lua)
------------------------------------------------------------------------------

local Client = {}
Client.__index = Client

-- pool(diag [, settings]) -> connections by URL, their lines going to diag
-- (lua/luagent/base/diagnostics.lua), reconnecting as the runtime's
-- settings say (redis_retry_every); M.close_pool(pool) closes them.
function M.pool(diag, settings)
  return { clients = {}, diag = diag, settings = settings }
end

-- Seconds between two reconnect attempts of a client of `pool`, read at
-- each wait: a change applies from the next one.
local function retry_every(pool)
  return pool.settings and pool.settings:get("redis_retry_every") or 1
end

-- Joins `task`, letting only a cancellation of the caller through.
local function join_quietly(task)
  local ok, err = pcall(task.join, task)
  if not ok and errors.is_cancel(err) then error(err, 0) end
end

-- The client of `url` in `pool`, made on first use (nothing is connected yet).
local function client_for(pool, url, timeout)
  local clients = pool.clients
  local c = clients[url]
  if c then return c end
  local u = assert(M.parse_url(url)) -- checked by check_shared
  c = setmetatable({ url = u.shown, host = u.host, port = u.port, db = u.db, user = u.user,
                     password = u.password, timeout = timeout,
                     state = "new", conn = nil, shas = {}, trying = nil, retrier = nil,
                     diag = pool.diag, pool = pool,
                     endpoints = {} }, Client) -- the shared endpoints it serves
  clients[url] = c
  return c
end

-- Connects, selects the database and loads the scripts; the connection, or
-- nil, err.
function Client:connect_once()
  local conn, err = core.redis_connect(self.host, self.port, self.timeout)
  if not conn then return nil, err end
  if self.password then
    local ok, e
    if self.user then
      ok, e = conn:command(self.timeout, "AUTH", self.user, self.password)
    else
      ok, e = conn:command(self.timeout, "AUTH", self.password)
    end
    if not ok then conn:close() return nil, e end
  end
  if self.db ~= 0 then
    local ok, e = conn:command(self.timeout, "SELECT", self.db)
    if not ok then conn:close() return nil, e end
  end
  for name, src in pairs(SCRIPTS) do
    local sha, e = conn:command(self.timeout, "SCRIPT", "LOAD", src)
    if not sha then conn:close() return nil, e end
    self.shas[name] = sha
  end
  return conn
end

-- Writes to the shared state what the endpoints of this client counted on
-- their local state while it could not serve (Shared:_keep_unshared), in
-- order, before the connection serves anyone: the other hosts then see a
-- trip made while this one was connecting. Results counted meanwhile are
-- written too. true, or nil, err when the connection failed (the results
-- sent then may have been counted: they are not sent again).
function Client:write_unshared(conn)
  local wrote = true
  while wrote do
    wrote = false
    for _, ep in ipairs(self.endpoints) do
      local results = ep.unshared
      if results ~= "" then
        ep.unshared, wrote = "", true
        local r, err = conn:command(self.timeout, "EVALSHA", self.shas.replay, 1, ep.rkey,
                                    table.unpack(ep:_args(results)))
        if not r then return nil, err end
        ep:_learn(r)
      end
    end
  end
  return true
end

-- The task of the connect attempt under way, started when there is none.
function Client:attempt()
  if self.trying then return self.trying end
  local t = core.spawn(function()
    local conn, err = self:connect_once()
    if conn and not self.closed then
      local ok, werr = self:write_unshared(conn)
      if not ok then
        conn:close()
        conn, err = nil, werr
      end
    end
    self.trying = nil
    if self.closed then
      if conn then conn:close() end
    elseif conn then
      self:up(conn)
    else
      self:down(err)
    end
  end)
  t:set_daemon(true)
  self.trying = t
  return t
end

-- Connected: the shared state serves again (said once, when it had failed).
function Client:up(conn)
  local was = self.state
  self.conn, self.state = conn, "up"
  if was == "down" then
    self.diag:write("warn", "redis " .. self.url .. " is back: endpoint state is shared again")
  end
end

-- Unreachable or too slow: local state from now on (said once), and a
-- daemon task that reconnects at once and then every redis_retry_every seconds
-- until it is back.
function Client:down(err)
  if self.conn then self.conn:close() self.conn = nil end
  if self.state ~= "down" then
    self.diag:write("warn", "redis " .. self.url .. " unreachable (" .. tostring(err)
      .. "): endpoint state is local to this host until it returns")
  end
  self.state = "down"
  if self.retrier or self.closed then return end
  self.retrier = core.spawn(function()
    join_quietly(self:attempt()) -- at once: Redis may be back already (a restart)
    while not self.conn and not self.closed do
      core.sleep(retry_every(self.pool))
      if not self.closed then join_quietly(self:attempt()) end
    end
    self.retrier = nil
  end)
  self.retrier:set_daemon(true)
end

-- True when the shared state can serve now. The first use waits for the
-- first connect (bounded by the timeout); later, a host whose Redis is down
-- does not wait at all.
function Client:usable()
  if self.state == "new" then
    self.state = "connecting"
    join_quietly(self:attempt())
  elseif self.state == "connecting" and self.trying then
    join_quietly(self.trying)
  end
  return self.state == "up"
end

-- Runs script `name` on `key` with `args`: its reply, or nil when Redis
-- failed (the client is then down and the caller uses its local state).
-- Any failure (no reply in time, a closed connection, an error reply such
-- as BUSY, LOADING, OOM or READONLY) takes the client down; a script flushed
-- from the server (NOSCRIPT) is loaded again first.
function Client:eval(name, key, args)
  if not self:usable() then return nil end
  local conn = self.conn -- another task may replace it while this one waits
  local r, err = conn:command(self.timeout, "EVALSHA", self.shas[name], 1, key, table.unpack(args))
  if r == nil and err.kind == "protocol" and err.message:find("NOSCRIPT", 1, true) then
    local sha
    sha, err = conn:command(self.timeout, "SCRIPT", "LOAD", SCRIPTS[name])
    if sha then
      self.shas[name] = sha
      r, err = conn:command(self.timeout, "EVALSHA", sha, 1, key, table.unpack(args))
    end
  end
  if r == nil then
    if self.conn == conn then self:down(err) end
    return nil
  end
  return r
end

-- Sends script `name` without waiting for its reply; false when down.
function Client:send(name, key, args)
  if self.state ~= "up" then return false end
  local ok, err = self.conn:send(self.timeout, "EVALSHA", self.shas[name], 1, key, table.unpack(args))
  if not ok then self:down(err) end
  return ok ~= nil
end

-- Closes the connection and stops reconnecting.
function Client:close()
  self.closed = true
  if self.retrier then self.retrier:cancel() self.retrier = nil end
  if self.conn then self.conn:close() self.conn = nil end
end

------------------------------------------------------------------------------
-- The endpoint
------------------------------------------------------------------------------

local Shared = setmetatable({}, { __index = endpoint.Endpoint })
Shared.__index = Shared
Shared.__name = "luagent.SharedEndpoint"

-- The config part of every script's ARGV: the breaker's config as a
-- local breaker built from the same options has it (the defaults of
-- host/breaker.c, completed the same way: b:config()), and the budget's
-- options with the defaults of host/budget.h filled in (the local
-- constructors have checked them already).
local function config_args(opts)
  local br, bu = opts and opts.breaker, opts and opts.budget
  local a = { "0", 0, 0, 0, 0, 0, 0, 0, 0 }
  if br ~= false then
    local b = core.breaker(br):config()
    a = { "1", b.consecutive, math.floor(b.ratio * 1e6 + 0.5), b.window, b.min_calls, b.open_for,
          b.open_max, b.growth, b.probe_timeout }
  end
  if bu ~= false then
    bu = bu or {}
    a[10] = math.floor((bu.max or 10) * 1000 + 0.5)
    a[11] = math.floor((bu.ratio or 0.1) * 1000 + 0.5)
  else
    a[10], a[11] = 0, 0
  end
  a[12] = M.ttl
  return a
end

-- Checks shared = {redis=, prefix=, timeout=}; raises naming the field.
local function check_shared(shared)
  if type(shared) ~= "table" then error("endpoint.get: shared must be a table", 4) end
  for k in pairs(shared) do
    if k ~= "redis" and k ~= "prefix" and k ~= "timeout" then
      error("endpoint.get: unknown option 'shared." .. tostring(k) .. "'", 4)
    end
  end
  local ok, why = M.parse_url(shared.redis)
  if not ok then error("endpoint.get: shared.redis must be " .. why, 4) end
  if shared.prefix ~= nil and type(shared.prefix) ~= "string" then
    error("endpoint.get: shared.prefix must be a string", 4)
  end
  local t = shared.timeout
  if t ~= nil and (type(t) ~= "number" or not (t > 0) or t == math.huge) then
    error("endpoint.get: shared.timeout must be a number of seconds > 0", 4)
  end
end

-- Wraps the in-process endpoint `fallback` (its state serves while Redis is
-- down) in one whose state lives in Redis under shared.prefix .. "ep:" ..
-- key, connected through `pool` (M.pool). `opts` are the endpoint's options
-- (registry:get).
function M.new(fallback, opts, shared, pool)
  check_shared(shared)
  local args = config_args(opts)
  local client = client_for(pool, shared.redis, shared.timeout or M.default_timeout)
  if client.state == "new" then -- start connecting now; the first admit waits for it
    client.state = "connecting"
    client:attempt()
  end
  local ep = setmetatable({
    key = fallback.key,
    rkey = (shared.prefix or M.default_prefix) .. "ep:" .. fallback.key,
    fallback = fallback,
    client = client,
    args = args,
    has_breaker = args[1] == "1",
    max_tokens = args[10] > 0 and args[10] / 1000 or nil,
    jitter = fallback.jitter,
    view = nil,           -- the shared state as the last reply showed it
    cooldown_until = nil, -- on this host's clock
    seen = nil,
    unshared = "",        -- results counted locally, not yet in Redis (_keep_unshared)
    waiters = {},         -- calls waiting for a change (endpoint.lua, wait_change)
  }, Shared)
  client.endpoints[#client.endpoints + 1] = ep
  return ep
end

-- Keeps a result the local state counted while the shared state could not
-- serve (connecting, or Redis down), to be written once it serves
-- (Client:write_unshared): "1" a success, "0" a counted failure, the
-- latest M.max_unshared. A result that counts for nothing is not kept.
function Shared:_keep_unshared(ok, counted)
  if not ok and not counted then return end
  local results = self.unshared .. (ok and "1" or "0")
  if #results > M.max_unshared then results = results:sub(-M.max_unshared) end
  self.unshared = results
end

-- ARGV for a script: the config, then `...`.
function Shared:_args(...)
  local a = table.move(self.args, 1, #self.args, 1, {})
  for i = 1, select("#", ...) do a[#a + 1] = select(i, ...) end
  return a
end

-- Keeps the shared state a reply showed (`v`, see view() in PRELUDE),
-- turning its durations into times on this host's clock: the loop's, read
-- when the reply arrived (the caller's `now` is older by the round trip).
function Shared:_learn(v)
  local now = core.now()
  local state = v[1]
  self.view = {
    state = state, trips = v[3], failures = v[4], consecutive = v[5], calls = v[6],
    probe_out = v[7] == 1, tokens = self.max_tokens and v[8] / 1000 or nil,
    open_until = (state == "open" or state == "half_open") and now + tonumber(v[2]) or nil,
    probe_until = v[7] == 1 and now + tonumber(v[10]) or nil, -- when an unanswered probe times out
    at = now,
  }
  local cd = tonumber(v[9])
  if cd > 0 then self.cooldown_until = now + cd end
end

-- Whether the kept view lets a retry go (true without a budget).
function Shared:_tokens_allow(v)
  return not self.max_tokens or v.tokens > self.max_tokens / 2
end

-- The answer the kept view gives an admission at `now` (ok, probe, events
-- as admit returns them), or nil when Redis must be asked. `learned`: the
-- view came from a reply that arrived while this admission waited (the
-- shared state of less than a round trip ago), so it answers what asking
-- again would: allowed while closed, refused while open or while another
-- caller's probe is out; only a probe must still be asked for (the script
-- hands it out).
function Shared:_from_view(is_retry, now, learned)
  local key, v = self.key, self.view
  if not v then return nil end
  if is_retry and not self:_tokens_allow(v) then
    return nil, endpoint.budget_error(key, v.tokens, self.max_tokens), {}
  end
  local state = v.state
  if state == "open" and now < v.open_until then
    return nil, endpoint.open_error(key, now, v.open_until), {}
  end
  if learned then
    if state == "none" or state == "closed" then return true, false, {} end
    if state == "half_open" and v.probe_out then -- another caller's probe is out
      return nil, endpoint.open_error(key, now, v.probe_until, true), {}
    end
    return nil
  end
  if not is_retry and (state == "none" or state == "closed" and v.consecutive == 0)
      and now - v.at < M.fresh then
    return true, false, {}
  end
  return nil
end

-- Frees a probe's slot that was handed to a caller that is gone (its
-- admission was cancelled while it waited for the reply), in Redis and in
-- the kept view, so the callers that waited on that reply ask for it
-- (after the release: one connection keeps the order).
function Shared:_give_back_probe()
  self.client:send("record", self.rkey, self:_args("0", "0", "1"))
  if self.view then self.view.probe_out = false end
end

-- See endpoint.lua. Answers from the kept view when it says closed and is
-- fresh, or open and not yet due (or, for a retry, the budget spent);
-- otherwise one EVALSHA of `admit`. Admissions that need Redis while one
-- is being asked already wait for its reply and answer from the view it
-- brings (one round trip in flight per endpoint and host, however many
-- tasks call at once: a thousand first calls cost one EVALSHA, and the
-- hosts' callers refused while a probe is out do not flood Redis).
function Shared:admit(is_retry, now)
  self:_see("admit", now)
  if not self.client:usable() then return self.fallback:admit(is_retry, now) end
  local learned, waits = false, 0
  while true do
    local ok, probe_or_err, events = self:_from_view(is_retry, now, learned)
    if ok ~= nil or probe_or_err then return ok, probe_or_err, events end
    local flight = self.asking
    if not flight then break end
    local done, r = pcall(flight.task.join, flight.task)
    if not done then
      if errors.is_cancel(r) then error(r, 0) end -- this caller (or the asking task) was cancelled
      r = nil -- the command failed (a connection closed under it): as Redis down
    end
    if not r then return self.fallback:admit(is_retry, now) end
    -- the reply may leave a probe to ask for; a fellow waiter may be
    -- asking for it already: wait on that too, a few times at most
    waits = waits + 1
    if waits >= M.max_waits then break end
    learned, now = true, core.now()
  end
  -- this caller asks; the reply's verdict is its own
  local flight = { owner_gone = false, reply = nil }
  flight.task = core.spawn(function()
    local asked, r = pcall(self.client.eval, self.client, "admit", self.rkey, self:_args(is_retry and "1" or "0"))
    if self.asking == flight then self.asking = nil end -- also when it raised
    if not asked then error(r, 0) end
    if r then
      self:_learn(r[4])
      flight.reply = r
      if flight.owner_gone and r[1] == "probe" then self:_give_back_probe() end
    end
    return r
  end)
  flight.task:set_daemon(true)
  self.asking = flight
  local done, r = pcall(flight.task.join, flight.task)
  if not done then
    if not errors.is_cancel(r) then return self.fallback:admit(is_retry, now) end -- the command failed
    -- cancelled: a probe it was handed is given back
    flight.owner_gone = true
    if flight.reply and flight.reply[1] == "probe" then self:_give_back_probe() end
    error(r, 0)
  end
  if not r then return self.fallback:admit(is_retry, now) end
  local key, events = self.key, {}
  if r[3] == 1 then events[1] = { type = "circuit_half_open", endpoint = key } end
  if r[1] == "budget" then
    return nil, endpoint.budget_error(key, self.view.tokens, self.max_tokens), events
  elseif r[1] == "refuse" then
    return nil, endpoint.open_error(key, now, now + tonumber(r[2]), self.view.state == "half_open"), events
  end
  return true, r[1] == "probe", events
end

-- See endpoint.lua: one EVALSHA of `record`; a result that counts for
-- nothing only frees a probe's slot, sent without waiting.
-- The waiters of this host (wait_change) are woken as the local state's
-- are: by a change a result recorded here made.
function Shared:record(now, ok, counted, was_probe)
  self:_see("record", now)
  local events = self:_record(now, ok, counted, was_probe)
  if endpoint.wakes(events, not ok and not counted and was_probe) then self:_wake() end
  return events
end

-- See endpoint.lua: wait_change, but at most M.probe_poll seconds, so a
-- change another host made is seen by asking again.
function Shared:wait_change(seconds)
  if type(seconds) == "number" and seconds > M.probe_poll then seconds = M.probe_poll end
  return endpoint.Endpoint.wait_change(self, seconds)
end

function Shared:_record(now, ok, counted, was_probe)
  if not self.client:usable() then
    self:_keep_unshared(ok, counted)
    return self.fallback:record(now, ok, counted, was_probe)
  end
  local wp = was_probe == nil and "?" or (was_probe and "1" or "0")
  local args = self:_args(ok and "1" or "0", counted and "1" or "0", wp)
  if not ok and not counted then
    if self.has_breaker and wp ~= "0" then self.client:send("record", self.rkey, args) end
    return {}
  end
  local r = self.client:eval("record", self.rkey, args)
  -- failed: Redis may have counted it before it went silent, so it is not
  -- kept to be written again
  if not r then return self.fallback:record(now, ok, counted, was_probe) end
  self:_learn(r[3])
  local events, key, v = {}, self.key, self.view
  if r[2] == 1 then
    events[#events + 1] = { type = "retry_budget_exhausted", endpoint = key, tokens = v.tokens }
  end
  if r[1] == "open" then
    events[#events + 1] = { type = "circuit_open", endpoint = key, open_until = v.open_until, trips = v.trips }
  elseif r[1] == "half_open" then
    events[#events + 1] = { type = "circuit_half_open", endpoint = key }
  elseif r[1] == "close" then
    events[#events + 1] = { type = "circuit_close", endpoint = key }
  end
  return events
end

-- See endpoint.lua. Sent without waiting; the event says whether this host
-- knew of a later cooldown (the script keeps the later of the two anyway).
function Shared:set_cooldown(until_time)
  if self.client.state ~= "up" then return self.fallback:set_cooldown(until_time) end
  if type(until_time) ~= "number" or until_time ~= until_time then
    error("endpoint.set_cooldown: until must be a number", 2)
  end
  -- until_time is on the loop's clock, as retry.lua's now() + retry_after
  self.client:send("cooldown", self.rkey, self:_args(string.format("%.6f", until_time - core.now())))
  if self.cooldown_until and until_time <= self.cooldown_until then return {} end
  self.cooldown_until = until_time
  return { { type = "cooldown", endpoint = self.key, cooldown_until = until_time } }
end

-- See endpoint.lua; the local state's while Redis is down.
function Shared:cooldown_wait(now, u)
  if self.client.state == "down" then return self.fallback:cooldown_wait(now, u) end
  return endpoint.Endpoint.cooldown_wait(self, now, u)
end

-- See endpoint.lua (asked before waiting to retry); from the kept view
-- while Redis serves.
function Shared:may_retry(cause)
  if self.client.state ~= "up" or not self.view then return self.fallback:may_retry(cause) end
  if self:_tokens_allow(self.view) then return true end
  return nil, endpoint.budget_error(self.key, self.view.tokens, self.max_tokens, cause)
end

-- health()'s row: the shared state as this host last saw it (backend
-- "redis"), or the local state (backend "local", fallback = true while
-- Redis is down).
function Shared:snapshot(now)
  local v = self.view
  if self.client.state ~= "up" or not v then
    local row = self.fallback:snapshot(now)
    row.fallback = self.client.state == "down"
    row.redis = self.client.url
    return row
  end
  local state = v.state
  if state == "open" and (now or self.seen or v.at) >= v.open_until then state = "half_open" end
  return {
    state = state, failures = v.failures, consecutive = v.consecutive, calls = v.calls,
    trips = v.trips, probe_out = v.probe_out, open_until = v.open_until,
    tokens = v.tokens, max_tokens = self.max_tokens, cooldown_until = self.cooldown_until,
    backend = "redis", redis = self.client.url,
  }
end

-- Finishes the writes of every connection of `pool` that serves: the
-- results counted locally are written, and the commands sent without
-- waiting (a cooldown, a probe let go) have been run once a PING after them
-- is answered (Redis answers in order). Each wait is bounded by the
-- connection's timeout; a connection that fails is left as it is.
function M.flush_pool(pool)
  for _, c in pairs(pool.clients) do
    local conn = c.conn
    if c.state == "up" and conn then
      local ok = c:write_unshared(conn)
      if ok then conn:command(c.timeout, "PING") end
    end
  end
end

-- Closes every connection of `pool` (its registry closes or starts over).
function M.close_pool(pool)
  local clients = pool.clients
  for url, c in pairs(clients) do
    c:close()
    clients[url] = nil
  end
end

return M
