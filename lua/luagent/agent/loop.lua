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
local sandbox = require "luagent.base.sandbox"
local parts = require "luagent.model.providers.common" -- check_parts: a prompt's content parts
local replay = require "luagent.agent.replay"
local output = require "luagent.agent.output"
local add_usage = require("luagent.base.usage").add
local zero_usage = require("luagent.base.usage").zero
local options = require "luagent.base.options"
local session = require "luagent.agent.session"

local M = {}

M.defaults = { max_turns = 20, max_parallel_tools = 4, loop_guard = 3 }

-- The options `luagent.agent{...}` takes (M.new reads them; the class
-- below documents them): any other key raises, naming the nearest. A new
-- option is added here.
M.OPTIONS = options.known { "model", "name", "system", "tools", "policy", "tool_policy", "max_turns",
  "max_parallel_tools", "loop_guard", "max_tokens", "temperature", "messages", "durable", "max_cost", "guard",
  "cache", "thinking", "reasoning", "extra_body", "fallback", "output", "session", "handoffs" }

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
---@field session string? a thread's name: the conversation is loaded from the journal at the first prompt and saved after every turn, so another process continues it (`luagent runs threads`)
---@field max_cost number? refuse model calls once the agent has cost this many dollars
---@field guard luagent.Guard|luagent.Guard[]? guardrails: checks of what is sent and what is answered (docs/guide/agent.md, "Guardrails")
---@field cache boolean|{ttl: string}? Anthropic: cache_control on the system prompt, the tool list and the last user turn
---@field thinking {budget_tokens: integer?, type: string?}? Anthropic: extended thinking with this budget (or `type = "adaptive"`); OpenRouter: reasoning.max_tokens
---@field reasoning {effort: string, summary: string?}? OpenAI: reasoning_effort (chat), reasoning.effort (responses); OpenRouter: reasoning.effort
---@field extra_body table? merged into every request body, over what luagent built (objects deep, anything else replaced; `luagent.json.null` removes a key)
---@field fallback (string|luagent.ProviderSpec|luagent.Provider)[]? models each call goes on with, in order, when it fails for good on the one before (docs/guide/agent.md, "Fallback models")
---@field output luagent.OutputOptions? structured output: the final answer is a JSON value of `output.schema`, checked and asked again (naming the wrong fields) at most `output.retries` times; the value is `agent_end.output`
---@field handoffs luagent.Agent[]? agents it may hand the rest of a run to: a tool `transfer_to_<name>` per target; calling it hands the run over, the history kept, after a `handoff {from, to}` event (docs/guide/agent.md, "Handoffs")

---A content part of a user message (a provider-neutral shape each wire format renders).
---@class luagent.Part
---@field type "text"|"image"|"file"
---@field text string? a text part's text
---@field url string? an image or file by URL
---@field data string? an image or file as base64 data (with mime)
---@field mime string? the data's media type: "image/png", "application/pdf", ...
---@field name string? a file's name
---@field detail string? an image's detail (OpenAI: "low", "high", "auto")

---A guardrail (`guard` of an agent). Each function runs in the sandbox
---under the policy hooks' bounds, on a copy; only `true` lets the step through.
---@class luagent.Guard
---@field input (fun(messages: luagent.Message[], ctx: {agent: string, turn: integer}): boolean?, string?)? sees the messages before each model call is sent
---@field output (fun(message: luagent.Message, ctx: {agent: string, turn: integer}): boolean?, string?)? sees the model's message before it is accepted (before history and its tool calls)
---@field name string? named in the stop's reason and in a failure

---Structured output: the answer is a JSON value of `schema`, checked, and
---asked again (naming the wrong fields) when it does not match.
---@class luagent.OutputOptions
---@field schema table a JSON Schema with an object at its root (docs/guide/agent.md, "Structured output", lists the keywords checked)
---@field name string? its name in the request (letters, digits, `_`, `-`; default "output")
---@field retries integer? answers sent back for another try when one does not match (default 2)
---@field strict boolean? OpenAI's strict mode (default: on when the schema allows it: every object closed, every property required)

