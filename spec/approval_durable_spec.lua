-- Human approval in durable runs, through the real binary: the run waits
-- (`luagent runs` says waiting), a second process approves or denies
-- (`luagent runs approve` / `deny`), `luagent resume` runs the tool once
-- (or tells the model it was denied); the evaluated needs_approval is
-- journaled; killed after the decision and before the tool finished, the
-- in-doubt rule applies (an approval never re-runs the call).
local helpers = require "spec.support.helpers"

local q, tempdir, lines, sh = helpers.quote, helpers.tempdir, helpers.lines, helpers.run_env

local SCRIPT = "spec/fixtures/durable/approve.lua"

local function run_id(stderr)
  return assert(stderr:match("luagent: durable run (%S+)"), "no run id in: " .. stderr)
end

local function with(env, extra)
  local e = {}
  for k, v in pairs(env) do e[k] = v end
  for k, v in pairs(extra or {}) do e[k] = v end
  return e
end

describe("a durable run whose tool needs approval", function()
  local dir, env
  before_each(function()
    dir = tempdir()
    env = { LUAGENT_HOME = dir, LEDGER = dir .. "/ledger" }
  end)
  after_each(function() os.execute("rm -rf " .. q(dir)) end)

  local function waiting(extra)
    local r = sh(with(env, extra), "run", SCRIPT)
    assert.equal(0, r.code, r.stderr)
    assert.equal("waiting: call_mockcall_2 transfer\n", r.stdout)
    local id = run_id(r.stderr)
    assert.matches("luagent: run " .. id:gsub("%-", "%%-") .. " waits for approval of transfer %(call "
      .. "call_mockcall_2%): 'luagent runs approve " .. id:gsub("%-", "%%-") .. " call_mockcall_2'", r.stderr)
    assert.equal(0, #lines(env.LEDGER))
    assert.matches(id:gsub("%-", "%%-") .. "%s+%S+%s+payer%s+waiting%s+2 ", sh(env, "runs").stdout)
    return id
  end

  it("waits; another process approves; resume runs the tool once", function()
    local id = waiting()
    local show = sh(env, "runs", "show", id)
    assert.matches("payer#1/1/t2/c1%s+waiting%s+transfer .*waits for approval %(call call_mockcall_2%)", show.stdout)
    local a = sh(env, "runs", "approve", id, "call_mockcall_2")
    assert.equal(0, a.code, a.stderr)
    assert.matches("^approved payer#1/1/t2/c1 %(transfer, call call_mockcall_2%) of run", a.stdout)
    local r = sh(env, "resume", id)
    assert.equal(0, r.code, r.stderr)
    assert.equal("answer: Done: sent 5 EUR to ACME\n", r.stdout)
    local paid = lines(env.LEDGER)
    assert.equal(1, #paid)
    assert.matches(id:gsub("%-", "%%-") .. ":payer#1/1/t2/c1$", paid[1])
    assert.matches("done", sh(env, "runs").stdout)
    assert.matches("payer#1/1/t2/c1%s+finished%s+transfer .* %-> sent 5 EUR to ACME %(approved%)",
      sh(env, "runs", "show", id).stdout)
    -- once decided, it does not wait: a second approval is refused
    local again = sh(env, "runs", "approve", id, "call_mockcall_2")
    assert.equal(2, again.code)
    assert.matches("runs approve: run " .. id:gsub("%-", "%%-") .. " has no call 'call_mockcall_2' waiting for "
      .. "approval %(none waits%)", again.stderr)
    -- resumed again: everything is answered from the journal
    r = sh(env, "resume", id)
    assert.equal(0, r.code, r.stderr)
    assert.equal(1, #lines(env.LEDGER))
  end)

  it("denied from another process: resume tells the model 'denied: <reason>' and the tool never runs", function()
    local id = waiting()
    local d = sh(env, "runs", "deny", id, "call_mockcall_2", "--reason", "not this month")
    assert.equal(0, d.code, d.stderr)
    local r = sh(env, "resume", id)
    assert.equal(0, r.code, r.stderr)
    assert.equal("answer: Done: denied: not this month\n", r.stdout)
    assert.equal(0, #lines(env.LEDGER))
  end)

  it("still waits when resumed undecided; the journaled needs_approval stands though the policy changed", function()
    local id = waiting { APPROVE_OVER = "1" } -- 5 > 1: it needs approval
    -- now the function would say no approval is needed: the journal answers
    local r = sh(with(env, { APPROVE_OVER = "100" }), "resume", id)
    assert.equal(0, r.code, r.stderr)
    assert.equal("waiting: call_mockcall_2 transfer\n", r.stdout)
    assert.equal(0, #lines(env.LEDGER))
    assert.matches("waiting", sh(env, "runs").stdout)
  end)

  it("killed after the decision, before the tool finished: outcome_unknown, not run again", function()
    local id = waiting()
    assert.equal(0, sh(env, "runs", "approve", id, "call_mockcall_2").code)
    local r = sh(with(env, { TRANSFER_CRASH = "1" }), "resume", id)
    assert.equal(137, r.code, r.stderr)
    assert.equal(1, #lines(env.LEDGER))
    r = sh(env, "resume", id)
    assert.equal(3, r.code, r.stderr)
    assert.matches("outcome_unknown: transfer %(call call_mockcall_2, step payer#1/1/t2/c1", r.stderr)
    assert.equal(1, #lines(env.LEDGER)) -- the approval was not permission to run it again
    -- and it cannot be approved again: it does not wait
    assert.equal(2, sh(env, "runs", "approve", id, "call_mockcall_2").code)
  end)

  it("approved in the script itself: journaled at the same positions, a resume replays it", function()
    local r = sh(with(env, { APPROVE_HERE = "1" }), "run", SCRIPT)
    assert.equal(0, r.code, r.stderr)
    assert.equal("answer: Done: sent 5 EUR to ACME\n", r.stdout)
    local id = run_id(r.stderr)
    assert.equal(1, #lines(env.LEDGER))
    assert.matches("payer#1/1/t2/c1%s+finished%s+transfer .* %(approved%)", sh(env, "runs", "show", id).stdout)
    assert.matches("done", sh(env, "runs").stdout)
    r = sh(with(env, { APPROVE_HERE = "1" }), "resume", id)
    assert.equal(0, r.code, r.stderr)
    assert.equal("answer: Done: sent 5 EUR to ACME\n", r.stdout)
    assert.equal(1, #lines(env.LEDGER))
  end)

  it("approve and deny: --help, and clear usage errors", function()
    local h = sh(env, "runs", "approve", "--help")
    assert.equal(0, h.code)
    assert.matches("luagent runs approve %[%-%-journal FILE%] RUN_ID CALL_ID", h.stdout)
    assert.matches("luagent runs deny %[%-%-journal FILE%] RUN_ID CALL_ID %[%-%-reason TEXT%]", h.stdout)
    local id = waiting()
    local bad = sh(env, "runs", "deny", id)
    assert.equal(2, bad.code)
    assert.matches("runs deny: expects RUN_ID CALL_ID", bad.stderr)
    bad = sh(env, "runs", "approve", id, "call_9")
    assert.equal(2, bad.code)
    assert.matches("has no call 'call_9' waiting for approval %(waiting: call_mockcall_2 %(transfer%)%)", bad.stderr)
    bad = sh(env, "runs", "approve", id, "call_mockcall_2", "--not-done")
    assert.equal(2, bad.code)
    assert.matches("runs approve: %-%-not%-done is for 'runs resolve'", bad.stderr)
  end)
end)
