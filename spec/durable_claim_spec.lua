-- A durable run has one runner: a 25-step run killed after step 5 and
-- resumed twice at once runs in one process; the other is refused (exit 2)
-- with a message naming the owner, and every side effect happens once. The
-- killed process's claim (its pid is gone) is taken over; a run that ends
-- lets its claim go. Real processes; the waits are bounded generously.
local helpers = require "spec.support.helpers"
local store_mod = require "luagent.agent.journal.sqlite"

local q = helpers.quote
local lines = helpers.lines

local tempdir = helpers.tempdir

-- The claims of a journal, as rows.
local function claims(db)
  local store = assert(store_mod.open(db))
  local rows = assert(assert(store.db:prepare("SELECT * FROM claims")):run())
  store:close()
  return rows
end

-- Two resumes of one run started together; once one of them has exited,
-- or both wait inside a live step (nothing kept them apart), the waiting
-- step may go on. Each writes its exit status to rc<name>.
local TWO = [[
D=$1; ID=$2
one() { STEPS_EFFECTS="$D/effects" STEPS_WAIT_DIR="$D" "$BIN" resume --journal "$D/runs.db" "$ID" \
  >"$D/out$1" 2>"$D/err$1"; echo $? >"$D/rc$1"; }
one a & one b &
i=0
while [ ! -e "$D/rca" ] && [ ! -e "$D/rcb" ] && [ "$(ls "$D" | grep -c '^waiting\.')" -lt 2 ] && [ $i -lt 6000 ]; do
  sleep 0.02; i=$((i+1))
done
touch "$D/go"
wait
]]

