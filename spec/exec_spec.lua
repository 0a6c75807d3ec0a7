-- luagent.exec{argv=...}: the process API tools use, for scripts too:
-- real child processes (argv, no shell), cwd, env over the reduced child
-- environment, stdin, capped output, a timeout that kills the group.
local luagent = require "luagent"
local core = require "luagent.core"
local helpers = require "helpers"

local exec = luagent.exec

describe("luagent.exec", function()
  before_each(function() luagent.clock.virtual() end)
  after_each(function() luagent.clock.real() end)

  it("runs argv with cwd, env and stdin, and returns code, stdout and stderr", function()
    local dir = helpers.tempdir()
    local r = assert(exec { argv = { "sh", "-c", 'pwd; echo "$GREETING"; cat; echo oops >&2; exit 3' },
      cwd = dir, env = { GREETING = "hello" }, stdin = "from stdin\n" })
    assert.equal(3, r.code)
    assert.is_nil(r.signal)
    assert.equal(dir .. "\nhello\nfrom stdin\n", r.stdout)
    assert.equal("oops\n", r.stderr)
    os.remove(dir)
  end)

  it("gives the child the reduced environment: no provider key unless env names it", function()
    local r = assert(exec { argv = { "sh", "-c", 'echo "[${OPENAI_API_KEY-unset}] [${PATH:+path}]"' } })
    assert.equal("[unset] [path]\n", r.stdout)
  end)

  it("reports a signal, caps output and says how much was left out", function()
    local r = assert(exec { argv = { "sh", "-c", "kill -9 $$" } })
    assert.equal(9, r.signal)
    assert.is_nil(r.code)
    r = assert(exec { argv = { "sh", "-c", "head -c 5000 /dev/zero" }, max_output = 100 })
    assert.equal(100, #r.stdout)
    assert.equal(4900, r.stdout_dropped)
  end)

  it("returns an error naming the program it cannot start", function()
    local none, err = exec { argv = { "/no/such/program" } }
    assert.is_nil(none)
    assert.equal("process", err.kind)
    assert.matches("/no/such/program", err.message, 1, true)
    local _, cerr = exec { argv = { "true" }, cwd = "/no/such/dir" }
    assert.equal("process", cerr.kind)
    assert.matches("/no/such/dir", cerr.message, 1, true)
  end)

  it("kills the whole group at its timeout and returns a timeout of its own", function()
    local t0 = luagent.now()
    local none, err = exec { argv = { "sh", "-c", "sleep 30 & sleep 30; echo never" }, timeout = 0.3, grace = 0.1 }
    assert.is_nil(none)
    assert.equal("timeout", err.kind)
    assert.equal("exec", err.which)
    assert.matches("sh", err.message, 1, true)
    assert.matches("0.3", err.message, 1, true)
    assert.is_true(luagent.now() - t0 < 10)
  end)

  it("raises for misuse, naming the option", function()
    assert.has_error(function() exec { "ls" } end, "exec: argv must be a non-empty list of strings")
    assert.has_error(function() exec { argv = { "ls" }, cdw = "/" } end, "exec: unknown option 'cdw'")
    assert.has_error(function() exec { argv = { "ls" }, timeout = -1 } end, "exec: timeout must be a number of seconds > 0")
    assert.has_error(function() exec { argv = { "ls" }, env = { A = 1 } } end, "exec: env.A must be a string (or false to leave it out)")
  end)

  it("is what a Lua tool uses: cancelled with the tool, its group killed", function()
    local tools = require "luagent.agent.tools"
    local pol = require("luagent.model.policy").tool_section { timeout = 0.5, grace = 0.2, max_retries = 0 }
    local marker = os.tmpname()
    local t = tools.new { name = "slow", description = "sleeps", read_only = true,
      run = function()
        return luagent.exec { argv = { "sh", "-c", "echo $$ > " .. marker .. "; sleep 30" } }.stdout
      end }
    local out = tools.execute(t, { id = "c1", name = "slow", arguments = {} }, { policy = pol })
    assert.equal("tool_timeout", out.error.kind)
    local pid = tonumber(helpers.slurp(marker))
    os.remove(marker)
    assert.is_false(helpers.alive(pid))
    assert.equal(0, core.stats().real)
  end)
end)
