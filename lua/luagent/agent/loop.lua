-- Agents: turns of one model call (the retry loop, luagent.stream, as it
-- is) followed by the tool calls of its message, until the model answers
-- without tool calls, max_turns is reached, the loop guard trips, a tool's
-- outcome is unknown, or the agent is aborted. Every step is an event
-- (lua/luagent/EVENTS.md, "Agent events"):
--
--   agent_start, then per turn: [tools_changed | tools_reload_failed]*,
--   turn_start, the model call's events (retries included),
--   (tool_execution_start, tool_execution_update*, tool_retry*,
--   tool_execution_end)* per call, turn_end; finally agent_end.
--
-- The agent's work runs as a task of its own; agent:prompt() returns an
-- iterator over its events (which are also published on the event bus).
-- Every event, the agent's own and its model calls', is told in one order:
-- the journal of a durable agent first (lua/luagent/agent/replay.lua,
-- record: a step is committed before anyone is told of it), then the bus,
-- then the caller's iterator.
-- History (agent.messages) is provider-neutral: the shapes of EVENTS.md,
-- "Conversation history", which every adapter sends.
local core = require "luagent.core"
local errors = require "luagent.base.errors"
local json = require "luagent.base.json"
local queue = require "luagent.base.queue"
local retry = require "luagent.model.call"
local policies = require "luagent.model.policy"
local provider_mod = require "luagent.model.provider"
local tools = require "luagent.agent.tools"
local replay = require "luagent.agent.replay"
local output = require "luagent.agent.output"
local add_usage = require("luagent.base.usage").add
local zero_usage = require("luagent.base.usage").zero

local M = {}

M.defaults = { max_turns = 20, max_parallel_tools = 4, loop_guard = 3 }

