-- parallel.lua: 23 agents share one provider that fails most calls. Each
-- agent retries sensibly; together, without shared protection, they flood
-- the provider. With the breaker, the retry budget and the cooldown shared
-- per endpoint, the flood is cut: a refused call fails at once and costs
-- the provider nothing, and these agents wait until the breaker's next probe
-- is due before they try the turn again.
--
--   build/luagent run examples/parallel.lua [FAULTS]     (default 503@p:0.7)
--
-- Runs twice against luagent's mock provider on loopback (real sockets), on
-- the virtual clock so the backoff waits take no real time, and prints
-- total requests, failed calls and (simulated) time for each.
local luagent = require "luagent"
local mock = require "luagent.mock"

local AGENTS, TURNS = 23, 5
local faults = arg[1] or "503@p:0.7"

luagent.configure { log_sink = function() end } -- the table below says it all
luagent.clock.virtual()

-- One run: every agent makes TURNS calls; returns the figures.
local function run(label, policy)
  local srv = assert(mock.start { faults = faults, seed = 42 })
  local model = { kind = "openai", model = "gpt-4o-mini", base_url = srv.url .. "/v1", api_key = "mock" }
  local ok, failed, kinds = 0, 0, {}
  local t0 = luagent.now()
  local agents = {}
  for a = 1, AGENTS do
    agents[a] = luagent.spawn(function()
      for turn = 1, TURNS do
        local msg, err
        for try = 1, 10 do -- a patient agent: a refused call waits, then tries the turn again
          msg, err = luagent.complete { model = model, policy = policy, seed = a * 1000 + turn * 10 + try,
            messages = { { role = "user", content = ("agent %d, turn %d"):format(a, turn) } } }
          if msg or (err.kind ~= "circuit_open" and err.kind ~= "retry_budget_exhausted") then break end
          luagent.sleep(err.retry_at and math.max(err.retry_at - luagent.now(), 0.1) or 10)
        end
        if msg then ok = ok + 1 else
          failed = failed + 1
          kinds[err.kind] = (kinds[err.kind] or 0) + 1
        end
      end
    end)
  end
  for _, t in ipairs(agents) do t:join() end
  local elapsed = luagent.now() - t0
  local requests = #srv:requests()
  srv:close()
  local why = {}
  for k, n in pairs(kinds) do why[#why + 1] = k .. " " .. n end
  table.sort(why)
  return { label = label, requests = requests, ok = ok, failed = failed, time = elapsed,
           why = table.concat(why, ", ") }
end

local base = { max_retries = 5, backoff = { strategy = "full_jitter", base = 1, max = 30 } }
local off, on = {}, {}
for k, v in pairs(base) do off[k], on[k] = v, v end
off.breaker, off.budget, off.cooldown = false, false, false
on.breaker = { consecutive = 5, open_for = 5 }

local rows = { run("protection off", off), run("protection on", on) }
print(("%d agents x %d calls against one provider with faults %s"):format(AGENTS, TURNS, faults))
print(("%-16s %9s %9s %9s %10s  %s"):format("", "requests", "calls ok", "failed", "time (s)", "failures"))
for _, r in ipairs(rows) do
  print(("%-16s %9d %9d %9d %10.1f  %s"):format(r.label, r.requests, r.ok, r.failed, r.time, r.why))
end
print(("protection cut the requests by %.0f %%"):format(100 * (1 - rows[2].requests / rows[1].requests)))
