-- Cost: a meter a runtime owns (lua/luagent/runtime.lua, rt:meter("cost")):
-- a consumer of the runtime's event bus that prices every attempt of every
-- model call (failed attempts included: their usage is billed too) with
-- its price table (lua/luagent/observe/prices.lua, overridable per meter),
-- and keeps a meter per agent, per call and for the whole run. A model
-- without a price is reported as "no price", never as free.
--
-- It also enforces `max_cost` (an agent's option, or the runtime's
-- max_cost setting, `--max-cost`): through the runtime's admission list, a
-- call (or a retry) that would start once the cap is reached is refused
-- with a `cost_limit` error before any request is sent. The totals of an
-- agent's run are added to its `agent_end` event as `cost`.
local core = require "luagent.core"
local errors = require "luagent.base.errors"
local usage = require "luagent.base.usage"
local PRICES = require "luagent.observe.prices"

local M = {}

M.CURRENCY = "USD"
-- How many call records a meter keeps for the costliest turns (at least),
-- unless its `keep` option says otherwise (cost.new).
M.KEEP = 20

local Meter = {}
Meter.__index = Meter
M.Meter = Meter

------------------------------------------------------------------------------
-- Prices
------------------------------------------------------------------------------

local PRICE_FIELDS = { input = true, output = true, cache_read = true, cache_write = true }

-- Checks one price entry; returns nil or what is wrong.
local function bad_entry(model, p)
  if type(model) ~= "string" or model == "" then return "a key is not a model name" end
  if type(p) ~= "table" then return model .. ": expected a table {input=, output=, ...}" end
  for k, v in pairs(p) do
    if not PRICE_FIELDS[k] then
      return model .. ": unknown field '" .. tostring(k) .. "' (input, output, cache_read, cache_write)"
    end
    if type(v) ~= "number" or v ~= v or v < 0 or v == math.huge then
      return model .. "." .. k .. " must be a number >= 0 (dollars per million tokens)"
    end
  end
  if p.input == nil or p.output == nil then return model .. ": input and output prices are required" end
end

