-- The demo (`make run`): the triage agent end to end through the real
-- binary, on the embedded mock replaying its cassette with a 503 injected on
-- the first model request. Each tool call, the retry and the answer are
-- shown once; create_issue ran once.
local helpers = require "spec.support.helpers"

local function count(s, pattern)
  return select(2, s:gsub(pattern, ""))
end

describe("examples/triage.lua", function()
  it("triages on the embedded default: tool calls, the 503 and its retry, the answer, each once", function()
    local r = helpers.run("run", "--faults", "503@1", "examples/triage.lua")
    assert.equal(0, r.code, r.stderr)
    local out = r.stdout
    assert.equal(1, count(out, "%[model call attempt 1 of 6 failed: http: HTTP 503; retrying in"))
    assert.equal(1, count(out, "%-> crash_list {}"))
    assert.equal(1, count(out, '%-> crash_show {"id":"c%-1041"}'))
    assert.equal(1, count(out, '%-> crash_show {"id":"c%-1043"}'))
    assert.equal(1, count(out, '%-> grep {"pattern":"pool_free"}'))
    assert.equal(1, count(out, "<%- grep: crashes/c%-1042.txt:9:  #1 pool_free"))
    assert.equal(3, count(out, "%-> issue_search"))
    assert.equal(1, count(out, "%-> create_issue"))
    assert.equal(1, count(out, "<%- create_issue: created issue: search%-indexer 0.9.3"))
    assert.equal(1, count(out, "Triage of 3 crash reports:"))
    assert.equal(1, count(out, "model: I'll start with the list of new crashes."))
    assert.matches("%[stop after 5 turn%(s%); tokens in %d+, out %d+; cost %$[%d.]+%]", r.stdout)
    assert.not_matches("divergence", r.stderr)
    assert.not_matches("WARN", r.stderr)
  end)
end)
