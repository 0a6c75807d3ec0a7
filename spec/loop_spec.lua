-- Tasks, sleep, cancellation, deadlines and the virtual clock.
local luagent = require "luagent"

-- Runs fn as a task on the virtual clock and returns its results.
local function virtual(fn)
  luagent.clock.virtual()
  local ok, a, b, c = pcall(function() return luagent.spawn(fn):join() end)
  luagent.clock.real()
  if not ok then error(a, 0) end
  return a, b, c
end

describe("spawn and join", function()
  it("returns the task's results, nils included", function()
    local t = luagent.spawn(function(a, b) return a + b, nil, "x" end, 2, 3)
    local r = table.pack(t:join())
    assert.are.same({ 5, nil, "x", n = 3 }, r)
    assert.equal("done", t:status())
  end)

  it("joins many times with the same results", function()
    local t = luagent.spawn(function() return 7 end)
    assert.equal(7, t:join())
    assert.equal(7, t:join())
  end)

  it("raises the task's error with the task's traceback", function()
    local t = luagent.spawn(function() error("boom") end)
    local ok, err = pcall(t.join, t)
    assert.is_false(ok)
    assert.matches("loop_spec.lua:%d+: boom", err)
    assert.matches("stack traceback:", err)
    assert.equal("failed", t:status())
  end)

  it("re-raises an error record as the same table, with a traceback field", function()
    local rec = luagent.errors.new("http", "503 from provider", { status = 503 })
    local t = luagent.spawn(function() error(rec) end)
    local ok, err = pcall(t.join, t)
    assert.is_false(ok)
    assert.equal(rec, err)
    assert.equal(503, err.status)
    assert.matches("stack traceback", err.traceback)
  end)

  it("lets one task join another and wait for it", function()
    local order = {}
    local a = luagent.spawn(function()
      luagent.sleep(0.01)
      order[#order + 1] = "a"
      return "A"
    end)
    local b = luagent.spawn(function()
      local r = a:join()
      order[#order + 1] = "b"
      return r .. "B"
    end)
    assert.equal("AB", b:join())
    assert.are.same({ "a", "b" }, order)
  end)

  it("refuses a task joining itself", function()
    local t
    t = luagent.spawn(function() return pcall(function() return t:join() end) end)
    local ok, err = t:join()
    assert.is_false(ok)
    assert.matches("cannot join itself", err)
  end)

  it("raises on misuse with the function's name", function()
    local ok, err = pcall(luagent.spawn, 42)
    assert.is_false(ok)
    assert.matches("bad argument #1 to '[%w.]*spawn' %(function expected", err)
    ok, err = pcall(luagent.sleep, "soon")
    assert.is_false(ok)
    assert.matches("bad argument #1 to '[%w.]*sleep' %(number expected", err)
    assert.has_error(function() luagent.deadline("x", print) end, "deadline: seconds must be a number")
  end)
end)

describe("cancellation", function()
  it("wakes a task blocked in sleep at once with kind cancelled, running <close> and pcall", function()
    local log = {}
    local t = luagent.spawn(function()
      local guard <close> = setmetatable({}, { __close = function() log[#log + 1] = "closed" end })
      local ok, err = pcall(luagent.sleep, 3600)
      log[#log + 1] = err.kind
      error(err)
    end)
    luagent.sleep(0) -- let it start and block
    assert.equal("waiting", t:status())
    local before = luagent.now()
    assert.is_true(t:cancel("user pressed stop"))
    local ok, err = pcall(t.join, t)
    assert.is_false(ok)
    assert.equal("cancelled", err.kind)
    assert.equal("user pressed stop", err.reason)
    assert.matches("user pressed stop", tostring(err))
    assert.are.same({ "cancelled", "closed" }, log)
    assert.is_true(luagent.now() - before < 1) -- at once, not after the hour
    assert.equal(0, luagent.stats().timers)  -- no timer left behind
  end)

  it("runs <close> variables of a task that does not catch the cancellation", function()
    local closed = false
    local t = luagent.spawn(function()
      local guard <close> = setmetatable({}, { __close = function() closed = true end })
      luagent.sleep(3600)
    end)
    luagent.sleep(0)
    t:cancel()
    assert.has_error(function() t:join() end)
    assert.is_true(closed)
    assert.equal(0, luagent.stats().timers)
  end)

  it("cancels a task that has not started yet without running it", function()
    local ran = false
    local t = luagent.spawn(function() ran = true end)
    t:cancel()
    local ok, err = pcall(t.join, t)
    assert.is_false(ok)
    assert.equal("cancelled", err.kind)
    assert.is_false(ran)
  end)

  it("is a no-op on a finished task", function()
    local t = luagent.spawn(function() return 1 end)
    t:join()
    assert.is_false(t:cancel())
    assert.equal(1, t:join())
  end)

  it("cancels a task blocked in join without touching the joined task", function()
    local slow = luagent.spawn(function() luagent.sleep(0.05) return "slow" end)
    local waiter = luagent.spawn(function() return slow:join() end)
    luagent.sleep(0)
    waiter:cancel()
    assert.has_error(function() waiter:join() end)
    assert.equal("slow", slow:join())
  end)
end)

describe("deadline", function()
  it("returns the results when fn finishes in time", function()
    assert.equal(42, luagent.deadline(10, function() return 42 end))
  end)

  it("cancels fn and raises kind timeout when the time is up", function()
    local closed = false
    local ok, err = pcall(luagent.deadline, 0.02, function()
      local g <close> = setmetatable({}, { __close = function() closed = true end })
      luagent.sleep(3600)
    end)
    assert.is_false(ok)
    assert.equal("timeout", err.kind)
    assert.equal("deadline", err.which)
    assert.is_true(closed)
    assert.equal(0, luagent.stats().timers)
  end)

  it("passes fn's own errors through", function()
    local ok, err = pcall(luagent.deadline, 10, function() error("inner", 0) end)
    assert.is_false(ok)
    assert.matches("^inner", err)
  end)

  it("works on the virtual clock without real waiting", function()
    local ok, err = virtual(function()
      return pcall(luagent.deadline, 30, function() luagent.sleep(60) end)
    end)
    assert.is_false(ok)
    assert.equal("timeout", err.kind)
  end)
end)

describe("the virtual clock", function()
  it("advances sleep instantly and exactly", function()
    local t0, t1 = virtual(function()
      local a = luagent.now()
      luagent.sleep(3600)
      return a, luagent.now()
    end)
    assert.equal(3600, t1 - t0)
  end)

  it("completes 10,000 concurrent sleeping tasks in simulated time", function()
    local woke, latest = virtual(function()
      local tasks, woke = {}, 0
      for i = 1, 10000 do
        tasks[i] = luagent.spawn(function()
          luagent.sleep((i % 1000) / 10) -- 0 .. 99.9 s
          woke = woke + 1
        end)
      end
      for i = 1, 10000 do tasks[i]:join() end
      return woke, luagent.now()
    end)
    assert.equal(10000, woke)
    assert.is_true(math.abs(latest - 99.9) < 1e-6)
    assert.equal(0, luagent.stats().timers)
  end)

  it("fires timers in due order, equal times in arming order", function()
    local order = virtual(function()
      local order, tasks = {}, {}
      for _, spec in ipairs({ { "c", 3 }, { "a", 1 }, { "b1", 2 }, { "b2", 2 } }) do
        tasks[#tasks + 1] = luagent.spawn(function()
          luagent.sleep(spec[2])
          order[#order + 1] = spec[1]
        end)
      end
      for _, t in ipairs(tasks) do t:join() end
      return order
    end)
    assert.are.same({ "a", "b1", "b2", "c" }, order)
  end)

  it("refuses to switch clocks while timers are armed", function()
    local t = luagent.spawn(function() luagent.sleep(0.05) end)
    luagent.sleep(0)
    assert.has_error(function() luagent.clock.virtual() end, "clock: cannot switch while timers are armed")
    t:join()
  end)
end)

describe("run", function()
  it("is refused from inside a task", function()
    local t = luagent.spawn(function() return pcall(luagent.run) end)
    local ok, err = t:join()
    assert.is_false(ok)
    assert.matches("run: called from inside a task", err)
  end)
end)

describe("sleep arguments", function()
  it("refuses NaN and infinities, and treats a negative time as 0", function()
    virtual(function()
      for _, s in ipairs({ math.huge, -math.huge, 0 / 0 }) do
        local ok, err = pcall(luagent.sleep, s)
        assert.is_false(ok, tostring(s))
        assert.matches("sleep: seconds must be a finite number", err)
      end
      local t0 = luagent.now()
      luagent.sleep(-5)
      assert.equal(t0, luagent.now())
      assert.equal(0, luagent.stats().timers)
    end)
  end)
end)

describe("task status", function()
  it("names every state: ready, running, waiting, done, failed", function()
    local seen
    local t
    t = luagent.spawn(function() seen = t:status(); luagent.sleep(0.001) end)
    assert.equal("ready", t:status())
    luagent.sleep(0)
    assert.equal("running", seen)
    assert.equal("waiting", t:status())
    t:join()
    assert.equal("done", t:status())
    local f = luagent.spawn(function() error("x") end)
    assert.has_error(function() f:join() end)
    assert.equal("failed", f:status())
  end)
end)

-- These run a script in the executable: they need a process of their own
-- (its exit report, a real SIGINT, a loop with nothing else on it).
describe("in a process of its own", function()
  local h = require "helpers"

  it("reports a failed task nobody joined with its message and traceback", function()
    local r = h.run_script([[
      local luagent = require "luagent"
      local function inner() error("boom") end
      local t = luagent.spawn(function() inner() end)
      luagent.sleep(0)
      t = nil
      collectgarbage(); collectgarbage()
    ]])
    assert.equal(0, r.code, r.stderr)
    assert.matches("a task failed and was never joined: [^\n]*:2: boom\nstack traceback:\n", r.stderr)
    assert.matches("in %a+ 'inner'", r.stderr)
  end)

  it("keeps the on_sigint task alive: a SIGINT after it was collected cancels nothing else", function()
    local r = h.run_script([[
      local luagent = require "luagent"
      local core = require "luagent.core"
      local t = luagent.spawn(function() end)
      core.on_sigint(t)
      t:join()
      t = nil
      collectgarbage(); collectgarbage()
      local others = {}
      for i = 1, 200 do others[i] = luagent.spawn(function() luagent.sleep(3600) end) end
      luagent.sleep(0)
      local pid = io.open("/proc/self/stat"):read("l"):match("^%d+")
      io.popen("kill -INT " .. pid):close() -- os.execute would ignore SIGINT meanwhile
      for _ = 1, 5000 do -- the signal arrives through the loop; at most ~5 s
        if core.interrupted() then break end
        luagent.sleep(0.001)
      end
      local hit = 0
      for i = 1, 200 do
        if others[i]:status() ~= "waiting" then hit = hit + 1 end
        others[i]:cancel()
      end
      print("cancelled by the signal: " .. hit)
    ]])
    assert.equal(130, r.code, r.stderr) -- `luagent run` exits 130 once interrupted
    assert.equal("cancelled by the signal: 0\n", r.stdout)
    assert.equal("", r.stderr)
  end)

  it("traps SIGINT for a REPL: each one wakes sigint_wait, none stops the run", function()
    local r = h.run_script([[
      local luagent = require "luagent"
      local core = require "luagent.core"
      local ok, err = pcall(core.sigint_wait)
      print(ok, (tostring(err):gsub("^.-: ", "", 1)))
      core.sigint_trap(true)
      local got = {}
      local waiter = luagent.spawn(function()
        while true do got[#got + 1] = core.sigint_wait() end
      end)
      local pid = io.open("/proc/self/stat"):read("l"):match("^%d+")
      for n = 1, 3 do -- three in all: each taken, so none ends the process
        io.popen("kill -INT " .. pid):close() -- os.execute would ignore SIGINT meanwhile
        for _ = 1, 5000 do -- the signal arrives through the loop; at most ~5 s
          if #got >= n then break end
          luagent.sleep(0.001)
        end
      end
      core.sigint_trap(false)
      waiter:cancel()
      print(#got, got[1], core.interrupted())
    ]])
    assert.equal(0, r.code, r.stderr)
    assert.equal("false\tSIGINT is not trapped (sigint_trap(true))\n3\t1\tfalse\n", r.stdout)
  end)

  it("refuses a wait inside a task's non-yieldable C call; outside a task it still waits", function()
    local r = h.run_script([[
      local luagent = require "luagent"
      -- inside a task: a sort comparator cannot yield, so a wait there raises
      -- (it would otherwise run a scheduler nested on this C stack, and the
      -- other task's 0.01 s sleep would wake only after this one's 0.5 s)
      local quick = luagent.spawn(function() luagent.sleep(0.01) return luagent.now() end)
      local t0 = luagent.now()
      local ok, err = luagent.spawn(function()
        return pcall(table.sort, { 3, 1, 2 }, function(a, b) luagent.sleep(0.5) return a < b end)
      end):join()
      print(ok, err)
      print(quick:join() - t0 < 0.25)
      -- not a task (a foreign coroutine): the wait drives the loop and works
      local x = coroutine.wrap(function()
        local v = { 3, 1, 2 }
        table.sort(v, function(a, b) luagent.sleep(0.001) return a < b end)
        return table.concat(v, ",")
      end)()
      print(x)
    ]])
    assert.equal(0, r.code, r.stderr)
    assert.matches("^false\t[^\n]*cannot wait inside a C call that cannot yield[^\n]*\ntrue\n1,2,3\n$", r.stdout)
  end)

  it("reports a deadlock though a background sleep is armed, which still wakes while others can go on", function()
    local core = require "luagent.core"
    local r = h.run_script([[
      local core = require "luagent.core"
      core.clock_virtual()
      local beats = 0
      local beat = core.spawn(function()
        while true do core.sleep(10, "background") beats = beats + 1 end
      end)
      beat:set_daemon(true)
      core.sleep(25) -- a foreground wait: the beat goes on meanwhile
      print(beats)
      local a, b
      a = core.spawn(function() return b:join() end)
      b = core.spawn(function() return a:join() end)
      local ok, err = coroutine.wrap(function() return pcall(a.join, a) end)()
      print(ok, err)
      a:cancel(); b:cancel(); beat:cancel()
    ]])
    assert.equal(0, r.code, r.stderr)
    assert.matches("^2\nfalse\t[^\n]*deadlock: waiting on something that can never happen\n$", r.stdout)
    assert.has_error(function() core.sleep(1, "later") end, "bad argument #2 to 'sleep' (invalid option 'later')")
  end)

  it("reports a blocking wait that can never end as a deadlock, and the loop goes on", function()
    local r = h.run_script([[
      local luagent = require "luagent"
      local a, b
      a = luagent.spawn(function() return b:join() end)
      b = luagent.spawn(function() return a:join() end)
      -- a foreign coroutine cannot yield to the loop: it waits blocking
      local ok, err = coroutine.wrap(function() return pcall(a.join, a) end)()
      print(ok, err)
      a:cancel(); b:cancel()
      print(luagent.spawn(function() luagent.sleep(0.001) return "after" end):join())
    ]])
    assert.equal(0, r.code, r.stderr)
    assert.matches("^false\t[^\n]*deadlock: waiting on something that can never happen\nafter\n$", r.stdout)
  end)
end)
