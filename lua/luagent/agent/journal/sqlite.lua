-- The run journal's SQLite store (the embedded default; see journal.lua
-- for the interface every store implements). One file, WAL mode, one
-- transaction per step: a step that was committed survives a kill -9 of
-- the process. Writes go through a writer thread (core.sqlite_writer): the
-- task that writes waits for its commit, the loop and every other task do
-- not; reads use the store's own connection. A file that is not a journal, or a damaged one, is reported
-- (error kind `journal`, `corrupt = true`) and left exactly as it is.
-- Opened to read only (`luagent runs`), the store writes nothing, so a
-- journal on a full disk or a read-only folder can still be listed.
local core = require "luagent.core"
local errors = require "luagent.base.errors"
local json = require "luagent.base.json"
local owner = require "luagent.agent.journal.owner"

local M = {}

local Store = {}
Store.__index = Store
Store.__name = "luagent.journal.SqliteStore"
M.Store = Store

-- The schema's version, in PRAGMA user_version. 1: runs and steps; 2: the
-- claims of runs (who runs each, since when, its last heartbeat); 3: the
-- threads of sessions (an agent's `session = NAME`: its conversation, saved
-- whole after every turn). Opening a
-- journal to write brings an older one up to this version (the tables it
-- lacks are created); a newer one is refused. Opened to read only, any
-- version up to this one is read as it is.
M.SCHEMA_VERSION = 3

