-- Durable runs through the real binary: a provider that fails for good at
-- turn 3, resumed once it is back, with exactly the remaining requests;
-- outcome_unknown resolved by a tool's check (it happened / it did not) and
-- by `luagent runs resolve`; divergence between script and journal; a
-- damaged journal reported and left alone; `luagent runs` and its help.
local helpers = require "spec.support.helpers"
local json = require "luagent.base.json"

local q = helpers.quote

local tempdir = helpers.tempdir

local lines = helpers.lines

-- sh(env, args...) -> {code, stdout, stderr}: the binary with environment
-- assignments (a table) before it.
local sh = helpers.run_env

local function run_id(stderr)
  return assert(stderr:match("luagent: durable run (%S+)"), "no run id in: " .. stderr)
end

local TRANSFER = "spec/fixtures/durable/transfer.lua"

describe("a durable run whose tool's outcome is unknown (killed while transfer ran)", function()
  local dir, env
  before_each(function()
    dir = tempdir()
    env = { LUAGENT_HOME = dir, LEDGER = dir .. "/ledger" }
  end)
  after_each(function() os.execute("rm -rf " .. q(dir)) end)

  local function crashed(when, extra)
    local e = { TRANSFER_CRASH = when }
    for k, v in pairs(env) do e[k] = v end
    for k, v in pairs(extra or {}) do e[k] = v end
    local r = sh(e, "run", TRANSFER)
    assert.equal(137, r.code, r.stderr)
    local id = run_id(r.stderr)
    -- marked running, its process gone
    assert.matches(id:gsub("%-", "%%-") .. "%s+%S+%s+payer%s+interrupted%s+2 ", sh(env, "runs").stdout)
    return id
  end

  it("records the options of `luagent run` when an agent made with durable = true starts it", function()
    -- without them, resume dropped --mock and --seed (issue 26's docs review)
    local e = { TRANSFER_CRASH = "after" }
    for k, v in pairs(env) do e[k] = v end
    local r = sh(e, "run", "--seed", "7", "--fast", TRANSFER)
    assert.equal(137, r.code, r.stderr)
    local id = run_id(r.stderr)
    local store = assert(require("luagent.agent.journal.sqlite").open(env.LUAGENT_HOME .. "/runs.db"))
    local rec = assert(store:read(id))
    store:close()
    assert.equal(7, tonumber(rec.options.seed))
    assert.is_true(rec.options.fast)
    assert.equal(TRANSFER, rec.script)
  end)

  it("is settled by its check when it happened: not run again", function()
    local id = crashed("after")
    assert.equal(1, #lines(env.LEDGER))
    local r = sh(env, "resume", id)
    assert.equal(0, r.code, r.stderr)
    assert.equal("answer: Done: sent 5 EUR to ACME (found in the ledger)\n", r.stdout)
    assert.equal(1, #lines(env.LEDGER))
    -- LUAGENT_HOME held the journal
    assert.truthy(io.open(dir .. "/runs.db"))
    local s = sh(env, "runs", "show", id)
    assert.equal(0, s.code, s.stderr)
    assert.matches("payer#1/1/t2/c1%s+finished%s+transfer .* %(its check found it happened%)", s.stdout)
  end)

  it("is traced and costed when resumed with --trace --cost: the replayed answers are no calls", function()
    local id = crashed("after")
    local r = sh(env, "resume", "--trace", "--cost", id)
    assert.equal(0, r.code, r.stderr)
    -- the observers stay subscribed (a replayed answer has no call number)
    assert.not_matches("event consumer failed", r.stderr)
    -- one real model call (the last turn): one chat span, one cost row
    local _, chats = r.stderr:gsub("\n  chat ", "")
    assert.equal(1, chats)
    assert.matches("\n    attempt 1 %S+  HTTP 200\n", r.stderr)
    assert.matches("\npayer%s+1%s+1%s", r.stderr)
  end)

  it("runs when its check says it did not happen", function()
    local id = crashed("before")
    assert.equal(0, #lines(env.LEDGER))
    local r = sh(env, "resume", id)
    assert.equal(0, r.code, r.stderr)
    assert.equal("answer: Done: sent 5 EUR to ACME\n", r.stdout)
    local paid = lines(env.LEDGER)
    assert.equal(1, #paid)
    -- the idempotency key is the run id and the call's position
    assert.equal(id .. ":payer#1/1/t2/c1", json.decode(paid[1]).key)
  end)

  it("without a check stops again with outcome_unknown until `luagent runs resolve` settles it", function()
    env.TRANSFER_NO_CHECK = "1"
    local id = crashed("after")
    local r = sh(env, "resume", id)
    assert.equal(3, r.code, r.stderr) -- the run cannot go on: exit 3, not the script's 1
    assert.matches("outcome_unknown: transfer %(call call_mockcall_2, step payer#1/1/t2/c1", r.stderr)
    assert.matches("luagent runs resolve " .. id:gsub("%-", "%%-") .. " call_mockcall_2 %-%-result JSON", r.stderr)
    local list = sh(env, "runs")
    assert.matches(id:gsub("%-", "%%-") .. "%s+%S+%s+payer%s+outcome_unknown%s+2 ", list.stdout)
    -- bad resolutions are usage errors naming the problem
    local bad = sh(env, "runs", "resolve", id, "call_mockcall_2", "--result", "{oops")
    assert.equal(2, bad.code)
    assert.matches("%-%-result is not JSON", bad.stderr)
    bad = sh(env, "runs", "resolve", id, "call_9", "--not-done")
    assert.equal(2, bad.code)
    assert.matches("has no unfinished call 'call_9'", bad.stderr)
    -- not while another process runs it: refused, naming that process
    local store = assert(require("luagent.agent.journal.sqlite").open(env.LUAGENT_HOME .. "/runs.db"))
    assert(store.db:exec("INSERT INTO claims VALUES ('" .. id .. "', 4242, 'elsewhere', 'b/7', "
      .. "(julianday('now') - 2440587.5) * 86400.0, (julianday('now') - 2440587.5) * 86400.0)"))
    local busy = sh(env, "runs", "resolve", id, "call_mockcall_2", "--not-done")
    assert.equal(2, busy.code, busy.stderr)
    assert.matches("runs resolve: run " .. id:gsub("%-", "%%-") .. " is being run by pid 4242@elsewhere", busy.stderr)
    assert(store.db:exec("DELETE FROM claims"))
    store:close()
    -- settled by hand: it happened, with this result
    local res = sh(env, "runs", "resolve", id, "call_mockcall_2", "--result", '"sent 5 EUR by hand"')
    assert.equal(0, res.code, res.stderr)
    r = sh(env, "resume", id)
    assert.equal(0, r.code, r.stderr)
    assert.equal("answer: Done: sent 5 EUR by hand\n", r.stdout)
    assert.equal(1, #lines(env.LEDGER))
    assert.matches("done", sh(env, "runs").stdout)
  end)

  it("exits 3 when resumed and stopped again on outcome_unknown, though the script ends normally", function()
    env.TRANSFER_NO_CHECK = "1"
    local id = crashed("after")
    local quiet = { TRANSFER_QUIET = "1" }
    for k, v in pairs(env) do quiet[k] = v end
    for _ = 1, 2 do -- every resume, until it is settled
      local r = sh(quiet, "resume", id)
      assert.equal(3, r.code, r.stderr)
      assert.matches("^stopped: outcome_unknown: transfer", r.stdout)
      assert.matches("luagent: run " .. id:gsub("%-", "%%-") .. " stopped on outcome_unknown %(exit 3%): settle "
        .. "the call with 'luagent runs resolve', then resume", r.stderr)
    end
    assert.equal(0, sh(env, "runs", "resolve", id, "call_mockcall_2", "--not-done").code)
    assert.equal(0, sh(quiet, "resume", id).code)
  end)

  it("resolved --not-done runs the call at the next resume", function()
    env.TRANSFER_NO_CHECK = "1"
    local id = crashed("before")
    local res = sh(env, "runs", "resolve", id, "payer#1/1/t2/c1", "--not-done")
    assert.equal(0, res.code, res.stderr)
    local r = sh(env, "resume", id)
    assert.equal(0, r.code, r.stderr)
    assert.equal("answer: Done: sent 5 EUR to ACME\n", r.stdout)
    assert.equal(1, #lines(env.LEDGER))
  end)

  it("reports a script that no longer matches its journal, naming the step", function()
    local id = crashed("after")
    local changed = { TRANSFER_PROMPT = "Pay invoice inv-8." }
    for k, v in pairs(env) do changed[k] = v end
    local r = sh(changed, "resume", id)
    assert.equal(1, r.code)
    assert.matches("divergence: the script no longer matches journal step payer#1/1/t1: message 1 sent to the "
      .. "model differs: journal .*inv%-7.*, script .*inv%-8", r.stderr)
    assert.equal(1, #lines(env.LEDGER))
    assert.matches("diverged", sh(env, "runs").stdout)
  end)

  it("reports a tool call at a position where the journal has another call", function()
    local id = crashed("after")
    -- the journal says another transfer ran at this position
    local store = assert(require("luagent.agent.journal.sqlite").open(dir .. "/runs.db"))
    assert(store.db:exec([[UPDATE steps SET data = json_set(data, '$.arguments', '{"amount":500,"to":"EVE"}')
      WHERE pos = 'payer#1/1/t2/c1']]))
    store:close()
    local r = sh(env, "resume", id)
    assert.equal(1, r.code)
    assert.matches('journal step payer#1/1/t2/c1: the journal has transfer {"amount":500,"to":"EVE"}, '
      .. 'the script calls transfer {"amount":5,"to":"ACME"}', r.stderr, 1, true)
    assert.equal(1, #lines(env.LEDGER))
  end)
end)

describe("`luagent run` of a durable run whose agent stops on outcome_unknown", function()
  it("exits 3, though the script ends normally; a run that is not durable leaves the code to its script", function()
    local dir = tempdir()
    local script = helpers.tempfile([[
local luagent = require "luagent"
local mock = require "luagent.mock"
local srv = assert(mock.start { script = function(_, n)
  if n == 1 then return { tools = { { id = "1", name = "charge", arguments = {} } } } end
  return { text = "charged" }
end })
-- no safety flag, and it dies while running: it may have charged
local charge = { name = "charge", description = "Charges", command = { "sh", "-c", "kill -9 $$" } }
local agent = luagent.agent { name = "biller", durable = os.getenv("DURABLE") == "1", tools = { charge },
  model = { kind = "openai", model = "m", base_url = srv.url .. "/v1", api_key = "k" } }
local last = agent:run("Charge it.")
srv:close()
print(last.stop_reason, last.error and last.error.kind)
]], ".lua")
    local r = sh({ LUAGENT_HOME = dir, DURABLE = "1" }, "run", script)
    assert.equal(3, r.code, r.stderr)
    assert.equal("error\toutcome_unknown\n", r.stdout)
    local id = run_id(r.stderr)
    assert.matches("luagent: run " .. id:gsub("%-", "%%-") .. " stopped on outcome_unknown %(exit 3%)", r.stderr)
    assert.matches(id:gsub("%-", "%%-") .. "%s+%S+%s+biller%s+outcome_unknown ", sh({ LUAGENT_HOME = dir }, "runs").stdout)
    r = sh({ LUAGENT_HOME = dir, DURABLE = "0" }, "run", script)
    assert.equal(0, r.code, r.stderr)
    assert.equal("error\toutcome_unknown\n", r.stdout)
    os.remove(script)
    os.execute("rm -rf " .. q(dir))
  end)
end)

describe("a durable triage run whose provider fails for good at turn 3", function()
  it("ends resumable; once the provider is back, resume sends exactly the remaining requests", function()
    local dir = tempdir()
    local policy = dir .. "/fast.lua"
    local f = assert(io.open(policy, "w"))
    f:write('return { name = "fast", max_retries = 2, backoff = { strategy = "fixed", base = 0.01 } }\n')
    f:close()
    local env = { TRIAGE_ISSUES = dir .. "/issues" }
    local db = dir .. "/runs.db"
    local r = sh(env, "run", "--durable", "--journal", db, "--fast", "--policy", policy, "--faults", "503@3-1000",
      "--events", "jsonl:" .. dir .. "/ev1", "examples/triage.lua")
    assert.equal(1, r.code, r.stderr)
    local id = run_id(r.stderr)
    assert.matches("%[error after 3 turn%(s%)", r.stdout)
    local count = {}
    for _, l in ipairs(lines(dir .. "/ev1")) do
      local e = json.decode(l)
      count[e.type] = (count[e.type] or 0) + 1
    end
    -- turns 1 and 2 answered; turn 3 tried three times, then failed for good
    assert.equal(3, count.turn_start)
    assert.equal(2, count.provider_retry)
    assert.equal(4, count.tool_execution_start) -- crash_list, then crash_show x3
    local list = sh(env, "runs", "--journal", db)
    assert.matches(id:gsub("%-", "%%-") .. "%s+examples/triage.lua%s+triage%s+failed%s+2 ", list.stdout)
    -- the provider is back (no --faults): turns 3 to 5, nothing else
    r = sh(env, "resume", "--journal", db, "--record", dir .. "/rec.jsonl", "--events", "jsonl:" .. dir .. "/ev2", id)
    assert.equal(0, r.code, r.stderr)
    assert.equal(3, #lines(dir .. "/rec.jsonl"))
    assert.matches("Triage of 3 crash reports:", r.stdout)
    assert.matches("%[stop after 5 turn%(s%)", r.stdout)
    local replayed = 0
    for _, l in ipairs(lines(dir .. "/ev2")) do
      local e = json.decode(l)
      if e.type == "message_end" and e.replayed then replayed = replayed + 1 end
    end
    assert.equal(2, replayed)
    assert.equal(1, #lines(env.TRIAGE_ISSUES))
    -- the failed attempts' tokens count too: the list has every turn
    assert.matches("done%s+5 ", sh(env, "runs", "--journal", db).stdout)
    os.execute("rm -rf " .. q(dir))
  end)
end)

describe("the run journal file", function()
  it("is reported, and left as it is, when it is not a journal or is damaged", function()
    local dir = tempdir()
    local bad = dir .. "/runs.db"
    local f = assert(io.open(bad, "wb"))
    local junk = string.rep("not a database ", 700)
    f:write(junk)
    f:close()
    local r = sh({}, "runs", "--journal", bad)
    assert.equal(1, r.code)
    assert.matches("journal '" .. bad:gsub("%p", "%%%0") .. "' is damaged or not a luagent journal", r.stderr)
    assert.matches("left as it is", r.stderr)
    r = sh({ TRIAGE_ISSUES = dir .. "/issues" }, "run", "--durable", "--journal", bad, "--fast", "examples/triage.lua")
    assert.equal(1, r.code)
    assert.matches("is damaged or not a luagent journal", r.stderr)
    assert.equal(junk, helpers.slurp(bad))
    assert.is_nil(io.open(dir .. "/issues"))
    -- a torn journal: a real one cut in the middle of its pages
    local good = dir .. "/good.db"
    r = sh({ TRIAGE_ISSUES = dir .. "/issues" }, "run", "--durable", "--journal", good, "--fast", "examples/triage.lua")
    assert.equal(0, r.code, r.stderr)
    assert.equal(0, sh({}, "runs", "--journal", good).code)
    -- fold the WAL into the file, then cut it
    local store = assert(require("luagent.agent.journal.sqlite").open(good))
    assert(store.db:exec("PRAGMA wal_checkpoint(TRUNCATE)"))
    store:close()
    local whole = helpers.slurp(good)
    assert.is_true(#whole > 8192)
    f = assert(io.open(good, "wb"))
    f:write(whole:sub(1, 4096 + 100))
    f:close()
    r = sh({}, "runs", "--journal", good)
    assert.equal(1, r.code)
    assert.matches("is damaged or not a luagent journal", r.stderr)
    assert.equal(4196, #helpers.slurp(good))
    os.execute("rm -rf " .. q(dir))
  end)

  it("is never created by resume, runs show, resolve or gc: the error names the path; runs lists nothing", function()
    local dir = tempdir()
    local none = dir .. "/none.db"
    local p = none:gsub("%p", "%%%0")
    for _, args in ipairs({ { "resume", "--journal", none, "20261201-000000-000-abcd" },
                            { "runs", "show", "--journal", none, "20261201-000000-000-abcd" },
                            { "runs", "resolve", "--journal", none, "20261201-000000-000-abcd", "c1", "--not-done" },
                            { "runs", "gc", "--journal", none, "--older-than", "1" } }) do
      local r = sh({}, table.unpack(args))
      assert.equal(2, r.code, table.concat(args, " ") .. ": " .. r.stderr)
      assert.matches("no journal at '" .. p .. "'", r.stderr)
    end
    local r = sh({}, "runs", "--journal", none)
    assert.equal(0, r.code, r.stderr)
    assert.matches("^no runs: no journal at '" .. p .. "'", r.stdout)
    -- nor the default folder
    local home = { LUAGENT_HOME = dir .. "/home" }
    assert.equal(0, sh(home, "runs").code)
    assert.equal(2, sh(home, "runs", "show", "20261201-000000-000-abcd").code)
    assert.equal(2, sh(home, "resume", "20261201-000000-000-abcd").code)
    assert.equal("", io.popen("ls -A " .. q(dir)):read("a"))
    os.execute("rm -rf " .. q(dir))
  end)

  -- runs luagent where no file can grow (ulimit -f 0: as on a full disk,
  -- for root too); its output goes through a pipe: {code, output}
  local function full_disk(env, ...)
    local words = {}
    for k, v in pairs(env) do words[#words + 1] = k .. "=" .. q(v) end
    words[#words + 1] = q(helpers.bin)
    for _, a in ipairs({ ... }) do words[#words + 1] = q(a) end
    local out = os.tmpname()
    os.execute("(ulimit -f 0; trap '' XFSZ; " .. table.concat(words, " ") .. " </dev/null 2>&1; echo \"exit=$?\") | cat >"
      .. out)
    local text = helpers.slurp(out)
    os.remove(out)
    local code = text:match("exit=(%d+)\n$")
    return { code = tonumber(code), output = text }
  end

  it("is listed and shown on a full disk: runs and runs show write nothing", function()
    local dir = tempdir()
    local env = { LUAGENT_HOME = dir, LEDGER = dir .. "/ledger" }
    local r = sh(env, "run", TRANSFER)
    assert.equal(0, r.code, r.stderr)
    local done = run_id(r.stderr)
    assert.is_nil(io.open(dir .. "/runs.db-wal")) -- a clean journal: everything in runs.db
    local l = full_disk(env, "runs")
    assert.equal(0, l.code, l.output)
    assert.matches(done:gsub("%-", "%%-") .. "%s+%S+%s+payer%s+done%s+3 ", l.output)
    local s = full_disk(env, "runs", "show", done)
    assert.equal(0, s.code, s.output)
    assert.matches("payer#1/1/t3%s+finished%s+model turn: answers: Done: sent 5 EUR to ACME", s.output)
    -- a run killed while its tool ran: its last steps are still in the WAL
    local crash = { TRANSFER_CRASH = "after" }
    for k, v in pairs(env) do crash[k] = v end
    r = sh(crash, "run", TRANSFER)
    assert.equal(137, r.code, r.stderr)
    local killed = run_id(r.stderr)
    l = full_disk(env, "runs")
    assert.equal(0, l.code, l.output)
    assert.matches(done:gsub("%-", "%%-") .. "%s+%S+%s+payer%s+done ", l.output)
    assert.matches(killed:gsub("%-", "%%-") .. "%s+%S+%s+payer%s+interrupted%s+2 ", l.output)
    s = full_disk(env, "runs", "show", killed)
    assert.equal(0, s.code, s.output)
    assert.matches("payer#1/1/t2/c1%s+started%s+transfer", s.output)
    -- what needs to write says why it cannot
    local g = full_disk(env, "runs", "gc", "--older-than", "0")
    assert.equal(1, g.code, g.output)
    -- with room again, nothing was lost
    local after = sh(env, "runs")
    assert.equal(0, after.code, after.stderr)
    assert.matches(killed:gsub("%-", "%%-") .. "%s+%S+%s+payer%s+interrupted%s+2 ", after.stdout)
    os.execute("rm -rf " .. q(dir))
  end)

  it("defaults to .luagent/runs.db in the current folder; --journal wins over LUAGENT_HOME", function()
    local dir = tempdir()
    local r = sh({ LEDGER = dir .. "/ledger" }, "run", "--journal", dir .. "/j.db", TRANSFER)
    assert.equal(0, r.code, r.stderr)
    assert.truthy(io.open(dir .. "/j.db"))
    local here = os.getenv("PWD") or "."
    r = sh({ LEDGER = dir .. "/ledger", LUAGENT_HOME = dir .. "/home" }, "run", "--journal", dir .. "/j.db", TRANSFER)
    assert.equal(0, r.code, r.stderr)
    assert.is_nil(io.open(dir .. "/home/runs.db"))
    -- --journal alone starts a run only for durable agents
    local plain = helpers.tempfile("print('no agent here')", ".lua")
    r = sh({}, "run", "--journal", dir .. "/empty.db", plain)
    assert.equal(0, r.code, r.stderr)
    assert.not_matches("durable run", r.stderr)
    assert.is_nil(io.open(dir .. "/empty.db"))
    os.remove(plain)
    -- no flag, no LUAGENT_HOME: .luagent/runs.db where it runs
    os.execute("mkdir -p " .. q(dir .. "/work") .. " && cp -R spec " .. q(dir .. "/work/"))
    local cmd = string.format("cd %s && LEDGER=%s PWD=%s %s run %s >/dev/null 2>&1", q(dir .. "/work"), q(dir .. "/ledger"),
      q(dir .. "/work"), q(here .. "/" .. helpers.bin), TRANSFER)
    assert(os.execute(cmd))
    assert.truthy(io.open(dir .. "/work/.luagent/runs.db"))
    os.execute("rm -rf " .. q(dir))
  end)
end)

describe("luagent runs", function()
  it("lists, shows and deletes runs; help texts for resume and runs", function()
    local dir = tempdir()
    local env = { LUAGENT_HOME = dir, LEDGER = dir .. "/ledger" }
    local r = sh(env, "run", TRANSFER)
    assert.equal(0, r.code, r.stderr)
    local id = run_id(r.stderr)
    local list = sh(env, "runs")
    assert.equal(0, list.code, list.stderr)
    assert.matches("RUN%s+SCRIPT%s+AGENTS%s+STATUS%s+TURNS%s+TOKENS IN/OUT%s+COST%s+STARTED %(UTC%)%s+LAST STEP", list.stdout)
    assert.matches(id:gsub("%-", "%%-") .. " spec/fixtures/durab%S* payer%s+done%s+3%s+%d+/%d+%s+%-%s+%d%d%d%d%-%d%d%-%d%d",
      list.stdout)
    local show = sh(env, "runs", "show", id)
    assert.matches("payer#1/1/t1%s+finished%s+model turn: calls invoice", show.stdout)
    assert.matches("payer#1/1/t3%s+finished%s+model turn: answers: Done: sent 5 EUR to ACME", show.stdout)
    assert.equal(2, sh(env, "runs", "show", "nope").code)
    assert.equal(2, sh(env, "resume", "nope").code)
    assert.equal(2, sh(env, "runs", "gc").code)
    local gc = sh(env, "runs", "gc", "--older-than", "1")
    assert.equal("deleted 0 run(s) older than 1 day(s)\n", gc.stdout)
    gc = sh(env, "runs", "gc", "--older-than", "0")
    assert.equal("deleted 1 run(s) older than 0 day(s)\n", gc.stdout)
    assert.matches("no runs in", sh(env, "runs").stdout)
    for _, topic in ipairs({ "resume", "runs" }) do
      local h = sh({}, "help", topic)
      assert.equal(0, h.code)
      assert.matches("usage: luagent " .. topic, h.stdout)
    end
    assert.matches("%-%-durable", sh({}, "help", "run").stdout)
    assert.matches("resume RUN_ID", sh({}, "--help").stdout)
    os.execute("rm -rf " .. q(dir))
  end)
end)