---What `luagent.agent{...}` takes. Only `model` is required.
---@class luagent.AgentOptions
---@field model string|luagent.Provider "kind/model" (`"openai/gpt-4o-mini"`) or a provider
---@field name string? shown in events, logs and traces (default "agent")
---@field system string? the system prompt
---@field tools luagent.ToolDef|luagent.ToolSet|(luagent.ToolDef|luagent.ToolSet)[]? a tool, a tool set, or a list of both
---@field policy string|table? the retry policy of its model calls: a name, a file or a table
---@field tool_policy table? how its tools are retried and bounded (a policy's `tool` section)
---@field max_turns integer? turns at most (default 20)
---@field max_parallel_tools integer? tool calls of one message run at once (default 4)
---@field loop_guard integer|false? stop when the same call comes this many times in a row (default 3)
---@field max_tokens integer? the answer's token limit, per model call
---@field temperature number? the sampling temperature
---@field messages luagent.Message[]? the conversation to start from
---@field durable boolean? journal its runs so `luagent resume` continues them
---@field max_cost number? refuse model calls once the agent has cost this many dollars
---@field output luagent.OutputOptions? structured output: the final answer is a JSON value of `output.schema`, checked and asked again (naming the wrong fields) at most `output.retries` times; the value is `agent_end.output`

---Structured output: the answer is a JSON value of `schema`, checked, and
---asked again (naming the wrong fields) when it does not match.
---@class luagent.OutputOptions
---@field schema table a JSON Schema with an object at its root (docs/guide/agent.md, "Structured output", lists the keywords checked)
---@field name string? its name in the request (letters, digits, `_`, `-`; default "output")
---@field retries integer? answers sent back for another try when one does not match (default 2)
---@field strict boolean? OpenAI's strict mode (default: on when the schema allows it: every object closed, every property required)

---The last event of a run (`agent:run` returns it).
---@class luagent.AgentEnd: luagent.Event
---@field stop_reason "stop"|"length"|"max_turns"|"loop_guard"|"aborted"|"error" why the run ended (docs/guide/agent.md, "How a run ends")
---@field output any? with an `output` option: the final answer decoded, matching its schema
---@field reason string? why, in words (max_turns, loop_guard)
---@field error luagent.Error? what failed, when stop_reason is "error"
---@field messages luagent.Message[] the history
---@field usage {input_tokens: integer, output_tokens: integer, cache_read_tokens: integer, cache_write_tokens: integer}? every model call's tokens, failed attempts included
---@field turns integer turns run
---@field cost {total: number?, calls: integer, attempts: integer, unpriced_calls: integer, currency: string}? when the cost meter is on

---An agent: a model, a system prompt, tools and a conversation.
---@class luagent.Agent
---@field name string its name (the `name` option)
---@field id string its own id, `name-xxxxxxxx`
---@field provider luagent.Provider the model it calls
---@field system string? its system prompt
---@field messages luagent.Message[] the conversation, provider-neutral
---@field running boolean true while a run goes on
---@field output luagent.OutputOptions? its structured output, completed with the defaults
local Agent = {}
Agent.__index = Agent
Agent.__name = "luagent.Agent"
M.Agent = Agent

local signal = queue.signal

------------------------------------------------------------------------------
-- Creating an agent
------------------------------------------------------------------------------

local function positive_int(v, name, default)
  if v == nil then return default end
  if math.type(v) ~= "integer" or v < 1 then error("agent: " .. name .. " must be an integer >= 1", 3) end
  return v
end

-- The tool sources of `spec`: a list of tools and tool sets (mixed), one
-- set, one tool, or nil. Plain tools become one static set.
local function tool_sources(spec)
  if spec == nil then return {} end
  if tools.is_set(spec) then return { spec } end
  if type(spec) ~= "table" then error("agent: tools must be a list of tools and tool sets, or a tool set", 3) end
  if getmetatable(spec) == tools.Tool or spec.name then spec = { spec } end
  local sources, plain = {}, {}
  for _, item in ipairs(spec) do
    if tools.is_set(item) then sources[#sources + 1] = item else plain[#plain + 1] = item end
  end
  if #plain > 0 then table.insert(sources, 1, tools.static(plain)) end
  return sources
end

-- new(rt, {name=, model=, system=, tools=, policy=, tool_policy=, max_turns=,
-- max_parallel_tools=, loop_guard=, max_tokens=, temperature=, messages=,
-- durable=, max_cost=, output=}) -> an agent of runtime rt (lua/luagent/runtime.lua). `model` is "kind/model" or a provider.
-- durable = true journals its runs (agent/journal, agent/replay.lua); nil
-- follows `luagent run --durable`. Raises on misuse.
function M.new(rt, opts)
  if type(opts) ~= "table" then error("agent: expects a table", 2) end
  if opts.model == nil then error("agent: model is required", 2) end
  local tool_policy
  if opts.tool_policy ~= nil then
    local err
    tool_policy, err = policies.check_tool_section(opts.tool_policy, "agent tool_policy")
    if not tool_policy then error(err, 2) end
  end
  local loop_guard = opts.loop_guard
  if loop_guard ~= false then loop_guard = positive_int(loop_guard, "loop_guard", M.defaults.loop_guard) end
  local name = opts.name or "agent"
  if type(name) ~= "string" then error("agent: name must be a string", 2) end
  if opts.durable ~= nil and type(opts.durable) ~= "boolean" then error("agent: durable must be true or false", 2) end
  local max_cost = opts.max_cost
  if max_cost ~= nil and not (type(max_cost) == "number" and max_cost >= 0 and max_cost < math.huge) then
    error("agent: max_cost must be a number >= 0 (a cost in the price table's currency)", 2)
  end
  local out = opts.output ~= nil and output.check(opts.output, "agent", 2) or nil
  -- after the checks of the options: a provider without a key raises too
  local provider = opts.model
  if getmetatable(provider) ~= provider_mod.Provider then provider = provider_mod.new(rt, provider) end
  if max_cost then rt:meter("cost") end -- the meter that holds the cap
  local self = setmetatable({
    rt = rt,
    name = name,
    id = string.format("%s-%08x", name, math.random(0, 0x7fffffff)),
    provider = provider,
    system = opts.system,
    policy = opts.policy,
    tool_policy = tool_policy,
    max_turns = positive_int(opts.max_turns, "max_turns", M.defaults.max_turns),
    max_parallel_tools = positive_int(opts.max_parallel_tools, "max_parallel_tools", M.defaults.max_parallel_tools),
    loop_guard = loop_guard,
    max_tokens = opts.max_tokens,
    temperature = opts.temperature,
    max_cost = max_cost,
    messages = opts.messages or {},
    sources = tool_sources(opts.tools),
    cursors = {},
    flagged = setmetatable({}, { __mode = "k" }), -- an MCP tool -> its copy with the flags this agent's trust gives
    rng = core.backoff_rng(math.random(0, 2 ^ 31)),
    running = false,
    durable = opts.durable,
    output = out,
  }, Agent)
  -- the runtime's own tool set (`luagent run --tools DIR`) comes after the
  -- agent's, unless the agent was given it
  local extra = rt.settings:get("tools")
  if extra then
    local given = false
    for _, s in ipairs(self.sources) do if s == extra then given = true end end
    if not given then self.sources[#self.sources + 1] = extra end
  end
  self:note_unflagged()
  return self
end

-- The tool as this agent runs it: an MCP tool's flags follow the agent's
-- tool section too (its trust_hints and overrides, laid over the set's),
-- so a copy carries them when they differ; any other tool as it is.
function Agent:as_run(t, policy)
  if not t.mcp then return t end
  local ro, idem = tools.mcp_flags(t, policy)
  if ro == t.read_only and idem == t.idempotent then return t end
  local c = self.flagged[t]
  if not (c and c.read_only == ro and c.idempotent == idem) then
    c = {}
    for k, v in pairs(t) do c[k] = v end
    c.read_only, c.idempotent = ro, idem
    c = setmetatable(c, getmetatable(t))
    self.flagged[t] = c
  end
  return c
end

-- Says once per tool (the runtime keeps which it said) what a timeout of
-- each tool of this agent with neither read_only nor idempotent does; an
-- MCP server's such tools in one line.
function Agent:note_unflagged()
  local policy = self:current_tool_policy()
  local noted, servers, order = self.rt.noted, {}, {}
  for _, src in ipairs(self.sources) do
    local snap = src:snapshot()
    for _, name in ipairs(snap.names) do
      local t = snap.tools[name]
      if tools.first_note(noted, t) then
        local r = self:as_run(t, policy)
        if t.mcp and not (r.read_only or r.idempotent) then
          local server = t.mcp.server
          if not servers[server] then servers[server] = {} order[#order + 1] = server end
          table.insert(servers[server], t.name)
        elseif not t.mcp then
          local line = tools.unflagged_note(r, policy.timeout)
          if line then self.rt.diag:write("note", line) end
        end
      end
    end
  end
  for _, server in ipairs(order) do
    local names = servers[server]
    self.rt.diag:write("note", string.format("luagent: %d tool(s) of the MCP server %s have neither read_only nor "
      .. "idempotent (%s): a timeout of %s s will stop the run with outcome_unknown (trust_hints or overrides in "
      .. "the tool policy give them flags)", #names, server, table.concat(names, ", "),
      string.format("%.3g", policy.timeout)))
  end
end

-- The tool section in force: the agent's tool_policy, else the `tool`
-- section of its retry policy (a name, file, table, or the default).
function Agent:current_tool_policy()
  return tools.section_in_force(self.tool_policy, self.policy, self.rt.policies)
end

------------------------------------------------------------------------------
-- One run
------------------------------------------------------------------------------

-- The tools of this turn: a snapshot of every source (the first source
-- naming a tool wins), after emitting what changed in them since the last
-- turn. Returns {tools={name=tool}, specs={...}}.
function Agent:toolbox(emit)
  local box, specs = {}, {}
  local policy = self:current_tool_policy()
  for _, src in ipairs(self.sources) do
    local evs, cursor = src:events_since(self.cursors[src])
    self.cursors[src] = cursor
    for _, e in ipairs(evs) do
      local copy = {}
      for k, v in pairs(e) do copy[k] = v end
      emit(copy)
    end
    local snap = src:snapshot()
    for _, name in ipairs(snap.names) do
      if not box[name] then
        box[name] = self:as_run(snap.tools[name], policy)
        specs[#specs + 1] = tools.spec(snap.tools[name])
      end
    end
  end
  return { tools = box, specs = specs }
end

-- The loop guard's key of a call: its name and canonical arguments.
local function call_key(call)
  local args = call.arguments and json.encode(call.arguments) or tostring(call.raw_arguments)
  return call.name .. "\0" .. args
end

-- Checks the turn's calls against the loop guard; returns a reason when
-- the same call with the same arguments came loop_guard times in a row.
function Agent:check_loop(calls)
  if not self.loop_guard then return nil end
  local s = self.streak
  for _, call in ipairs(calls) do
    local key = call_key(call)
    if key == s.key then s.count = s.count + 1 else s.key, s.count = key, 1 end
    if s.count >= self.loop_guard then
      return string.format("loop guard: %s called %d times in a row with the same arguments %s",
        call.name, s.count, call.raw_arguments or json.encode(call.arguments or {}))
    end
  end
  return nil
end

-- The result of a call whose outcome is unknown (`err`, kind
-- outcome_unknown or a journal failure): it stops the run.
local function unknown_outcome(err)
  return { is_error = true, unknown = true, error = err, content = err.message, attempts = 0, duration = 0 }
end

-- An error result for a call that did not run.
local function not_run(call, why)
  return { is_error = true, content = why, attempts = 0, duration = 0,
    error = errors.new("tool_error", why) }
end

-- Runs call i of a turn's message (its events included); returns its
-- outcome. The replay answers first: a durable agent's finished call is
-- replayed (events marked replayed), an unfinished one is re-run, checked
-- or reported as outcome_unknown (agent/replay.lua).
function Agent:run_call(box, call, i, emit, policy, turn)
  local tool = box.tools[call.name]
  local ctx = { agent = self.name, policy = policy, emit = emit, rng = self.rng,
    idempotency_key = self.replay:idempotency_key(self, call, turn, i), aborted = function() return self.aborted end }
  local function ev_end(outcome, mark)
    local e = { type = "tool_execution_end", call_id = call.id, name = call.name, index = i,
                result = not outcome.is_error and outcome.content or nil,
                error = outcome.is_error and outcome.error or nil,
                attempts = outcome.attempts, duration = outcome.duration }
    if mark then e[mark] = true end
    return e
  end
  local known, jerr = self.replay:call(turn, i, call, tool, ctx)
  if jerr then return unknown_outcome(jerr) end
  local mark = known and known.mark
  local start = { type = "tool_execution_start", call_id = call.id, name = call.name, arguments = call.arguments,
                  raw_arguments = call.raw_arguments, index = i }
  if mark then start[mark] = true end
  emit(start)
  local outcome
  if known then
    outcome = known.outcome or unknown_outcome(known.unknown)
  elseif self.replay:failed() then -- the write-ahead failed: the call does not run
    outcome = unknown_outcome(self.replay:failed())
  elseif not tool then
    local names = {}
    for k in pairs(box.tools) do names[#names + 1] = k end
    table.sort(names)
    local e = errors.new("unknown_tool", string.format("unknown tool '%s' (available: %s)",
      tostring(call.name), #names > 0 and table.concat(names, ", ") or "none"))
    outcome = { is_error = true, error = e, content = e.message, attempts = 0, duration = 0 }
  else
    outcome = tools.execute(tool, call, ctx)
  end
  local e = ev_end(outcome, mark)
  if known and known.resolved then e.resolved = true end
  emit(e)
  return outcome
end

-- Runs the tool calls of one message: at most max_parallel_tools at once,
-- results in the calls' order. Returns the outcomes.
function Agent:run_tools(box, calls, emit, policy, turn)
  local n, results, next_i = #calls, {}, 0
  local halted -- an unknown outcome stops the run: calls not started stay so
  local function worker()
    while true do
      next_i = next_i + 1
      local i = next_i
      if i > n then return end
      local call = calls[i]
      if self.aborted then
        results[i] = not_run(call, "not run: the agent was aborted")
      elseif halted then
        results[i] = not_run(call, "not run: the run stops because the outcome of " .. halted .. " is unknown")
      else
        local outcome = self:run_call(box, call, i, emit, policy, turn)
        results[i] = outcome
        if outcome.unknown then halted = halted or (call.name .. " (call " .. tostring(call.id) .. ")") end
      end
    end
  end
  local workers = {}
  for w = 1, math.min(self.max_parallel_tools, n) do workers[w] = core.spawn(worker) end
  for _, w in ipairs(workers) do
    local ok, err = pcall(w.join, w)
    if not ok then
      if not errors.is_cancel(err) then error(err, 0) end
      -- this run was aborted: stop every running tool, then collect
      self.aborted = self.aborted or err.reason or "aborted"
      for _, x in ipairs(workers) do x:cancel(self.aborted) end
      for _, x in ipairs(workers) do pcall(x.join, x) end
      break
    end
  end
  for i = 1, n do
    results[i] = results[i] or not_run(calls[i], "not run: the agent was aborted")
  end
  return results
end

-- Makes `list` the history, in place (agent.messages stays the table its
-- caller holds): the messages a context overflow was compacted to are the
-- conversation from then on, so the next turn does not overflow again.
function Agent:adopt_history(list)
  local h = self.messages
  for i = 1, math.max(#h, #list) do h[i] = list[i] end
end

-- The body of a run (in the agent's task): turns until a stop reason.
-- `emit` tells an event of the agent's own; `deliver` hands one of its
-- model calls' (already recorded and on the bus) to the caller.
function Agent:run_turns(emit, deliver)
  -- zeros until a call reports usage: a run whose first call failed has
  -- used nothing, which is not "unknown"
  local usage, turns, stop, err, reason = zero_usage(), 0, nil, nil, nil
  local value, retried = nil, 0 -- structured output: the decoded answer; answers sent back
  self.run_usage = usage -- (summed in place: a run cancelled mid-turn still reports it)
  local r, jerr = replay.begin(self)
  self.replay = r or replay.live
  -- the call layer shows each event to the journal before the bus
  local function record(ev) self.replay:record(ev) end
  emit { type = "agent_start", history = #self.messages, run_id = self.replay.run_id, resumed = self.replay.resumed }
  if jerr then
    emit { type = "agent_end", messages = self.messages, stop_reason = "error", error = jerr, usage = usage, turns = 0 }
    return
  end
  while true do
    if self.aborted then stop = "aborted" break end
    local box = self:toolbox(emit)
    if turns >= self.max_turns then
      stop, reason = "max_turns", "max_turns (" .. self.max_turns .. ") reached"
      break
    end
    turns = turns + 1
    emit { type = "turn_start", turn = turns }
    -- a turn that ends without a message or tool results
    local function end_empty_turn() emit { type = "turn_end", turn = turns, tool_results = json.array() } end
    local final, ok, cerr
    local partial -- the message of the call's last failed or aborted attempt, if it had one
    -- a turn whose call failed or was aborted (`why`): what the model had
    -- said is its message and stays in history, marked incomplete with the
    -- turn's outcome (yoagent keeps the aborted message too), when it holds
    -- text the next request can send. A copy: the event keeps its own.
    local function end_failed_turn(why)
      local msg
      if partial and type(partial.content) == "string" and partial.content:find("%S") then
        msg = {}
        for k, v in pairs(partial) do msg[k] = v end
        msg.stop_reason = why
        self.messages[#self.messages + 1] = msg
      end
      emit { type = "turn_end", turn = turns, message = msg, tool_results = json.array() }
    end
    final, cerr = self.replay:turn(self, turns, emit) -- answered from the journal: no request
    if cerr then
      err, stop = cerr, "error"
      end_empty_turn()
      break
    end
    if final then ok = true
    else ok, cerr = pcall(function()
      for ev in retry.stream(self.rt, { model = self.provider, system = self.system, messages = self.messages,
                               tools = box.specs, policy = self.policy, max_tokens = self.max_tokens,
                               temperature = self.temperature, agent = self.name, agent_id = self.id,
                               max_cost = self.max_cost, output = self.output, before_publish = record }) do
        deliver(ev)
        local t = ev.type
        if t == "context_compacted" then
          self:adopt_history(ev.messages)
        elseif t == "message_end" then
          if ev.final then final = ev end
          if ev.message and ev.message.incomplete then partial = ev.message end
        end
      end
    end) end
    if ok and self.replay:failed() then
      err, stop = self.replay:failed(), "error"
      end_empty_turn()
      break
    end
    if not ok then
      if not errors.is_cancel(cerr) then error(cerr, 0) end
      self.aborted = self.aborted or cerr.reason or "aborted"
      end_failed_turn("aborted")
      stop = "aborted"
      break
    end
    if final then usage = add_usage(usage, final.total_usage) end
    if not final or final.stop_reason == "error" or final.stop_reason == "aborted" then
      err = final and final.error or errors.new("truncated", "the model call ended without an answer")
      stop = final and final.stop_reason == "aborted" and "aborted" or "error"
      end_failed_turn(stop)
      break
    end
    local msg = final.message
    self.messages[#self.messages + 1] = msg
    local calls = msg.tool_calls or {}
    if #calls == 0 then
      emit { type = "turn_end", turn = turns, message = msg, tool_results = json.array() }
      stop = final.stop_reason == "length" and "length" or "stop"
      if not self.output then break end
      -- structured output: the answer decoded and checked; one that does
      -- not match is sent back naming what is wrong, at most `retries`
      -- times (an answer cut at its token limit is not: stop_reason says so)
      local errs
      value, errs = output.read(self.output, msg)
      if value ~= nil or stop == "length" then break end
      if retried >= self.output.retries then
        stop, err = "error", output.failure(errs, msg.content, retried + 1)
        break
      end
      retried = retried + 1
      local text = output.retry_text(errs)
      emit(output.retry_event(self.output, retried, errs, text))
      self.messages[#self.messages + 1] = { role = "user", content = text }
    else
      local guard = self:check_loop(calls)
      local results
      if guard then
        results = {}
        for i, c in ipairs(calls) do results[i] = not_run(c, "not run: " .. guard) end
      else
        results = self:run_tools(box, calls, emit, self:current_tool_policy(), turns)
      end
      local tool_msgs, unknown = {}, nil
      for i, c in ipairs(calls) do
        local o = results[i]
        tool_msgs[i] = { role = "tool", tool_call_id = c.id, name = c.name, content = o.content or "",
                         is_error = o.is_error or false }
        self.messages[#self.messages + 1] = tool_msgs[i]
        if o.unknown and not unknown then unknown = o.error end
      end
      emit { type = "turn_end", turn = turns, message = msg, tool_results = tool_msgs }
      if guard then stop, reason = "loop_guard", guard break end
      if self.aborted then stop = "aborted" break end
      if unknown then stop, err = "error", unknown break end
    end
  end
  if stop == "aborted" then reason = reason or ("aborted: " .. tostring(self.aborted)) end
  emit { type = "agent_end", messages = self.messages, stop_reason = stop, reason = reason,
         error = err, usage = usage, turns = turns, output = value }
end

-- Starts a run; returns the iterator of its events (and a closing value
-- that aborts the run when the loop is left early).
function Agent:start()
  if self.running then error("agent: already running (one prompt at a time)", 3) end
  self.running, self.aborted, self.replay, self.run_usage = true, nil, replay.live, nil
  local running = self.rt.agents -- the runtime aborts and joins it when it closes
  running[self] = true
  local q, sig, finished = queue.new(), signal(), false
  local function deliver(ev) -- to the caller's iterator
    q:push(ev)
    sig.notify()
  end
  -- the journal sees each event first: a step is committed before anyone
  -- is told of it (a tool's start before the tool runs, a turn before its
  -- message_end); then the bus, then the caller
  local function emit(ev)
    ev.agent, ev.agent_id = self.name, self.id
    self.replay:record(ev)
    self.rt.bus:publish(ev)
    deliver(ev)
  end
  local failure -- a programming error in the run (a bug, a misused API)
  self.streak = { key = nil, count = 0 }
  self.task = core.spawn(function()
    local ok, err = pcall(self.run_turns, self, emit, deliver)
    if not ok then
      if errors.is_cancel(err) then
        emit { type = "agent_end", messages = self.messages, stop_reason = "aborted", error = err,
               usage = self.run_usage or zero_usage(), turns = 0 }
      else
        failure = err
      end
    end
    self.running, finished = false, true
    running[self] = nil
    sig.notify()
  end)
  -- the iterator raises a programming error of the run once its events are out
  local iter = function()
    while true do
      local ev = q:pop()
      if ev then return ev end
      if finished then
        if failure then
          local e = failure
          failure = nil
          error(e, 0)
        end
        return nil
      end
      sig.wait()
    end
  end
  local closer = setmetatable({}, { __close = function()
    if not finished then self:abort("the caller stopped reading events") end
  end })
  -- the runtime's filters (--retry-safe) see what the caller is handed
  for _, f in ipairs(self.rt.event_filters or {}) do iter = f(iter) end
  return iter, nil, nil, closer
end

-- agent:prompt(text) -> iterator of events: adds a user message, runs.
---Adds a user message and runs: returns an iterator over the run's events
---(the run goes on as they are read; leaving the loop early aborts it).
---One prompt at a time: a second while it runs raises.
---@param text string
---@return fun(): luagent.Event? iterator
function Agent:prompt(text)
  if type(text) ~= "string" then error("agent:prompt: expects a string", 2) end
  if self.running then error("agent: already running (one prompt at a time)", 2) end
  self.messages[#self.messages + 1] = { role = "user", content = text }
  return self:start()
end

-- agent:continue() -> iterator of events: another run on the history as it is.
---Runs again on the history as it is (after an abort or a failure).
---@return fun(): luagent.Event? iterator
function Agent:continue()
  return self:start()
end

-- agent:abort([reason]): stops the run: the model call in flight or the
-- backoff ends, running tools are cancelled (children killed), calls not
-- yet started get an error result; agent_end says "aborted".
---Stops the run: the model call or its backoff ends, running tools are
---cancelled, `agent_end` says "aborted".
---@param reason? string
---@return boolean stopped false when no run was going on
function Agent:abort(reason)
  if not self.running then return false end
  self.aborted = self.aborted or reason or "aborted"
  if self.task then self.task:cancel(self.aborted) end
  return true
end

-- agent:run(text) -> the agent_end event of a whole run (draining events),
-- and its structured output (agent_end.output).
---Runs a prompt to its end (or, without text, continues) and returns its
---last event and, with an `output` option, the decoded answer.
---@param text? string
---@return luagent.AgentEnd
---@return any output `agent_end.output`: the answer matching the output schema, or nil
function Agent:run(text)
  local last
  for ev in (text and self:prompt(text) or self:continue()) do last = ev end
  return last, last and last.output
end

return M
