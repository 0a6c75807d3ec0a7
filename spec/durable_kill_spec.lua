-- Durable runs survive SIGKILL at every point: the triage agent (on the
-- embedded mock replaying its cassette) runs with --durable and is killed
-- after the k-th line of its --events file, for every k of one run; each
-- is resumed with `luagent resume`. Then: the final answer is the
-- uninterrupted run's, create_issue (no safety flag; it counts its own runs
-- in its tracker file) ran exactly once, and the only model request sent
-- twice is the one of the turn in flight at the kill.
local helpers = require "spec.support.helpers"
local json = require "luagent.base.json"

local q = helpers.quote

local lines = helpers.lines

local function events(path)
  local out = {}
  for _, l in ipairs(lines(path)) do out[#out + 1] = assert(json.decode(l), l) end
  return out
end

-- The answer of a run: the last message of the history, which an agent_end
-- line carries as last_message.
local function answer(evs)
  for i = #evs, 1, -1 do
    local e = evs[i]
    if e.type == "agent_end" then return e.stop_reason, e.last_message.content end
  end
end

-- One invocation per kill point k (run killed, then resumed), as a shell
-- script for xargs -P.
local ONE = [[
k=$1; d=$DIR/$k; mkdir -p "$d"
LUAGENT_SPEC_KILL_AFTER=$k TRIAGE_ISSUES=$d/issues "$BIN" run --durable --journal "$d/runs.db" \
  --cassette examples/triage.cassette.jsonl --fast --events "jsonl:$d/ev1" \
  spec/fixtures/durable/killed_triage.lua >"$d/out1" 2>"$d/err1"
echo $? >"$d/rc1"
id=$(sed -n 's/^luagent: durable run \([^ ]*\) .*/\1/p' "$d/err1")
TRIAGE_ISSUES=$d/issues "$BIN" resume --journal "$d/runs.db" --events "jsonl:$d/ev2" "$id" >"$d/out2" 2>"$d/err2"
echo $? >"$d/rc2"
]]

describe("a durable triage run killed with SIGKILL", function()
  it("resumes from every event line to the same answer, filing the issue once, re-sending only the turn in flight", function()
    local dir = os.tmpname()
    os.remove(dir)
    assert(os.execute("mkdir -p " .. q(dir .. "/ref")))
    -- the uninterrupted run
    local ref = dir .. "/ref"
    local cmd = string.format("TRIAGE_ISSUES=%s %s run --durable --journal %s --cassette examples/triage.cassette.jsonl "
      .. "--fast --events jsonl:%s spec/fixtures/durable/killed_triage.lua >%s 2>%s", q(ref .. "/issues"), q(helpers.bin),
      q(ref .. "/runs.db"), q(ref .. "/ev"), q(ref .. "/out"), q(ref .. "/err"))
    assert(os.execute(cmd), helpers.slurp(ref .. "/err"))
    local ref_evs = events(ref .. "/ev")
    local n = #ref_evs
    local stop, want = answer(ref_evs)
    assert.equal("stop", stop)
    assert.matches("Triage of 3 crash reports", want)
    assert.equal(1, #lines(ref .. "/issues"))
    local turns = 0
    for _, e in ipairs(ref_evs) do if e.type == "turn_start" then turns = turns + 1 end end
    assert.equal(5, turns)
    assert.is_true(n > 100, "a run of " .. n .. " events")

    -- every kill point, in parallel
    local script = dir .. "/one.sh"
    local f = assert(io.open(script, "w"))
    f:write(ONE)
    f:close()
    local par = tonumber((io.popen("nproc"):read("a"))) or 2
    assert(os.execute(string.format("cd %s && seq 0 %d | DIR=%s BIN=%s xargs -P %d -n 1 sh %s", q(os.getenv("PWD") or "."),
      n, q(dir), q(helpers.bin), math.max(4, par * 3), q(script))))

    local in_flight = 0
    for k = 0, n do
      local d = dir .. "/" .. k
      local where = "kill after line " .. k .. ": "
      assert.equal("137", lines(d .. "/rc1")[1], where .. helpers.slurp(d .. "/err1"))
      assert.equal("0", lines(d .. "/rc2")[1], where .. helpers.slurp(d .. "/err2"))
      local ev1, ev2 = events(d .. "/ev1"), events(d .. "/ev2")
      assert.equal(k, #ev1, where .. "the kill is exact")
      local s, got = answer(ev2)
      assert.equal("stop", s, where)
      assert.equal(want, got, where)
      assert.equal(1, #lines(d .. "/issues"), where .. "create_issue ran once")
      -- turns answered before the kill (their final message_end line is
      -- out) are replayed, and so is the turn whose final message_end the
      -- kill came at: the journal commits a turn before the bus (and the
      -- --events file) is told of it; each other turn is requested once on
      -- resume
      local done1, started1, replayed, live = 0, 0, 0, 0
      for _, e in ipairs(ev1) do
        if e.type == "message_end" and e.final then done1 = done1 + 1 end
        if e.type == "turn_start" then started1 = started1 + 1 end
      end
      for _, e in ipairs(ev2) do
        if e.type == "message_end" and e.final and e.replayed then replayed = replayed + 1 end
        if e.type == "message_start" and not e.replayed then live = live + 1 end
      end
      local at_kill = ref_evs[k + 1] -- the event the kill came at, not written
      local committed = done1 + ((at_kill and at_kill.type == "message_end" and at_kill.final) and 1 or 0)
      assert.equal(committed, replayed, where .. "every answered turn replays")
      assert.equal(turns, replayed + live, where .. "each remaining turn is requested once")
      assert.is_true(started1 - committed <= 1, where .. "at most the turn in flight is sent again")
      in_flight = in_flight + (started1 - committed)
    end
    -- the sweep did kill turns in flight (their requests were sent again)
    assert.is_true(in_flight > 0)
    os.execute("rm -rf " .. q(dir))
  end)
end)
