-- Sessions (`session = NAME` on an agent): the conversation is loaded from
-- the journal at the first prompt and saved after every turn, so another
-- process continues it; a compacted history is saved compacted; `luagent
-- runs threads` lists sessions and `runs threads rm NAME` deletes one.
local helpers = require "spec.support.helpers"
local luagent = require "luagent"

local q = helpers.quote
local sh = helpers.run_env
local CHAT = "spec/fixtures/session/chat.lua"

describe("a session", function()
  local dir, env
  before_each(function()
    dir = helpers.tempdir()
    env = { LUAGENT_HOME = dir }
  end)
  after_each(function() os.execute("rm -rf " .. q(dir)) end)

  local function chat(extra)
    local e = {}
    for k, v in pairs(env) do e[k] = v end
    for k, v in pairs(extra or {}) do e[k] = v end
    local r = sh(e, "run", CHAT)
    assert.equal(0, r.code, r.stderr)
    return r
  end

  it("is continued by a second process", function()
    local r1 = chat { PROMPT = "my name is Ada" }
    -- the first request: the one prompt
    assert.equal("answer: seen 1\nmessages: 2\n", r1.stdout)
    local r2 = chat { PROMPT = "what is my name?" }
    -- the second process sent the first one's turn and its own prompt
    assert.equal("answer: seen 3\nmessages: 4\n", r2.stdout)
    -- another name is another conversation
    local r3 = chat { SESSION = "other", PROMPT = "hi" }
    assert.equal("answer: seen 1\nmessages: 2\n", r3.stdout)
  end)

  it("keeps its last whole turn when the process is killed in the middle of one", function()
    chat { PROMPT = "one" }
    local e = { CRASH = "1", PROMPT = "two" }
    for k, v in pairs(env) do e[k] = v end
    local r = sh(e, "run", CHAT)
    assert.equal(137, r.code, r.stderr)
    assert.matches("thread%-42%s+1%s+2%s+", sh(env, "runs", "threads").stdout)
    -- the next process goes on from the whole turn: "two" and its call are not in it
    assert.equal("answer: seen 3\nmessages: 4\n", chat({ PROMPT = "three" }).stdout)
  end)

  it("is saved compacted when its history was compacted", function()
    for i = 1, 3 do chat { PROMPT = "u" .. i } end -- 6 messages saved
    local r = chat { PROMPT = "u4", OVERFLOW = "1" }
    -- 7 overflowed; drop_oldest sent fewer, and that history was kept
    local n = tonumber(r.stdout:match("messages: (%d+)"))
    assert.is_true(n < 8, r.stdout)
    local r2 = chat { PROMPT = "u5" }
    -- the next process starts from the compacted history, not the 8 of the full one
    assert.equal(string.format("answer: seen %d\nmessages: %d\n", n + 1, n + 2), r2.stdout)
    local l = sh(env, "runs", "threads")
    assert.matches("thread%-42%s+5%s+" .. (n + 2) .. "%s+.-compacted", l.stdout)
  end)

  it("is listed by `luagent runs threads` and deleted by `runs threads rm`", function()
    chat { PROMPT = "one" }
    chat { PROMPT = "two" }
    chat { SESSION = "other", PROMPT = "hi" }
    local l = sh(env, "runs", "threads")
    assert.equal(0, l.code, l.stderr)
    assert.matches("NAME%s+TURNS%s+MESSAGES%s+UPDATED %(UTC%)%s+MODEL", l.stdout)
    assert.matches("thread%-42%s+2%s+4%s+%d%d%d%d%-%d%d%-%d%d %d%d:%d%d:%d%d%s+openai/m", l.stdout)
    assert.matches("other%s+1%s+2%s+", l.stdout)
    local h = sh(env, "runs", "threads", "--help")
    assert.equal(0, h.code)
    assert.matches("runs threads rm", h.stdout)
    local d = sh(env, "runs", "threads", "rm", "other")
    assert.equal(0, d.code, d.stderr)
    assert.equal("deleted session other\n", d.stdout)
    assert.not_matches("other", sh(env, "runs", "threads").stdout)
    local again = sh(env, "runs", "threads", "rm", "other")
    assert.equal(2, again.code)
    assert.matches("no session 'other'", again.stderr)
    -- the second process starts the deleted one afresh
    assert.equal("answer: seen 1\nmessages: 2\n", chat({ SESSION = "other", PROMPT = "hi" }).stdout)
  end)

  it("lists no sessions in a journal made before sessions (an older schema)", function()
    -- a version 2 journal: runs, steps and claims only
    local sqlite = require "luagent.core"
    local db = assert(sqlite.sqlite_open(dir .. "/runs.db"))
    assert(db:exec("CREATE TABLE runs (id TEXT PRIMARY KEY, script TEXT, args TEXT, options TEXT, cwd TEXT, "
      .. "pid INTEGER, agents TEXT, status TEXT NOT NULL, error TEXT, started REAL NOT NULL, updated REAL NOT NULL);"
      .. "CREATE TABLE steps (run_id TEXT NOT NULL, pos TEXT NOT NULL, seq INTEGER NOT NULL, kind TEXT NOT NULL, "
      .. "status TEXT NOT NULL, name TEXT, call_id TEXT, input_tokens INTEGER, output_tokens INTEGER, cost REAL, "
      .. "data TEXT, at REAL NOT NULL, PRIMARY KEY (run_id, pos)) WITHOUT ROWID;"
      .. "CREATE TABLE claims (run_id TEXT PRIMARY KEY, pid INTEGER NOT NULL, host TEXT NOT NULL, pid_start TEXT, "
      .. "since REAL NOT NULL, heartbeat REAL NOT NULL); PRAGMA user_version = 2"))
    db:close()
    local l = sh(env, "runs", "threads")
    assert.equal(0, l.code, l.stderr)
    assert.matches("no sessions", l.stdout)
    -- and a session brings it up to date
    assert.equal("answer: seen 1\nmessages: 2\n", chat({ PROMPT = "hi" }).stdout)
    assert.matches("thread%-42%s+1%s+2", sh(env, "runs", "threads").stdout)
  end)

  it("used by two at once: the last writer wins, and the one that replaced the other's turns warns", function()
    local mock = require "luagent.mock"
    local srv = assert(mock.start { script = function(_, _, body) return { text = "seen " .. #body.messages } end })
    local logged = {}
    local function runtime()
      return luagent.runtime { home = dir, log_sink = function(level, line)
        logged[#logged + 1] = level .. ": " .. line
      end }
    end
    local rt1, rt2 = runtime(), runtime() -- two journals' connections, as two processes have
    local model = { kind = "openai", model = "m", base_url = srv.url .. "/v1", api_key = "k" }
    local a = rt1:agent { session = "shared", model = model }
    local b = rt2:agent { session = "shared", model = model }
    assert.equal("seen 1", a:run("a1").messages[2].content)
    assert.equal("seen 3", b:run("b1").messages[4].content) -- b loaded a's turn
    assert.same({}, logged)
    -- a saves over b's turn: a warning names the session and last-writer-wins
    assert.equal("seen 3", a:run("a2").messages[4].content)
    assert.equal(1, #logged)
    assert.matches("^warn: .*luagent: session shared was saved by another process %(pid %d+ on .-%) since this one "
      .. "loaded it; this save replaces it %(last writer wins", logged[1])
    rt1:close()
    rt2:close()
    srv:close()
    local store = assert(require("luagent.agent.journal.sqlite").open(dir .. "/runs.db", { readonly = true }))
    local t = assert(store:thread("shared"))
    store:close()
    assert.equal("a2", t.messages[3].content) -- a's history, whole
    assert.equal(3, t.version)
  end)

  it("refuses a bad name, naming it", function()
    local ok, err = pcall(luagent.agent, { session = "no spaces/here", model = "openai/m" })
    assert.is_false(ok)
    assert.matches("agent: session 'no spaces/here'", tostring(err))
    ok, err = pcall(luagent.agent, { session = 42, model = "openai/m" })
    assert.is_false(ok)
    assert.matches("agent: session must be a string", tostring(err))
  end)
end)