local SCHEMA = [[
CREATE TABLE IF NOT EXISTS runs (
  id TEXT PRIMARY KEY,
  script TEXT, args TEXT, options TEXT, cwd TEXT, pid INTEGER,
  agents TEXT, status TEXT NOT NULL, error TEXT,
  started REAL NOT NULL, updated REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS steps (
  run_id TEXT NOT NULL, pos TEXT NOT NULL, seq INTEGER NOT NULL,
  kind TEXT NOT NULL, status TEXT NOT NULL, name TEXT, call_id TEXT,
  input_tokens INTEGER, output_tokens INTEGER, cost REAL,
  data TEXT, at REAL NOT NULL,
  PRIMARY KEY (run_id, pos)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS runs_started ON runs (started);
CREATE INDEX IF NOT EXISTS steps_order ON steps (run_id, seq);
CREATE TABLE IF NOT EXISTS claims (
  run_id TEXT PRIMARY KEY,
  pid INTEGER NOT NULL, host TEXT NOT NULL, pid_start TEXT,
  since REAL NOT NULL, heartbeat REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS threads (
  name TEXT PRIMARY KEY,
  messages TEXT NOT NULL, turns INTEGER NOT NULL, model TEXT, compacted INTEGER NOT NULL DEFAULT 0,
  version INTEGER NOT NULL, pid INTEGER, host TEXT, updated REAL NOT NULL
);
]]

-- SQL for the wall clock in seconds (with milliseconds).
local NOW = "((julianday('now') - 2440587.5) * 86400.0)"

-- A step's columns, its place after the run's last step, and how a step
-- at the same position replaces the earlier one.
local STEP_COLUMNS = "INSERT INTO steps (run_id, pos, seq, kind, status, name, call_id, input_tokens, output_tokens, "
  .. "cost, data, at) "
local STEP_VALUES = "?1, ?2, (SELECT coalesce(max(seq), 0) + 1 FROM steps WHERE run_id = ?1), ?3, ?4, ?5, ?6, ?7, ?8, "
  .. "?9, ?10, " .. NOW
local STEP_REPLACES = " ON CONFLICT (run_id, pos) DO UPDATE SET status = excluded.status, name = excluded.name, "
  .. "call_id = excluded.call_id, input_tokens = excluded.input_tokens, output_tokens = excluded.output_tokens, "
  .. "cost = excluded.cost, data = excluded.data, at = excluded.at"
local RUN_SET = "UPDATE runs SET status = coalesce(?1, status), error = ?2, agents = coalesce(?3, agents), "
  .. "pid = coalesce(?4, pid), updated = " .. NOW .. " WHERE id = ?5"

-- The claim of run ?R held by the process ?P, ?H, ?S (pid, host, pid_start).
local function claim_of(r, p, h, s)
  return string.format("run_id = ?%d AND pid IS ?%d AND host IS ?%d AND pid_start IS ?%d", r, p, h, s)
end

-- The condition of a write by the holder of a run's claim: it still holds it.
local function still_held(r, p, h, s)
  return "EXISTS (SELECT 1 FROM claims WHERE " .. claim_of(r, p, h, s) .. ")"
end

local SQL = {
  create = "INSERT INTO runs (id, script, args, options, cwd, pid, agents, status, started, updated) "
    .. "VALUES (?, ?, ?, ?, ?, ?, '', 'running', " .. NOW .. ", " .. NOW .. ")",
  upsert = STEP_COLUMNS .. "VALUES (" .. STEP_VALUES .. ")" .. STEP_REPLACES,
  upsert_held = STEP_COLUMNS .. "SELECT " .. STEP_VALUES .. " WHERE " .. still_held(1, 11, 12, 13) .. STEP_REPLACES,
  begin = "BEGIN IMMEDIATE", commit = "COMMIT", rollback = "ROLLBACK",
  update = RUN_SET,
  update_held = RUN_SET .. " AND " .. still_held(5, 6, 7, 8),
  -- the claim of a run, and how old its heartbeat is on the journal's clock
  claim = "SELECT pid, host, pid_start, since, heartbeat, " .. NOW .. " - heartbeat AS age FROM claims WHERE run_id = ?",
  -- takes the claim if it is still as seen (?5..?8; all nil: there was none)
  take = "INSERT INTO claims (run_id, pid, host, pid_start, since, heartbeat) VALUES (?1, ?2, ?3, ?4, " .. NOW .. ", "
    .. NOW .. ") ON CONFLICT (run_id) DO UPDATE SET pid = excluded.pid, host = excluded.host, "
    .. "pid_start = excluded.pid_start, since = excluded.since, heartbeat = excluded.heartbeat "
    .. "WHERE claims.pid IS ?5 AND claims.host IS ?6 AND claims.pid_start IS ?7 AND claims.heartbeat IS ?8",
  heartbeat = "UPDATE claims SET heartbeat = " .. NOW .. " WHERE " .. claim_of(1, 2, 3, 4),
  release = "DELETE FROM claims WHERE " .. claim_of(1, 2, 3, 4),
  runs_table = "SELECT count(*) AS n FROM sqlite_master WHERE type = 'table' AND name = 'runs'",
  threads_table = "SELECT count(*) AS n FROM sqlite_master WHERE type = 'table' AND name = 'threads'",
  -- sessions: one row per thread, replaced whole by each save (one statement:
  -- a crash leaves the last whole save)
  thread = "SELECT * FROM threads WHERE name = ?",
  thread_save = "INSERT INTO threads (name, messages, turns, model, compacted, version, pid, host, updated) "
    .. "VALUES (?1, ?2, ?3, ?4, ?5, 1, ?6, ?7, " .. NOW .. ") ON CONFLICT (name) DO UPDATE SET "
    .. "messages = excluded.messages, turns = excluded.turns, model = excluded.model, "
    .. "compacted = max(threads.compacted, excluded.compacted), version = threads.version + 1, "
    .. "pid = excluded.pid, host = excluded.host, updated = excluded.updated",
  threads = "SELECT name, turns, model, compacted, version, updated, json_array_length(messages) AS messages "
    .. "FROM threads ORDER BY updated DESC, name",
  thread_rm = "DELETE FROM threads WHERE name = ?",
  run = "SELECT * FROM runs WHERE id = ?",
  steps = "SELECT * FROM steps WHERE run_id = ? ORDER BY seq",
  list = "SELECT r.*, (SELECT count(*) FROM steps s WHERE s.run_id = r.id AND s.kind = 'turn') AS turns, "
    .. "(SELECT pos || ' ' || status FROM steps s WHERE s.run_id = r.id ORDER BY at DESC, seq DESC LIMIT 1) AS last_step, "
    .. "max(r.updated, coalesce((SELECT max(at) FROM steps s WHERE s.run_id = r.id), 0)) AS updated, "
    .. "(SELECT sum(input_tokens) FROM steps s WHERE s.run_id = r.id) AS input_tokens, "
    .. "(SELECT sum(output_tokens) FROM steps s WHERE s.run_id = r.id) AS output_tokens, "
    .. "(SELECT sum(cost) FROM steps s WHERE s.run_id = r.id) AS cost FROM runs r ORDER BY r.started, r.id",
  waiting_calls = "SELECT * FROM steps WHERE run_id = ? AND kind = 'call' AND status = 'waiting' ORDER BY seq",
  open_calls = "SELECT * FROM steps WHERE run_id = ? AND kind = 'call' AND status IN ('started', 'unknown') "
    .. "AND (call_id = ?2 OR pos = ?2) ORDER BY seq",
  -- runs whose last write (a step, or the run itself) is that old, and
  -- that no process runs now (a claim whose heartbeat is fresher than ?2)
  gc_old = "CREATE TEMP TABLE IF NOT EXISTS gc_ids (id TEXT); DELETE FROM gc_ids",
  gc_pick = "INSERT INTO gc_ids SELECT id FROM runs r WHERE max(r.updated, coalesce((SELECT max(at) FROM steps s "
    .. "WHERE s.run_id = r.id), 0)) <= " .. NOW .. " - ?1 AND NOT EXISTS (SELECT 1 FROM claims c "
    .. "WHERE c.run_id = r.id AND c.heartbeat > " .. NOW .. " - ?2)",
  gc_steps = "DELETE FROM steps WHERE run_id IN (SELECT id FROM gc_ids)",
  gc_runs = "DELETE FROM runs WHERE id IN (SELECT id FROM gc_ids)",
  gc_claims = "DELETE FROM claims WHERE run_id IN (SELECT id FROM gc_ids)",
  now = "SELECT " .. NOW .. " AS now",
}

-- Adds what a failed operation was doing to its record.
local function fail(err, what)
  if errors.is(err) then
    err.message = what .. ": " .. err.message
    return nil, err
  end
  return nil, errors.new("journal", what .. ": " .. tostring(err))
end

-- Reads what makes a file a journal: its header, then PRAGMA quick_check.
-- true, or nil and the failure ("reading it", "checking it").
local function check(db, path)
  -- reading the header first: a foreign file must not be converted to WAL
  local ok, e = db:exec("SELECT count(*) FROM sqlite_master")
  if not ok then return nil, e, "reading it" end
  local chk = db:prepare("PRAGMA quick_check")
  local rows
  if chk then rows, e = chk:run() chk:close() end
  if not rows then return nil, e or errors.new("journal", "quick_check failed", { corrupt = true }), "checking it" end
  if rows[1] and rows[1].quick_check ~= "ok" then
    local problems = {}
    for i = 1, math.min(#rows, 3) do problems[i] = rows[i].quick_check end
    return nil, errors.new("journal", table.concat(problems, "; "), { file = path, corrupt = true }), "checking it"
  end
  return true
end

-- A path as a "file:" URI with SQLite's parameters (`query`).
local function uri(path, query)
  local escaped = path:gsub("[%%?#]", function(c) return string.format("%%%02X", c:byte()) end)
  return "file:" .. escaped:gsub("^/+", "/") .. "?" .. query
end

-- Whether a failure to read is SQLite's shared memory (the WAL's -shm
-- file) that it could not create or grow: a full disk, a read-only folder.
local function no_shared_memory(e)
  return e.code_name == "SQLITE_IOERR" or e.code_name == "SQLITE_FULL" or e.code_name == "SQLITE_CANTOPEN"
    or e.code_name == "SQLITE_READONLY"
end

local function size(path)
  local f = io.open(path, "rb")
  if not f then return 0 end
  local n = f:seek("end")
  f:close()
  return n or 0
end

-- Opens the journal to read only: a connection that writes nothing. A WAL
-- journal needs its -shm file, which SQLite creates and grows even to read;
-- where it cannot, the WAL is read with its index in memory
-- (readonly_shm), and with no WAL to read, the file alone (immutable).
-- db, or nil, err, what failed.
local function open_readonly(path)
  local tries = { { "mode=ro" }, { "mode=ro&readonly_shm=1" } }
  if size(path .. "-wal") == 0 then tries[3] = { "mode=ro&immutable=1" } end
  local first_err, first_what
  for _, try in ipairs(tries) do
    local db, err = core.sqlite_open(uri(path, try[1]), { readonly = true, uri = true })
    local what = "opening it"
    if db then
      local ok
      ok, err, what = check(db, path)
      if ok then return db end
      db:close()
    end
    first_err, first_what = first_err or err, first_what or what
    if not no_shared_memory(err) then return nil, err, what end
  end
  return nil, first_err, first_what
end

-- open(path, [opts]) -> store | nil, err. Creates the file (never its
-- folder) when missing, switches it to WAL, checks it (PRAGMA quick_check)
-- and creates the tables. A damaged or foreign file gives err.corrupt =
-- true and is not touched beyond reading. With opts.readonly the file must
-- exist; nothing is written (no WAL switch, no tables, no writer), and the
-- writing methods raise.
function M.open(path, opts)
  local readonly = opts and opts.readonly
  local db, err, what
  if readonly then
    db, err, what = open_readonly(path)
  else
    db, err = core.sqlite_open(path)
    if not db then return nil, err end
  end
  local function bail(e, doing)
    if db then db:close() end
    if e.corrupt then
      e.message = string.format("journal '%s' is damaged or not a luagent journal (%s: %s); it is left "
        .. "as it is: move it away (or restore it) to go on", path, doing, e.message:gsub("^.-: .-: ", ""))
    end
    return nil, e
  end
  if not db then return bail(err, what) end
  if not readonly then
    local ok, e, doing = check(db, path)
    if not ok then return bail(e, doing) end
    ok, e = db:exec("PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = OFF")
    if not ok then return bail(e, "switching to WAL") end
  end
  local vrows = assert(db:prepare("PRAGMA user_version")):run()
  local version = vrows and vrows[1] and vrows[1].user_version or 0
  if version > M.SCHEMA_VERSION then
    db:close()
    return nil, errors.new("journal", string.format("journal '%s' has schema version %d; this luagent knows %d",
      path, version, M.SCHEMA_VERSION), { file = path })
  end
  local store = setmetatable({ db = db, path = path, stmts = {}, claimed = {}, readonly = readonly or nil }, Store)
  if readonly then
    -- a file with no tables yet (an empty database) holds no runs
    local rows = store:q("runs_table")
    store.empty = not (rows and rows[1] and rows[1].n > 0)
    rows = store:q("threads_table")
    store.no_threads = not (rows and rows[1] and rows[1].n > 0) -- a journal older than sessions
    return store
  end
  local ok, e = db:exec("BEGIN IMMEDIATE; " .. SCHEMA .. " PRAGMA user_version = " .. M.SCHEMA_VERSION .. "; COMMIT")
  if not ok then
    db:exec("ROLLBACK")
    return bail(e, "creating its tables")
  end
  local writer, werr = core.sqlite_writer(path)
  if not writer then return bail(werr, "starting its writer") end
  store.writer = writer
  return store
end

-- The prepared statement for SQL[name] (kept for the store's life).
function Store:stmt(name)
  local s = self.stmts[name]
  if not s then
    if not self.db then error("journal: the store is closed", 3) end
    local err
    s, err = self.db:prepare(SQL[name])
    if not s then error("journal: bad statement " .. name .. ": " .. tostring(err), 3) end
    self.stmts[name] = s
  end
  return s
end

-- Runs SQL[name] with the parameters: rows, changes | nil, err.
function Store:q(name, ...)
  return self:stmt(name):run(...)
end

-- Store:q inside a transaction: rows, changes; raises the error record.
function Store:must(name, ...)
  local rows, n = self:q(name, ...)
  if not rows then error(n, 0) end
  return rows, n
end

-- Runs fn() inside BEGIN IMMEDIATE ... COMMIT: fn's results, or nil, err
-- (rolled back).
function Store:tx(what, fn)
  if self.readonly then error("journal: the store was opened read-only", 3) end
  local ok, err = self:q("begin")
  if not ok then return fail(err, what) end
  local res = table.pack(pcall(fn))
  if res[1] and res[2] ~= nil then
    ok, err = self:q("commit")
    if ok then return table.unpack(res, 2, res.n) end
  else
    err = res[1] and res[3] or res[2]
  end
  self:q("rollback")
  return fail(err, what)
end

-- store:now() -> the wall clock in seconds (the journal's clock).
function Store:now()
  local rows = self:q("now")
  return rows and rows[1].now or os.time()
end

-- Runs SQL[name] with the parameters as one transaction in the writer
-- thread (the calling task waits): true, changes | nil, err.
function Store:write(what, name, ...)
  if self.readonly then error("journal: the store was opened read-only", 3) end
  if not self.writer then error("journal: the store is closed", 3) end
  local ok, changes = self.writer:tx({ SQL[name], ... })
  if not ok then return fail(changes, what) end
  return true, changes
end

-- The claim of run_id as held: {pid=, host=, pid_start=, since=,
-- heartbeat=, age=} | false (none) | nil, err.
function Store:holder(run_id)
  local rows, err = self:q("claim", run_id)
  if not rows then return fail(err, "reading the claim of run " .. run_id) end
  return rows[1] or false
end

-- The failure of a write this store may no longer make: the run's claim
-- went to another process (err.holder), or is gone.
function Store:lost(run_id, what)
  local h = self:holder(run_id)
  local why = h and ("it is being run by " .. owner.describe(h, h.age)) or "its claim is gone"
  return nil, errors.new("journal", string.format("%s: run %s is no longer run by this process: %s", what, run_id,
    why), { file = self.path, holder = h or nil, lost = true })
end

-- A write of run_id: fenced by its claim when this store holds it (the
-- write happens only while the claim is still this process's).
function Store:write_run(run_id, what, name, ...)
  local me = self.claimed[run_id]
  if not me then return self:write(what, name, ...) end
  local args = table.pack(...)
  args[args.n + 1], args[args.n + 2], args[args.n + 3] = me.pid, me.host, me.pid_start
  local ok, changes = self:write(what, name .. "_held", table.unpack(args, 1, args.n + 3))
  if not ok then return nil, changes end
  if changes == 0 then return self:lost(run_id, what) end
  return true
end

-- store:create(run) -> true | nil, err. run = {id=, script=, args=<list>,
-- options=<table>, cwd=, pid=}.
function Store:create(run)
  return self:write("creating run " .. run.id, "create", run.id, run.script,
    json.encode(json.array(run.args or {})), json.encode(run.options or {}), run.cwd, run.pid)
end

-- store:append(run_id, step) -> true | nil, err: one step in one
-- transaction (a step at the same position replaces the earlier one, which
-- is how a call goes from started to finished). step = {pos=, kind=,
-- status=, name=, call_id=, input_tokens=, output_tokens=, cost=, data=}.
-- A run this store claimed is written only while the claim is its own.
function Store:append(run_id, step)
  return self:write_run(run_id, "writing step " .. step.pos, "upsert", run_id, step.pos, step.kind, step.status,
    step.name, step.call_id, step.input_tokens, step.output_tokens, step.cost,
    step.data ~= nil and json.encode(step.data) or nil)
end

-- store:update(run_id, {status=, error=, agents=, pid=}) -> true | nil, err.
function Store:update(run_id, f)
  return self:write_run(run_id, "updating run " .. run_id, "update", f.status, f.error, f.agents, f.pid, run_id)
end

------------------------------------------------------------------------------
-- Claims: one runner per run
------------------------------------------------------------------------------

-- store:claim(run_id, me, stale_after) -> claim | nil, err. Takes the run
-- for the process `me` ({pid=, host=, pid_start=}, journal/owner.lua): when
-- nobody holds it, when `me` holds it already, or when its holder is gone
-- (owner.gone: on this host its process is gone; on another, its heartbeat
-- is older than stale_after seconds). The claim seen is taken by one
-- conditional write (it is still as seen): of two processes taking it at
-- once, one wins and the other sees the winner. Else nil, err: kind
-- journal, err.holder = {pid=, host=, since=, heartbeat=, age=}. claim =
-- {taken_from=<the holder that was gone>, why=<why it was>}.
function Store:claim(run_id, me, stale_after)
  for _ = 1, 5 do
    local h, err = self:holder(run_id)
    if h == nil then return nil, err end
    local mine = h and owner.same(h, me)
    local why = h and not mine and owner.gone(h, me, h.age, stale_after)
    if h and not mine and not why then
      return nil, errors.new("journal", string.format("run %s is being run by %s; a run has one runner at a "
        .. "time: wait for it to end, or stop that process", run_id, owner.describe(h, h.age)),
        { file = self.path, holder = h })
    end
    local ok, changes
    if mine then
      ok, changes = self:write("claiming run " .. run_id, "heartbeat", run_id, me.pid, me.host, me.pid_start)
    else
      ok, changes = self:write("claiming run " .. run_id, "take", run_id, me.pid, me.host, me.pid_start,
        h and h.pid, h and h.host, h and h.pid_start, h and h.heartbeat)
    end
    if not ok then return nil, changes end
    if changes == 1 then
      self.claimed[run_id] = { pid = me.pid, host = me.host, pid_start = me.pid_start }
      return { taken_from = not mine and h or nil, why = why or nil }
    end
    -- the claim changed since it was read: look again
  end
  return nil, errors.new("journal", "claiming run " .. run_id .. ": its claim keeps changing", { file = self.path })
end

-- store:heartbeat(run_id, me) -> true | nil, err: the claim's heartbeat
-- is now. err.lost: the claim is no longer `me`'s (err.holder: whose).
function Store:heartbeat(run_id, me)
  local ok, changes = self:write("refreshing the claim of run " .. run_id, "heartbeat", run_id, me.pid, me.host,
    me.pid_start)
  if not ok then return nil, changes end
  if changes == 0 then return self:lost(run_id, "refreshing the claim") end
  return true
end

-- store:release(run_id, me) -> true | nil, err: lets the claim go (if it is
-- still `me`'s).
function Store:release(run_id, me)
  self.claimed[run_id] = nil
  return self:write("releasing run " .. run_id, "release", run_id, me.pid, me.host, me.pid_start)
end

-- Decodes a row's JSON columns.
local function decode_step(row)
  if row.data then row.data = json.integerize(json.decode(row.data)) end -- a replayed value is the value
  return row
end

local function decode_run(row)
  row.args = row.args and json.decode(row.args) or {}
  row.options = row.options and json.decode(row.options) or {}
  return row
end

-- store:read(run_id) -> run with .steps (in order) and .by_pos, or nil
-- (no such run), or nil, err.
function Store:read(run_id)
  if self.empty then return nil end
  local rows, err = self:q("run", run_id)
  if not rows then return fail(err, "reading run " .. run_id) end
  if not rows[1] then return nil end
  local run = decode_run(rows[1])
  local steps
  steps, err = self:q("steps", run_id)
  if not steps then return fail(err, "reading the steps of run " .. run_id) end
  run.steps, run.by_pos = steps, {}
  for _, s in ipairs(steps) do run.by_pos[s.pos] = decode_step(s) end
  return run
end

-- store:list() -> runs (oldest first) with turns, input_tokens,
-- output_tokens, cost summed over their steps | nil, err.
function Store:list()
  if self.empty then return {} end
  local rows, err = self:q("list")
  if not rows then return fail(err, "listing runs") end
  for _, r in ipairs(rows) do decode_run(r) end
  return rows
end

-- store:resolve(run_id, call, {result=<text>} | {not_done=true}) -> step |
-- nil, err. `call` is a call id or a step position of a call that started
-- and did not finish; the step becomes finished (resolved by hand) or
-- not_done (it runs at the next resume).
function Store:resolve(run_id, call, how)
  return self:tx("resolving " .. call, function()
    local rows = self:must("open_calls", run_id, call)
    if #rows == 0 then
      error(errors.new("usage", string.format("run %s has no unfinished call '%s'", run_id, call)), 0)
    elseif #rows > 1 then
      local where = {}
      for i, r in ipairs(rows) do where[i] = r.pos end
      error(errors.new("usage", string.format("call id '%s' names %d unfinished calls (%s): give the step",
        call, #rows, table.concat(where, ", "))), 0)
    end
    local step = decode_step(rows[1])
    local data = step.data or {}
    if how.not_done then
      step.status = "not_done"
    else
      step.status = "finished"
      data.content, data.is_error, data.resolved = how.result, false, true
    end
    step.data = data
    self:must("upsert", run_id, step.pos, step.kind, step.status, step.name, step.call_id,
      step.input_tokens, step.output_tokens, step.cost, json.encode(data))
    return step
  end)
end

-- store:decide(run_id, call, {approved =, reason =}) -> step | nil, err:
-- `call` (a call id or a step position) waits for approval; its step
-- becomes approved or denied, the decision in its data (approval).
function Store:decide(run_id, call, how)
  return self:tx("deciding " .. call, function()
    local rows = self:must("waiting_calls", run_id)
    local hits, ids = {}, {}
    for _, r in ipairs(rows) do
      ids[#ids + 1] = r.call_id .. " (" .. r.name .. ")"
      if r.call_id == call or r.pos == call then hits[#hits + 1] = r end
    end
    if #hits == 0 then
      error(errors.new("usage", string.format("run %s has no call '%s' waiting for approval (%s)", run_id, call,
        #ids > 0 and ("waiting: " .. table.concat(ids, ", ")) or "none waits")), 0)
    elseif #hits > 1 then
      local where = {}
      for i, r in ipairs(hits) do where[i] = r.pos end
      error(errors.new("usage", string.format("call id '%s' names %d waiting calls (%s): give the step",
        call, #hits, table.concat(where, ", "))), 0)
    end
    local step = decode_step(hits[1])
    local data = step.data or {}
    step.status = how.approved and "approved" or "denied"
    data.approval = { approved = how.approved, reason = how.reason, by = "luagent runs" }
    step.data = data
    self:must("upsert", run_id, step.pos, step.kind, step.status, step.name, step.call_id,
      step.input_tokens, step.output_tokens, step.cost, json.encode(data))
    return step
  end)
end

-- store:gc(seconds, live) -> number of runs deleted: those last updated
-- more than `seconds` ago, but for a run whose claim had a heartbeat in the
-- last `live` seconds (a process runs it now).
function Store:gc(seconds, live)
  return self:tx("deleting old runs", function()
    assert(self.db:exec(SQL.gc_old))
    self:must("gc_pick", seconds, live or 0)
    self:must("gc_steps")
    self:must("gc_claims")
    local _, n = self:must("gc_runs")
    return n
  end)
end

------------------------------------------------------------------------------
-- Sessions: the saved conversations of agents with `session = NAME`
------------------------------------------------------------------------------

-- store:thread(name) -> {name=, messages=<list>, turns=, model=, compacted=,
-- version=, pid=, host=, updated=} | false (none) | nil, err.
function Store:thread(name)
  if self.no_threads or self.empty then return false end
  local rows, err = self:q("thread", name)
  if not rows then return fail(err, "reading session " .. name) end
  local row = rows[1]
  if not row then return false end
  row.messages = json.integerize(json.decode(row.messages))
  row.compacted = row.compacted == 1
  return row
end

-- store:save_thread(name, {messages=, turns=, model=, compacted=, pid=,
-- host=}) -> true | nil, err: replaces the session's conversation in one
-- statement (its version goes up by one).
function Store:save_thread(name, t)
  return self:write("saving session " .. name, "thread_save", name, json.encode(json.array(t.messages)), t.turns,
    t.model, t.compacted and 1 or 0, t.pid, t.host)
end

-- store:threads() -> the sessions, last saved first: {name=, turns=,
-- messages=<count>, model=, compacted=, version=, updated=} | nil, err.
function Store:threads()
  if self.no_threads or self.empty then return {} end
  local rows, err = self:q("threads")
  if not rows then return fail(err, "listing sessions") end
  for _, r in ipairs(rows) do r.compacted = r.compacted == 1 end
  return rows
end

-- store:delete_thread(name) -> true | false (no such session) | nil, err.
function Store:delete_thread(name)
  local ok, n = self:write("deleting session " .. name, "thread_rm", name)
  if not ok then return nil, n end
  return n > 0
end

-- store:close(): idempotent.
function Store:close()
  if not self.db then return end
  if self.writer then self.writer:close() end
  self.writer = nil
  for _, s in pairs(self.stmts) do s:close() end
  self.stmts = {}
  self.db:close()
  self.db = nil
end

return M