describe("two `luagent resume` of one killed run at once", function()
  it("run it in one process: the other is refused with exit 2 naming the owner; each step ran once", function()
    local dir = tempdir()
    local db = dir .. "/runs.db"
    local cmd = string.format("STEPS_EFFECTS=%s STEPS_KILL_AFTER=5 %s run --journal %s spec/fixtures/durable/steps.lua "
      .. ">%s 2>%s", q(dir .. "/effects"), q(helpers.bin), q(db), q(dir .. "/out1"), q(dir .. "/err1"))
    local _, _, code = os.execute(cmd)
    assert.equal(137, code, helpers.slurp(dir .. "/err1"))
    local id = assert(helpers.slurp(dir .. "/err1"):match("luagent: durable run (%S+)"))
    assert.equal(5, #lines(dir .. "/effects"))
    -- the killed process's claim is still there (checked below), its pid gone
    local read_claims, left = pcall(claims, db)

    local script = helpers.tempfile(TWO, ".sh")
    assert(os.execute(string.format("BIN=%s sh %s %s %s", q(helpers.bin), q(script), q(dir), q(id))))
    os.remove(script)
    local rc = { a = lines(dir .. "/rca")[1], b = lines(dir .. "/rcb")[1] }
    local ran, refused = "a", "b"
    if rc.a ~= "0" then ran, refused = "b", "a" end
    assert.equal("0", rc[ran], helpers.slurp(dir .. "/err" .. ran))
    assert.equal("2", rc[refused], "both resumes ran: " .. helpers.slurp(dir .. "/err" .. refused))
    assert.equal("answer: All 25 steps done.\n", helpers.slurp(dir .. "/out" .. ran))
    assert(read_claims, left)
    assert.equal(1, #left)
    assert.is_false(helpers.alive(left[1].pid))
    -- the refusal names the process that runs the run, and since when
    local waiting = {}
    for name in io.popen("ls " .. q(dir)):lines() do
      local pid = name:match("^waiting%.(%d+)$")
      if pid then waiting[#waiting + 1] = pid end
    end
    assert.equal(1, #waiting)
    local host = assert(io.open("/proc/sys/kernel/hostname")):read("l")
    local err = helpers.slurp(dir .. "/err" .. refused)
    assert.matches("run " .. id:gsub("%p", "%%%0") .. " is being run by pid " .. waiting[1] .. "@"
      .. host:gsub("%p", "%%%0") .. " since %d%d%d%d%-%d%d%-%d%d %d%d:%d%d:%d%d UTC", err)
    assert.equal("", helpers.slurp(dir .. "/out" .. refused))
    -- every side effect once: steps 1 to 25, each with its own key
    local seen, effects = {}, lines(dir .. "/effects")
    for _, l in ipairs(effects) do
      local n, key = l:match("^(%d+) (%S+)$")
      assert.is_nil(seen[n], "step " .. tostring(n) .. " ran twice")
      seen[n] = true
      assert.equal(id .. ":stepper#1/1/t" .. n .. "/c1", key)
    end
    assert.equal(25, #effects)
    -- the run ended: its claim is gone
    assert.same({}, claims(db))
    os.execute("rm -rf " .. q(dir))
  end)

  it("a run that ends lets its claim go; resumed, it is claimed and let go again", function()
    local dir = tempdir()
    local db = dir .. "/runs.db"
    local env = string.format("STEPS_EFFECTS=%s STEPS_N=3", q(dir .. "/effects"))
    local r = os.execute(string.format("%s %s run --journal %s spec/fixtures/durable/steps.lua >/dev/null 2>%s", env,
      q(helpers.bin), q(db), q(dir .. "/err")))
    assert(r, helpers.slurp(dir .. "/err"))
    local id = assert(helpers.slurp(dir .. "/err"):match("luagent: durable run (%S+)"))
    assert.same({}, claims(db))
    r = os.execute(string.format("%s %s resume --journal %s %s >/dev/null 2>%s", env, q(helpers.bin), q(db), q(id),
      q(dir .. "/err")))
    assert(r, helpers.slurp(dir .. "/err"))
    assert.same({}, claims(db))
    assert.equal(3, #lines(dir .. "/effects"))
    os.execute("rm -rf " .. q(dir))
  end)

end)

describe("a durable run", function()
  -- The heartbeat sleeps in the background: a durable script whose tasks
  -- wait on each other is reported as deadlocked, as any script is, on
  -- either clock (`timeout` bounds the run should the heartbeat keep it up).
  for _, clock in ipairs { "real", "virtual" } do
    it("whose script deadlocks is reported so on the " .. clock .. " clock, its heartbeat beating or not", function()
      local dir = tempdir()
      local script = helpers.tempfile([[
        local luagent = require "luagent"
        local a, b
        a = luagent.spawn(function() return b:join() end)
        b = luagent.spawn(function() return a:join() end)
      ]], ".lua")
      local words = { "timeout", "-s", "KILL", "60", q(helpers.bin), "run", "--durable", "--journal", q(dir .. "/runs.db") }
      if clock == "virtual" then words[#words + 1] = "--virtual-clock" end
      words[#words + 1] = q(script)
      local _, _, code = os.execute(table.concat(words, " ") .. " >/dev/null 2>" .. q(dir .. "/err"))
      local err = helpers.slurp(dir .. "/err")
      os.remove(script)
      assert.equal(1, code, err)
      assert.matches("luagent: deadlock: 2 task%(s%) wait on something that can never happen", err)
      assert.same({}, claims(dir .. "/runs.db"))
      -- the run did not end well: a resume may take it on
      local store = assert(store_mod.open(dir .. "/runs.db"))
      local rows = assert(assert(store.db:prepare("SELECT status FROM runs")):run())
      store:close()
      assert.same({ { status = "failed" } }, rows)
      os.execute("rm -rf " .. q(dir))
    end)
  end

  it("that a usage error stops before its script runs is recorded as failed, not left running", function()
    local dir = tempdir()
    local script = helpers.tempfile("print('never')\n", ".lua")
    local _, _, code = os.execute(string.format("%s run --durable --journal %s --policy %s %s >/dev/null 2>%s",
      q(helpers.bin), q(dir .. "/runs.db"), q(dir .. "/none.lua"), q(script), q(dir .. "/err")))
    os.remove(script)
    assert.equal(2, code, helpers.slurp(dir .. "/err"))
    local store = assert(store_mod.open(dir .. "/runs.db"))
    local rows = assert(assert(store.db:prepare("SELECT status FROM runs")):run())
    store:close()
    assert.same({ { status = "failed" } }, rows)
    assert.same({}, claims(dir .. "/runs.db"))
    os.execute("rm -rf " .. q(dir))
  end)
end)
