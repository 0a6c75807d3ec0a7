-- Child processes on the loop (host/process.c): argv without a shell, stdin,
-- captured output with a cap, exit status, and process-group kills that
-- reach a child ignoring SIGTERM and the child it started.
local luagent = require "luagent"
local core = require "luagent.core"

local helpers = require "spec.support.helpers"

-- True when `pid` no longer runs (gone, or a zombie nobody reaped yet).
local function dead(pid) return not helpers.alive(pid) end

-- Waits (real time, polling) until `pred()` holds or `limit` seconds pass.
local function eventually(pred, limit)
  local t0 = luagent.now()
  while not pred() do
    if luagent.now() - t0 > limit then return false end
    luagent.sleep(0.01)
  end
  return true
end

describe("process_spawn", function()
  it("runs argv without a shell and captures stdout, stderr and the exit code", function()
    local p = assert(core.process_spawn({ "sh", "-c", 'echo "$1 $2"; echo oops >&2; exit 3', "x", "a b", "$HOME" }))
    local r = p:wait()
    assert.equal("a b $HOME\n", r.stdout)
    assert.equal("oops\n", r.stderr)
    assert.equal(3, r.code)
    assert.is_nil(r.signal)
    assert.is_false(r.killed)
    assert.same(r, p:wait()) -- the result of a second wait is the same data
    p:close()
  end)

  it("ends a child whose detached grandchild holds its pipes, keeping what was read", function()
    -- setsid takes the grandchild out of the group (no group kill reaches
    -- it) while it keeps stdout open; the child's exit must still end the wait
    local p = assert(core.process_spawn({ "sh", "-c", "setsid sleep 30 & echo $! ; echo done" }))
    local t0 = luagent.now()
    local r = p:wait()
    assert.is_true(luagent.now() - t0 < 10, "the wait ended after the drain, not the grandchild")
    local grandchild, rest = r.stdout:match("^(%d+)\n(.*)$")
    assert.equal("done\n", rest)
    assert.equal(0, r.code)
    p:close()
    os.execute("kill " .. grandchild .. " 2>/dev/null")
  end)

  it("kills what the child left running in its group when it exits: its output ends at once", function()
    -- a job put in the background inherits stdout: until it is gone the
    -- pipe has no end, and it must not outlive the child
    local p = assert(core.process_spawn({ "sh", "-c", "sleep 1000 & echo $!; echo hi" }))
    local r = p:wait()
    local bg, rest = r.stdout:match("^(%d+)\n(.*)$")
    finally(function() os.execute("kill " .. bg .. " 2>/dev/null") end) -- should it have outlived it
    assert.equal("hi\n", rest)
    assert.equal(0, r.code)
    assert.is_false(r.killed) -- the child itself exited as it would
    p:close()
    assert.is_true(eventually(function() return dead(bg) end, 5), "the background job outlived its group's leader")
  end)

  it("kills a stream child's leftovers too when it exits", function()
    local p = assert(core.process_spawn({ "sh", "-c", "sleep 1000 & echo $!; read -r x; exit 0" }, { stream = true }))
    local bg = assert(tonumber(p:read_line()))
    finally(function() os.execute("kill " .. bg .. " 2>/dev/null") end)
    p:close_stdin()
    assert.equal(0, p:wait().code)
    assert.is_true(eventually(function() return dead(bg) end, 5), "the background job outlived its group's leader")
    p:close()
  end)

  it("writes stdin and closes it", function()
    local p = assert(core.process_spawn({ "cat" }, { stdin = '{"a":1}' }))
    local r = p:wait()
    assert.equal('{"a":1}', r.stdout)
    assert.equal(0, r.code)
  end)

  it("keeps max_output bytes per stream and counts the rest", function()
    local p = assert(core.process_spawn({ "head", "-c", "100000", "/dev/zero" }, { max_output = 1000 }))
    local r = p:wait()
    assert.equal(1000, #r.stdout)
    assert.equal(99000, r.stdout_dropped)
    assert.equal(0, r.code)
  end)

  it("returns nil and a `process` error for a program that does not exist", function()
    local p, err = core.process_spawn({ "/nonexistent/luagent-tool" })
    assert.is_nil(p)
    assert.equal("process", err.kind)
    assert.matches("cannot start '/nonexistent/luagent%-tool'", err.message)
  end)

  it("refuses bad argv", function()
    assert.has_error(function() core.process_spawn({}) end)
    assert.has_error(function() core.process_spawn({ "echo", 3 }) end)
  end)

  it("runs many children at once as tasks", function()
    local tasks = {}
    for i = 1, 20 do
      tasks[i] = luagent.spawn(function()
        return core.process_spawn({ "sh", "-c", "echo " .. i }):wait().stdout
      end)
    end
    for i = 1, 20 do assert.equal(i .. "\n", tasks[i]:join()) end
  end)
end)

describe("killing a process group", function()
  local pidfile
  before_each(function() pidfile = os.tmpname() end)
  after_each(function() os.remove(pidfile) end)

  -- A child that ignores SIGTERM and starts a grandchild that ignores it
  -- too (SIG_IGN survives exec), writing the grandchild's pid to pidfile.
  local function stubborn(grace)
    return assert(core.process_spawn({ "sh", "-c",
      'trap "" TERM; sleep 30 & echo $! > "$1"; wait; wait', "sh", pidfile }, { grace = grace }))
  end

  local function grandchild()
    local f = io.open(pidfile)
    local pid = f and tonumber(f:read("a"))
    if f then f:close() end
    return pid
  end

  it("a cancelled wait kills a child ignoring SIGTERM, and its own child, after the grace", function()
    local p = stubborn(0.2)
    assert.is_true(eventually(function() return grandchild() ~= nil end, 5))
    local gpid, pid = grandchild(), p:pid()
    local t0 = luagent.now()
    local ok, err = pcall(luagent.deadline, 0.05, p.wait, p)
    assert.is_false(ok)
    assert.equal("timeout", err.kind)
    -- SIGTERM was ignored: both still run until the grace ends
    assert.is_false(dead(pid))
    assert.is_false(dead(gpid))
    local r = p:wait()
    assert.equal(9, r.signal)
    assert.is_true(r.killed)
    assert.is_true(luagent.now() - t0 >= 0.2)
    assert.is_true(eventually(function() return dead(gpid) end, 5))
  end)

  it("closing a running process kills its group at once", function()
    local p = stubborn(10)
    assert.is_true(eventually(function() return grandchild() ~= nil end, 5))
    local gpid, pid = grandchild(), p:pid()
    p:close()
    assert.is_true(eventually(function() return dead(pid) and dead(gpid) end, 5))
    assert.has_error(function() p:wait() end, "wait: process is closed")
  end)

  it("a wait ended by another task's close returns nil, err; use after close raises", function()
    local p = assert(core.process_spawn({ "sleep", "30" }))
    local waiter = luagent.spawn(function() return p:wait() end)
    luagent.sleep(0.01)
    p:close()
    local r, err = waiter:join()
    assert.is_nil(r)
    assert.equal("eof", err.kind)
    assert.matches("wait: the process was closed while this task waited", err.message)
    local ok, e = pcall(p.wait, p)
    assert.is_false(ok)
    assert.matches("wait: process is closed", e)
  end)

  it("sends nothing once the child exited (its group's id may be someone else's): kill says false", function()
    -- the child exits at once; a grandchild that left the group holds its
    -- stdout, so the process is not finished for the drain's second
    local p = assert(core.process_spawn({ "sh", "-c", 'setsid sleep 3 & echo $! > "$1"; sleep 0.2', "sh", pidfile },
      { grace = 0.2 }))
    local pid = p:pid()
    finally(function()
      local gpid = grandchild()
      if gpid then os.execute("kill -9 " .. gpid .. " 2>/dev/null") end
    end)
    assert.is_true(eventually(function() -- reaped: not even a zombie
      local f = io.open("/proc/" .. pid .. "/stat")
      if f then f:close() end
      return f == nil
    end, 5))
    assert.is_false(p:finished())
    assert.is_false(p:kill())
    assert.is_false(p:kill(0))
    local r = p:wait()
    assert.equal(0, r.code)
    assert.is_false(r.killed)
    local q = assert(core.process_spawn({ "sleep", "30" }))
    assert.is_true(q:kill(0))
    assert.is_true(q:wait().killed)
  end)

  it("closed after its exit while a process that left its group holds its pipes, it is no work any more", function()
    -- the drain would have ended the output; a close before it fires must
    -- end it too, or the child counts as real work (and busy) for good
    local p = assert(core.process_spawn({ "sh", "-c", 'setsid sleep 20 & echo $! > "$1"; sleep .1; echo hi', "sh", pidfile }))
    local pid = p:pid()
    finally(function()
      local gpid = grandchild()
      if gpid then os.execute("kill -9 " .. gpid .. " 2>/dev/null") end
    end)
    assert.is_true(eventually(function() -- reaped, the drain not yet over
      local f = io.open("/proc/" .. pid .. "/stat")
      if f then f:close() end
      return f == nil
    end, 5))
    assert.is_false(p:finished())
    assert.equal(1, luagent.stats().real)
    p:close()
    assert.equal(0, luagent.stats().real, "a closed child is no real work")
    assert.equal(0, luagent.stats().busy)
    luagent.clock.virtual()
    local started = os.time()
    local ok, err = pcall(luagent.sleep, 30)
    luagent.clock.real()
    assert(ok, err)
    assert.is_true(os.time() - started < 10, "the virtual sleep jumped")
  end)

  it("kill(0) sends SIGKILL at once; a cooperative child ends on SIGTERM", function()
    local p = assert(core.process_spawn({ "sleep", "30" }))
    p:kill()
    local r = p:wait()
    assert.equal(15, r.signal)
    local q = stubborn(10)
    assert.is_true(eventually(function() return grandchild() ~= nil end, 5))
    q:kill(0)
    assert.equal(9, q:wait().signal)
  end)
end)

describe("children at luagent's exit", function()
  it("are killed, group and all, whether the script returns or calls os.exit while they run", function()
    for _, ending in ipairs { "return", "os.exit(3)" } do
      local pidfile = os.tmpname()
      local r = helpers.run_script(string.format([[
        local core = require "luagent.core"
        local p = assert(core.process_spawn({ "sh", "-c", 'sleep 1000 & echo $$ $! > "$1"; sleep 1000', "sh", %q }))
        while io.open(%q):read("a") == "" do require("luagent").sleep(0.01) end
        %s]], pidfile, pidfile, ending))
      local leader, job = helpers.slurp(pidfile):match("^(%d+) (%d+)")
      os.remove(pidfile)
      finally(function() os.execute("kill -9 -" .. leader .. " 2>/dev/null") end)
      assert.equal(ending == "return" and 0 or 3, r.code, r.stderr)
      assert.is_true(eventually(function() return dead(leader) and dead(job) end, 5), ending .. ": a child outlived luagent")
    end
  end)
end)

describe("a stream process (a long-lived peer)", function()
  it("takes writes on its open stdin and gives its stdout line by line", function()
    local p = assert(core.process_spawn({ "sh", "-c", 'while read -r l; do echo "got $l"; done; printf tail' },
      { stream = true }))
    assert.is_true(p:write("one\ntwo\r\n"))
    assert.equal("got one", p:read_line())
    assert.equal("got two", p:read_line()) -- "\r\n" ends a line too
    assert.is_true(p:write("three\n"))
    assert.equal("got three", p:read_line())
    p:close_stdin()
    assert.equal("tail", p:read_line()) -- a last line without its end
    assert.is_nil(p:read_line())
    assert.equal(0, p:wait().code)
    local ok, err = p:write("late\n")
    assert.is_nil(ok)
    assert.equal("eof", err.kind)
    p:close()
  end)

  it("says how many written bytes wait for a child that does not read them", function()
    local block = ("x"):rep(64 * 1024)
    local idle = assert(core.process_spawn({ "sleep", "30" }, { stream = true }))
    assert.equal(0, idle:queued())
    for _ = 1, 8 do assert.is_true(idle:write(block)) end
    -- the pipe holds some (64 KiB on Linux); the rest waits here
    assert.is_true(idle:queued() >= 256 * 1024, tostring(idle:queued()))
    idle:close_stdin()
    assert.equal(0, idle:queued())
    idle:close()

    local reader = assert(core.process_spawn({ "sh", "-c", "cat >/dev/null" }, { stream = true }))
    for _ = 1, 8 do assert.is_true(reader:write(block)) end
    assert.is_true(eventually(function() return reader:queued() == 0 end, 10)) -- read: none waits
    reader:close()
  end)

  it("keeps the latest bytes of stderr and sets the child's environment", function()
    local p = assert(core.process_spawn({ "sh", "-c",
      'for i in 1 2 3 4 5 6 7 8 9; do echo "line $i of stderr" >&2; done; echo "$LG_A|${HOME-unset}"; read -r x' },
      { stream = true, max_output = 40, env = { LG_A = "set here", HOME = false } }))
    assert.equal("set here|unset", p:read_line())
    local err = p:stderr()
    assert.is_true(#err <= 40)
    assert.matches("line 9 of stderr\n$", err)
    p:close()
  end)

  it("refuses a line longer than max_output, and a cancelled read leaves the child running", function()
    local p = assert(core.process_spawn({ "sh", "-c", "head -c 300 /dev/zero | tr '\\0' x; echo; sleep 30" },
      { stream = true, max_output = 100 }))
    local line, err = p:read_line()
    assert.is_nil(line)
    assert.equal("protocol", err.kind)
    assert.equal("read_line: a line of stdout is longer than 100 bytes (max_output)", err.message)
    p:close()

    local q = assert(core.process_spawn({ "sh", "-c", "read -r x; echo $x" }, { stream = true }))
    local ok, e = pcall(luagent.deadline, 0.05, q.read_line, q)
    assert.is_false(ok)
    assert.equal("timeout", e.kind)
    assert.is_false(q:finished())
    q:write("still here\n")
    assert.equal("still here", q:read_line())
    q:close()
  end)

  it("gives the child opts.env alone with inherit_env = false, and lists our environment", function()
    local ours = core.environment()
    assert.equal(os.getenv("PATH"), ours.PATH)
    local p = assert(core.process_spawn({ "/usr/bin/env" }, { env = { LG_ONLY = "this", LG_OUT = false },
      inherit_env = false }))
    local r = p:wait()
    p:close()
    assert.equal("LG_ONLY=this\n", r.stdout)
    assert.has_error(function() core.process_spawn({ "true" }, { inherit_env = false }) end,
      "process_spawn: opts.inherit_env = false needs opts.env")
  end)

  it("raises for a bad env", function()
    assert.has_error(function() core.process_spawn({ "true" }, { env = { A = 1 } }) end,
      "process_spawn: opts.env must map names to strings (or false)")
    assert.has_error(function() core.process_spawn({ "true" }, { env = { ["A=B"] = "x" } }) end,
      "process_spawn: opts.env: bad variable name 'A=B'")
  end)
end)
