-- The executable's command line: messages and exit codes, and the binary
-- face agreeing with the module face.
local h = require "helpers"

describe("luagent (the executable)", function()
  it("prints usage for --help and exits 0", function()
    local r = h.run("--help")
    assert.equal(0, r.code)
    assert.matches("usage: luagent <command>", r.stdout)
    assert.matches("run FILE.lua", r.stdout)
  end)

  it("prints the version", function()
    local r = h.run("--version")
    assert.equal(0, r.code)
    assert.matches("^luagent %d+%.%d+%.%d+", r.stdout)
  end)

  it("explains `run` with `help run`", function()
    local r = h.run("help", "run")
    assert.equal(0, r.code)
    assert.matches("usage: luagent run", r.stdout)
    assert.matches("130", r.stdout)
    assert.matches("%-%-events jsonl:FILE", r.stdout)
  end)

  it("names an unknown command, exit 2", function()
    local r = h.run("frobnicate")
    assert.equal(2, r.code)
    assert.matches("unknown command 'frobnicate'", r.stderr)
    assert.matches("luagent %-%-help", r.stderr)
  end)

  it("names an unknown flag, exit 2", function()
    local r = h.run("--frob")
    assert.equal(2, r.code)
    assert.matches("unknown flag '%-%-frob'", r.stderr)
    r = h.run("run", "--nope", "x.lua")
    assert.equal(2, r.code)
    assert.matches("run: unknown flag '%-%-nope'", r.stderr)
  end)

  it("says clearly when the script is missing, exit 2", function()
    local r = h.run("run", "missing.lua")
    assert.equal(2, r.code)
    assert.matches("cannot open 'missing.lua': No such file or directory", r.stderr)
  end)

  it("reports a script error as FILE:LINE: message with a traceback, exit 1", function()
    local r = h.run_script("local x = 1\nerror('it broke')\n")
    assert.equal(1, r.code)
    assert.matches("^luagent: [^\n]+%.lua:2: it broke\n", r.stderr)
    assert.matches("stack traceback:", r.stderr)
  end)

  it("reports a syntax error with its line, exit 1", function()
    local r = h.run_script("local x = = 1\n")
    assert.equal(1, r.code)
    assert.matches("^luagent: [^\n]+%.lua:1:", r.stderr)
  end)

  it("passes arguments as `arg` and waits for spawned tasks", function()
    local r = h.run_script([[
      local luagent = require "luagent"
      print(arg[1], arg[2], select("#", ...))
      luagent.spawn(function() luagent.sleep(0.01) print("late task") end)
    ]], "one", "two")
    assert.equal(0, r.code)
    assert.equal("one\ttwo\t2\nlate task\n", r.stdout)
  end)

  it("does not wait for daemon tasks", function()
    local r = h.run_script([[
      local luagent = require "luagent"
      luagent.daemon(function() luagent.sleep(3600) end)
      print("main done")
    ]])
    assert.equal(0, r.code)
    assert.equal("main done\n", r.stdout)
  end)

  it("agrees with the module face on the same script", function()
    local script = [[
      local luagent = require "luagent"
      luagent.clock.virtual()
      local t = luagent.spawn(function(a) luagent.sleep(5) return a * 2, luagent.now() end, 21)
      local ok, err = pcall(luagent.deadline, 1, function() luagent.sleep(2) end)
      print(t:join())
      print(ok, err.kind, err.which)
    ]]
    local binary = h.run_script(script)
    assert.equal(0, binary.code)
    local path = h.tempfile(script, ".lua")
    local p = io.popen("LUA_PATH='lua/?.lua;lua/?/init.lua;;' LUA_CPATH='build/lua/?.so;;' lua5.4 " .. path)
    local module_out = p:read("a")
    p:close()
    os.remove(path)
    assert.equal("42\t5.0\nfalse\ttimeout\tdeadline\n", binary.stdout)
    assert.equal(binary.stdout, module_out)
  end)
end)

describe("SIGINT", function()
  -- Starts a script in the background, waits until it prints "ready", sends
  -- SIGINT `count` times, and returns the exit code and output.
  local function interrupt(source, count)
    local script = h.tempfile(source, ".lua")
    local out = os.tmpname()
    local cmd = string.format([[
      %s run %s >%s 2>&1 & pid=$!
      i=0; while ! grep -q ready %s && [ $i -lt 200 ]; do sleep 0.02; i=$((i+1)); done
      for n in $(seq %d); do kill -INT $pid; sleep 0.05; done
      wait $pid; echo "exit=$?" >>%s
    ]], h.quote(h.bin), script, out, out, count, out)
    os.execute(cmd)
    local text = h.slurp(out)
    os.remove(script)
    os.remove(out)
    return text
  end

  it("cancels the main task on the first, which cleans up and exits 130", function()
    local text = interrupt([[
      local luagent = require "luagent"
      local guard <close> = setmetatable({}, { __close = function() print("cleanup ran") end })
      print("ready"); io.stdout:flush()
      luagent.sleep(3600)
    ]], 1)
    assert.matches("cleanup ran", text)
    assert.matches("exit=130", text)
  end)

  it("exits at once on the second", function()
    local text = interrupt([[
      local luagent = require "luagent"
      print("ready"); io.stdout:flush()
      pcall(luagent.sleep, 3600)   -- swallows the first cancellation
      print("still here"); io.stdout:flush()
      luagent.spawn(function() luagent.sleep(3600) end):join()
    ]], 2)
    assert.matches("still here", text)
    assert.matches("exit=130", text)
  end)
end)
