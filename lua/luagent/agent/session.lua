-- Sessions: an agent made with `session = NAME` keeps its conversation in
-- the run journal (the threads table of agent/journal/sqlite.lua), so that
-- another process continues it. The history is loaded at the agent's first
-- prompt (or continue) and saved whole after every turn (at turn_end,
-- before the bus is told), in one statement: a crash mid-turn leaves the
-- last whole turn. A history compacted after a context overflow is saved
-- as it is, compacted (and the thread says so).
--
-- Two processes on one session at once: last writer wins, with a warning.
-- Each save replaces the whole conversation; a process whose save finds
-- the thread saved by someone else since it loaded (or last saved) it
-- warns, naming the session and the other process, and replaces it. A
-- claim (as durable runs have) would lock a second terminal out of a chat
-- until a crashed holder is found gone; a thread is never half written, so
-- what two writers can cost is the turns of one of them, which the
-- warning names.
local journal = require "luagent.agent.journal"
local owner = require "luagent.agent.journal.owner"
local bus = require "luagent.base.bus"

local M = {}

-- A session's name: a letter or digit, then letters, digits and . _ : @ -
-- (128 at most), so that it is one word in `luagent runs threads`.
M.PATTERN = "^[%w][%w%._:@%-]*$"
M.MAX = 128

-- check(name, where, level) -> name; raises naming it when it is not one.
function M.check(name, where, level)
  if name == nil then return nil end
  if type(name) ~= "string" then error(where .. ": session must be a string (a thread's name)", level + 1) end
  if #name > M.MAX or not name:find(M.PATTERN) then
    error(string.format("%s: session '%s' is not a valid name: a letter or digit, then letters, digits and "
      .. "'.', '_', ':', '@', '-' (at most %d)", where, name, M.MAX), level + 1)
  end
  return name
end

-- The store sessions of runtime rt use: its durable run's, else the journal
-- its settings name (the default journal: LUAGENT_HOME/runs.db, else
-- .luagent/runs.db), opened once and closed with the runtime.
local function store_of(rt)
  local j = rt.journal
  if j.run then return j.run.store end
  if j.session_store then return j.session_store end
  local settings = rt.settings
  local store, err = journal.open(settings:get("journal_file"), { home = settings:get("home") })
  if not store then return nil, err end
  j:own(store)
  j.session_store = store
  return store
end

-- load(agent) -> true | nil, err: the first time, the agent's history
-- becomes the saved conversation of its session (when there is one; else
-- the history it was given starts it).
function M.load(agent)
  if agent.session_state then return true end
  local store, err = store_of(agent.rt)
  if not store then return nil, err end
  local t
  t, err = store:thread(agent.session)
  if t == nil then return nil, err end
  local st = { store = store, version = 0, turns = 0 }
  if t then
    local h = agent.messages
    for i = #h, 1, -1 do h[i] = nil end
    for i, m in ipairs(t.messages) do h[i] = journal.restore_message(m) end
    st.version, st.turns, st.compacted = t.version, t.turns, t.compacted
  end
  agent.session_state = st
  return true
end

-- save(agent): the agent's history as its session's conversation, after a
-- turn. A save that fails is a warning (the conversation goes on in memory).
function M.save(agent)
  local st = agent.session_state
  if not st then return end
  local rt, name, store = agent.rt, agent.session, st.store
  local now = store:thread(name)
  local seen = now and now.version or 0
  if now ~= nil and seen ~= st.version then
    rt.diag:write("warn", string.format("luagent: session %s was saved by another process (%s) since this one "
      .. "loaded it; this save replaces it (last writer wins: the other's turns since are dropped)", name,
      now and ("pid " .. tostring(now.pid) .. " on " .. tostring(now.host)) or "it was deleted"))
  end
  local msgs = {}
  for i, m in ipairs(agent.messages) do msgs[i] = bus.plain(m) end
  local p = agent.provider
  local ok, err = store:save_thread(name, { messages = msgs, turns = st.turns + 1,
    model = p.kind and p.model and (p.kind .. "/" .. p.model) or nil, compacted = st.compacted,
    pid = journal.pid(), host = owner.host() })
  if not ok then
    rt.diag:write("warn", "luagent: " .. tostring(err))
    return
  end
  st.turns, st.version = st.turns + 1, (now and seen or 0) + 1
end

return M
