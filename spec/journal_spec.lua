-- The run journal in process: the SQLite binding of the core (born closed,
-- idempotent close, prepared statements, errors as records), the SQLite
-- store behind the journal interface, and a durable agent on the mock:
-- write-ahead of tool calls, replay by position (no request, no tool run,
-- events marked replayed), idempotency keys stable across a resume.
local luagent = require "luagent"
local core = require "luagent.core"
local mock = require "luagent.mock"
local journal = require "luagent.agent.journal"
local store_mod = require "luagent.agent.journal.sqlite"
local owner = require "luagent.agent.journal.owner"

local tempdb, cleanup = require("spec.support.helpers").tempdb, require("spec.support.helpers").remove_db

describe("core.sqlite_open", function()
  it("gives handles with prepared statements, errors as records, and one idempotent close", function()
    local p = tempdb()
    local db = assert(core.sqlite_open(p))
    assert(db:exec("CREATE TABLE t (a INTEGER, b TEXT, c REAL)"))
    local ins = assert(db:prepare("INSERT INTO t VALUES (?, ?, ?)"))
    local rows, changes = ins:run(1, "x", 0.5)
    assert.same({}, rows)
    assert.equal(1, changes)
    assert(ins:run(2, nil, true))
    local sel = assert(db:prepare("SELECT * FROM t ORDER BY a"))
    rows = assert(sel:run())
    assert.same({ { a = 1, b = "x", c = 0.5 }, { a = 2, c = 1.0 } }, rows)
    assert.equal("integer", math.type(rows[1].a))
    -- misuse raises, naming the function
    assert.has_error(function() ins:run(1) end, "run: 3 parameter(s) expected, got 1")
    assert.has_error(function() ins:run({}, 1, 2) end, "run: parameter 1 is a table (nil, boolean, number or string expected)")
    -- operational failures are records
    local none, err = db:prepare("SELEC 1")
    assert.is_nil(none)
    assert.equal("journal", err.kind)
    assert.equal("SQLITE_ERROR", err.code_name)
    assert.is_false(err.corrupt)
    assert.matches('near "SELEC": syntax error', tostring(err))
    local ok, cerr = db:exec("INSERT INTO nowhere VALUES (1)")
    assert.is_nil(ok)
    assert.matches("no such table: nowhere", cerr.message)
    -- close: idempotent; a statement outliving its db raises
    db:close()
    db:close()
    assert.has_error(function() sel:run() end, "run: database is closed")
    assert.has_error(function() db:exec("SELECT 1") end, "exec: database is closed")
    sel:close()
    sel:close()
    assert.has_error(function() sel:run() end, "run: statement is closed")
    ins:close()
    -- __close and __gc share the close
    do
      local db2 <close> = assert(core.sqlite_open(p))
      assert(db2:exec("SELECT 1"))
    end
    collectgarbage()
    cleanup(p)
  end)

  it("reports a file that is not a database with corrupt = true, and a missing folder", function()
    local p = tempdb()
    local f = assert(io.open(p, "wb"))
    f:write(string.rep("garbage!", 512))
    f:close()
    local db = assert(core.sqlite_open(p)) -- opening reads nothing yet
    local ok, err = db:exec("SELECT count(*) FROM sqlite_master")
    assert.is_nil(ok)
    assert.equal("SQLITE_NOTADB", err.code_name)
    assert.is_true(err.corrupt)
    db:close()
    local none, oerr = core.sqlite_open("/nonexistent-folder/x.db")
    assert.is_nil(none)
    assert.equal("journal", oerr.kind)
    assert.equal("SQLITE_CANTOPEN", oerr.code_name)
    assert.equal("/nonexistent-folder/x.db", oerr.file)
    cleanup(p)
  end)
end)

