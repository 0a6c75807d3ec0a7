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
    assert.equal(1, count(out, "%[model call attempt 1 of 6 failed: http: HTTP 503 from POST http://127%.0%.0%.1:%d+/v1/chat/completions: server_error: The engine is currently overloaded, please try again later%.; retrying in"))
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
    assert.matches("%[stop after 5 turn%(s%); tokens in %d+, out %d+%]", r.stdout)
    assert.not_matches("divergence", r.stderr)
    assert.not_matches("WARN", r.stderr)
  end)

  it("shows the span tree and the cost table with --trace --cost, the failed attempt in both", function()
    local r = helpers.run("run", "--faults", "503@1", "--trace", "--cost", "examples/triage.lua")
    assert.equal(0, r.code, r.stderr)
    assert.matches("%[stop after 5 turn%(s%); tokens in %d+, out %d+; cost %$[%d.]+%]", r.stdout)
    local tree = r.stderr:match("\n(invoke_agent triage .-)\ncost ")
    assert(tree, r.stderr)
    local lines = {}
    for l in tree:gmatch("[^\n]+") do lines[#lines + 1] = l end
    assert.matches("^invoke_agent triage %S+$", lines[1])
    assert.matches("^  chat gpt%-4o%-mini %S+$", lines[2])
    assert.matches("^    attempt 1 %S+  HTTP 503, retried after %S+$", lines[3])
    assert.matches("^    attempt 2 %S+  HTTP 200$", lines[4])
    assert.matches("^  execute_tool crash_list %S+$", lines[5])
    assert.equal(5, count(tree, "\n  chat "))
    assert.equal(1, count(tree, "\n  execute_tool create_issue "))
    assert.matches("\ntriage%s+5%s+6%s+%d+%s+%d+%s+0%s+0%s+%$0%.%d+\n", r.stderr)
    assert.matches("\ntotal%s+5%s+6%s", r.stderr)
    -- the costliest turns: the first call shows its failed attempt
    assert.matches("triage turn 1, call %d+  gpt%-4o%-mini  2 attempts %(1 failed: %$0%.0000%)", r.stderr)
  end)
end)