---The last event of a run (`agent:run` returns it).
---@class luagent.AgentEnd: luagent.Event
---@field stop_reason "stop"|"length"|"max_turns"|"loop_guard"|"guardrail"|"aborted"|"error"|"approval_required" why the run ended (docs/guide/agent.md, "How a run ends")
---@field output any? with an `output` option: the final answer decoded, matching its schema
---@field reason string? why, in words (max_turns, loop_guard, guardrail, approval_required)
---@field guard "input"|"output"? which guard stopped the run (guardrail)
---@field approvals luagent.ApprovalRequest[]? the calls that wait for a decision, when stop_reason is "approval_required"
---@field error luagent.Error? what failed, when stop_reason is "error"
---@field messages luagent.Message[] the history
---@field usage {input_tokens: integer, output_tokens: integer, cache_read_tokens: integer, cache_write_tokens: integer}? every model call's tokens, failed attempts included
---@field turns integer turns run
---@field cost {total: number?, calls: integer, attempts: integer, unpriced_calls: integer, currency: string}? when the cost meter is on

---A tool call that waits for a human's decision (`approval_requested`,
---`agent_end.approvals`, `agent:pending_approvals()`).
---@class luagent.ApprovalRequest
---@field call_id string the model's id of the call: what `agent:approve` and `agent:deny` take
---@field approval_id string stable across resumes (the call's idempotency key)
---@field name string the tool
---@field arguments table? the call's arguments
---@field index integer the call's place in its message, from 1

---An agent: a model, a system prompt, tools and a conversation.
---@class luagent.Agent
---@field name string its name (the `name` option)
---@field id string its own id, `name-xxxxxxxx`
---@field provider luagent.Provider the model it calls
---@field fallback luagent.Provider[]? the models a call falls back to, in order
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

-- The fields a guard table may have.
local GUARD_FIELDS = options.known { "input", "name", "output" }

-- The agent's guards as a list of {input=, output=, name=} (nil: none).
-- Raises on misuse, at the line that called luagent.agent (level 3: this
-- function's caller's caller).
local function checked_guards(spec)
  if spec == nil then return nil end
  if type(spec) ~= "table" then error("agent: guard must be a table {input =, output =, name =}", 3) end
  local list = spec[1] ~= nil and spec or { spec }
  local out = {}
  for i, g in ipairs(list) do
    local where = spec[1] ~= nil and ("guard[" .. i .. "]") or "guard"
    if type(g) ~= "table" then error("agent: " .. where .. " must be a table {input =, output =, name =}", 3) end
    options.check(g, GUARD_FIELDS, "agent: " .. where, 3)
    for _, f in ipairs { "input", "output" } do
      if g[f] ~= nil and type(g[f]) ~= "function" then error("agent: " .. where .. "." .. f .. " must be a function", 3) end
    end
    if g.name ~= nil and type(g.name) ~= "string" then error("agent: " .. where .. ".name must be a string", 3) end
    out[i] = { input = g.input, output = g.output, name = g.name }
  end
  return out
end

-- The transfer tools of `handoffs` (a list of agents): one per target,
-- `transfer_to_<name>`, marked with its target (the loop hands the run
-- over when one is called). Raises on misuse.
local function handoff_tools(list, level)
  if list == nil then return nil end
  if type(list) ~= "table" then error("agent: handoffs must be a list of agents", level) end
  local out, names = {}, {}
  for i, target in ipairs(list) do
    local mt = getmetatable(target)
    if type(mt) ~= "table" or mt.__name ~= Agent.__name then error("agent: handoffs[" .. i .. "] must be an agent (luagent.agent{...})", level) end
    local name = ("transfer_to_" .. target.name:gsub("[^A-Za-z0-9_-]", "_")):sub(1, 64)
    if names[name] then error("agent: handoffs[" .. i .. "]: two targets give the tool name '" .. name .. "'", level) end
    names[name] = true
    local t = tools.new { name = name, read_only = true, params = { type = "object", properties = {} },
      description = "Hands the conversation over to the agent " .. target.name .. ", which answers from then on",
      run = function() return "transferred to " .. target.name end }
    t.handoff = target
    out[#out + 1] = t
  end
  return #out > 0 and out or nil
end

-- new(rt, {name=, model=, system=, tools=, policy=, tool_policy=, max_turns=,
-- max_parallel_tools=, loop_guard=, max_tokens=, temperature=, messages=,
-- durable=, max_cost=, fallback=, output=}) -> an agent of runtime rt (lua/luagent/runtime.lua). `model` is "kind/model" or a provider;
-- `fallback`, the models its calls go on with (lua/luagent/model/call.lua).
-- durable = true journals its runs (agent/journal, agent/replay.lua); nil
-- follows `luagent run --durable`. Raises on misuse.
function M.new(rt, opts)
  if type(opts) ~= "table" then error("agent: expects a table", 2) end
  options.check(opts, M.OPTIONS, "agent")
  if opts.model == nil then error("agent: model is required", 2) end
  -- a policy table (or file, or name) given here is checked here, not at the first call
  if opts.policy ~= nil then rt.policies:resolve(opts.policy, 2, "agent") end
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
  local guards = checked_guards(opts.guard)
  local transfers = handoff_tools(opts.handoffs, 3)
  retry.check_knobs(opts, "agent", 2)
  if opts.durable ~= nil and type(opts.durable) ~= "boolean" then error("agent: durable must be true or false", 2) end
  session.check(opts.session, "agent", 2)
  local max_cost = opts.max_cost
  if max_cost ~= nil and not (type(max_cost) == "number" and max_cost >= 0 and max_cost < math.huge) then
    error("agent: max_cost must be a number >= 0 (a cost in the price table's currency)", 2)
  end
  local out = opts.output ~= nil and output.check(opts.output, "agent", 2) or nil
  -- after the checks of the options: a provider without a key raises too
  local provider = opts.model
  if getmetatable(provider) ~= provider_mod.Provider then provider = provider_mod.new(rt, provider) end
  local fallback = retry.fallback_models(rt, opts.fallback, "agent", 2)
  if max_cost then rt:meter("cost") end -- the meter that holds the cap
  local self = setmetatable({
    rt = rt,
    name = name,
    id = string.format("%s-%08x", name, math.random(0, 0x7fffffff)),
    provider = provider,
    fallback = fallback,
    system = opts.system,
    policy = opts.policy,
    tool_policy = tool_policy,
    max_turns = positive_int(opts.max_turns, "max_turns", M.defaults.max_turns),
    max_parallel_tools = positive_int(opts.max_parallel_tools, "max_parallel_tools", M.defaults.max_parallel_tools),
    loop_guard = loop_guard,
    max_tokens = opts.max_tokens,
    temperature = opts.temperature,
    max_cost = max_cost,
    guards = guards,
    cache = opts.cache, thinking = opts.thinking, reasoning = opts.reasoning, extra_body = opts.extra_body,
    messages = opts.messages or {},
    sources = tool_sources(opts.tools),
    transfers = transfers, -- the handoffs' transfer tools
    cursors = {},
    flagged = setmetatable({}, { __mode = "k" }), -- an MCP tool -> its copy with the flags this agent's trust gives
    rng = core.backoff_rng(math.random(0, 2 ^ 31)),
    running = false,
    durable = opts.durable,
    output = out,
    session = opts.session,
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
      if not t.subagent and tools.first_note(noted, t) then
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
  for _, t in ipairs(self.transfers or {}) do
    if not box[t.name] then
      box[t.name] = t
      specs[#specs + 1] = tools.spec(t)
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
function Agent:run_call(box, call, i, emit, policy, turn, decision)
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
  if decision then -- a human's decision, told (and journaled) before the tool starts
    emit { type = "approval_decided", call_id = call.id, approval_id = decision.approval_id, name = call.name,
           index = i, approved = decision.approved, reason = decision.reason, replayed = decision.replayed }
    if not decision.approved then -- the tool does not run: the model is told why
      local why = "denied: " .. (decision.reason or "no reason given")
      emit { type = "tool_execution_start", call_id = call.id, name = call.name, arguments = call.arguments,
             raw_arguments = call.raw_arguments, index = i, denied = true }
      local outcome = { is_error = true, content = why, attempts = 0, duration = 0,
        error = errors.new("tool_error", why, { denied = true }) }
      local e = ev_end(outcome)
      e.denied = true
      emit(e)
      return outcome
    end
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
  elseif tool.handoff then -- the loop hands the run over once the turn's calls are done
    local target = tool.handoff
    if target.running then
      local e = errors.new("tool_error", "cannot hand over to " .. target.name .. ": it is running (an agent of this run)")
      outcome = { is_error = true, error = e, content = e.message, attempts = 1, duration = 0 }
    else
      outcome = { content = "transferred to " .. target.name, attempts = 1, duration = 0 }
    end
  elseif tool.subagent then
    outcome = self:run_subagent(tool, call, i, emit, turn)
  else
    outcome = tools.execute(tool, call, ctx)
  end
  local e = ev_end(outcome, mark)
  if known and known.resolved then e.resolved = true end
  emit(e)
  return outcome
end

-- The text of the last assistant message of a history (a sub-agent's answer).
local function last_answer(messages)
  for k = #(messages or {}), 1, -1 do
    local m = messages[k]
    if m.role == "assistant" then
      if type(m.content) == "string" then return m.content end
      local out = {}
      for _, p in ipairs(type(m.content) == "table" and m.content or {}) do
        if p.type == "text" then out[#out + 1] = p.text end
      end
      return table.concat(out)
    end
  end
  return ""
end

-- Runs call i of a sub-agent tool (luagent.tools.agent): the child's own
-- run, in this task, on a copy of its history (each call starts from the
-- child's history as it is; the child keeps it unchanged), its agent_start
-- naming this call (its spans nest under the call's), its text told as
-- tool_execution_update, its tokens added to this run's. An abort of this
-- run aborts it (and waits for its end). A run that does not end with an
-- answer is an error result saying why. Returns the outcome.
-- Hands the rest of this run to `target` (a transfer tool of `handoffs`,
-- call i of turn `turn`, was called): a `handoff` event, then the
-- target's run on a copy of this history (its events handed to this run's
-- caller as they come: they are on the bus and in the journal already; a
-- durable run journals its steps under the transfer call's position),
-- whose history this agent adopts. Returns the target's agent_end (an
-- abort of this run aborts it: then an aborted end).
function Agent:hand_off(target, call, i, turn, emit, deliver)
  emit { type = "handoff", from = self.name, to = target.name, from_id = self.id, to_id = target.id,
         call_id = call.id }
  local history = {}
  for k, m in ipairs(self.messages) do history[k] = m end
  target.messages = history
  target.under = { agent = self.name, agent_id = self.id, call_id = call.id, index = i, turn = turn,
                   replay = self.replay, handoff = true }
  local last
  local ok, err = pcall(function()
    for ev in target:continue() do
      deliver(ev)
      last = ev
    end
  end)
  if not ok and errors.is_cancel(err) then
    target:abort(self.aborted or err.reason or "aborted")
    if target.task then pcall(target.task.join, target.task) end
  end
  target.under = nil
  if last and last.type == "agent_end" and type(last.messages) == "table" then self:adopt_history(last.messages) end
  if not ok then
    if not errors.is_cancel(err) then error(err, 0) end
    self.aborted = self.aborted or err.reason or "aborted"
    return { stop_reason = "aborted", usage = last and last.usage }
  end
  return last
end

function Agent:run_subagent(tool, call, i, emit, turn)
  local child = tool.subagent.agent
  local t0 = core.now()
  local function done(o)
    o.attempts, o.duration = o.attempts or 1, core.now() - t0
    if o.error and not o.content then o.content = o.error.message end
    return o
  end
  local function failed(kind, msg, extra)
    return done { is_error = true, error = errors.new(kind, msg, extra) }
  end
  if type(call.arguments) ~= "table" or call.error then
    return failed("invalid_arguments", "invalid arguments for " .. call.name .. ": "
      .. tostring(call.error or "not a JSON object"), nil)
  end
  local prompt = tools.subagent_prompt(tool, call.arguments, json.encode)
  if child.running then
    return failed("tool_error", "sub-agent " .. child.name .. " is already running (one call at a time)")
  end
  local base = child.messages
  local history = {}
  for k, m in ipairs(base) do history[k] = m end
  child.messages = history
  -- (a durable parent's replay: the child's steps go under this call's position)
  child.under = { agent = self.name, agent_id = self.id, call_id = call.id, index = i, turn = turn,
                  replay = self.replay }
  local last
  local ok, err = pcall(function()
    for ev in child:prompt(prompt) do
      if ev.type == "text_delta" and ev.text then
        emit { type = "tool_execution_update", call_id = call.id, name = call.name, index = i,
               data = { agent = child.name, delta = ev.text } }
      end
      last = ev
    end
  end)
  if not ok and errors.is_cancel(err) then
    -- this run was aborted: so is the child's, and its end is waited for
    child:abort(self.aborted or err.reason or "aborted")
    if child.task then pcall(child.task.join, child.task) end
  end
  child.under, child.messages = nil, base
  if last and last.type == "agent_end" and self.run_usage then add_usage(self.run_usage, last.usage) end
  if not ok then
    if not errors.is_cancel(err) then error(err, 0) end
    return done { is_error = true, cancelled = true, error = err,
      content = "sub-agent " .. child.name .. " was cancelled: " .. tostring(err.message or err) }
  end
  local stop = last and last.stop_reason
  if stop == "stop" or stop == "length" then return done { content = last_answer(last.messages) } end
  if stop == "error" then
    local e = last.error or {}
    return failed("tool_error", string.format("sub-agent %s stopped with an error: %s: %s", child.name,
      tostring(e.kind or "error"), tostring(e.message or e)), { agent = child.name, cause = last.error })
  end
  return failed("tool_error", string.format("sub-agent %s stopped without an answer: %s%s", child.name,
    tostring(stop), last and last.reason and (" (" .. last.reason .. ")") or ""), { agent = child.name })
end

-- Runs the tool calls of one message: at most max_parallel_tools at once,
-- results in the calls' order. Returns the outcomes.
function Agent:run_tools(box, calls, emit, policy, turn, preset, decisions)
  preset, decisions = preset or {}, decisions or {}
  local n, results, next_i = #calls, {}, 0
  local halted -- an unknown outcome stops the run: calls not started stay so
  local function worker()
    while true do
      next_i = next_i + 1
      local i = next_i
      if i > n then return end
      local call = calls[i]
      if preset[i] then
        results[i] = preset[i] -- known already, or waiting for a decision
      elseif self.aborted then
        results[i] = not_run(call, "not run: the agent was aborted")
      elseif halted then
        results[i] = not_run(call, "not run: the run stops because the outcome of " .. halted .. " is unknown")
      else
        local outcome = self:run_call(box, call, i, emit, policy, turn, decisions[i])
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

-- What run_tools is given for a call that waits for a human's decision.
local WAIT = setmetatable({}, { __name = "waiting for approval" })

-- The tool calls of a turn, approvals first: each call whose tool's
-- needs_approval says so (evaluated once per call; a durable run's journal
-- answers first, so a resume never asks a changed policy again) and that
-- has no decision gets an approval_requested and does not run; the
-- others run (a decided one after its approval_decided). `pending` is the
-- stopped turn a continue finishes (its results so far, the decisions
-- made). Returns the outcomes and the list of calls still waiting (nil
-- when none: the turn is done).
function Agent:tool_phase(box, calls, emit, turn, pending)
  local policy = self:current_tool_policy()
  local preset, decisions, waiting = {}, {}, nil
  local decided = pending and pending.decided or {}
  for i, call in ipairs(calls) do
    local done = pending and pending.results[i]
    if done and done ~= WAIT then
      preset[i] = done
    else
      local key = self.replay:idempotency_key(self, call, turn, i)
      local a, aerr = self.replay:approval(turn, i, call)
      local d = decided[call.id]
      if aerr then
        preset[i] = unknown_outcome(aerr)
      elseif a and a.settled then -- it went past its approval already: the replay answers
        preset[i] = nil
      elseif d then
        decisions[i] = { approved = d.approved, reason = d.reason, approval_id = key }
      elseif a and a.decision then -- decided from another process (`luagent runs approve`)
        decisions[i] = { approved = a.decision.approved, reason = a.decision.reason, approval_id = key,
          replayed = a.decision.replayed }
      else
        local need, nerr = true, nil
        if not (a and a.waiting) then
          need, nerr = tools.needs_approval(box.tools[call.name], call,
            { agent = self.name, policy = policy, idempotency_key = key })
        end
        if nerr then -- fails closed: the call does not run
          decisions[i] = { approved = false, approval_id = key,
            reason = "needs_approval failed: " .. tostring(nerr.message or nerr) }
        elseif need then
          local w = { call_id = call.id, approval_id = key, name = call.name, arguments = call.arguments, index = i }
          waiting = waiting or {}
          waiting[#waiting + 1] = w
          emit { type = "approval_requested", call_id = w.call_id, approval_id = key, name = w.name,
                 arguments = w.arguments, raw_arguments = call.raw_arguments, index = i,
                 replayed = a and a.waiting and true or nil }
          preset[i] = WAIT
        end
      end
    end
  end
  local results = self:run_tools(box, calls, emit, policy, turn, preset, decisions)
  if waiting then
    -- a run that stops for another reason (an unknown outcome, an abort)
    -- does not wait: its waiting calls did not run
    local halted
    for i = 1, #calls do
      if results[i] ~= WAIT and results[i].unknown then halted = calls[i] break end
    end
    if halted or self.aborted then
      for i = 1, #calls do
        if results[i] == WAIT then
          results[i] = not_run(calls[i], halted and ("not run: the run stops because the outcome of " .. halted.name
            .. " (call " .. tostring(halted.id) .. ") is unknown") or "not run: the agent was aborted")
        end
      end
      waiting = nil
    end
  end
  return results, waiting
end

-- Makes `list` the history, in place (agent.messages stays the table its
-- caller holds): the messages a context overflow was compacted to are the
-- conversation from then on, so the next turn does not overflow again.
function Agent:adopt_history(list)
  local h = self.messages
  for i = 1, math.max(#h, #list) do h[i] = list[i] end
  if self.session_state then self.session_state.compacted = true end -- the session is saved compacted
end

-- A deep copy of v for a guard: tables without metatables (json.null
-- and marked arrays become plain), strings whole (a guard must see all of
-- what it checks); functions and userdata left out. A guard cannot change
-- the history through it.
local function guard_copy(v, seen)
  if type(v) ~= "table" then
    local t = type(v)
    if t == "string" or t == "number" or t == "boolean" then return v end
    return nil
  end
  seen = seen or {}
  if seen[v] then return seen[v] end
  local c = {}
  seen[v] = c
  for k, x in next, v do
    if type(k) == "string" or type(k) == "number" then c[k] = guard_copy(x, seen) end
  end
  return c
end

-- Runs the agent's `which` guards ("input" on the messages about to be
-- sent, "output" on the model's message) in order, each in the sandbox
-- under the policy hooks' bounds. Returns nil when every one let it
-- through; else "guardrail" and the reason, or "error" and a guardrail
-- record (a guard that raised, passed a bound or tried to wait: the
-- step does not go through).
function Agent:check_guards(which, value, turn)
  for _, g in ipairs(self.guards or {}) do
    local fn = g[which]
    if fn then
      local label = which .. " guard" .. (g.name and (" '" .. g.name .. "'") or "")
      local ok, verdict, why = sandbox.call(fn, { guard_copy(value), { agent = self.name, turn = turn } }, {
        instructions = policies.limits.hook, wall = policies.limits.hook_wall, memory = policies.limits.memory,
        who = label })
      if not ok then
        local msg = label .. " failed: " .. tostring(verdict)
        self.rt.diag:write("warn", "luagent: " .. msg .. " (the run stops)")
        return "error", errors.new("guardrail", msg, { guard = which, name = g.name })
      end
      if verdict ~= true then
        why = why ~= nil and tostring(why) or "blocked"
        return "guardrail", label .. ": " .. why
      end
    end
  end
  return nil
end

-- The body of a run (in the agent's task): turns until a stop reason.
-- `emit` tells an event of the agent's own; `deliver` hands one of its
-- model calls' (already recorded and on the bus) to the caller.
function Agent:run_turns(emit, deliver)
  -- zeros until a call reports usage: a run whose first call failed has
  -- used nothing, which is not "unknown"
  local usage, turns, stop, err, reason = zero_usage(), 0, nil, nil, nil
  local guarded -- which guard stopped the run: "input" or "output"
  local value, retried = nil, 0 -- structured output: the decoded answer; answers sent back
  self.run_usage = usage -- (summed in place: a run cancelled mid-turn still reports it)
  local r, jerr = replay.begin(self)
  self.replay = r or replay.live
  -- the call layer shows each event to the journal before the bus
  local function record(ev) self.replay:record(ev) end
  local under = self.under -- the parent's call this run is a sub-agent's run of
  emit { type = "agent_start", history = #self.messages, run_id = self.replay.run_id, resumed = self.replay.resumed,
         parent_agent = under and under.agent, parent_agent_id = under and under.agent_id,
         parent_call_id = under and under.call_id, handoff = under and under.handoff or nil }
  jerr = jerr or self.session_error
  self.session_error = nil
  if jerr then
    emit { type = "agent_end", messages = self.messages, stop_reason = "error", error = jerr, usage = usage, turns = 0 }
    return
  end
  -- the tool calls of a turn's message (msg), then its end: true when the
  -- run stops there (stop, reason, err set)
  local function tools_of_turn(box, msg, calls, pending)
    local guard = not pending and self:check_loop(calls)
    local results, waiting
    if guard then
      results = {}
      for i, c in ipairs(calls) do results[i] = not_run(c, "not run: " .. guard) end
    else
      results, waiting = self:tool_phase(box, calls, emit, turns, pending)
    end
    if waiting then -- the turn stops here; agent:continue() finishes it
      self.approvals = { turn = turns, message = msg, calls = calls, results = results, waiting = waiting }
      local names = {}
      for k, w in ipairs(waiting) do names[k] = w.name .. " (call " .. tostring(w.call_id) .. ")" end
      stop, reason = "approval_required", "waiting for approval: " .. table.concat(names, ", ")
      return true
    end
    self.approvals = nil
    local tool_msgs, unknown = {}, nil
    for i, c in ipairs(calls) do
      local o = results[i]
      tool_msgs[i] = { role = "tool", tool_call_id = c.id, name = c.name, content = o.content or "",
                       is_error = o.is_error or false }
      self.messages[#self.messages + 1] = tool_msgs[i]
      if o.unknown and not unknown then unknown = o.error end
    end
    emit { type = "turn_end", turn = turns, message = msg, tool_results = tool_msgs }
    if guard then stop, reason = "loop_guard", guard return true end
    if self.aborted then stop = "aborted" return true end
    if unknown then stop, err = "error", unknown return true end
    -- a transfer tool called (its result no error): the rest of the run is the target's
    for i, c in ipairs(calls) do
      local t = box.tools[c.name]
      if t and t.handoff and not results[i].is_error then
        local e = self:hand_off(t.handoff, c, i, turns, emit, deliver)
        if e then
          usage = add_usage(usage, e.usage)
          stop, reason, err = e.stop_reason, e.reason, e.error
          return true
        end
      end
    end
    return false
  end
  local pending = self.approvals
  if pending then -- a continue after approvals: the stopped turn's calls first
    turns = pending.turn
    if tools_of_turn(self:toolbox(emit), pending.message, pending.calls, pending) then
      return self:end_run(emit, stop, reason, err, usage, turns)
    end
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
    if self.guards then
      local verdict, why = self:check_guards("input", self.messages, turns)
      if verdict then
        end_empty_turn()
        if verdict == "error" then err, stop = why, "error" else stop, reason, guarded = "guardrail", why, "input" end
        break
      end
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
                               max_cost = self.max_cost, cache = self.cache, thinking = self.thinking,
                               reasoning = self.reasoning, extra_body = self.extra_body, fallback = self.fallback,
                               output = self.output, before_publish = record }) do
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
    if self.guards then
      local verdict, why = self:check_guards("output", msg, turns)
      if verdict then
        end_empty_turn()
        if verdict == "error" then err, stop = why, "error" else stop, reason, guarded = "guardrail", why, "output" end
        break
      end
    end
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
    elseif tools_of_turn(box, msg, calls) then
      break
    end
  end
  self:end_run(emit, stop, reason, err, usage, turns, guarded, value)
end

-- The run's agent_end (`guarded`: "input" or "output", the guard that
-- stopped a guardrail run; `value`: structured output's decoded answer).
function Agent:end_run(emit, stop, reason, err, usage, turns, guarded, value)
  if stop == "aborted" then reason = reason or ("aborted: " .. tostring(self.aborted)) end
  local approvals
  if stop == "approval_required" then approvals = self:pending_approvals() end
  emit { type = "agent_end", messages = self.messages, stop_reason = stop, reason = reason, guard = guarded,
         error = err, usage = usage, turns = turns, approvals = approvals,
         output = value }
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
    if ev.type == "turn_end" and self.session then session.save(self) end -- a whole turn, before anyone is told
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

-- The first prompt of an agent with a session: its history becomes the
-- saved conversation. A journal that cannot be read ends the run that
-- follows with its error (agent_end, stop_reason "error").
function Agent:load_session()
  if not self.session or self.session_state then return end
  local ok, err = session.load(self)
  if not ok then self.session_error = err end
end

-- agent:prompt(text) -> iterator of events: adds a user message, runs.
---Adds a user message and runs: returns an iterator over the run's events
---(the run goes on as they are read; leaving the loop early aborts it).
---One prompt at a time: a second while it runs raises. The content is text
---or a list of parts (`{type = "text", text =}`, `{type = "image", url = | data =, mime =}`,
---`{type = "file", url = | data =, mime =, name =}`), which every wire format renders its way.
---@param text string|luagent.Part[]
---@return fun(): luagent.Event? iterator
function Agent:prompt(text)
  if type(text) == "table" then
    local ok, err = parts.check_parts(text, "content")
    if not ok then error("agent:prompt: " .. err, 2) end
  elseif type(text) ~= "string" then
    error("agent:prompt: expects a string or a list of content parts", 2)
  end
  if self.running then error("agent: already running (one prompt at a time)", 2) end
  if self.approvals then
    error(string.format("agent:prompt: %d tool call(s) wait for approval: agent:approve(call_id) or "
      .. "agent:deny(call_id, reason) each, then agent:continue()", #self.approvals.waiting), 2)
  end
  self:load_session()
  local content = text
  if type(text) == "table" then
    -- a copy (the list and each part): the caller's table may change later
    content = {}
    for i, part in ipairs(text) do
      local p = {}
      for k, v in pairs(part) do p[k] = v end
      content[i] = p
    end
  end
  self.messages[#self.messages + 1] = { role = "user", content = content }
  return self:start()
end

-- agent:continue() -> iterator of events: another run on the history as it is.
---Runs again on the history as it is (after an abort or a failure); after
---`approval_required`, once every waiting call is approved or denied: the
---stopped turn's calls run (a denied one's result is the error
---`denied: <reason>`), then the run goes on.
---@return fun(): luagent.Event? iterator
function Agent:continue()
  if self.running then error("agent: already running (one prompt at a time)", 2) end
  local left = self:pending_approvals()
  if #left > 0 then
    local names = {}
    for k, w in ipairs(left) do names[k] = tostring(w.call_id) .. " (" .. w.name .. ")" end
    error("agent:continue: tool call(s) still wait for approval: " .. table.concat(names, ", ")
      .. " (agent:approve(call_id) or agent:deny(call_id, reason) first)", 2)
  end
  self:load_session()
  return self:start()
end

---The tool calls that wait for a decision (none unless the last run
---stopped with `approval_required`), in call order, but for those already
---approved or denied.
---@return luagent.ApprovalRequest[]
function Agent:pending_approvals()
  local p, out = self.approvals, {}
  if not p then return out end
  local decided = p.decided or {}
  for _, w in ipairs(p.waiting) do
    if not decided[w.call_id] then
      out[#out + 1] = { call_id = w.call_id, approval_id = w.approval_id, name = w.name, arguments = w.arguments,
                        index = w.index }
    end
  end
  return out
end

-- Records a decision on a waiting call (approve, deny).
function Agent:decide(what, call_id, approved, reason)
  if self.running then error("agent:" .. what .. ": the agent is running (decide once it stopped with "
    .. "approval_required)", 3) end
  if reason ~= nil and type(reason) ~= "string" then error("agent:" .. what .. ": reason must be a string", 3) end
  local p = self.approvals
  local found
  for _, w in ipairs(p and p.waiting or {}) do
    if w.call_id == call_id then found = w end
  end
  if not found then
    local ids = {}
    for k, w in ipairs(p and p.waiting or {}) do ids[k] = tostring(w.call_id) end
    error(string.format("agent:%s: no tool call '%s' waits for approval (%s)", what, tostring(call_id),
      #ids > 0 and ("waiting: " .. table.concat(ids, ", ")) or "none waits"), 3)
  end
  p.decided = p.decided or {}
  p.decided[call_id] = { approved = approved, reason = reason }
  return true
end

---Approves a call that waits (`approval_requested`); `agent:continue()`
---then runs it. Raises for a call that does not wait, or while running.
---@param call_id string
---@param reason? string kept in `approval_decided`
---@return true
function Agent:approve(call_id, reason) return self:decide("approve", call_id, true, reason) end

---Denies a call that waits: it does not run, and the model gets its error
---result `denied: <reason>` when `agent:continue()` goes on.
---@param call_id string
---@param reason? string what the model is told (default "no reason given")
---@return true
function Agent:deny(call_id, reason) return self:decide("deny", call_id, false, reason) end

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
---@param text? string|luagent.Part[]
---@return luagent.AgentEnd
---@return any output `agent_end.output`: the answer matching the output schema, or nil
function Agent:run(text)
  local last
  for ev in (text and self:prompt(text) or self:continue()) do last = ev end
  return last, last and last.output
end

return M