describe("core.sqlite_writer", function()
  it("commits transactions in a thread of its own while other tasks run; errors are records", function()
    local p = tempdb()
    local db = assert(core.sqlite_open(p))
    assert(db:exec("PRAGMA journal_mode = WAL; CREATE TABLE t (a INTEGER PRIMARY KEY, b TEXT)"))
    local w = assert(core.sqlite_writer(p))
    local ok, changes = w:tx({ "INSERT INTO t VALUES (?, ?)", 1, "x" }, { "INSERT INTO t VALUES (?, ?)", 2, nil })
    assert.is_true(ok)
    assert.equal(1, changes)
    -- one transaction: a failing statement rolls back the others
    local none, err = w:tx({ "INSERT INTO t VALUES (?, ?)", 3, "y" }, { "INSERT INTO t VALUES (?, ?)", 1, "dup" })
    assert.is_nil(none)
    assert.equal("journal", err.kind)
    assert.equal("SQLITE_CONSTRAINT", err.code_name)
    assert.matches("UNIQUE constraint failed", err.message)
    local rows = assert(assert(db:prepare("SELECT a, b FROM t ORDER BY a")):run())
    assert.same({ { a = 1, b = "x" }, { a = 2 } }, rows)
    -- while a task waits for its commits, the others run
    local ticks, done = 0, false
    local writer_task = luagent.spawn(function()
      for i = 10, 209 do assert(w:tx({ "INSERT INTO t VALUES (?, ?)", i, string.rep("z", 200) })) end
      done = true
    end)
    local ticker = luagent.spawn(function()
      while not done do
        ticks = ticks + 1
        luagent.sleep(0)
      end
    end)
    writer_task:join()
    ticker:join()
    assert.is_true(ticks > 1, "the other task ran " .. ticks .. " time(s)")
    -- a task cancelled while it waits: its transaction still commits
    local t = luagent.spawn(function() w:tx({ "INSERT INTO t VALUES (?, ?)", 999, "late" }) end)
    luagent.spawn(function() t:cancel() end):join()
    assert.has_error(function() t:join() end)
    -- misuse raises
    assert.has_error(function() w:tx() end, "tx: no statements")
    assert.has_error(function() w:tx({ "SELECT ?", {} }) end,
      "tx: statement 1, parameter 1 is a table (nil, boolean, number or string expected)")
    w:close()
    w:close()
    assert.has_error(function() w:tx({ "SELECT 1" }) end, "tx: writer is closed")
    rows = assert(assert(db:prepare("SELECT count(*) AS n FROM t")):run())
    assert.equal(2 + 200 + 1, rows[1].n)
    db:close()
    cleanup(p)
  end)
end)

