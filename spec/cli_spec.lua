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

  it("escapes what a terminal would act on in a script's error, keeping its traceback's lines", function()
    local r = h.run_script('error("tool said: \\27]0;pwned\\7\\27[31mred")')
    assert.equal(1, r.code)
    assert.matches("tool said: \\u{1b}]0;pwned\\u{07}\\u{1b}[31mred", r.stderr, 1, true)
    assert.is_nil(r.stderr:find("\27", 1, true))
    assert.matches("\nstack traceback:\n\t", r.stderr, 1, true)
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
    -- the module face is the plain build's core.so (an ASan one cannot load
    -- into a plain lua5.4): `make test` builds it, `make test SAN=1` alone not
    local so = io.open("build/lua/luagent/core.so")
    if not so then
      pending("skipped: build/lua/luagent/core.so is not built (run `make` first)")
      return
    end
    so:close()
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

-- Starts a script in the background (with `flags` before it), waits until
-- its output holds `mark` ("ready" by default), sends `sig` (INT by
-- default) `count` times, or runs the shell command `send` ($pid is the
-- process), and returns the output with "exit=CODE" appended. A process
-- still alive 10 s later is killed (exit=137), so a failure cannot hang.
local function interrupt(source, count, sig, flags, mark, send)
  local script = h.tempfile(source, ".lua")
  local out = os.tmpname()
  send = send or string.format("for n in $(seq %d); do kill -%s $pid; sleep 0.05; done", count, sig or "INT")
  local cmd = string.format([[
    %s run %s %s >%s 2>&1 & pid=$!
    i=0; while ! grep -q %s %s && [ $i -lt 250 ]; do sleep 0.02; i=$((i+1)); done
    %s
    ( sleep 10; kill -KILL $pid 2>/dev/null ) & killer=$!
    wait $pid; echo "exit=$?" >>%s
    kill $killer 2>/dev/null
  ]], h.quote(h.bin), flags or "", script, out, mark or "ready", out, send, out)
  os.execute(cmd)
  local text = h.slurp(out)
  os.remove(script)
  os.remove(out)
  return text
end

describe("SIGINT", function()
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

  it("exits at once on the second (INT, INT: 130; TERM, then INT: 143)", function()
    for _, c in ipairs({ { "kill -INT $pid; sleep 0.1; kill -INT $pid", "exit=130" },
                         { "kill -TERM $pid; sleep 0.1; kill -INT $pid", "exit=143" } }) do
      local text = interrupt([[
        local luagent = require "luagent"
        print("ready"); io.stdout:flush()
        pcall(luagent.sleep, 3600)   -- swallows the first cancellation
        print("still here"); io.stdout:flush()
        luagent.spawn(function() luagent.sleep(3600) end):join()
      ]], nil, nil, nil, nil, c[1])
      assert.matches("still here", text)
      assert.matches(c[2], text)
    end
  end)

  it("interrupts busy Lua: the first raises `cancelled` in the running loop, cleanup runs, 130", function()
    local text = interrupt([[
      local guard <close> = setmetatable({}, { __close = function() print("cleanup ran") end })
      print("ready"); io.stdout:flush()
      local n = 0
      while true do n = n + 1 end
    ]], 1)
    assert.matches("cleanup ran", text)
    assert.matches("luagent: interrupted", text)
    assert.matches("exit=130", text)
  end)

  it("ends a busy script that swallows the first on the second", function()
    local text = interrupt([[
      print("ready"); io.stdout:flush()
      while true do pcall(function() while true do end end) end
    ]], 2)
    assert.matches("exit=130", text)
  end)
end)

describe("SIGTERM", function()
  it("stops a run gracefully: the call in flight ends aborted and is recorded, exit 143", function()
    local cassette = os.tmpname()
    -- the mock stalls the reply after its first bytes: the call is in flight
    local text = interrupt([[
      local luagent = require "luagent"
      local stream = luagent.stream { model = "openai/gpt-4o-mini", messages = { { role = "user", content = "hi" } } }
      for _ in stream do end
    ]], 1, "TERM", "--faults 'stall:secs=30:after=400@1' --events jsonl --record " .. cassette, "message_start")
    local recorded = h.slurp(cassette)
    os.remove(cassette)
    assert.matches('"stop_reason":"aborted"', text)
    assert.matches("luagent: recorded 1 exchange%(s%)", text)
    assert.matches("luagent: terminated", text)
    assert.matches("exit=143", text)
    local _, lines = recorded:gsub("\n", "")
    assert.equal(1, lines)
    assert.matches('"status":200', recorded)
  end)
end)

describe("a closed stdout", function()
  -- The embedded mock needs SIGPIPE not to kill the process on a socket;
  -- stdout whose reader left must still end it, as it ends any Unix tool.
  it("ends `luagent run x.lua | head -c 10` with the embedded mock (SIGPIPE, 141)", function()
    local script = h.tempfile([[
      local line = ("x"):rep(99)
      for _ = 1, 20000 do print(line) end
      io.stderr:write("ran to the end\n")
    ]], ".lua")
    local err = os.tmpname()
    local p = io.popen(string.format("bash -c '%s run --mock %s 2>%s | head -c 10 >/dev/null; echo ${PIPESTATUS[0]}'",
      h.bin, script, err))
    local status = p:read("a")
    p:close()
    local stderr = h.slurp(err)
    os.remove(script)
    os.remove(err)
    assert.matches("embedded mock", stderr)
    assert.not_matches("ran to the end", stderr)
    assert.equal("141\n", status)
  end)
end)
