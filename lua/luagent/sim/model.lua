--[[ luagent.sim.model: the contention simulation's model and runner
(the face is luagent.sim; the command line is luagent.sim.cli).

THE MODEL
  N clients each need one successful call. A provider accepts at most C
  calls per fixed window of W seconds (windows start at 0, W, 2W, ...) and
  answers every other call with 429, carrying the time left until the next
  window (as `retry-after-ms` would). A call takes `service` seconds (± a
  fraction `service_jitter`, drawn per call) before the client learns the
  answer; the provider counts it when it arrives. All clients start at
  time 0. Each client is a luagent task on the virtual clock, and on a 429
  it waits as its strategy says, with luagent.sleep. A run of thousands of
  clients takes seconds of real time, whatever the simulated time.

  The waits and the protection are the real code, not copies:
  core.backoff_delay and core.backoff_server_wait (host/backoff.c),
  core.retry_budget (host/budget.c), core.breaker (host/breaker.c), and the
  cooldown of a luagent.endpoint. Every client draws its randomness from its
  own core.backoff_rng, seeded from the seed and its number, so a run is
  the same for the same seed and every strategy sees the same random
  numbers (a fair comparison).

STRATEGIES (wait before retry n, from 1; c = min(base × 2^(n-1), max);
U uniform in [0, 1))
  fixed                 fixed_wait, every time
  exponential           c, without jitter
  full_jitter           U × c
  equal_jitter          c/2 + U × c/2
  decorrelated_jitter   min(max, dbase + U × (3 × previous wait − dbase))
  full_jitter+budget    full jitter, and one retry budget shared by all
                        clients (gRPC retry throttling): each 429 costs a
                        token, each success earns `ratio`, and a retry may
                        go only while tokens > max/2, asked just before it
                        is sent (as luagent.endpoint's admit asks)
  full_jitter+breaker   full jitter, and one circuit breaker shared by all
                        clients, asked before every attempt; a 429 counts
                        as a failure (it says the provider is overloaded)
  full_jitter+cooldown  the provider's wait in place of the backoff, obeyed
                        plus up to retry_after.jitter seconds (what
                        policies/default.lua does), and one endpoint shared
                        by all clients: every 429 sets its cooldown to the
                        provider's time, and before each attempt a client
                        holds while the cooldown lasts, released with the
                        endpoint's jitter (cooldown.jitter of the time left)

  HOSTS (--hosts N, N > 1): the clients are spread over N hosts (client i
  on host (i - 1) % N + 1), as when many luagent processes call one
  provider. The three guarded strategies then run twice: ":shared", one
  budget, breaker and cooldown for all hosts (what a shared Redis state
  gives, lua/luagent/model/endpoint/redis.lua; modelled without its round trip),
  and ":local", one per host (each process on its own). The other
  strategies share nothing, so hosts do not change them. Where all clients
  start at time 0 the first wave goes out before any guard has seen a
  failure, shared or not; with clients arriving over time (--spread S:
  client i starts at (i - 1) / N × S, and its times count from its start)
  a shared breaker, once open, stops every host's new clients, while local
  ones must each trip on their own:
    luagent sim --hosts 4 --clients 1000 --spread 5

  A retry the budget refuses, or a call the open breaker refuses, is not
  sent: that client's call fails (kinds retry_budget_exhausted and
  circuit_open) and it counts as "gave up". That is what gRPC does with a
  throttled retry, what the book's breaker does ("fails calls
  immediately"), and what luagent's retry loop does (neither is retried).
  Both are protection for a provider that is failing; against a quota that
  every client hits at once they trade clients for requests, and the table
  shows that price. A client also gives up when the provider asks it to
  wait longer than retry_after.max_wait (the book's rule), and when its
  next attempt would start after the scenario's horizon.

  The table: requests per client (mean, max), total requests, rejected
  requests (429s), clients that gave up, and the time each served client
  got its success (median and worst over the served clients).

SCENARIOS
  book  The book's contention test (chapter 12, "Retries, traces, and
        cost"): "A fixed short wait gets everyone served quickly, at a price
        of 46 requests per client. Plain backoff cuts the request count
        sharply but is slow ... Full jitter sends the fewest requests and is
        done in about two seconds." The book publishes those figures but not
        its parameters; these were chosen to reproduce them:
          clients 100, capacity 5 per window, window 0.1 s (so 2 s is the
          soonest anyone can serve them all), service 10 ms, no service
          jitter, fixed_wait 11 ms, base 0.1 s, max 1 s, horizon 3600 s;
          budget {max 10, ratio 0.1} (gRPC's example); breaker
          {consecutive 5, open_for 1 s, open_max 10 s, growth 2};
          retry_after {max_wait 60, jitter 1}; cooldown {jitter 0.25}.
  aws   Marc Brooker, "Exponential Backoff And Jitter" (AWS Architecture
        Blog, 2015; code in aws-samples/aws-arch-backoff-simulator): 100
        clients contend to update one row under optimistic concurrency
        (read, then a conditional write); a network hop takes 10 ms (sd
        2 ms); backoff base 5 ms, cap 2 s. Published: jitter cuts the calls
        by more than half; full and equal jitter make about the same number
        of calls and decorrelated more; exponential without jitter is "the
        clear loser", so slow it is left off the time graph; equal jitter
        takes much longer than full; full uses less work than decorrelated
        but slightly more time. Mapped onto this model:
          clients 100, capacity 1, window 20 ms (a write wins when no other
          write landed in the two hops since its read: about one success
          per 20 ms), service 40 ms ± 20 % (read and write, four hops),
          fixed_wait 0 (AWS's "no backoff" line), base 10 ms (AWS sleeps
          base × 2^n from n = 1, so its first ceiling is 10 ms), max 2 s,
          decorrelated base 5 ms (AWS's own), horizon 3600 s; budget,
          breaker, retry_after and cooldown as in book.
]]
local core = require "luagent.core"
local registry = require "luagent.model.endpoint.registry"

local M = {}

local floor, fmt = math.floor, string.format

------------------------------------------------------------------------------
-- Scenarios and strategies
------------------------------------------------------------------------------

-- Built-in scenarios (documented at the top). Fields: clients, capacity
-- (calls per window), window (s), service (s per call), service_jitter
-- (fraction), fixed_wait (s), base and max (s, the backoff), hosts (the
-- clients are spread over; 1 unless set), spread (s over which the clients
-- start; 0 unless set),
-- decorrelated_base (s, default base), horizon (s), budget (core.retry_budget
-- config), breaker (core.breaker config), retry_after (core.backoff_server_wait
-- params) and cooldown ({jitter=}, luagent.endpoint's cooldown option).
M.scenarios = {
  book = {
    name = "book",
    clients = 100, capacity = 5, window = 0.1, service = 0.01, service_jitter = 0,
    fixed_wait = 0.011, base = 0.1, max = 1, horizon = 3600,
    budget = { max = 10, ratio = 0.1 },
    breaker = { consecutive = 5, open_for = 1, open_max = 10, growth = 2 },
    retry_after = { max_wait = 60, jitter = 1 }, cooldown = { jitter = 0.25 },
  },
  aws = {
    name = "aws",
    clients = 100, capacity = 1, window = 0.02, service = 0.04, service_jitter = 0.2,
    fixed_wait = 0, base = 0.01, max = 2, decorrelated_base = 0.005, horizon = 3600,
    budget = { max = 10, ratio = 0.1 },
    breaker = { consecutive = 5, open_for = 1, open_max = 10, growth = 2 },
    retry_after = { max_wait = 60, jitter = 1 }, cooldown = { jitter = 0.25 },
  },
}

-- The strategies, in table order. backoff: the core strategy name; budget,
-- breaker, cooldown: the shared protection used on top.
M.strategies = {
  { name = "fixed", backoff = "fixed" },
  { name = "exponential", backoff = "exponential" },
  { name = "full_jitter", backoff = "full_jitter" },
  { name = "equal_jitter", backoff = "equal_jitter" },
  { name = "decorrelated_jitter", backoff = "decorrelated_jitter" },
  { name = "full_jitter+budget", backoff = "full_jitter", budget = true },
  { name = "full_jitter+breaker", backoff = "full_jitter", breaker = true },
  { name = "full_jitter+cooldown", backoff = "full_jitter", cooldown = true },
}

local by_name = {}
for _, s in ipairs(M.strategies) do by_name[s.name] = s end

-- The core.backoff_delay parameters of `strat` in scenario `sc`.
local function backoff_params(sc, strat)
  local kind = strat.backoff
  if kind == "fixed" then return { base = sc.fixed_wait } end
  if kind == "exponential" then
    return { base = sc.base, max = sc.max, multiplier = 2, jitter = 0 }
  elseif kind == "decorrelated_jitter" then
    return { base = sc.decorrelated_base or sc.base, max = sc.max }
  end
  return { base = sc.base, max = sc.max }
end

------------------------------------------------------------------------------
-- The provider
------------------------------------------------------------------------------

-- A provider that accepts at most sc.capacity calls per window of sc.window
-- seconds. counts[w] is the number of calls that arrived in window w (from
-- 0); the first `capacity` of them were accepted.
local function new_provider(sc)
  local W, C = sc.window, sc.capacity
  local p = { rejected = 0, counts = {}, last = 0 }
  local counts = p.counts
  -- call(now) -> true | false, seconds until the next window starts. The
  -- tiny epsilon keeps a call made exactly at a window's start (as summed
  -- floating-point times are) in that window.
  function p.call(now)
    local w = floor(now / W + 1e-9)
    local n = (counts[w] or 0) + 1
    counts[w] = n
    if w > p.last then p.last = w end
    if n <= C then return true end
    p.rejected = p.rejected + 1
    return false, (w + 1) * W - now
  end
  return p
end

------------------------------------------------------------------------------
-- One run
------------------------------------------------------------------------------

-- The simulation's endpoints (a registry of its own, as a runtime's).
M.endpoints = registry.new()
local endpoint_runs = 0 -- cooldown runs so far: each gets an endpoint of its own

-- The shared protection of one run of `strat`: {budget=, breaker=,
-- endpoint=}, each present only when the strategy uses it. The budget and
-- the breaker are the C objects the endpoints are made of; the cooldown
-- is an endpoint's (luagent.endpoint), under a key no agent uses.
local function new_guards(sc, strat)
  local g = {}
  if strat.budget then g.budget = core.retry_budget(sc.budget) end
  if strat.breaker then g.breaker = core.breaker(sc.breaker) end
  if strat.cooldown then
    endpoint_runs = endpoint_runs + 1
    g.endpoint = M.endpoints:get(fmt("luagent-sim:%s:%d", sc.name, endpoint_runs), { cooldown = sc.cooldown })
  end
  return g
end

-- The row of the table from one run's raw results.
local function summarize(name, requests, done_at, gave_up, provider, sc)
  local N, total, maxr, times = #requests, 0, 0, {}
  for i = 1, N do
    total = total + requests[i]
    if requests[i] > maxr then maxr = requests[i] end
    if done_at[i] then times[#times + 1] = done_at[i] end
  end
  table.sort(times)
  local per_window = {}
  for w = 0, provider.last do per_window[w + 1] = provider.counts[w] or 0 end
  return {
    strategy = name, clients = N, total = total, mean = total / N, max = maxr,
    rejected = provider.rejected, served = #times,
    gave_up = gave_up.budget + gave_up.breaker + gave_up.server + gave_up.horizon,
    gave_up_by = gave_up,
    median = times[(#times + 1) // 2], worst = times[#times],
    per_window = per_window, window = sc.window, capacity = sc.capacity,
  }
end

-- Runs every client of `sc` with strategy `strat` on the virtual clock,
-- from time 0, and returns the row of the table. `sharing` is "shared"
-- (one set of guards for all sc.hosts hosts), "local" (one per host) or
-- nil (one host). Must run inside a task.
local function run_tasks(sc, strat, seed, sharing)
  local sleep, now, delay = core.sleep, core.now, core.backoff_delay
  local server_wait = core.backoff_server_wait
  local provider = new_provider(sc)
  local hosts = sc.hosts or 1
  local host_guards = {}
  for h = 1, sharing == "local" and hosts or 1 do host_guards[h] = new_guards(sc, strat) end
  local guarded = strat.budget or strat.breaker or strat.cooldown
  local N, service, sj, horizon = sc.clients, sc.service, sc.service_jitter or 0, sc.horizon
  local kind, params = strat.backoff, backoff_params(sc, strat)
  local requests, done_at = {}, {}
  local gave_up = { budget = 0, breaker = 0, server = 0, horizon = 0 } -- by reason

  -- One client: attempts until served or refused. Before an attempt it
  -- holds while the endpoint's cooldown lasts, and asks the budget (a
  -- retry only) and then the breaker, in the order luagent.endpoint's
  -- admit does. Unguarded strategies sleep the service time and the wait
  -- as one timer (the same instants, half the timers); guarded ones wake
  -- at the reply, because the shared state must see each result when it
  -- arrives.
  local function client(i)
    local guards = host_guards[(i - 1) % #host_guards + 1]
    local budget, breaker, endpoint = guards.budget, guards.breaker, guards.endpoint
    local rng = core.backoff_rng((seed << 32) + i)
    local start = (sc.spread or 0) * (i - 1) / N
    if start > 0 then sleep(start) end
    local n, prev, sent = 0, 0, 0
    while true do
      if endpoint then
        local hold = endpoint:cooldown_wait(now(), rng)
        while hold > 0 do
          sleep(hold)
          hold = endpoint:cooldown_wait(now(), rng)
        end
      end
      if budget and n > 0 and not budget:allow_retry() then
        gave_up.budget = gave_up.budget + 1
        break
      end
      local probe = false
      if breaker then
        local verdict = breaker:allow(now())
        if not verdict then
          gave_up.breaker = gave_up.breaker + 1
          break
        end
        probe = verdict == "probe"
      end
      sent = sent + 1
      local t = now()
      local ok, asked = provider.call(t)
      local took = sj > 0 and service * (1 - sj + 2 * sj * rng:next()) or service
      if guarded then
        sleep(took)
        t, took = now(), 0
        if breaker then breaker:record(t, ok, probe) end
        if budget then
          if ok then budget:success() else budget:failure() end
        end
        if endpoint and not ok then endpoint:set_cooldown(t + asked) end
      end
      if ok then
        done_at[i] = t + took - start
        break
      end
      n = n + 1
      local wait, verdict
      if endpoint then
        wait, verdict = server_wait(asked, sc.retry_after, rng)
        if verdict == "give_up" then -- the provider asks for more than max_wait
          gave_up.server = gave_up.server + 1
          break
        end
      end
      wait = wait or delay(kind, n, params, rng, prev)
      prev = wait
      if t + took + wait > horizon then
        gave_up.horizon = gave_up.horizon + 1
        break
      end
      sleep(took + wait)
    end
    requests[i] = sent
  end

  local tasks = {}
  for i = 1, N do tasks[i] = core.spawn(client, i) end
  for i = 1, N do tasks[i]:join() end
  local row = summarize(strat.name .. (sharing and ":" .. sharing or ""), requests, done_at, gave_up,
    provider, sc)
  row.hosts, row.sharing = hosts, sharing
  return row
end

-- Runs one strategy on the virtual clock (starting at 0) and restores the
-- real clock, even on error. Inside a task it runs there; outside, in a
-- task of its own.
local function run_one(sc, strat, seed, sharing)
  core.clock_virtual(0)
  local ok, row
  if core.current() then
    ok, row = pcall(run_tasks, sc, strat, seed, sharing)
  else
    local task = core.spawn(run_tasks, sc, strat, seed, sharing)
    core.run()
    ok, row = pcall(task.join, task)
  end
  core.clock_real()
  if not ok then error(row, 0) end
  return row
end

-- A copy of the scenario opts.scenario (default book) with the overrides in
-- opts applied.
local function scenario(opts)
  local base = M.scenarios[opts.scenario or "book"]
  if not base then error("sim: unknown scenario '" .. tostring(opts.scenario) .. "'", 3) end
  local sc = {}
  for k, v in pairs(base) do sc[k] = v end
  for _, k in ipairs({ "clients", "capacity", "window", "horizon", "hosts", "spread" }) do
    if opts[k] ~= nil then sc[k] = opts[k] end
  end
  sc.hosts = sc.hosts or 1
  return sc
end

-- run{scenario=, clients=, capacity=, window=, horizon=, hosts=, spread=,
-- seed=, strategies=} -> {scenario=<the parameters used>, seed=, rows={<one per
-- strategy; with hosts > 1, two per guarded strategy: ":shared" then
-- ":local">}}. strategies: a list of names (default all); rows keep the
-- table's order. An unknown scenario or strategy raises.
function M.run(opts)
  opts = opts or {}
  local sc = scenario(opts)
  local seed = opts.seed or 1
  local wanted = {}
  for _, n in ipairs(opts.strategies or {}) do
    if not by_name[n] then error("sim: unknown strategy '" .. tostring(n) .. "'", 2) end
    wanted[n] = true
  end
  local result = { scenario = sc, seed = seed, rows = {} }
  for _, strat in ipairs(M.strategies) do
    if not opts.strategies or wanted[strat.name] then
      local guarded = strat.budget or strat.breaker or strat.cooldown
      if guarded and sc.hosts > 1 then
        result.rows[#result.rows + 1] = run_one(sc, strat, seed, "shared")
        result.rows[#result.rows + 1] = run_one(sc, strat, seed, "local")
      else
        result.rows[#result.rows + 1] = run_one(sc, strat, seed)
      end
    end
  end
  return result
end

return M