describe("the SQLite journal store", function()
  it("creates runs, appends steps (one position, one step), lists, resolves and collects", function()
    local p = tempdb()
    local s = assert(store_mod.open(p))
    local mode = assert(s.db:prepare("PRAGMA journal_mode")):run()
    assert.equal("wal", mode[1].journal_mode)
    assert(s:create { id = "r1", script = "x.lua", args = { "a", "b" }, options = { fast = true }, cwd = "/w", pid = 1 })
    assert(s:append("r1", { pos = "a#1/1/t1", kind = "turn", status = "finished", input_tokens = 10, output_tokens = 2,
      data = { message = { role = "assistant", content = "hi" } } }))
    assert(s:append("r1", { pos = "a#1/1/t1/c1", kind = "call", status = "started", name = "pay", call_id = "c1",
      data = { arguments = "{}" } }))
    assert(s:append("r1", { pos = "a#1/1/t1/c1", kind = "call", status = "unknown", name = "pay", call_id = "c1",
      data = { arguments = "{}" } }))
    assert(s:append("r1", { pos = "a#1/1/t2/failed-1", kind = "turn_failed", status = "failed", input_tokens = 5,
      output_tokens = 0 }))
    local run = assert(s:read("r1"))
    assert.same({ "a", "b" }, run.args)
    assert.same({ fast = true }, run.options)
    assert.equal(3, #run.steps)
    assert.equal("unknown", run.by_pos["a#1/1/t1/c1"].status)
    assert.equal("hi", run.by_pos["a#1/1/t1"].data.message.content)
    assert.is_nil(s:read("nope"))
    local list = assert(s:list())
    assert.equal(1, #list)
    assert.equal(1, list[1].turns)
    assert.equal(15, list[1].input_tokens)
    assert.equal("a#1/1/t2/failed-1 failed", list[1].last_step)
    -- resolve: by call id or position, only unfinished calls
    local _, err = s:resolve("r1", "c9", { not_done = true })
    assert.equal("usage", err.kind)
    local step = assert(s:resolve("r1", "c1", { result = "paid" }))
    assert.equal("finished", step.status)
    run = s:read("r1")
    assert.same({ arguments = "{}", content = "paid", is_error = false, resolved = true }, run.by_pos["a#1/1/t1/c1"].data)
    _, err = s:resolve("r1", "a#1/1/t1/c1", { not_done = true })
    assert.matches("no unfinished call", err.message)
    assert(s:update("r1", { status = "done", agents = "a" }))
    assert.equal(0, s:gc(3600))
    assert.equal(1, s:gc(0))
    assert.same({}, s:list())
    s:close()
    s:close()
    cleanup(p)
  end)

  it("refuses a damaged journal and does not touch it", function()
    local p = tempdb()
    local f = assert(io.open(p, "wb"))
    f:write(string.rep("\0\1\2\3", 2048))
    f:close()
    local s, err = store_mod.open(p)
    assert.is_nil(s)
    assert.equal("journal", err.kind)
    assert.is_true(err.corrupt)
    assert.matches("is damaged or not a luagent journal", err.message)
    assert.equal(string.rep("\0\1\2\3", 2048), io.open(p, "rb"):read("a"))
    assert.is_nil(io.open(p .. "-wal"))
    cleanup(p)
  end)

  it("brings a journal of schema version 1 up to the current one; opened read-only, reads it as it is", function()
    local p = tempdb()
    local db = assert(core.sqlite_open(p))
    assert(db:exec([[PRAGMA journal_mode = WAL;
      CREATE TABLE runs (id TEXT PRIMARY KEY, script TEXT, args TEXT, options TEXT, cwd TEXT, pid INTEGER,
        agents TEXT, status TEXT NOT NULL, error TEXT, started REAL NOT NULL, updated REAL NOT NULL);
      CREATE TABLE steps (run_id TEXT NOT NULL, pos TEXT NOT NULL, seq INTEGER NOT NULL, kind TEXT NOT NULL,
        status TEXT NOT NULL, name TEXT, call_id TEXT, input_tokens INTEGER, output_tokens INTEGER, cost REAL,
        data TEXT, at REAL NOT NULL, PRIMARY KEY (run_id, pos)) WITHOUT ROWID;
      INSERT INTO runs VALUES ('old', 'x.lua', '[]', '{}', '/w', 1, 'a', 'done', NULL, 1.0, 2.0);
      PRAGMA user_version = 1;]]))
    db:close()
    local function version(st) return assert(st.db:prepare("PRAGMA user_version")):run()[1].user_version end
    local ro = assert(store_mod.open(p, { readonly = true }))
    assert.equal(1, version(ro))
    assert.equal("old", assert(ro:list())[1].id)
    assert.same({}, assert(ro:threads())) -- no threads table yet: no sessions
    assert.is_false(ro:thread("t"))
    assert.equal("done", ro:read("old").status)
    assert.has_error(function() ro:append("old", { pos = "a", kind = "turn", status = "finished" }) end,
      "journal: the store was opened read-only")
    assert.has_error(function() ro:gc(0) end, "journal: the store was opened read-only")
    ro:close()
    local rw = assert(store_mod.open(p))
    assert.equal(store_mod.SCHEMA_VERSION, version(rw))
    assert.equal(3, store_mod.SCHEMA_VERSION)
    assert.equal("old", assert(rw:list())[1].id)
    assert(rw:save_thread("t", { messages = { { role = "user", content = "hi" } }, turns = 1 }))
    assert.equal("hi", rw:thread("t").messages[1].content)
    assert(rw:claim("old", owner.this(), 60))
    rw:close()
    cleanup(p)
  end)

  it("path(): --journal, else HOME/runs.db (the home setting, LUAGENT_HOME), else .luagent/runs.db", function()
    assert.equal("x.db", journal.path("x.db", "/h"))
    assert.equal("/h/runs.db", journal.path(nil, "/h/"))
    assert.equal(".luagent/runs.db", journal.path()) -- the environment is the runtime's to read, not path's
    assert.matches("^%d%d%d%d%d%d%d%d%-%d%d%d%d%d%d%-%d%d%d%-%x%x%x%x$", journal.new_id(1764530000.25))
    assert.is_true(journal.new_id(1764530000) < journal.new_id(1764530001))
  end)
end)

describe("the claims of the SQLite store", function()
  local p, s, me
  before_each(function()
    p = tempdb()
    s = assert(store_mod.open(p))
    assert(s:create { id = "r1", script = "x.lua", args = {}, options = {}, cwd = "/w", pid = 1 })
    me = owner.this()
  end)
  after_each(function()
    s:close()
    cleanup(p)
  end)

  -- The claim of r1 as if held by another process, its heartbeat `age` s old.
  local function held_by(pid, host, pid_start, age)
    local st = assert(s.db:prepare("UPDATE claims SET pid = ?, host = ?, pid_start = ?, heartbeat = "
      .. "((julianday('now') - 2440587.5) * 86400.0) - ? WHERE run_id = 'r1'"))
    local _, n = assert(st:run(pid, host, pid_start, age))
    st:close()
    assert.equal(1, n)
  end

  local function pid_max()
    return math.tointeger(tonumber(io.open("/proc/sys/kernel/pid_max"):read("l")))
  end

  it("give a run one runner: free or own, taken; held by a process that runs, refused naming it", function()
    local c = assert(s:claim("r1", me, 60))
    assert.is_nil(c.taken_from)
    assert(s:claim("r1", me, 60)) -- its own: taken again
    local h = assert(s:holder("r1"))
    assert.same({ me.pid, me.host, me.pid_start }, { h.pid, h.host, h.pid_start })
    -- another process of this host that runs (pid 1) is refused, and told who runs it
    local init = { pid = 1, host = me.host, pid_start = owner.start_of(1) }
    assert.is_string(init.pid_start)
    local none, err = s:claim("r1", init, 60)
    assert.is_nil(none)
    assert.equal("journal", err.kind)
    assert.equal(me.pid, err.holder.pid)
    assert.matches("run r1 is being run by pid " .. me.pid .. "@" .. me.host:gsub("%p", "%%%0")
      .. " since %d%d%d%d%-%d%d%-%d%d %d%d:%d%d:%d%d UTC %(last heartbeat 0 s ago%)", err.message)
    -- the heartbeat and the release are the holder's
    local ok, lost = s:heartbeat("r1", init)
    assert.is_nil(ok)
    assert.is_true(lost.lost)
    assert(s:heartbeat("r1", me))
    assert(s:release("r1", init))
    assert.truthy(s:holder("r1"))
    assert(s:release("r1", me))
    assert.is_false(s:holder("r1"))
    assert(s:claim("r1", init, 60))
  end)

  it("are taken over when the holder is gone: its process on this host, its heartbeat on another", function()
    assert(s:claim("r1", me, 60))
    local function take() return s:claim("r1", me, 60) end
    -- no process has its pid
    held_by(pid_max() + 1, me.host, "boot/1", 0)
    local c = assert(take())
    assert.equal(pid_max() + 1, c.taken_from.pid)
    assert.equal("its process is gone", c.why)
    -- its pid is another process now (started later)
    held_by(1, me.host, "another-boot/1", 0)
    assert.equal("its process is gone", assert(take()).why)
    -- the process runs: however old its heartbeat, it is its run
    held_by(1, me.host, owner.start_of(1), 3600)
    local none, err = take()
    assert.is_nil(none)
    assert.equal(1, err.holder.pid)
    -- on another host: its heartbeat decides
    held_by(4242, "elsewhere", "b/7", 5)
    none, err = take()
    assert.is_nil(none)
    assert.matches("being run by pid 4242@elsewhere since .* %(last heartbeat 5 s ago%)", err.message)
    held_by(4242, "elsewhere", "b/7", 3600)
    c = assert(take())
    assert.equal("elsewhere", c.taken_from.host)
    assert.equal("no heartbeat for 3600 s", c.why)
  end)

  it("fence the writes of the run they hold: once another process took it, a step is refused", function()
    assert(s:claim("r1", me, 60))
    assert(s:append("r1", { pos = "a#1/1/t1", kind = "turn", status = "finished" }))
    held_by(4242, "elsewhere", "b/7", 0)
    local ok, err = s:append("r1", { pos = "a#1/1/t1/c1", kind = "call", status = "started", name = "pay" })
    assert.is_nil(ok)
    assert.is_true(err.lost)
    assert.equal("elsewhere", err.holder.host)
    assert.matches("writing step a#1/1/t1/c1: run r1 is no longer run by this process: it is being run by "
      .. "pid 4242@elsewhere", err.message)
    ok, err = s:update("r1", { status = "failed" })
    assert.is_nil(ok)
    assert.is_true(err.lost)
    local run = s:read("r1")
    assert.equal(1, #run.steps)
    assert.equal("running", run.status)
    -- gc leaves a run whose claim beat lately (a process runs it), and
    -- deletes a run's claim with it
    assert.equal(0, s:gc(0, 60))
    assert.equal(1, s:gc(0))
    assert.is_false(s:holder("r1"))
  end)
end)

describe("a durable agent", function()
  local srv, p, store
  before_each(function()
    luagent.clock.virtual()
    p = tempdb()
    store = assert(journal.open(p))
  end)
  after_each(function()
    if srv then srv:close() srv = nil end
    journal.use(luagent.default_runtime(), nil) -- the run lets its claim go and stops its heartbeat
    store:close()
    cleanup(p)
    require("luagent").configure { durable = false }
    luagent.clock.real()
  end)

  -- The model: one tool call per turn for two turns, then an answer.
  local function start_mock()
    srv = assert(mock.start { script = function(_, _, body)
      local n = 0
      for _, m in ipairs(body.messages) do if m.role == "tool" then n = n + 1 end end
      if n < 2 then return { text = "step " .. n, tools = { { id = "k" .. n, name = "note", arguments = { n = n } } } } end
      return { text = "finished" }
    end })
  end

  local runs_of_note, keys = 0, {}
  local note = { name = "note", description = "Notes", idempotent = true,
    params = { type = "object", properties = { n = { type = "integer" } } },
    run = function(args, ctx)
      runs_of_note = runs_of_note + 1
      keys[#keys + 1] = ctx.idempotency_key
      -- write-ahead: the call is committed as started before it runs
      local r = luagent.default_runtime().journal.run.store:read(luagent.default_runtime().journal.run.id)
      local step = r.by_pos["d#1/1/t" .. (args.n + 1) .. "/c1"]
      assert(step and step.status == "started", "not journaled before running: " .. tostring(step and step.status))
      return "noted " .. args.n
    end }

  local function agent()
    return luagent.agent { name = "d", durable = true, tools = { note },
      model = { kind = "openai", model = "m", base_url = srv.url .. "/v1", api_key = "k" } }
  end

  local drain = require("spec.support.helpers").drain

  it("journals its steps and, run again with the run id, replays them without a request or a tool run", function()
    start_mock()
    journal.use(luagent.default_runtime(), assert(journal.start(store, { script = "s.lua", args = {}, options = {}, quiet = true })))
    local id = luagent.default_runtime().journal.run.id
    runs_of_note, keys = 0, {}
    local evs, last = drain(agent(), "go")
    assert.equal("stop", last.stop_reason)
    assert.equal(id, evs[1].run_id)
    assert.is_nil(evs[1].resumed)
    assert.equal(2, runs_of_note)
    assert.equal(3, #srv:requests())
    assert.same({ id .. ":d#1/1/t1/c1", id .. ":d#1/1/t2/c1" }, keys)
    local rec = store:read(id)
    assert.equal("done", rec.status)
    assert.equal(5, #rec.steps)
    -- the same script again under the same run id: all from the journal
    journal.use(luagent.default_runtime(), assert(journal.resume(store, id)))
    local evs2, last2 = drain(agent(), "go")
    assert.equal("finished", last2.messages[#last2.messages].content)
    assert.same(last.usage, last2.usage)
    assert.equal(2, runs_of_note)
    assert.equal(3, #srv:requests())
    assert.is_true(evs2[1].resumed)
    local marked = 0
    for _, e in ipairs(evs2) do
      if e.type == "message_end" or e.type == "tool_execution_start" or e.type == "tool_execution_end" then
        assert.is_true(e.replayed, e.type)
        marked = marked + 1
      end
    end
    assert.equal(3 + 2 * 2, marked)
    -- a started call of an idempotent tool runs again, with the same key
    assert(store:append(id, { pos = "d#1/1/t2/c1", kind = "call", status = "started", name = "note",
      call_id = "call_mockk1", data = { arguments = '{"n":1}' } }))
    journal.use(luagent.default_runtime(), assert(journal.resume(store, id)))
    keys = {}
    local _, last3 = drain(agent(), "go")
    assert.equal("stop", last3.stop_reason, tostring(last3.error))
    assert.equal(3, runs_of_note)
    assert.same({ id .. ":d#1/1/t2/c1" }, keys)
    assert.equal(3, #srv:requests())
  end)

  it("tells every event in one order: the journal commits its step, then the bus, then the caller", function()
    start_mock()
    local rt = luagent.default_runtime()
    journal.use(rt, assert(journal.start(store, { script = "s.lua", args = {}, options = {}, quiet = true })))
    local id = rt.journal.run.id
    -- what the journal's file held when the bus told a subscriber of a
    -- step's last event: read through a connection of its own
    local turn, on_bus, held = 0, {}, {}
    local function committed(pos)
      local reader = assert(store_mod.open(p, { readonly = true }))
      local step = assert(reader:read(id)).by_pos[pos]
      reader:close()
      return step and step.status or "nothing"
    end
    local unsubscribe = rt:subscribe(function(ev)
      if ev.agent ~= "d" then return end
      on_bus[ev] = true
      local t = ev.type
      if t == "turn_start" then turn = ev.turn
      elseif t == "message_end" and ev.final then
        held[#held + 1] = "t" .. turn .. " " .. committed("d#1/1/t" .. turn)
      elseif t == "tool_execution_start" or t == "tool_execution_end" then
        held[#held + 1] = t .. " t" .. turn .. " " .. committed("d#1/1/t" .. turn .. "/c" .. ev.index)
      end
    end)
    local told_late = {}
    for ev in agent():prompt("go") do
      if not on_bus[ev] then told_late[#told_late + 1] = ev.type end
    end
    unsubscribe()
    assert.same({}, told_late) -- the caller is told after the bus
    assert.same({
      "t1 finished", "tool_execution_start t1 started", "tool_execution_end t1 finished",
      "t2 finished", "tool_execution_start t2 started", "tool_execution_end t2 finished",
      "t3 finished",
    }, held)
  end)

  it("belongs to its runtime: two runtimes, two durable runs; closing one lets its run's claim go", function()
    start_mock()
    local p2 = tempdb()
    local info = { script = "s.lua", args = {}, options = {}, quiet = true }
    local a = luagent.runtime { journal_file = p, run_info = info }
    local b = luagent.runtime { journal_file = p2, run_info = info }
    local plain = { name = "note", description = "Notes", idempotent = true,
      params = { type = "object", properties = { n = { type = "integer" } } },
      run = function(args) return "noted " .. args.n end }
    local function run_in(rt)
      local last = rt:agent { name = "d", durable = true, tools = { plain },
        model = { kind = "openai", model = "m", base_url = srv.url .. "/v1", api_key = "k" } }:run("go")
      assert.equal("stop", last.stop_reason, tostring(last.error))
      return rt.journal.run
    end
    local ra, rb = run_in(a), run_in(b)
    assert.are_not.equal(ra.id, rb.id)
    assert.is_nil(luagent.default_runtime().journal.run) -- the default runtime has none of them
    assert.equal("done", store:read(ra.id).status)
    assert.is_nil(store:read(rb.id)) -- b's run is in b's journal
    local other = assert(journal.open(p2))
    assert.equal("done", other:read(rb.id).status)
    assert.equal(journal.pid(), store:holder(ra.id).pid)
    local opened = a.journal.stores[1] -- the store a's journal opened for its run
    a:close()
    assert.is_false(store:holder(ra.id))
    assert.is_nil(a.journal.run)
    assert.is_nil(opened.db) -- closed with its runtime
    assert.equal(journal.pid(), other:holder(rb.id).pid) -- b's run is still b's
    b:close()
    assert.is_false(other:holder(rb.id))
    other:close()
    cleanup(p2)
  end)

  it("stops, without running the tool, when the journal cannot record the call's start", function()
    start_mock()
    journal.use(luagent.default_runtime(), assert(journal.start(store, { script = "s.lua", args = {}, options = {}, quiet = true })))
    local append = store.append
    store.append = function(st, id, step)
      if step.kind == "call" then
        return nil, require("luagent.base.errors").new("journal", "writing step " .. step.pos .. ": disk I/O error")
      end
      return append(st, id, step)
    end
    runs_of_note = 0
    local _, last = drain(agent(), "go")
    store.append = nil
    assert.equal("error", last.stop_reason)
    assert.equal("journal", last.error.kind)
    assert.matches("writing step d#1/1/t1/c1: disk I/O error", last.error.message)
    assert.equal(0, runs_of_note)
    assert.equal(1, #srv:requests())
    assert.equal("failed", store:read(luagent.default_runtime().journal.run.id).status)
  end)

  it("asks an unflagged tool's check about a call that started and never finished; a failing check stops the run", function()
    start_mock()
    journal.use(luagent.default_runtime(), assert(journal.start(store, { script = "s.lua", args = {}, options = {}, quiet = true })))
    local id = luagent.default_runtime().journal.run.id
    local ran, answer = 0, nil
    local pay = { name = "note", description = "Pays",
      params = { type = "object", properties = { n = { type = "integer" } } },
      run = function(args) ran = ran + 1 return "paid " .. args.n end,
      check = function(args, ctx)
        assert(ctx.idempotency_key == id .. ":d#1/1/t1/c1")
        if answer == "boom" then error("tracker down") end
        return answer
      end }
    local function payer()
      return luagent.agent { name = "d", durable = true, tools = { pay },
        model = { kind = "openai", model = "m", base_url = srv.url .. "/v1", api_key = "k" } }
    end
    local _, last = drain(payer(), "go")
    assert.equal("stop", last.stop_reason)
    assert.equal(2, ran)
    -- as if the process died while call 1 of turn 1 ran
    assert(store:append(id, { pos = "d#1/1/t1/c1", kind = "call", status = "started", name = "note",
      call_id = "call_mockk0", data = { arguments = '{"n":0}' } }))
    answer = "boom"
    journal.use(luagent.default_runtime(), assert(journal.resume(store, id)))
    _, last = drain(payer(), "go")
    assert.equal("error", last.stop_reason)
    assert.equal("outcome_unknown", last.error.kind)
    assert.matches("its check failed: tool_error: note check failed: .*tracker down", last.error.message)
    assert.equal(2, ran)
    -- the check finds it happened (with the result the later turns saw)
    answer = "paid 0"
    journal.use(luagent.default_runtime(), assert(journal.resume(store, id)))
    local evs
    evs, last = drain(payer(), "go")
    assert.equal("stop", last.stop_reason, tostring(last.error))
    assert.equal(2, ran)
    local ends = {}
    for _, e in ipairs(evs) do if e.type == "tool_execution_end" then ends[#ends + 1] = e end end
    assert.is_true(ends[1].checked)
    assert.is_nil(ends[1].replayed)
    assert.equal("paid 0", ends[1].result)
    assert.is_true(ends[2].replayed)
    assert.equal("finished", store:read(id).by_pos["d#1/1/t1/c1"].status)
  end)

  it("keeps a compacted history through a resume: replayed turns rebuild it, the next live turn sends it", function()
    -- the model: a call to note, a second one after its result, then an
    -- answer; request 2 (turn 2) overflows and is resent compacted
    srv = assert(mock.start { faults = "400:overflow@2", script = function(_, _, body)
      local last = body.messages[#body.messages]
      if last.role == "user" then return { tools = { { id = "k0", name = "note", arguments = { n = 0 } } } } end
      if last.tool_call_id == "call_mockk0" then return { tools = { { id = "k1", name = "note", arguments = { n = 1 } } } } end
      return { text = "finished" }
    end })
    local function long_agent()
      local function U(t) return { role = "user", content = t } end
      local function A(t) return { role = "assistant", content = t } end
      return luagent.agent { name = "d", durable = true, tools = { note },
        messages = { U("u1"), A("a1"), U("u2"), A("a2"), U("u3"), A("a3") },
        policy = { on_context_overflow = "drop_oldest", max_retries = 2 },
        model = { kind = "openai", model = "m", base_url = srv.url .. "/v1", api_key = "k" } }
    end
    local function contents(list)
      local out = {}
      for i, m in ipairs(list) do out[i] = m.role .. ":" .. tostring(m.tool_call_id or m.content) end
      return table.concat(out, " ")
    end
    journal.use(luagent.default_runtime(), assert(journal.start(store, { script = "s.lua", args = {}, options = {}, quiet = true })))
    local id = luagent.default_runtime().journal.run.id
    local _, last = drain(long_agent(), "u4")
    assert.equal("stop", last.stop_reason, tostring(last.error))
    local reqs = srv:requests()
    assert.equal(4, #reqs)
    -- turn 3 sends the compacted history: u3 a3 u4, call k0 and result, call k1 and result
    assert.equal(7, #reqs[4].body.messages)
    local live = contents(last.messages)
    -- as if the process died before turn 3 was journaled: turns 1 and 2
    -- replay (the compaction with them) and turn 3 sends what the live run sent
    assert(store.db:exec("DELETE FROM steps WHERE pos = 'd#1/1/t3'"))
    journal.use(luagent.default_runtime(), assert(journal.resume(store, id)))
    local _, again = drain(long_agent(), "u4")
    assert.equal("stop", again.stop_reason, tostring(again.error))
    reqs = srv:requests()
    assert.equal(5, #reqs)
    assert.same(reqs[4].body.messages, reqs[5].body.messages)
    assert.equal(live, contents(again.messages))
    -- every step from the journal: the same history, nothing sent, no divergence
    journal.use(luagent.default_runtime(), assert(journal.resume(store, id)))
    local revs, replayed = drain(long_agent(), "u4")
    assert.equal("stop", replayed.stop_reason, tostring(replayed.error))
    local compactions = {}
    for _, e in ipairs(revs) do if e.type == "context_compacted" then compactions[#compactions + 1] = e end end
    assert.equal(1, #compactions)
    assert.is_true(compactions[1].replayed)
    assert.same({ 1, 9, 5 }, { compactions[1].attempt, compactions[1].before, compactions[1].after })
    assert.equal(5, #srv:requests())
    assert.equal(live, contents(replayed.messages))
  end)

  it("journals a call whose arguments hold a non-finite number as an error result, and replays it", function()
    srv = assert(mock.start { script = function(_, n)
      if n == 1 then return { tools = { { id = "1", name = "note", json = '{"n": 1e999}', pieces = { '{"n": 1e999}' } } } } end
      return { text = "finished" }
    end })
    journal.use(luagent.default_runtime(), assert(journal.start(store, { script = "s.lua", args = {}, options = {}, quiet = true })))
    local id = luagent.default_runtime().journal.run.id
    runs_of_note = 0
    local evs, last = drain(agent(), "go")
    assert.equal("stop", last.stop_reason, tostring(last.error))
    assert.equal(0, runs_of_note)
    local en
    for _, e in ipairs(evs) do if e.type == "tool_execution_end" then en = e end end
    assert.equal("invalid_arguments", en.error.kind)
    assert.equal("done", store:read(id).status)
    -- resumed, the turn and the call come from the journal: the same error, no crash
    journal.use(luagent.default_runtime(), assert(journal.resume(store, id)))
    evs, last = drain(agent(), "go")
    assert.equal("stop", last.stop_reason, tostring(last.error))
    assert.equal("finished", last.messages[#last.messages].content)
    for _, e in ipairs(evs) do if e.type == "tool_execution_end" then en = e end end
    assert.is_true(en.replayed)
    assert.equal("invalid_arguments", en.error.kind)
    assert.equal(0, runs_of_note)
    assert.equal(2, #srv:requests())
  end)

  it("holds its run's claim while it runs, its heartbeat refreshed on the loop's clock; lets it go at the end", function()
    start_mock()
    local beats, beat = 0, store.heartbeat
    store.heartbeat = function(st, ...)
      beats = beats + 1
      return beat(st, ...)
    end
    journal.use(luagent.default_runtime(), assert(journal.start(store, { script = "s.lua", args = {}, options = {}, quiet = true })))
    local id = luagent.default_runtime().journal.run.id
    local holders = {}
    local slow = { name = "note", description = "Notes slowly", idempotent = true,
      params = { type = "object", properties = { n = { type = "integer" } } },
      run = function(args)
        holders[#holders + 1] = store:holder(id)
        luagent.sleep(25) -- virtual seconds
        return "noted " .. args.n
      end }
    local _, last = drain(luagent.agent { name = "d", durable = true, tools = { slow },
      model = { kind = "openai", model = "m", base_url = srv.url .. "/v1", api_key = "k" } }, "go")
    store.heartbeat = nil
    assert.equal("stop", last.stop_reason, tostring(last.error))
    assert.equal(2, #holders)
    assert.equal(journal.pid(), holders[1].pid)
    assert.is_true(beats >= 4, beats .. " heartbeat(s) in 50 virtual seconds")
    local timers = luagent.stats().timers
    journal.use(luagent.default_runtime(), nil)
    assert.is_false(store:holder(id))
    assert.equal(timers - 1, luagent.stats().timers) -- the heartbeat's timer is gone
  end)

  it("stops writing its run once another process took it over: the run stops, naming that process", function()
    start_mock()
    journal.use(luagent.default_runtime(), assert(journal.start(store, { script = "s.lua", args = {}, options = {}, quiet = true })))
    local id = luagent.default_runtime().journal.run.id
    local ran = 0
    local taken = { name = "note", description = "Notes", idempotent = true,
      params = { type = "object", properties = { n = { type = "integer" } } },
      run = function(args)
        ran = ran + 1
        -- meanwhile another host took the run over
        assert(store.db:exec("UPDATE claims SET pid = 4242, host = 'elsewhere', pid_start = 'b/7'"))
        return "noted " .. args.n
      end }
    local _, last = drain(luagent.agent { name = "d", durable = true, tools = { taken },
      model = { kind = "openai", model = "m", base_url = srv.url .. "/v1", api_key = "k" } }, "go")
    assert.equal("error", last.stop_reason)
    assert.equal("journal", last.error.kind)
    assert.matches("run " .. id:gsub("%p", "%%%0") .. " is no longer run by this process: it is being run by "
      .. "pid 4242@elsewhere", last.error.message)
    assert.equal(1, ran)
    assert.equal(1, #srv:requests())
    local rec = store:read(id)
    assert.equal("started", rec.by_pos["d#1/1/t1/c1"].status) -- its end was not written
    assert.equal("running", rec.status) -- nor the run's end: the run is the other process's
    journal.use(luagent.default_runtime(), nil)
    assert.equal("elsewhere", store:holder(id).host)
  end)

  it("resumes from what the journal holds once the run is claimed, not from a read before the claim", function()
    start_mock()
    journal.use(luagent.default_runtime(), assert(journal.start(store, { script = "s.lua", args = {}, options = {}, quiet = true })))
    local id = luagent.default_runtime().journal.run.id
    local _, last = drain(agent(), "go")
    assert.equal("stop", last.stop_reason, tostring(last.error))
    journal.use(luagent.default_runtime(), nil)
    -- as if its runner finished the run between a resumer's first read and
    -- its claim: the claim is where the resumer learns it
    store:update(id, { status = "running" })
    local claim = store.claim
    store.claim = function(st, ...)
      st:update(id, { status = "done" })
      return claim(st, ...)
    end
    local run = assert(journal.resume(store, id))
    store.claim = nil
    journal.use(luagent.default_runtime(), run) -- after_each lets it go
    assert.equal("done", run.record.status)
  end)

  it("bounds what a tool's check found, as a result is", function()
    local tools = require "luagent.agent.tools"
    local t = assert(tools.check { name = "big", description = "B", run = function() end,
      check = function() return ("x"):rep(5000) end })
    local text = tools.check_outcome(t, { id = "c1", arguments = {} }, { agent = "a",
      policy = { timeout = 5, grace = 1, max_result_bytes = 100 } })
    assert.equal(100, #text:match("^x*"))
    assert.matches("%[result cut: 4900 of 5000 bytes left out%]$", text)
  end)

  it("misuse raises: durable must be a boolean, check a function", function()
    assert.has_error(function() luagent.agent { model = "openai/m", durable = "yes" } end,
      "agent: durable must be true or false")
    local _, err = luagent.tools.check { name = "x", description = "x", run = function() end, check = 1 }
    assert.matches("check must be a function", err)
  end)
end)