-- The models of price table `t`, sorted, or nil and what is wrong with it
-- (`source` names it).
local function checked_keys(t, source)
  if type(t) ~= "table" then return nil, source .. ": expected a table of models" end
  local keys = {}
  for k in pairs(t) do keys[#keys + 1] = k end
  table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
  for _, k in ipairs(keys) do
    local why = bad_entry(k, t[k])
    if why then return nil, source .. ": " .. why end
  end
  return keys
end

-- meter:set_prices(t [, source]) -> true | nil, message: entries of `t`
-- replace the meter's, model by model.
function Meter:set_prices(t, source)
  local keys, err = checked_keys(t, source or "prices")
  if not keys then return nil, err end
  for _, k in ipairs(keys) do self.prices[k] = t[k] end
  self.found = {}
  return true
end

-- read_prices(path) -> table | nil, message: a Lua file returning a price
-- table, run as text in an empty environment, and checked.
function M.read_prices(path)
  local chunk, err = loadfile(path, "t", {})
  if not chunk then return nil, err end
  local ok, t = pcall(chunk)
  if not ok then return nil, tostring(t) end
  local keys, why = checked_keys(t, path)
  if not keys then return nil, why end
  return t
end

-- meter:load_prices(path) -> true | nil, message: read_prices(path), laid
-- over the meter's prices.
function Meter:load_prices(path)
  local t, err = M.read_prices(path)
  if not t then return nil, err end
  return self:set_prices(t, path)
end

-- The entry in `prices` for a model: its own, its name without a vendor
-- prefix, or the longest key its dated name starts with.
local function lookup(prices, model)
  local p = prices[model]
  if p then return p end
  local bare = model:match("^[^/]+/(.+)$")
  if bare and prices[bare] then return prices[bare] end
  local name, best = bare or model, nil
  for k, v in pairs(prices) do
    local suffix = #k < #name and name:sub(1, #k) == k and name:sub(#k + 1)
    if suffix and (suffix:match("^%-%d") or suffix == "-latest") and (not best or #k > #best) then best, p = k, v end
  end
  return p
end

-- meter:price(model) -> the entry for a model name, or nil (no price).
function Meter:price(model)
  if type(model) ~= "string" then return nil end
  local found = self.found -- model name -> entry or false: lookups made, until the table changes
  local p = found[model]
  if p == nil then
    p = lookup(self.prices, model) or false
    found[model] = p
  end
  return p or nil
end

-- usage_cost(usage, price) -> dollars: uncached input, cache reads and
-- writes, and output, each at its price per million tokens.
function M.usage_cost(u, p)
  local input, out = u.input_tokens or 0, u.output_tokens or 0
  local cr, cw = u.cache_read_tokens or 0, u.cache_write_tokens or 0
  local uncached = math.max(0, input - cr - cw)
  return (uncached * p.input + cr * (p.cache_read or p.input) + cw * (p.cache_write or p.input)
    + out * p.output) / 1e6
end

------------------------------------------------------------------------------
-- Meters
------------------------------------------------------------------------------

-- Whether a call (its cost, nil: no price; its number) comes before record
-- b, costliest first (no price sorts last), then by call.
local function ahead(cost, call, b)
  local x, y = cost or -1, b.cost or -1
  if x ~= y then return x > y end
  return call < b.call
end

-- Sorts call records costliest first.
local function costliest_first(a, b) return ahead(a.cost, a.call, b) end

local function by_call(a, b) return a.call < b.call end

-- A count: calls, attempts, usage and cost of an agent (or of the run).
local function new_count(name)
  return { name = name, calls = 0, attempts = 0, usage = usage.zero(), cost = 0, unpriced = 0 }
end

-- The counts of a meter: per agent (by id, in first-seen order), the
-- records of calls in flight (made at a call's first charge, or at its
-- end), the finished calls' records (and the floor a record must beat to
-- be kept), each agent's current turn.
local function new_state()
  return { agents = {}, order = {}, calls = {}, done = {}, turns = {}, run = new_count("total"), floor = nil,
           parents = {} } -- a sub-agent's id -> its parent's (tools.agent)
end

-- The count of the agent an event belongs to ("(no agent)" for bare calls).
local function agent_meter(state, ev)
  local key = ev.agent_id or ev.agent or "(no agent)"
  local m = state.agents[key]
  if not m then
    m = new_count(ev.agent or "(no agent)")
    state.agents[key] = m
    state.order[#state.order + 1] = key
  end
  return m
end

-- The record of call `ev.call`: {call, agent, turn, model, attempts,
-- usage, cost (nil: no price), message_id (the last attempt's answer id),
-- generation_ids (OpenRouter: every attempt's id, in order, failed ones
-- included, to look their cost up by: lua/luagent/observe/generations.lua),
-- generation_id (the last of them), attempt_costs}.
local function call_record(state, ev)
  local r = state.calls[ev.call]
  if not r then
    r = { call = ev.call, agent = ev.agent, agent_id = ev.agent_id, turn = state.turns[ev.agent_id or ""],
          attempts = 0, usage = usage.zero(), cost = 0, attempt_costs = {} }
    state.calls[ev.call] = r
  end
  return r
end

-- The cost of usage `u` at price `p` (nil: no price; no usage costs 0).
local function cost_of(u, p)
  return p and (type(u) == "table" and M.usage_cost(u, p) or 0) or nil
end

-- Charges one attempt's usage `u` (costing c, nil: no price) to the
-- agent's count and the run's.
local function charge_meters(state, ev, u, c)
  local a, run = agent_meter(state, ev), state.run
  a.attempts, run.attempts = a.attempts + 1, run.attempts + 1
  usage.add(a.usage, u)
  usage.add(run.usage, u)
  if c then a.cost, run.cost = a.cost + c, run.cost + c end
end

-- Charges one attempt's usage to the call's record, its agent and the run,
-- at the price of the model the attempt asked (a call that fell back to
-- another model pays each model's attempts at its own price); the record
-- names the last model charged, the one that answered at the end.
local function charge(self, r, ev, u)
  r.model = ev.request_model or r.model
  r.provider_kind = ev.provider_kind or r.provider_kind
  r.attempts = r.attempts + 1
  local c = cost_of(u, self:price(r.model))
  r.attempt_costs[#r.attempt_costs + 1] = c or false
  usage.add(r.usage, u)
  charge_meters(self.state, ev, u, c)
  if c and r.cost then r.cost = r.cost + c else r.cost = nil end
end

-- Counts a finished call (priced or not) on its agent's count and the run's.
local function count_call(state, ev, priced)
  local a, run = agent_meter(state, ev), state.run
  a.calls, run.calls = a.calls + 1, run.calls + 1
  if not priced then a.unpriced, run.unpriced = a.unpriced + 1, run.unpriced + 1 end
end

-- A call ended: counted on its meters, its record kept for the report.
local function finish_call(self, r, ev)
  local state = self.state
  state.calls[ev.call] = nil
  -- a call refused before any attempt (an open circuit, a cost cap) was
  -- never charged: its model and why come from its final event (which
  -- names the model that answered, or the last one tried)
  r.model = ev.request_model or r.model
  r.provider_kind = ev.provider_kind or r.provider_kind
  r.fallback_from = ev.fallback_from
  if r.attempts == 0 and ev.error then r.refused = ev.error.kind or "error" end
  local ids = ev.response_ids -- every attempt's message id (the final event's)
  r.message_id = ids and ids[#ids]
  count_call(state, ev, r.cost ~= nil)
  if r.provider_kind == "openrouter" and ids then
    r.generation_ids, r.generation_id = ids, ids[#ids]
  end
  -- keep the costliest `keep` (for the report), not every call of a long
  -- run: past 2 * keep records, the costliest `keep` stay, and the
  -- cheapest of them becomes the floor a later call must beat to be kept
  -- at all (the kept set only grows costlier)
  if state.floor and not costliest_first(r, state.floor) then return end
  local done, keep = state.done, self.keep
  done[#done + 1] = r
  if #done > 2 * keep then
    table.sort(done, costliest_first)
    for i = #done, keep + 1, -1 do done[i] = nil end
    state.floor = done[#done]
    table.sort(done, by_call)
  end
end

-- The consumer of meter `self`.
local function consume(self, ev)
  local t, state = ev.type, self.state
  if t == "turn_start" then
    state.turns[ev.agent_id or ""] = ev.turn
  elseif t == "agent_start" then
    if ev.parent_agent_id and ev.agent_id then state.parents[ev.agent_id] = ev.parent_agent_id end
  elseif (t == "provider_retry" or (t == "model_fallback" and ev.attempt)) and ev.call ~= nil then
    -- a retried attempt, or the last attempt of a model the call falls back from
    charge(self, call_record(state, ev), ev, ev.usage)
  elseif ((t == "message_end" and ev.final) or t == "call_aborted") and ev.call ~= nil then
    -- (an answer a resumed run replays from its journal has no call
    -- number: the run that got it paid for it)
    local r = state.calls[ev.call]
    if not r and ev.attempts == 1 and state.floor then
      -- the common case, one attempt and nothing charged before: when the
      -- call cannot beat the floor, it is charged and counted without a
      -- record (none is kept)
      local u = ev.total_usage
      local c = cost_of(u, self:price(ev.request_model))
      if not ahead(c, ev.call, state.floor) then
        charge_meters(state, ev, u, c)
        return count_call(state, ev, c ~= nil)
      end
    end
    r = r or call_record(state, ev)
    if (ev.attempts or 0) > r.attempts then
      -- the last attempt: what the call's total holds beyond the attempts
      -- charged so far (so the meter always adds up to total_usage); all
      -- of it when it was the only one
      local rest = ev.total_usage
      if r.attempts > 0 then rest = usage.add(usage.add(usage.zero(), rest), r.usage, -1) end
      charge(self, r, ev, rest)
    end
    finish_call(self, r, ev)
  elseif t == "agent_end" then
    ev.cost = self:totals(ev.agent_id or ev.agent, true)
  end
end

-- meter:totals([agent_id]) -> {total=<dollars or nil when no call was
-- priced>, calls=, attempts=, unpriced_calls=, usage=, currency=} of an
-- agent (by id) or of the whole run.
-- With `nested`, an agent's count includes its sub-agents' (tools.agent:
-- each agent whose parent, or its parent's parent, is this one).
function Meter:totals(key, nested)
  local state = self.state
  local m = key and state.agents[key] or (not key and state.run)
  if not m then m = new_count(key) end
  if key and nested then
    local sum = new_count(m.name)
    for _, k in ipairs(state.order) do
      local p, hops = k, 0
      while p and p ~= key and hops < 64 do p, hops = state.parents[p], hops + 1 end
      if p == key then
        local c = state.agents[k]
        sum.calls, sum.attempts, sum.cost, sum.unpriced = sum.calls + c.calls, sum.attempts + c.attempts,
          sum.cost + c.cost, sum.unpriced + c.unpriced
        usage.add(sum.usage, c.usage)
      end
    end
    m = sum
  end
  local priced = m.calls - m.unpriced
  return { total = (priced > 0 or m.calls == 0) and m.cost or nil, calls = m.calls, attempts = m.attempts,
           unpriced_calls = m.unpriced, usage = m.usage, currency = self.currency }
end

-- meter:records() -> the finished calls' records in call order: every
-- one, or (in a long run) at least the `keep` costliest.
function Meter:records() return self.state.done end

-- meter:reset(): forgets every count and record (the prices stay).
function Meter:reset() self.state = new_state() end

------------------------------------------------------------------------------
-- The cap
------------------------------------------------------------------------------

-- "$0.0123", or "no price".
local function money(v) return v and string.format("$%.4f", v) or "no price" end
M.money = money

-- The model name a call asks for (from its `model` option).
local function model_of(opts)
  local m = opts.model
  if type(m) == "string" then return m:match("^[%w_]+/(.+)$") or m end
  return type(m) == "table" and m.model or nil
end

-- The admission check: a refusal when a cap applies and is reached, or
-- when a cap applies and the model has no price (the cap could not hold).
local function gate(self, opts, run_limit)
  if not opts.max_cost and not run_limit then return nil end -- no cap: every call's case, no work
  local state = self.state
  local limits = {}
  if opts.max_cost then
    local m = state.agents[opts.agent_id or opts.agent or ""]
    limits[#limits + 1] = { limit = opts.max_cost, spent = m and m.cost or 0,
      scope = "agent", what = "the agent '" .. tostring(opts.agent) .. "'" }
  end
  if run_limit then
    limits[#limits + 1] = { limit = run_limit, spent = state.run.cost, scope = "run", what = "the run" }
  end
  local model = model_of(opts)
  for _, l in ipairs(limits) do
    local msg
    if not self:price(model) then
      msg = string.format("max_cost of %s (%s) cannot hold: model '%s' has no price (add it with --prices)",
        l.what, money(l.limit), tostring(model))
    elseif l.spent >= l.limit then
      msg = string.format("max_cost of %s (%s) reached: %s spent; the call was not sent",
        l.what, money(l.limit), money(l.spent))
    end
    if msg then
      return errors.new("cost_limit", msg, { limit = l.limit, spent = l.spent, scope = l.scope,
        retryable = false, reason = "max_cost reached" })
    end
  end
end

------------------------------------------------------------------------------
-- Making, starting, the table
------------------------------------------------------------------------------

-- new(rt [, opts]) -> the cost meter of runtime rt, not yet counting: its
-- prices start from lua/luagent/observe/prices.lua; start() subscribes it
-- to rt's bus and registers its cap in rt's admission list (the run's cap
-- is rt's max_cost setting, an agent's its own max_cost option).
-- opts.keep: how many of the costliest call records it keeps (M.KEEP).
function M.new(rt, opts)
  if type(rt) ~= "table" or not rt.bus or not rt.admission then error("cost.new: expects a runtime", 2) end
  local keep = opts and opts.keep or M.KEEP
  if math.tointeger(keep) == nil or keep < 1 then error("cost.new: keep must be a whole number >= 1", 2) end
  local self = setmetatable({
    rt = rt, currency = M.CURRENCY, keep = keep,
    prices = {}, found = {}, state = new_state(),
    unsubscribe = nil, admit = nil, -- while started
  }, Meter)
  for k, v in pairs(PRICES) do self.prices[k] = v end
  return self
end

-- meter:start(): subscribes the meter (once) to the runtime's bus and
-- registers the cap in its admission list.
function Meter:start()
  if self.unsubscribe then return end
  local rt = self.rt
  self.unsubscribe = rt.bus:subscribe(function(ev) consume(self, ev) end, { annotate = "first",
    types = { "agent_start", "turn_start", "provider_retry", "model_fallback", "message_end", "call_aborted", "agent_end" } })
  self.admit = function(opts) return gate(self, opts, rt.settings:get("max_cost")) end
  rt.admission[#rt.admission + 1] = self.admit
end

-- meter:stop(): unsubscribes and takes the cap out of the admission list;
-- the counts stay readable (report, totals) until reset().
function Meter:stop()
  if not self.unsubscribe then return end
  self.unsubscribe()
  self.unsubscribe = nil
  local admission = self.rt.admission
  for i, g in ipairs(admission) do if g == self.admit then table.remove(admission, i) break end end
  self.admit = nil
end

-- Whether the meter counts.
function Meter:started() return self.unsubscribe ~= nil end

-- "  generation ID" or "  generations ID, ID" of a record, or "".
local function generations_text(r)
  local ids = r.generation_ids
  if not ids then return "" end
  return (#ids == 1 and "  generation " or "  generations ") .. table.concat(ids, ", ")
end

-- meter:report([top]) -> lines: a table per agent (calls, attempts,
-- tokens, cost) with the run's total, then the `top` costliest turns; text
-- a terminal would act on is escaped.
function Meter:report(top)
  top = top or 5
  local state = self.state
  local lines = {}
  local fmt = "%-20s %6s %8s %10s %10s %10s %10s %12s"
  lines[1] = string.format("cost (%s; prices per million tokens, lua/luagent/observe/prices.lua or --prices)", self.currency)
  lines[2] = string.format(fmt, "agent", "calls", "attempts", "input", "output", "cache_read", "cache_write", "cost")
  local function row(name, key)
    local t = self:totals(key)
    local cost = money(t.total)
    if t.total and t.unpriced_calls > 0 then cost = cost .. " + " .. t.unpriced_calls .. " unpriced" end
    lines[#lines + 1] = string.format(fmt, name:sub(1, 20), t.calls, t.attempts, t.usage.input_tokens,
      t.usage.output_tokens, t.usage.cache_read_tokens, t.usage.cache_write_tokens, cost)
  end
  -- a sub-agent's row is named by its parent's: "lead/researcher" (its own
  -- counts; the parent's agent_end holds both)
  local function label(key, hops)
    local p = state.parents[key]
    local own = state.agents[key] and state.agents[key].name or tostring(key)
    if p and hops < 8 and state.agents[p] then return label(p, hops + 1) .. "/" .. own end
    return own
  end
  for _, key in ipairs(state.order) do row(label(key, 0), key) end
  row("total", nil)
  local turns = {}
  for _, r in ipairs(state.done) do turns[#turns + 1] = r end
  table.sort(turns, costliest_first)
  if #turns > 0 then
    lines[#lines + 1] = "costliest turns:"
    for i = 1, math.min(top, #turns) do
      local r = turns[i]
      local failed, failed_cost = #r.attempt_costs - 1, 0
      for j = 1, failed do failed_cost = failed_cost and r.attempt_costs[j] and failed_cost + r.attempt_costs[j] end
      -- a refused call says so instead of "0 attempts"
      local attempts = r.refused and "not sent (" .. r.refused .. ")"
        or string.format("%d attempt%s", r.attempts, r.attempts == 1 and "" or "s")
      lines[#lines + 1] = string.format("  %s%s call %d  %s  %s%s  in %d out %d  %s%s",
        r.agent and (r.agent .. " ") or "", r.turn and ("turn " .. r.turn .. ",") or "", r.call,
        (r.model or "(model unknown)") .. (r.fallback_from and " (after " .. table.concat(r.fallback_from, ", ") .. ")" or ""),
        attempts,
        failed > 0 and string.format(" (%d failed: %s)", failed, money(failed_cost or nil)) or "",
        r.usage.input_tokens, r.usage.output_tokens, money(r.cost),
        generations_text(r))
    end
  end
  -- agent and model names, generation ids: a script's, a model's, a
  -- server's text, printed on a terminal (host/termtext.c)
  for i = 1, #lines do lines[i] = core.terminal_text(lines[i]) end
  return lines
end

return M
