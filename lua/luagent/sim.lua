--[[ luagent.sim: the contention simulation (`luagent sim`).

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

local M = {}

local floor, fmt = math.floor, string.format

------------------------------------------------------------------------------
-- Scenarios and strategies
------------------------------------------------------------------------------

-- Built-in scenarios (documented at the top). Fields: clients, capacity
-- (calls per window), window (s), service (s per call), service_jitter
-- (fraction), fixed_wait (s), base and max (s, the backoff),
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
    g.endpoint = require("luagent.endpoint").get(
      fmt("luagent-sim:%s:%d", sc.name, endpoint_runs), { cooldown = sc.cooldown })
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
-- from time 0, and returns the row of the table. Must run inside a task.
local function run_tasks(sc, strat, seed)
  local sleep, now, delay = core.sleep, core.now, core.backoff_delay
  local server_wait = core.backoff_server_wait
  local provider = new_provider(sc)
  local guards = new_guards(sc, strat)
  local budget, breaker, endpoint = guards.budget, guards.breaker, guards.endpoint
  local guarded = budget or breaker or endpoint
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
    local rng = core.backoff_rng((seed << 32) + i)
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
        done_at[i] = t + took
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
  return summarize(strat.name, requests, done_at, gave_up, provider, sc)
end

-- Runs one strategy on the virtual clock (starting at 0) and restores the
-- real clock, even on error. Inside a task it runs there; outside, in a
-- task of its own.
local function run_one(sc, strat, seed)
  core.clock_virtual(0)
  local ok, row
  if core.current() then
    ok, row = pcall(run_tasks, sc, strat, seed)
  else
    local task = core.spawn(run_tasks, sc, strat, seed)
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
  for _, k in ipairs({ "clients", "capacity", "window", "horizon" }) do
    if opts[k] ~= nil then sc[k] = opts[k] end
  end
  return sc
end

-- run{scenario=, clients=, capacity=, window=, horizon=, seed=, strategies=}
-- -> {scenario=<the parameters used>, seed=, rows={<one per strategy>}}.
-- strategies: a list of names (default all); rows keep the table's order.
-- An unknown scenario or strategy raises.
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
      result.rows[#result.rows + 1] = run_one(sc, strat, seed)
    end
  end
  return result
end

------------------------------------------------------------------------------
-- Output: table, CSV, SVG
------------------------------------------------------------------------------

-- Seconds as text: "1.234", or "-" when there is none.
local function secs(v) return v and fmt("%.3f", v) or "-" end

-- Milliseconds or seconds, whichever reads better ("11 ms", "0.1 s").
local function dur(v)
  if v == 0 then return "0 s" end
  if v < 1 then return fmt("%g ms", v * 1000) end
  return fmt("%g s", v)
end

-- One line describing the scenario's parameters.
local function describe(sc)
  local sj = (sc.service_jitter or 0) > 0 and fmt(" ± %g %%", sc.service_jitter * 100) or ""
  return fmt("%d clients, %d call%s per %s window, %s per call%s; fixed wait %s, "
    .. "backoff base %s, cap %s", sc.clients, sc.capacity, sc.capacity == 1 and "" or "s",
    dur(sc.window), dur(sc.service), sj, dur(sc.fixed_wait), dur(sc.base), dur(sc.max))
end

-- The printed comparison table.
function M.format_table(result)
  local sc = result.scenario
  local out = {
    fmt("luagent sim: scenario %s, seed %d", sc.name, result.seed),
    describe(sc),
    "",
    fmt("%-21s %8s %6s %8s %8s %7s %9s %9s", "strategy", "req/cli", "max", "total",
      "rejected", "gave up", "median s", "worst s"),
  }
  for _, r in ipairs(result.rows) do
    out[#out + 1] = fmt("%-21s %8.1f %6d %8d %8d %7d %9s %9s", r.strategy, r.mean, r.max,
      r.total, r.rejected, r.gave_up, secs(r.median), secs(r.worst))
  end
  return table.concat(out, "\n") .. "\n"
end

M.csv_columns = {
  "scenario", "seed", "strategy", "clients", "capacity", "window_s", "requests_mean",
  "requests_max", "requests_total", "rejected", "served", "gave_up", "median_s", "worst_s",
}

-- The same data as CSV, one row per strategy (empty cells for no value).
function M.csv(result)
  local sc = result.scenario
  local lines = { table.concat(M.csv_columns, ",") }
  for _, r in ipairs(result.rows) do
    lines[#lines + 1] = table.concat({
      sc.name, result.seed, r.strategy, r.clients, sc.capacity, fmt("%g", sc.window),
      fmt("%.3f", r.mean), r.max, r.total, r.rejected, r.served, r.gave_up,
      r.median and fmt("%.4f", r.median) or "", r.worst and fmt("%.4f", r.worst) or "",
    }, ",")
  end
  return table.concat(lines, "\n") .. "\n"
end

-- Escapes text for SVG.
local function xml(s)
  return (tostring(s):gsub("[&<>\"]", { ["&"] = "&amp;", ["<"] = "&lt;", [">"] = "&gt;", ['"'] = "&quot;" }))
end

-- A plot: total requests and time to serve per strategy as bars, and each
-- strategy's requests per window over time (the waves and idle windows).
function M.svg(result)
  local rows, sc = result.rows, result.scenario
  local W, label_w, bar_w, row_h = 1040, 170, 260, 22
  local o = {}
  local function add(...) o[#o + 1] = fmt(...) end
  local n = #rows
  local top = 70
  local bars_h = n * row_h
  local line_h = 46
  local tl_top = top + bars_h + 70
  local H = tl_top + n * line_h + 40
  add('<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" '
    .. 'font-family="sans-serif" font-size="12">', W, H, W, H)
  add('<rect width="%d" height="%d" fill="white"/>', W, H)
  add('<text x="10" y="22" font-size="16" font-weight="bold">luagent sim: scenario %s, seed %d</text>',
    xml(sc.name), result.seed)
  add('<text x="10" y="40">%s</text>', xml(describe(sc)))
  local max_total, max_time = 1, 0.001
  for _, r in ipairs(rows) do
    max_total = math.max(max_total, r.total)
    max_time = math.max(max_time, r.worst or 0)
  end
  local x1, x2 = label_w, label_w + bar_w + 130
  add('<text x="%d" y="%d" font-weight="bold">total requests</text>', x1, top - 8)
  add('<text x="%d" y="%d" font-weight="bold">time until served: median (dark), worst (light), s</text>',
    x2, top - 8)
  for i, r in ipairs(rows) do
    local y = top + (i - 1) * row_h
    add('<text x="%d" y="%d" text-anchor="end">%s</text>', label_w - 8, y + 15, xml(r.strategy))
    local w = bar_w * r.total / max_total
    add('<rect x="%d" y="%d" width="%.1f" height="%d" fill="#4a78b5"/>', x1, y + 3, w, row_h - 6)
    add('<text x="%.1f" y="%d">%d (%.1f/client)</text>', x1 + w + 4, y + 15, r.total, r.mean)
    if r.worst then
      local ww, wm = bar_w * r.worst / max_time, bar_w * r.median / max_time
      add('<rect x="%d" y="%d" width="%.1f" height="%d" fill="#f0a35e"/>', x2, y + 3, ww, row_h - 6)
      add('<rect x="%d" y="%d" width="%.1f" height="%d" fill="#c0580f"/>', x2, y + 3, wm, row_h - 6)
      add('<text x="%.1f" y="%d">%s / %s</text>', x2 + ww + 4, y + 15, secs(r.median), secs(r.worst))
    else
      add('<text x="%d" y="%d">nobody served</text>', x2, y + 15)
    end
    if r.gave_up > 0 then
      add('<text x="%d" y="%d" fill="#b00">%d gave up</text>', W - 90, y + 15, r.gave_up)
    end
  end
  add('<text x="10" y="%d" font-weight="bold">requests per %s window over time (the busiest '
    .. 'window where windows share a pixel; each row its own scales; dashed: the capacity, %d)'
    .. '</text>', tl_top - 14, xml(dur(sc.window)), sc.capacity)
  local tw = W - label_w - 160
  for i, r in ipairs(rows) do
    local y = tl_top + (i - 1) * line_h
    local pw, nw = r.per_window, #r.per_window
    local bins = math.min(nw, tw // 2)
    local per = nw / bins
    local sums, peak = {}, 1 -- sums[b]: the busiest window of bin b
    for b = 1, bins do
      local m = 0
      for w = floor((b - 1) * per) + 1, floor(b * per) do m = math.max(m, pw[w]) end
      sums[b] = m
      peak = math.max(peak, m)
    end
    peak = math.max(peak, sc.capacity)
    local h = line_h - 10
    add('<text x="%d" y="%d" text-anchor="end">%s</text>', label_w - 8, y + h - 4, xml(r.strategy))
    add('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#999"/>', label_w, y + h, label_w + tw, y + h)
    local bw = tw / bins
    for b = 1, bins do
      if sums[b] > 0 then
        local bh = h * sums[b] / peak
        add('<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"/>', label_w + (b - 1) * bw,
          y + h - bh, math.max(bw - 0.3, 0.3), bh, sums[b] > sc.capacity and "#d9534f" or "#5cb85c")
      end
    end
    local cy = y + h - h * sc.capacity / peak
    add('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#333" stroke-dasharray="4 3"/>', label_w, cy,
      label_w + tw, cy)
    add('<text x="%d" y="%d">0 .. %s s, peak %d</text>', label_w + tw + 6, y + h - 4,
      fmt("%.3g", nw * sc.window), math.floor(peak + 0.5))
  end
  add('</svg>')
  return table.concat(o, "\n") .. "\n"
end

------------------------------------------------------------------------------
-- Command line
------------------------------------------------------------------------------

M.help = [[
usage: luagent sim [options]

A deterministic simulation of many clients contending for one rate-limited
provider, on the virtual clock (a run of thousands of clients takes
seconds). N clients each need one successful call; the provider accepts at
most C calls per window of W seconds and answers the rest with 429. It runs
the real backoff, retry budget, circuit breaker and cooldown code, and
prints one row per strategy: requests per client (mean and max), total
requests, rejected requests (429s), clients that gave up, and when the
served clients got their success (median and worst, seconds).

strategies (wait before retry n; c = min(base × 2^(n-1), cap)):
  fixed                 a fixed short wait
  exponential           c, without jitter
  full_jitter           U × c (U uniform in [0, 1))
  equal_jitter          c/2 + U × c/2
  decorrelated_jitter   min(cap, base + U × (3 × previous wait − base))
  full_jitter+budget    plus a shared retry budget (gRPC retry throttling)
  full_jitter+breaker   plus a shared circuit breaker
  full_jitter+cooldown  the provider's Retry-After in place of the backoff,
                        and a shared cooldown released with jitter
A retry refused by the budget, or a call refused by the open breaker, is
not sent: the client's call fails ("gave up"), as in gRPC and the book.

scenarios:
  book  100 clients, 5 calls per 0.1 s window, 10 ms per call, fixed wait
        11 ms, backoff base 0.1 s, cap 1 s. The book reports that a fixed
        short wait costs about 46 requests per client, plain backoff is
        slow, and full jitter sends the fewest and is done in about two
        seconds, but not its parameters: these were chosen to reproduce
        those figures.
  aws   Marc Brooker's AWS "Exponential Backoff And Jitter" experiment (100
        clients, 10 ms network hops, base 5 ms, cap 2 s) mapped onto this
        model: 1 call per 20 ms window, 40 ms ± 20 % per call, base 10 ms
        (AWS's first ceiling; decorrelated keeps 5 ms), cap 2 s, fixed
        wait 0 (AWS's "no backoff").
The top of lua/luagent/sim.lua explains both mappings.

options:
  --scenario NAME     book (default) or aws
  --clients N         number of clients
  --capacity C        calls accepted per window
  --window W          window length, seconds
  --seed S            seed of the clients' jitter (default 1)
  --strategies LIST   comma-separated names (default: all)
  --csv FILE          also write the table as CSV
  --svg FILE          also write a plot (SVG)
  -h, --help          show this help

example:
  luagent sim --scenario aws --svg aws.svg
]]

-- Options: name -> the kind of value.
local FLAGS = {
  scenario = "string", clients = "count", capacity = "count", window = "seconds",
  seed = "integer", strategies = "list", csv = "string", svg = "string",
}

-- parse_args(args) -> opts | nil, message.
function M.parse_args(args)
  local opts, i = {}, 1
  while args[i] do
    local a = args[i]
    if a == "-h" or a == "--help" then
      opts.help = true
      return opts
    end
    local name, value = a:match("^%-%-([%w%-]+)=(.*)$")
    name = name or a:match("^%-%-([%w%-]+)$")
    local kind = name and FLAGS[name]
    if not kind then return nil, fmt("unknown argument '%s'", a) end
    if value == nil then
      i = i + 1
      value = args[i]
      if value == nil then return nil, fmt("flag '--%s' needs a value", name) end
    end
    local v
    if kind == "string" then
      v = value
    elseif kind == "list" then
      v = {}
      for s in value:gmatch("[^,%s]+") do v[#v + 1] = s end
      if #v == 0 then return nil, "--strategies: empty list" end
      for _, s in ipairs(v) do
        if not by_name[s] then return nil, fmt("--strategies: unknown strategy '%s'", s) end
      end
    else
      v = tonumber(value)
      local int = v and math.tointeger(v)
      if kind == "seconds" and not (v and v > 0 and v < math.huge) then
        return nil, fmt("--%s wants a number of seconds > 0, got '%s'", name, value)
      elseif kind == "count" and not (int and int >= 1) then
        return nil, fmt("--%s wants a whole number >= 1, got '%s'", name, value)
      elseif kind == "integer" and not int then
        return nil, fmt("--%s wants an integer, got '%s'", name, value)
      end
      if kind ~= "seconds" then v = int end
    end
    opts[name] = v
    i = i + 1
  end
  if opts.scenario and not M.scenarios[opts.scenario] then
    return nil, fmt("--scenario: unknown scenario '%s' (book, aws)", opts.scenario)
  end
  return opts
end

-- Writes `text` to `path`; true, or nil and a message.
local function write_file(path, text)
  local fh, err = io.open(path, "w")
  if not fh then return nil, err end
  local ok, werr = fh:write(text)
  fh:close()
  if not ok then return nil, werr end
  return true
end

-- main(args, out, err) -> exit code: 0 done, 1 a file could not be
-- written, 2 usage error.
function M.main(args, out, err)
  out, err = out or io.stdout, err or io.stderr
  local opts, perr = M.parse_args(args or {})
  if not opts then
    err:write("luagent sim: ", perr, "\nRun 'luagent sim --help' for usage.\n")
    return 2
  end
  if opts.help then
    out:write(M.help)
    return 0
  end
  local result = M.run(opts)
  out:write(M.format_table(result))
  for _, f in ipairs({ { "csv", M.csv }, { "svg", M.svg } }) do
    local path = opts[f[1]]
    if path then
      local ok, werr = write_file(path, f[2](result))
      if not ok then
        err:write("luagent sim: cannot write ", path, ": ", tostring(werr), "\n")
        return 1
      end
      err:write("luagent sim: wrote ", path, "\n")
    end
  end
  return 0
end

return M
