-- rt:close() while its agents run, and what a closed runtime refuses.
local luagent = require "luagent"
local core = require "luagent.core"
local mock = require "luagent.mock"

local tempdb, cleanup = require("spec.support.helpers").tempdb, require("spec.support.helpers").remove_db

describe("rt:close() while its agents run", function()
  it("aborts a durable agent in its backoff: the run ends with agent_end, not a journal error", function()
    local srv = assert(mock.start { faults = "503" })
    local p = tempdb()
    local rt = luagent.runtime { journal_file = p,
      run_info = { script = "s.lua", args = {}, options = {}, quiet = true } }
    local a = rt:agent { name = "d", durable = true,
      model = { kind = "openai", model = "m", base_url = srv.url .. "/v1", api_key = "k" } }
    local last, failure
    local task = core.spawn(function()
      local ok, err = pcall(function() last = a:run("go") end)
      if not ok then failure = err end
    end)
    while #srv:requests() == 0 do luagent.sleep(0.01) end -- in its backoff after the first 503
    assert.is_true(a.running)
    rt:close()
    assert.is_false(a.running) -- close joined the agent's task
    task:join()
    srv:close()
    cleanup(p)
    assert.is_nil(failure)
    assert.equal("agent_end", last.type)
    assert.equal("aborted", last.stop_reason)
  end)
end)

describe("rt.toolsets", function()
  it("keeps no tool set its opener closed and dropped", function()
    local rt = luagent.runtime {}
    rt:own({ close = function() end })
    collectgarbage()
    collectgarbage()
    assert.is_nil(next(rt.toolsets))
    rt:close()
  end)
end)

describe("a closed runtime", function()
  it("raises 'runtime: closed', naming the caller's line, from its methods", function()
    local rt = luagent.runtime { max_cost = 0 }
    rt:close()
    local model = { kind = "openai", model = "m", base_url = "http://127.0.0.1:9/v1", api_key = "k" }
    local calls = {
      stream = function() local r = rt:stream { model = model, messages = { { role = "user", content = "hi" } } } return r end,
      complete = function() local r = rt:complete { model = model, messages = { { role = "user", content = "hi" } } } return r end,
      agent = function() local r = rt:agent { model = model } return r end,
      provider = function() local r = rt:provider "openai/m" return r end,
      trace = function() local r = rt:trace() return r end,
      meter = function() local r = rt:meter "cost" return r end,
      subscribe = function() local r = rt:subscribe(function() end) return r end,
    }
    -- (no tail calls: the line blamed is the one that called the method)
    for name, fn in pairs(calls) do
      local ok, err = pcall(fn)
      assert.is_false(ok, name)
      assert.equal("spec/runtime_close_spec.lua:" .. debug.getinfo(fn, "S").linedefined .. ": runtime: closed", err, name)
    end
  end)
end)

describe("a runtime's durable run", function()
  it("says its notes to the runtime's log_sink, at info, when the runtime has one", function()
    local srv = assert(mock.start { script = function() return { text = "done" } end })
    local p = tempdb()
    local lines = {}
    local rt = luagent.runtime { journal_file = p, log_format = "text", log_level = "info",
      log_sink = function(level, line) lines[#lines + 1] = level .. " " .. line end,
      run_info = { script = "s.lua", args = {}, options = {} } }
    local last = rt:agent { name = "d", durable = true,
      model = { kind = "openai", model = "m", base_url = srv.url .. "/v1", api_key = "k" } }:run("go")
    assert.equal("stop", last.stop_reason)
    local id = rt.journal.run.id
    rt:close()
    srv:close()
    cleanup(p)
    assert.equal(1, #lines, table.concat(lines, "\n"))
    assert.matches("^info .*luagent: durable run " .. id:gsub("%-", "%%-") .. " %(journal ", lines[1])
  end)
end)
