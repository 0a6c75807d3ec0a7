-- Replay: what a durable agent's steps are answered with when its run is
-- journaled (lua/luagent/agent/journal/init.lua), so that the agent loop
-- (lua/luagent/agent/loop.lua) asks one question at each step and reads as
-- the loop. Before a model turn, replay:turn emits the turn the journal
-- holds (marked replayed: EVENTS.md, "Durable runs") and no request is
-- made; before a tool call, replay:call answers it from the journal, from
-- the tool's check, or as outcome_unknown. Every event the agent publishes
-- goes through replay:record first, where the journal commits its steps:
-- a step is committed before the bus or the caller is told of it.
--
-- An agent that is not durable has the live replay (M.live): it answers
-- nothing and records nothing.
local tools = require "luagent.agent.tools"
local journal = require "luagent.agent.journal"

local M = {}

------------------------------------------------------------------------------
-- Live: nothing journaled
------------------------------------------------------------------------------

local Live = {}
Live.__index = Live

function Live.turn() return nil end
function Live.call() return nil end
function Live.approval() return nil end
function Live.record() end
function Live.failed() return nil end
function Live.call_position() return nil end

-- The idempotency key of a call: the agent's id and the call's id.
function Live.idempotency_key(_, agent, call) return agent.id .. ":" .. tostring(call.id) end

M.live = setmetatable({}, Live)

------------------------------------------------------------------------------
-- Durable: the agent's binding to its runtime's durable run
------------------------------------------------------------------------------

local Durable = {}
Durable.__index = Durable

-- begin(agent) -> the replay of a new run of the agent (a prompt or a
-- continue): M.live when the agent is not durable (durable = nil follows
-- its runtime's `durable` setting, `luagent run --durable`); nil, err when
-- the journal cannot be opened. The agent keeps its binding (agent.binder)
-- from run to run, so its steps keep their positions.
function M.begin(agent)
  -- a sub-agent's run under a durable parent's call (tools.agent): its
  -- steps are journaled under that call's position, a binding of its own
  -- per call (agent.binder, its runs of its own, stays as it was)
  local under = agent.under
  local parent = under and under.replay
  if parent and parent.binder then
    local binder = journal.bind_under(parent.binder, parent.binder:call_pos(under.turn, under.index), agent.name)
    binder:begin(false)
    return setmetatable({ binder = binder, run_id = binder.run.id, resumed = binder.run.resumed or nil }, Durable)
  end
  local durable = agent.durable
  if durable == nil then durable = agent.rt.settings:get("durable") or false end
  if not durable then return M.live end
  if not agent.binder then
    local b, err = journal.bind(agent)
    if not b then return nil, err end
    agent.binder = b
  end
  local binder = agent.binder
  -- a continue after approvals finishes the stopped turn: same positions
  binder:begin(agent.approvals ~= nil)
  return setmetatable({ binder = binder, run_id = binder.run.id, resumed = binder.run.resumed or nil }, Durable)
end

-- replay:record(ev): the journal sees the event (and writes the step it
-- ends) before anyone else does.
function Durable:record(ev) self.binder:observe(ev) end

-- replay:failed() -> the journal failure that stops the run (a write that
-- failed, the run's claim lost), or nil.
function Durable:failed() return self.binder.failed end

-- The idempotency key of call i of a turn: stable across resumes.
function Durable:idempotency_key(_, _, turn, i) return self.binder:idempotency_key(turn, i) end

-- replay:turn(agent, turn, emit) -> the final message_end of a turn the
-- journal answered (its events emitted: context_compacted when the live
-- turn compacted the history, which the agent adopts again, message_start,
-- message_end; all marked replayed) | nil (the turn goes live) | nil, err
-- (a divergence, a journal failure).
function Durable:turn(agent, turn, emit)
  local known, err = self.binder:turn(turn, agent.messages, agent.system)
  if not known then return nil, err end
  if known.compacted then -- the live turn's compaction, as it was
    local c = known.compacted
    emit { type = "context_compacted", replayed = true, attempt = c.attempt, before = #agent.messages,
           after = #c.messages, messages = c.messages }
    agent:adopt_history(c.messages)
  end
  emit { type = "message_start", replayed = true }
  local final = { type = "message_end", replayed = true, final = true, message = known.message, usage = known.usage,
                  total_usage = known.total_usage, attempts = known.attempts, stop_reason = known.stop_reason }
  emit(final)
  return final
end

-- replay:approval(turn, i, call) -> nil (nothing journaled: ask the
-- tool's needs_approval) | {waiting = true} (requested, not decided) |
-- {decision = {approved =, reason =, replayed = true}} (decided: `luagent
-- runs approve`/`deny`, or this run before it stopped) | {settled = true}
-- (past its approval: replay:call answers) | nil, err (a divergence).
function Durable:approval(turn, i, call) return self.binder:approval(turn, i, call) end

-- replay:call(turn, i, call, tool, ctx) -> nil (run it) | answer | nil, err
-- (a divergence, a journal failure: the call does not run). answer:
-- {outcome=} (from the journal, a resolution or the tool's check) or
-- {unknown=<outcome_unknown record>}; `mark` names the flag its events
-- carry ("replayed", "checked"), `resolved` that `luagent runs resolve`
-- gave its result.
function Durable:call(turn, i, call, tool, ctx)
  local known, err = self.binder:call(turn, i, call, tool, function(t, c) return tools.check_outcome(t, c, ctx) end)
  if not known then return nil, err end
  known.mark = known.checked and "checked" or (known.outcome and "replayed") or nil
  return known
end

return M
