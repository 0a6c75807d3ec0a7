-- luagent.runtime{...} and its methods (rt:provider, rt:complete, rt:stream,
-- rt:subscribe and the function it returns, rt:agent, rt:health,
-- rt:close) work the same from `luagent run` and from a plain lua5.4
-- (spec/install_spec.lua runs the same script on the rock).
local h = require "spec.support.helpers"

local EXPECTED = table.concat({
  "provider\topenai\tgpt-4o-mini\ttrue",
  "complete\tstring\t1",
  "stream\ttrue",
  "agent\tagent_end\tstop",
  "subscribed\t2", -- the complete's and the stream's message_end; none after unsubscribing
  "health\t1",
  "closed",
}, "\n") .. "\n"

describe("luagent.runtime{...}", function()
  it("makes a runtime whose methods work under `luagent run`", function()
    local r = h.run_env({ within = 60 }, "run", "spec/fixtures/runtime_api.lua")
    assert.equal("", r.stderr)
    assert.equal(0, r.code)
    assert.equal(EXPECTED, r.stdout)
  end)

  it("makes a runtime whose methods work from a plain lua5.4", function()
    local so = io.open("build/lua/luagent/core.so")
    if not so then
      pending("skipped: build/lua/luagent/core.so is not built (run `make` first)")
      return
    end
    so:close()
    local out = os.tmpname()
    local ok = os.execute("LUA_PATH='lua/?.lua;lua/?/init.lua;;' LUA_CPATH='build/lua/?.so;;' timeout -s KILL 60 lua5.4 "
      .. "spec/fixtures/runtime_api.lua >" .. out .. " 2>&1 </dev/null")
    local text = h.slurp(out)
    os.remove(out)
    assert(ok, text)
    assert.equal(EXPECTED, text)
  end)

  it("closes its policy watchers and tool sets, and closing twice is harmless", function()
    local luagent = require "luagent"
    local rt = luagent.runtime { policy = "yoagent" }
    local loader = rt.policies:resolve(nil)
    assert.truthy(loader.watcher)
    local closed = 0
    rt:own({ close = function() closed = closed + 1 end })
    rt:close()
    rt:close()
    assert.equal(1, closed)
    luagent.sleep(0) -- the watcher's task runs its cancellation
    local st = loader.watcher:status()
    assert.is_true(st == "failed" or st == "done", st)
    assert.is_nil(next(rt.policies.loaders))
  end)

  it("checks its settings as configure does, naming the setting", function()
    local luagent = require "luagent"
    local ok, err = pcall(luagent.runtime, { sede = 1 })
    assert.is_false(ok)
    assert.matches("no setting 'sede'", err)
    ok, err = pcall(luagent.runtime, { seed = "x" })
    assert.is_false(ok)
    assert.matches("seed must be an integer", err)
  end)
end)

-- A misuse error names the line that made the call (error levels through
-- the face's tail calls).
describe("misuse errors name the caller's line", function()
  local luagent = require "luagent"
  local function blamed(fn)
    local ok, err = pcall(fn)
    assert.is_false(ok)
    return err
  end
  local function here(fn) return "spec/runtime_api_spec.lua:" .. debug.getinfo(fn, "S").linedefined .. ": " end

  it("for luagent.configure, rt:configure, rt.settings:set and luagent.runtime", function()
    local rt = luagent.runtime {}
    local cases = {
      function() luagent.configure { sede = 1 } end,
      function() rt:configure { sede = 1 } end,
      function() rt.settings:set { sede = 1 } end,
      function() luagent.runtime { sede = 1 } end,
    }
    for i, fn in ipairs(cases) do
      local err = blamed(fn)
      assert.equal(here(fn), err:sub(1, #here(fn)), "case " .. i .. ": " .. err)
      assert.matches("no setting 'sede'", err)
    end
    rt:close()
  end)

  it("for luagent.tools.mcp", function()
    local cases = {
      function() luagent.tools.mcp { bogus = 1 } end,
      function() luagent.tools.mcp { command = { "x" }, env = { A = 1 } } end,
      function() luagent.tools.mcp { command = { "x" }, tool_policy = { trust_hints = 1 } } end,
    }
    for i, fn in ipairs(cases) do
      local err = blamed(fn)
      assert.equal(here(fn), err:sub(1, #here(fn)), "case " .. i .. ": " .. err)
    end
  end)
end)
