-- The endpoint state shared between hosts through Redis
-- (lua/luagent/model/endpoint/redis.lua, host/redis.c), against a real
-- redis-server started on a free port in a temporary folder and stopped
-- after; skipped, saying so, when redis-server is not installed (`make
-- test` installs it). Real time throughout: Redis's clock is the shared
-- one, so open intervals here are short (tens of milliseconds).
local luagent = require "luagent"
local core = require "luagent.core"
local endpoint = require "luagent.model.endpoint"
-- the endpoints of these specs: the default runtime's (luagent.health() shows them)
local registry = luagent.default_runtime().endpoints
local shared = require "luagent.model.endpoint.redis"
local http = require "luagent.base.http"
local mock = require "luagent.mock"
local cjson = require "cjson"
local helpers = require "helpers"

local q = helpers.quote

-- Runs a shell command; its stdout, or nil when it failed.
local function sh(cmd)
  local p = io.popen(cmd, "r")
  local out = p:read("a")
  if not p:close() then return nil end
  return out
end

local redis_server = (sh("command -v redis-server") or ""):match("%S+")

-- A port nobody listens on now (the kernel's pick for port 0).
local function free_port()
  local srv = assert(core.tcp_listen("127.0.0.1", 0))
  local _, port = srv:address()
  srv:close()
  return port
end

local alive = helpers.alive

-- Starts redis-server on `port` (a free one when nil) in folder `dir` (a
-- new temporary one when nil), with `extra` flags, and waits (at most 5 s) until it answers.
-- {pid=, port=, dir=, url=}.
local function start_redis(port, dir, extra)
  dir = dir or assert(sh("mktemp -d")):gsub("%s+$", "")
  port = port or free_port()
  os.execute(table.concat({ q(redis_server), "--port", port, "--bind 127.0.0.1",
    "--save ''", "--appendonly no", "--dir", q(dir), extra or "", "</dev/null >", q(dir .. "/log"),
    "2>&1 & echo $! >", q(dir .. "/pid") }, " "))
  local r = { dir = dir, port = port, url = "redis://127.0.0.1:" .. port .. "/0",
              pid = math.tointeger(tonumber(helpers.slurp(dir .. "/pid"):match("%d+"))) }
  local limit = core.now() + 5
  while core.now() < limit do
    local conn = core.redis_connect("127.0.0.1", port, 0.5)
    if conn then conn:close() return r end
    luagent.sleep(0.02)
  end
  error("redis-server did not start: " .. helpers.slurp(dir .. "/log"))
end

-- Kills redis-server at once (SIGKILL: no goodbye to its clients).
local function kill_redis(r)
  os.execute("kill -KILL " .. r.pid .. " 2>/dev/null")
  local limit = core.now() + 5
  while alive(r.pid) and core.now() < limit do luagent.sleep(0.01) end
end

-- Stops redis-server and removes its folder.
local function stop_redis(r)
  kill_redis(r)
  os.execute("rm -rf " .. q(r.dir))
end

-- Starts `luagent mock --faults 503` as a child (this spec blocks while its
-- hosts run, so an in-process mock could not answer). {pid=, url=, dir=}.
local function start_mock()
  local dir = assert(sh("mktemp -d")):gsub("%s+$", "")
  os.execute(q(helpers.bin) .. " mock --listen 127.0.0.1:0 --faults 503 </dev/null >"
    .. q(dir .. "/log") .. " 2>&1 & echo $! >" .. q(dir .. "/pid"))
  local m = { dir = dir, pid = math.tointeger(tonumber(helpers.slurp(dir .. "/pid"):match("%d+"))) }
  local limit = core.now() + 10
  while core.now() < limit do
    m.url = helpers.slurp(dir .. "/log"):match("listening on (http://%S+)")
    if m.url then return m end
    luagent.sleep(0.02)
  end
  error("luagent mock did not start: " .. helpers.slurp(dir .. "/log"))
end

-- The POST requests the mock child received.
local function mock_requests(m)
  local r = assert(http.fetch { url = m.url .. "/__luagent/requests", timeout = { total = 10 } })
  local n = 0
  for _, e in ipairs(cjson.decode(r.body)) do if e.method == "POST" then n = n + 1 end end
  return n
end

local function stop_mock(m)
  os.execute("kill -KILL " .. m.pid .. " 2>/dev/null")
  os.execute("rm -rf " .. q(m.dir))
end

-- Runs groups of luagent processes of spec/fixtures/shared_host.lua, all
-- at once (each group {hosts=N, env=<a table of extra variables>}; all
-- start their agents at the same START_AT), and waits for all; for each
-- group, the sums of what its hosts printed and the list of each host's
-- {requests=, half_open=}.
local function run_groups(groups)
  local words, out = {}, os.tmpname()
  local start_at = string.format("%.3f", core.now() + 1) -- room for the processes to start
  for g, group in ipairs(groups) do
    for h = 1, group.hosts do
      local vars = { "HOSTS=" .. group.hosts, "HOST=" .. h, "START_AT=" .. start_at,
                     "LUAGENT_LOG=off" } -- no line per failed call
      for k, v in pairs(group.env) do vars[#vars + 1] = k .. "=" .. q(v) end
      words[#words + 1] = "env " .. table.concat(vars, " ") .. " timeout 60 " .. q(helpers.bin)
        .. " run spec/fixtures/shared_host.lua > " .. q(out .. "." .. g .. "." .. h) .. " 2>&1 &"
    end
  end
  os.execute("(" .. table.concat(words, " ") .. " wait)")
  os.remove(out)
  local results = {}
  for g, group in ipairs(groups) do
    local sum, each = { requests = 0, half_open = 0 }, {}
    for h = 1, group.hosts do
      local file = out .. "." .. g .. "." .. h
      local text = helpers.slurp(file)
      os.remove(file)
      local r, half = text:match("requests=(%d+) half_open=(%d+)")
      assert(r, "host " .. h .. " printed: " .. text)
      each[h] = { requests = tonumber(r), half_open = tonumber(half) }
      sum.requests = sum.requests + tonumber(r)
      sum.half_open = sum.half_open + tonumber(half)
    end
    results[g] = { sum = sum, each = each }
  end
  return results
end

describe("Redis", function()
  if not redis_server then
    pending("redis-server is not installed (Debian package redis-server; `make test` installs it): skipped")
    return
  end

describe("core.redis_connect", function()
  local redis
  before_each(function()
    luagent.clock.real()
    redis = start_redis(nil, nil, "--enable-debug-command local")
  end)
  after_each(function() stop_redis(redis) end)

  it("connects, sends commands, pipelines many tasks' commands and closes idempotently", function()
    local r = assert(core.redis_connect("localhost", redis.port, 1))
    assert.is_true(r:connected())
    assert.equal("PONG", r:command(1, "PING"))
    assert.equal("OK", r:command(1, "SET", "k", 42))
    assert.equal("42", r:command(1, "GET", "k"))
    assert.is_false(r:command(1, "GET", "missing"))
    assert.same({ 1, "x", { 2 } }, r:command(1, "EVAL", "return {1, 'x', {2}}", 0))
    local _, err = r:command(1, "NOSUCHCOMMAND")
    assert.equal("protocol", err.kind)
    assert.matches("unknown command", err.message)
    assert.is_true(r:send(1, "SET", "sent", "yes"))
    assert.equal("yes", r:command(1, "GET", "sent"))
    local tasks = {}
    for i = 1, 200 do tasks[i] = luagent.spawn(function() return r:command(1, "INCR", "n") end) end
    local sum = 0
    for i = 1, 200 do sum = sum + tasks[i]:join() end
    assert.equal(200 * 201 / 2, sum)
    r:close()
    r:close()
    assert.is_false(r:connected())
    local ok, perr = pcall(r.command, r, 1, "PING")
    assert.is_false(ok) -- use after close raises
    assert.matches("command: connection is closed", perr)
  end)

  it("takes a connect that completed while the loop was busy for a connection, not a timeout", function()
    -- libuv runs due timers before it polls: after a busy stretch the
    -- connect's timeout fires before the poll that would see it connected
    local connecting = luagent.spawn(function() return core.redis_connect("127.0.0.1", redis.port, 0.1) end)
    luagent.spawn(function()
      local t0 = os.clock()
      while os.clock() - t0 < 0.3 do end -- busy, past the timeout, after the connect began
    end)
    local conn, err = connecting:join()
    assert.is_not_nil(conn, tostring(err))
    assert.equal("PONG", conn:command(1, "PING"))
    conn:close()
  end)

  it("times out a silent server, fails refused connects, and lets a cancelled command go", function()
    local r = assert(core.redis_connect("127.0.0.1", redis.port, 1))
    local t0 = core.now()
    local _, err = r:command(0.1, "DEBUG", "SLEEP", "0.5")
    assert.equal("timeout", err.kind)
    assert.is_true(core.now() - t0 < 0.4, "no waiting for the reply")
    assert.is_false(r:connected())
    local _, cerr = core.redis_connect("127.0.0.1", free_port(), 0.5)
    assert.equal("refused", cerr.kind)
    -- a name is looked up off the loop: other tasks run meanwhile
    local ticks, ticking = 0, true
    local ticker = luagent.spawn(function() while ticking do ticks = ticks + 1 luagent.sleep(0.001) end end)
    t0 = core.now()
    local none, derr = core.redis_connect("no-such-host.invalid", redis.port, 1)
    ticking = false
    ticker:join()
    assert.is_nil(none)
    assert.is_true(derr.kind == "dns" or derr.kind == "timeout", tostring(derr))
    assert.is_true(core.now() - t0 < 1.5)
    assert.is_true(ticks > 0, "the loop kept running during the lookup")
    local name = (sh("hostname") or ""):match("%S+")
    local addr = name and (sh("getent hosts " .. q(name)) or ""):match("^(%S+)")
    if addr == "127.0.0.1" then -- the name resolves to where the server listens
      local byname = assert(core.redis_connect(name, redis.port, 1))
      assert.equal("PONG", byname:command(1, "PING"))
      byname:close()
    end
    luagent.sleep(0.5) -- the server is awake again
    local r2 = assert(core.redis_connect("127.0.0.1", redis.port, 1))
    local t = luagent.spawn(function() return r2:command(5, "DEBUG", "SLEEP", "0.2") end)
    luagent.sleep(0.05)
    t:cancel()
    assert.has_error(function() t:join() end)
    assert.equal("PONG", r2:command(1, "PING")) -- the dropped reply did not confuse the next
    r2 = nil
    collectgarbage() -- __gc of an open connection
  end)
end)

describe("endpoint state shared through Redis", function()
  local redis
  before_each(function()
    luagent.clock.real()
    registry:reset()
    redis = start_redis()
  end)
  after_each(function()
    registry:reset()
    stop_redis(redis)
  end)

  it("finishes a runtime's Redis writes when it closes: a cooldown sent without waiting reaches the others", function()
    local opts = { breaker = false, budget = false, cooldown = {}, shared = { redis = redis.url, prefix = "close:" } }
    local a_rt, b_rt = luagent.runtime {}, luagent.runtime {}
    local a = a_rt.endpoints:get("http://closing/v1", opts)
    assert.is_true((a:admit(false, core.now())))
    a:set_cooldown(core.now() + 5) -- sent, not waited for
    a_rt:close()
    local b = b_rt.endpoints:get("http://closing/v1", opts)
    b:record(core.now(), true, true, false)
    local hold = b:cooldown_wait(core.now(), 0)
    b_rt:close()
    assert.is_true(hold > 4.9 and hold <= 5.05, "b holds for the cooldown a set before it closed: " .. hold)
  end)

  it("4 hosts x 25 agents send about as many requests as 1 host x 100, far fewer than unshared", function()
    -- one mock for the single host, one for the four sharing hosts: both
    -- run at the same time, so a stall of this shared 2-core machine (other
    -- benchmarks run on it) weighs on both sides alike
    local m1, m4 = start_mock(), start_mock()
    finally(function() stop_mock(m1) stop_mock(m4) end)
    -- agents start 20 ms apart and call every 25 to 75 ms (random: callers
    -- in step would all wait for the same instant after each open interval,
    -- and whether a probe catches it or waits a whole period for the next
    -- flips with the machine's timing: the 28 against 32 once seen); open
    -- intervals of 200 ms, long beside the round trips to Redis a probe adds
    -- (its admission, its failure's record: a few ms on a loaded machine);
    -- rounds of 4 s: about 23 requests a round for one host
    local function group(hosts, agents, m, url, prefix)
      return { hosts = hosts, env = { MOCK_URL = m.url, SECONDS_RUN = "4", STAGGER = "0.02", PERIOD = "0.05",
        JITTER = "0.5", OPEN_FOR = "0.2", AGENTS = agents, REDIS_URL = url, PREFIX = prefix } }
    end
    local one, shared4, rounds = 0, 0, {}
    for r = 1, 3 do -- each round on a fresh shared state, as the single host's is
      local b1, b4 = mock_requests(m1), mock_requests(m4)
      run_groups { group(1, "100", m1), group(4, "25", m4, redis.url, "round" .. r .. ":") }
      local a, b = mock_requests(m1) - b1, mock_requests(m4) - b4
      one, shared4, rounds[r] = one + a, shared4 + b, a .. "/" .. b
    end
    local b4 = mock_requests(m4)
    run_groups { group(4, "25", m4) }
    local unshared4 = mock_requests(m4) - b4
    io.stderr:write(string.format("\n[shared_spec] requests in 3 rounds of 4 s (1x100/4x25 shared: %s): "
      .. "1x100 %d, 4x25 shared %d (%+.1f %%); one round of 4x25 unshared %d\n",
      table.concat(rounds, ", "), one, shared4, (shared4 / one - 1) * 100, unshared4))
    assert.is_true(one > 50, "the single host made its probes: " .. one)
    assert.is_true(math.abs(shared4 - one) <= 0.1 * one,
      string.format("shared %d within 10 %% of one host's %d", shared4, one))
    assert.is_true(unshared4 * 3 >= 2 * shared4,
      string.format("unshared %d in one round well above shared %d in three", unshared4, shared4))
  end)

  it("hands the half-open probe to exactly one host", function()
    local m = start_mock()
    finally(function() stop_mock(m) end)
    -- trip the shared breaker from here: 5 counted failures, open 0.4 s
    -- (then 4 s after the probe fails: growth 10)
    local key = endpoint.key(m.url .. "/v1")
    local ep = registry:get(key, { breaker = { consecutive = 5, open_for = 0.4, growth = 10, open_max = 30 },
                                   budget = false, shared = { redis = redis.url } })
    for _ = 1, 5 do
      assert.is_true((ep:admit(false, core.now())))
      ep:record(core.now(), false, true, false)
    end
    assert.equal("open", ep:snapshot(core.now()).state)
    assert.equal("redis", ep:snapshot(core.now()).backend)
    local run = run_groups { { hosts = 4, env = { MOCK_URL = m.url, SECONDS_RUN = "1.2", STAGGER = "0",
      OPEN_FOR = "0.4", GROWTH = "10", AGENTS = "10", REDIS_URL = redis.url } } }
    local sum, each = run[1].sum, run[1].each
    local requests = mock_requests(m)
    stop_mock(m)
    local probing = 0
    for _, h in ipairs(each) do if h.requests > 0 then probing = probing + 1 end end
    io.stderr:write(string.format("[shared_spec] half-open: %d probe request(s) from %d host(s) of 4\n",
      requests, probing))
    assert.equal(1, requests, "one request reached the provider")
    assert.equal(1, sum.requests)
    assert.equal(1, probing, "from one host")
    assert.equal(1, sum.half_open, "one host saw the breaker half-open")
  end)

  -- EVALSHA commands the server has run so far.
  local function evalshas()
    local conn = assert(core.redis_connect("127.0.0.1", redis.port, 1))
    local info = assert(conn:command(1, "INFO", "commandstats"))
    conn:close()
    return tonumber(info:match("cmdstat_evalsha:calls=(%d+)") or "0")
  end

  -- Two hosts' endpoints for `key` with options `opts` (one process
  -- standing in for two: each has its own view of the shared state).
  local function two_hosts(key, opts)
    local local_a, local_b = registry:get(key .. "#a", opts), registry:get(key .. "#b", opts)
    local_a.key, local_b.key = key, key
    return shared.new(local_a, opts, opts.shared, registry.pool), shared.new(local_b, opts, opts.shared, registry.pool)
  end

  it("asks Redis once for admissions made at once, however many tasks make them", function()
    local opts = { breaker = { consecutive = 3, open_for = 0.05 }, budget = { max = 10 },
                   shared = { redis = redis.url } }
    local a, b = two_hosts("http://at-once/v1", opts)
    assert.is_true((a:admit(false, core.now()))) -- connected, scripts loaded
    -- 200 first calls of a host with no view yet: one EVALSHA, all admitted
    local before = evalshas()
    local tasks, admitted = {}, 0
    for i = 1, 200 do
      tasks[i] = luagent.spawn(function() if b:admit(false, core.now()) then admitted = admitted + 1 end end)
    end
    for _, t in ipairs(tasks) do t:join() end
    assert.equal(200, admitted)
    assert.equal(1, evalshas() - before, "one round trip for 200 admissions")
    -- tripped on host a; once the open time is over, 100 tasks of host b
    -- ask at once: one probe, 99 refusals, one round trip
    for _ = 1, 3 do a:record(core.now(), false, true, false) end
    assert.equal("open", a:snapshot(core.now()).state)
    luagent.sleep(0.06)
    b.view = nil -- b knows nothing of the trip yet
    before = evalshas()
    local probes, refused = 0, 0
    tasks = {}
    for i = 1, 100 do
      tasks[i] = luagent.spawn(function()
        local ok, probe, err = b:admit(false, core.now())
        if ok and probe then probes = probes + 1
        elseif not ok and probe.kind == "circuit_open" then refused = refused + 1 end
        assert(err) -- events
      end)
    end
    for _, t in ipairs(tasks) do t:join() end
    assert.same({ 1, 99 }, { probes, refused })
    assert.equal(1, evalshas() - before, "one round trip for 100 admissions while the probe is out")
    -- retries wait for the same reply and read the budget from it
    b.view = nil
    before = evalshas()
    tasks = {}
    local kinds = {}
    for i = 1, 10 do
      tasks[i] = luagent.spawn(function()
        local _, err = b:admit(true, core.now())
        kinds[#kinds + 1] = err.kind
      end)
    end
    for _, t in ipairs(tasks) do t:join() end
    assert.equal(10, #kinds)
    assert.equal(1, evalshas() - before)
  end)

  it("keeps to few round trips when the reply waited on leaves a probe to ask for", function()
    local opts = { breaker = { consecutive = 3, open_for = 0.05, probe_timeout = 30 }, budget = { max = 10 },
                   shared = { redis = redis.url } }
    local a, b = two_hosts("http://herd/v1", opts)
    assert(a:admit(false, core.now()))
    for _ = 1, 6 do a:record(core.now(), false, true, false) end -- tripped, the budget spent
    luagent.sleep(0.06) -- the open time is over: half-open, no probe out
    b.view = nil
    local before = evalshas()
    local kinds, tasks = {}, {}
    -- a retry asks first (refused for the budget); ten first calls wait on
    -- its reply, which leaves the probe to ask for
    tasks[1] = luagent.spawn(function()
      local ok, err = b:admit(true, core.now())
      kinds[#kinds + 1] = ok and "allowed" or err.kind
    end)
    for i = 2, 11 do
      tasks[i] = luagent.spawn(function()
        local ok, probe = b:admit(false, core.now())
        kinds[#kinds + 1] = ok and (probe and "probe" or "allowed") or probe.kind
      end)
    end
    for _, t in ipairs(tasks) do t:join() end
    table.sort(kinds)
    local want = { "circuit_open", "circuit_open", "circuit_open", "circuit_open", "circuit_open", "circuit_open",
      "circuit_open", "circuit_open", "circuit_open", "probe", "retry_budget_exhausted" }
    assert.same(want, kinds)
    assert.is_true(evalshas() - before <= 3, "round trips: " .. (evalshas() - before))
  end)

  it("falls back to local state when the command a caller waited on fails", function()
    local opts = { breaker = { consecutive = 3, open_for = 0.05 }, budget = { max = 10 },
                   shared = { redis = redis.url } }
    local a = two_hosts("http://failing-command/v1", opts)
    assert(a:admit(false, core.now()))
    a.view = nil
    local eval = a.client.eval
    a.client.eval = function(client, ...) -- the connection closes under the command
      luagent.sleep(0.01)
      error("command: connection is closed", 0)
    end
    local results, tasks = {}, {}
    for i = 1, 5 do
      tasks[i] = luagent.spawn(function()
        local ok, err = a:admit(false, core.now())
        results[#results + 1] = ok or tostring(err)
      end)
    end
    for _, t in ipairs(tasks) do t:join() end
    a.client.eval = eval
    assert.same({ true, true, true, true, true }, results)
  end)

  it("gives back the probe of an admission cancelled while it waited for Redis", function()
    local opts = { breaker = { consecutive = 1, open_for = 0.05, probe_timeout = 30 }, budget = false,
                   shared = { redis = redis.url } }
    local a, b = two_hosts("http://cancelled-probe/v1", opts)
    a:record(core.now(), false, true, false) -- tripped
    luagent.sleep(0.06)
    local t = luagent.spawn(function() return a:admit(false, core.now()) end)
    luagent.sleep(0) -- t sends its admission and waits for the reply
    t:cancel()
    assert.has_error(function() t:join() end)
    luagent.sleep(0.05) -- the reply (the probe, handed to nobody) and its release
    local ok, probe = b:admit(false, core.now())
    assert.is_true(ok, "the probe was given back: " .. tostring(probe))
    assert.is_true(probe)
  end)

  it("falls back to local state within the timeout when Redis dies, and returns when it is back", function()
    local lines = {}
    -- `make test` runs with --log off; reconnects come quickly
    local old = luagent.configure { log_sink = function(_, line) lines[#lines + 1] = line end, log_level = "warn",
                                    redis_retry_every = 0.05 }
    local srv = assert(mock.start { faults = "503" })
    local model = { kind = "openai", model = "m", base_url = srv.url .. "/v1", api_key = "k" }
    local policy = { max_retries = 0, budget = false, cooldown = false,
                     breaker = { consecutive = 1000, window = 0 }, shared = { redis = redis.url, timeout = 0.2 } }
    local function call()
      local t0 = core.now()
      local _, err = luagent.complete { model = model, messages = { { role = "user", content = "hi" } }, policy = policy }
      return err, core.now() - t0
    end
    local function backend() return luagent.health()[srv.url .. "/v1"] end
    local ok, failure = pcall(luagent.deadline, 20, function()
      for _ = 1, 3 do call() end
      assert.equal("redis", backend().backend)
      assert.equal(3, backend().consecutive)

      -- 20 tasks keep calling while Redis is killed under them
      local running, slowest, kinds = true, 0, {}
      local tasks = {}
      for i = 1, 20 do
        tasks[i] = luagent.spawn(function()
          while running do
            local err, took = call()
            kinds[err.kind] = (kinds[err.kind] or 0) + 1
            if took > slowest then slowest = took end
            luagent.sleep(0.01)
          end
        end)
      end
      luagent.sleep(0.2)
      kill_redis(redis)
      luagent.sleep(0.5)
      running = false
      for _, t in ipairs(tasks) do t:join() end -- nobody hangs
      assert.same({ "http" }, (function() local k = {} for n in pairs(kinds) do k[#k + 1] = n end return k end)(),
        "every call went on to the provider (503s), none failed on Redis")
      assert.is_true(slowest < 0.2 + 0.3, "fell back within the timeout: " .. slowest)
      local h = backend()
      assert.equal("local", h.backend)
      assert.is_true(h.fallback)
      local down = 0
      for _, l in ipairs(lines) do if l:find("unreachable", 1, true) then down = down + 1 end end
      assert.equal(1, down, "said once: " .. table.concat(lines, " | "))

      redis = start_redis(redis.port, redis.dir)
      local restarted = core.now()
      local limit = restarted + 5
      while backend().backend ~= "redis" and core.now() < limit do
        call()
        luagent.sleep(0.05)
      end
      assert.equal("redis", backend().backend)
      local calls = 0
      for _, n in pairs(kinds) do calls = calls + n end
      io.stderr:write(string.format("[shared_spec] Redis killed under 20 calling tasks: %d calls, the slowest "
        .. "%.1f ms (timeout 200 ms); shared again %.0f ms after the restarted server answered\n",
        calls, slowest * 1000, (core.now() - restarted) * 1000))
      local back = 0
      for _, l in ipairs(lines) do if l:find("is back", 1, true) then back = back + 1 end end
      assert.equal(1, back)
      -- the next call's transitions go to the new server
      call()
      local conn = assert(core.redis_connect("127.0.0.1", redis.port, 1))
      local fields = assert(conn:command(1, "HGETALL", "luagent:ep:" .. srv.url .. "/v1"))
      conn:close()
      assert.is_true(#fields > 0)
    end)
    luagent.configure(old)
    srv:close()
    assert(ok, failure)
  end)

  it("falls back within the timeout when Redis stops answering (SIGSTOP), and returns after SIGCONT", function()
    local lines = {}
    -- `make test` runs with --log off; reconnects come quickly
    local old = luagent.configure { log_sink = function(_, line) lines[#lines + 1] = line end, log_level = "warn",
                                    redis_retry_every = 0.05 }
    local opts = { breaker = { consecutive = 1000, window = 0 }, budget = false,
                   shared = { redis = redis.url, timeout = 0.2 } }
    local ep = registry:get("http://stopped/v1", opts)
    local ok, failure = pcall(luagent.deadline, 20, function()
      assert.same({}, ep:record(core.now(), false, true, false))
      assert.equal("redis", ep:snapshot().backend)
      os.execute("kill -STOP " .. redis.pid)
      local t0 = core.now()
      ep:record(core.now(), false, true, false)
      local took = core.now() - t0
      assert.is_true(took >= 0.15 and took < 0.5, "fell back after the timeout: " .. took)
      assert.is_true(ep:snapshot().fallback)
      t0 = core.now()
      for _ = 1, 50 do ep:record(core.now(), false, true, false) end
      assert.is_true(core.now() - t0 < 0.1, "no more waiting while Redis is down")
      assert.equal(51, ep:snapshot().consecutive, "the local state counted them")
      os.execute("kill -CONT " .. redis.pid)
      local limit = core.now() + 5
      while ep:snapshot().backend ~= "redis" and core.now() < limit do
        luagent.sleep(0.05)
        ep:record(core.now(), false, true, false)
      end
      assert.equal("redis", ep:snapshot().backend)
    end)
    luagent.configure(old)
    os.execute("kill -CONT " .. redis.pid)
    assert(ok, failure)
    local down = 0
    for _, l in ipairs(lines) do if l:find("unreachable", 1, true) then down = down + 1 end end
    assert.equal(1, down)
  end)

  it("shares the retry budget and the cooldown: what one host spends or sets, another sees", function()
    local key = "http://shared-budget/v1"
    local opts = { breaker = false, budget = { max = 10, ratio = 0.1 }, cooldown = {},
                   shared = { redis = redis.url } }
    local a, b = two_hosts(key, opts)
    local now = core.now()
    assert.is_true((b:admit(true, now)), "full budget: a retry may go")
    for _ = 1, 4 do a:record(now, false, true, false) end
    assert.is_true((b:admit(true, now)), "6 tokens of 10 left: still more than half")
    local evs = a:record(now, false, true, false)
    assert.same({ { type = "retry_budget_exhausted", endpoint = key, tokens = 5 } }, evs)
    local ok, err = b:admit(true, now)
    assert.is_nil(ok)
    assert.equal("retry_budget_exhausted", err.kind)
    assert.is_nil((b:may_retry()))
    assert.is_true((b:admit(false, now)), "a first attempt needs no budget")
    -- a cooldown set by a: b holds once a reply has shown it
    assert.equal(0, b:cooldown_wait(core.now(), 0))
    a:set_cooldown(core.now() + 5)
    b:record(core.now(), true, true, false)
    local hold = b:cooldown_wait(core.now(), 0)
    assert.is_true(hold > 4.9 and hold <= 5.05, "b holds for a's cooldown: " .. hold)
    assert.equal("redis", b:snapshot(core.now()).backend)
  end)

  it("authenticates with the URL's password and never shows it", function()
    local secured = start_redis(nil, nil, "--requirepass s3cret")
    local lines = {}
    -- `make test` runs with --log off
    local old = luagent.configure { log_sink = function(_, line) lines[#lines + 1] = line end, log_level = "warn" }
    finally(function() -- one finally per case: busted keeps the last one given
      luagent.configure(old)
      stop_redis(secured)
    end)
    local good = registry:get("http://auth/v1", { shared = { redis = "redis://:s3cret@127.0.0.1:" .. secured.port .. "/3" } })
    assert.is_true((good:admit(false, core.now())))
    good:record(core.now(), false, true, false)
    local h = luagent.health()["http://auth/v1"]
    assert.equal("redis", h.backend)
    assert.equal("redis://:***@127.0.0.1:" .. secured.port .. "/3", h.redis)
    local conn = assert(core.redis_connect("127.0.0.1", secured.port, 1))
    assert(conn:command(1, "AUTH", "s3cret"))
    assert(conn:command(1, "SELECT", 3))
    assert.equal(1, conn:command(1, "EXISTS", "luagent:ep:http://auth/v1"), "written to database 3")
    conn:close()
    local bad = registry:get("http://noauth/v1", { shared = { redis = "redis://:wrong@127.0.0.1:" .. secured.port .. "/0" } })
    assert.is_true((bad:admit(false, core.now())))
    assert.is_true(luagent.health()["http://noauth/v1"].fallback)
    assert.equal(1, #lines)
    assert.matches("redis://:%*%*%*@127%.0%.0%.1:%d+/0 unreachable", lines[1])
    assert.is_nil(table.concat(lines):find("wrong", 1, true))
  end)

  -- Runs one host of spec/fixtures/shared_breaker_host.lua with `env`
  -- (added to MOCK_URL, REDIS_URL, PREFIX), in the background when `async`
  -- (then: the file it prints to, and its pid); else what it printed, as a
  -- list of lines.
  local function breaker_host(m, prefix, env, async)
    local vars = { "MOCK_URL=" .. q(m.url), "REDIS_URL=" .. q(redis.url), "PREFIX=" .. q(prefix), "LUAGENT_LOG=off" }
    for k, v in pairs(env) do vars[#vars + 1] = k .. "=" .. q(v) end
    local out = os.tmpname()
    local cmd = "env " .. table.concat(vars, " ") .. " timeout 60 " .. q(helpers.bin)
      .. " run spec/fixtures/shared_breaker_host.lua >" .. q(out) .. " 2>&1"
    if async then
      os.execute(cmd .. " & echo $! >" .. q(out .. ".pid"))
      local pid = math.tointeger(tonumber(helpers.slurp(out .. ".pid"):match("%d+")))
      os.remove(out .. ".pid")
      return out, pid
    end
    os.execute(cmd)
    local printed = helpers.lines(out)
    os.remove(out)
    return printed
  end

  it("a breaker one host tripped refuses the next host's first call, 8 runs in a row", function()
    local m = start_mock()
    finally(function() stop_mock(m) end)
    for run = 1, 8 do
      local before = mock_requests(m)
      -- a generous timeout: a loaded machine's slow replies are not Redis down
      local first = breaker_host(m, "next" .. run .. ":", { CALLS = "3", TIMEOUT = "5" })
      assert.same({ "http http http", "redis" }, first, "run " .. run .. ": the first host tripped it")
      local second = breaker_host(m, "next" .. run .. ":", { CALLS = "1", TIMEOUT = "5" })
      assert.same({ "circuit_open", "redis" }, second, "run " .. run .. ": the second host saw it open")
      assert.equal(3, mock_requests(m) - before, "run " .. run .. ": none of the second host's calls went out")
    end
  end)

  it("writes what a host counted before its connection was up once it is: the trip reaches the next host", function()
    local m = start_mock()
    finally(function()
      os.execute("kill -CONT " .. redis.pid)
      stop_mock(m)
    end)
    for run = 1, 3 do
      -- Redis answers nothing while the first host starts: it trips its
      -- breaker on its local state, then Redis is back while it runs on
      os.execute("kill -STOP " .. redis.pid)
      local out, pid = breaker_host(m, "late" .. run .. ":", { CALLS = "3", TIMEOUT = "0.2", RETRY_EVERY = "0.02",
                                                             WAIT_SHARED = "1" }, true)
      local limit = core.now() + 20
      while not helpers.slurp(out):find("\n", 1, true) and core.now() < limit do luagent.sleep(0.02) end
      os.execute("kill -CONT " .. redis.pid)
      while alive(pid) and core.now() < limit do luagent.sleep(0.02) end
      local first = helpers.lines(out)
      os.remove(out)
      assert.equal("http http http", first[1], "run " .. run .. ": " .. table.concat(first, " | "))
      local second = breaker_host(m, "late" .. run .. ":", { CALLS = "1", TIMEOUT = "5" })
      assert.same({ "circuit_open", "redis" }, second, "run " .. run .. ": the second host saw it open")
    end
  end)

  it("is named in health() and validated in policies", function()
    local policy = require "luagent.model.policy"
    local p = assert(policy.new { shared = { redis = "redis://127.0.0.1:6380/2", prefix = "x:" } })
    assert.same({ redis = "redis://127.0.0.1:6380/2", prefix = "x:" }, p.shared)
    local _, err = policy.new { shared = { redis = "http://x" } }
    assert.matches("shared.redis must be a URL that starts with redis://", err.message)
    assert.truthy(policy.new { shared = { redis = "redis://db.example.com:6379/0" } })
    _, err = policy.new { shared = { redis = "redis://db example/0" } }
    assert.matches("a host name or a numeric address as host", err.message)
    _, err = policy.new { shared = { prefix = "x" } }
    assert.matches("shared.redis is required", err.message)
    _, err = policy.new { shared = { redis = "redis://127.0.0.1/0", port = 1 } }
    assert.matches("unknown field 'shared.port'", err.message)
    local ep = registry:get("http://a/v1", { shared = { redis = redis.url } })
    assert.is_true((ep:admit(false, core.now())))
    assert.equal("redis", luagent.health()["http://a/v1"].backend)
    registry:get("http://b/v1", {})
    assert.equal("local", luagent.health()["http://b/v1"].backend)
    -- LUAGENT_REDIS_URL shares the endpoints of policies that say nothing
    local script = helpers.tempfile([[
      local luagent = require "luagent"
      local srv = assert(require("luagent.mock").start {})
      local model = { kind = "openai", model = "m", base_url = srv.url .. "/v1", api_key = "k" }
      assert(luagent.complete { model = model, messages = { { role = "user", content = "hi" } } })
      io.write(luagent.health()[model.base_url].backend)
      srv:close()]], ".lua")
    local function run_with(url)
      local out = os.tmpname()
      os.execute("LUAGENT_REDIS_URL=" .. q(url) .. " " .. q(helpers.bin) .. " run " .. q(script) .. " >" .. q(out) .. " 2>&1")
      local text = helpers.slurp(out)
      os.remove(out)
      return text
    end
    assert.equal("redis", run_with(redis.url))
    assert.matches("LUAGENT_REDIS_URL must be a URL that starts with redis:// %(got 'bogus'%)", run_with("bogus"))
    os.remove(script)
  end)
end)

-- issue 26: a call held by the shared state waits as it does in process
-- (spec/breaker_small_spec.lua), and says so with call_waiting. Two
-- runtimes of this process stand for two hosts: each has its registry and
-- its connection, and they share only what Redis holds.
describe("waiting calls through Redis", function()
  local redis, a_rt, b_rt
  before_each(function()
    luagent.clock.real()
    redis = start_redis()
    a_rt = luagent.runtime { log_sink = function() end }
    b_rt = luagent.runtime { log_sink = function() end }
  end)
  after_each(function()
    a_rt:close()
    b_rt:close()
    stop_redis(redis)
  end)

  -- Streams one call of runtime `rt`: its events and its final message_end.
  local function call(rt, model, pol)
    local evs = {}
    for ev in rt:stream { model = model, messages = { { role = "user", content = "hi" } }, policy = pol } do
      evs[#evs + 1] = ev
    end
    return evs, evs[#evs]
  end
  local of_type = helpers.of_type

  local function pol(prefix, extra)
    local p = { max_retries = 0, budget = false, cooldown = false,
                -- open 2 s: long enough that host b, on a loaded machine, still
                -- finds the circuit open when its call starts
                breaker = { consecutive = 3, window = 0, open_for = 2, probe_timeout = 5, wait_for_probe = true },
                shared = { redis = redis.url, prefix = prefix, timeout = 2 } }
    for k, v in pairs(extra or {}) do p[k] = v end
    return p
  end

  it("a call refused by the breaker another host opened waits for the probe and is the probe", function()
    local srv = assert(mock.start { faults = "503@1-3" })
    finally(function() srv:close() end)
    local model = { kind = "openai", model = "m", base_url = srv.url .. "/v1", api_key = "k" }
    for _ = 1, 3 do
      local _, final = call(a_rt, model, pol "w1:")
      assert.equal("overloaded", final.error.class)
    end
    local evs, final = call(b_rt, model, pol "w1:")
    assert.equal("stop", final.stop_reason, tostring(final.error))
    local waits = of_type(evs, "call_waiting")
    assert.equal(1, #waits)
    assert.equal("circuit_open", waits[1].reason)
    assert.is_true(waits[1].wait_ms > 0 and waits[1].wait_ms <= 2010, "waits the open time: " .. waits[1].wait_ms)
    assert.equal(1, #of_type(evs, "circuit_half_open"), "this host's call was the probe")
    assert.equal(1, #of_type(evs, "circuit_close"))
    assert.equal("redis", b_rt:health()[model.base_url].backend)
    assert.equal(4, #srv:requests())
  end)

  it("a call waits while another host's probe is out, and goes when it closed the circuit", function()
    -- request 4, the probe, takes 3 s before its headers: b asks while it is out
    local srv = assert(mock.start { faults = "503@1-3,stall:secs=3@4" })
    finally(function() srv:close() end)
    local model = { kind = "openai", model = "m", base_url = srv.url .. "/v1", api_key = "k" }
    local p = pol "w2:"
    p.breaker.probe_timeout = 10
    for _ = 1, 3 do call(a_rt, model, p) end
    luagent.sleep(2.05) -- the open time is over
    local a_done
    local probe_start = core.now() -- the probe's slot is taken after this
    local probe = luagent.spawn(function()
      local r = { call(a_rt, model, p) }
      a_done = core.now()
      return r
    end)
    -- the probe is out once the server has its request (it stalls there)
    local deadline = core.now() + 10
    while #srv:requests() < 4 and core.now() < deadline do luagent.sleep(0.01) end
    assert.equal(4, #srv:requests(), "the probe reached the server")
    local b_start = core.now()
    local evs, final = call(b_rt, model, p)
    local b_done = core.now()
    local a = probe:join()
    assert.equal("stop", a[2].stop_reason)
    assert.equal("stop", final.stop_reason, tostring(final.error))
    local waits = of_type(evs, "call_waiting")
    assert.equal(1, #waits, "one announcement however often it asked again")
    assert.equal("circuit_open", waits[1].reason)
    -- the wait's end is the probe slot's timeout (10 s), but it went on the
    -- close it learned by asking again (every 0.25 s)
    local at_least = (probe_start + 10 - b_start) * 1000 - 50
    assert.is_true(waits[1].wait_ms >= at_least, "until the probe's slot frees: " .. waits[1].wait_ms
      .. " ms, at least " .. at_least)
    assert.is_true(b_done - a_done < 3, "went " .. (b_done - a_done) .. " s after the probe closed the circuit")
    assert.same({}, of_type(evs, "circuit_half_open"))
    assert.equal(5, #srv:requests())
  end)

  it("a cooldown another host set holds this host's call, with call_waiting", function()
    local srv = assert(mock.start { faults = "429:retry-after=1@2" })
    finally(function() srv:close() end)
    local model = { kind = "openai", model = "m", base_url = srv.url .. "/v1", api_key = "k" }
    local p = pol("w3:", { breaker = false, cooldown = {}, max_retries = 2 })
    local _, first = call(b_rt, model, p) -- request 1: b's view of the shared state
    local viewed = core.now()
    assert.equal("stop", first.stop_reason)
    local retried = false
    local unsubscribe = a_rt:subscribe(function() retried = true end, { "provider_retry" })
    local a_run = luagent.spawn(function() return { call(a_rt, model, p) } end)
    -- a's 429 set the cooldown (polled: a loaded machine may take a while)
    local deadline = core.now() + 10
    while not retried and core.now() < deadline do luagent.sleep(0.01) end
    unsubscribe()
    assert.is_true(retried, "a got its 429")
    -- b's view is no longer fresh (redis.fresh: 0.5 s)
    local stale = viewed + 0.55 - core.now()
    if stale > 0 then luagent.sleep(stale) end
    local t = core.now()
    local evs, final = call(b_rt, model, p)
    local a = a_run:join()
    assert.equal("stop", a[2].stop_reason)
    assert.equal(1, #of_type(a[1], "provider_retry"))
    assert.equal("stop", final.stop_reason)
    local waits = of_type(evs, "call_waiting")
    assert.equal(1, #waits)
    assert.equal("cooldown", waits[1].reason)
    assert.is_true(waits[1]["until"] > t)
    assert.is_true(core.now() - t >= 0.2, "the call waited for the cooldown")
  end)
end)
end)
