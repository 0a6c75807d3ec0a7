-- Tools that are easy to write, and flags that act by themselves (issue
-- 26, items 4 and 6): a command tool's cwd and env and its arguments on
-- stdin, in LUAGENT_ARGS and LUAGENT_ARG_<NAME>; a tool with neither
-- read_only nor idempotent reported once when it is loaded; `--tools DIR`
-- and `--retry-safe` acting on a script's agents that never read
-- luagent.options; an agent's trust_hints reaching its MCP sets; the
-- shipped command tool decoding no JSON with sed.
local luagent = require "luagent"
local tools = require "luagent.agent.tools"
local policy = require "luagent.model.policy"
local helpers = require "helpers"

local function write(path, text)
  local f = assert(io.open(path, "w"))
  f:write(text)
  f:close()
end

local function run_tool(t, args, raw)
  return tools.execute(t, { id = "c1", name = t.name, arguments = args, raw_arguments = raw },
    { policy = policy.tool_section(nil) })
end

describe("a command tool", function()
  it("runs in its cwd with its env, its arguments as JSON on stdin, in LUAGENT_ARGS and as LUAGENT_ARG_<NAME>", function()
    local dir = helpers.tempdir()
    local t = tools.new { name = "show", description = "shows what it gets", read_only = true, cwd = dir,
      env = { COLOR = "blue" },
      params = { type = "object", properties = { pattern = { type = "string" }, n = { type = "integer" },
        ["max-depth"] = { type = "integer" }, deep = { type = "boolean" }, list = { type = "array" } } },
      command = { "sh", "-c", 'pwd; echo "$COLOR"; cat; echo; echo "$LUAGENT_ARGS"; '
        .. 'echo "[$LUAGENT_ARG_PATTERN] [$LUAGENT_ARG_N] [$LUAGENT_ARG_MAX_DEPTH] [$LUAGENT_ARG_DEEP] '
        .. '[${LUAGENT_ARG_LIST-unset}]"' } }
    local raw = '{"pattern": "it\'s \\"x\\"", "n": 3, "max-depth": 2, "deep": true, "list": [1]}'
    local out = run_tool(t, { pattern = 'it\'s "x"', n = 3, ["max-depth"] = 2, deep = true, list = { 1 } }, raw)
    assert.is_nil(out.error, out.content)
    local lines = {}
    for l in out.content:gmatch("[^\n]+") do lines[#lines + 1] = l end
    assert.equal(dir, lines[1])
    assert.equal("blue", lines[2])
    assert.equal(raw, lines[3])
    assert.equal(raw, lines[4])
    assert.equal('[it\'s "x"] [3] [2] [true] [unset]', lines[5])
    os.remove(dir)
  end)

  it("gets many large arguments on stdin whole, leaving out the variables past a total budget", function()
    -- each variable is under the system's bound for one, but 24 of 100 KiB
    -- are past ARG_MAX together: the spawn failed with E2BIG
    local args = {}
    for i = 1, 24 do args[string.format("a%02d", i)] = string.rep(string.char(96 + i), 100 * 1024) end
    local t = tools.new { name = "many", description = "counts what it gets", read_only = true,
      command = { "sh", "-c", "wc -c; env | grep '^LUAGENT_ARG' | cut -d= -f1 | sort" } }
    local out = run_tool(t, args)
    assert.is_nil(out.error, out.content)
    local stdin, names = out.content:match("^%s*(%d+)\n(.*)$")
    assert.equal(#require("luagent.base.json").encode(args), tonumber(stdin))
    local got, total = {}, 0
    for name in names:gmatch("[^\n]+") do
      got[#got + 1] = name
      local key = name:match("^LUAGENT_ARG_A(%d%d)$")
      assert(key, "only the variables of arguments that fit: " .. name)
      total = total + #name + 2 + 100 * 1024
    end
    assert.is_true(#got > 0 and #got < 24, #got .. " variables")
    assert.equal("LUAGENT_ARG_A01", got[1]) -- in name order, while they fit
    assert.is_true(total <= require("luagent.agent.tools.tool").ARG_TOTAL_MAX, total .. " bytes of variables")
  end)

  it("says which cwd it could not start in; cwd is for a command tool", function()
    local t = tools.new { name = "nowhere", description = "d", read_only = true, cwd = "/no/such/dir",
      command = { "true" } }
    local out = run_tool(t, {})
    assert.equal("process", out.error.kind)
    assert.matches("/no/such/dir", out.content, 1, true)
    local bad, why = tools.check { name = "x", description = "d", cwd = "/tmp", run = function() end }
    assert.is_nil(bad)
    assert.matches("cwd is for a command tool", why)
    assert.matches("cwd must be a string", select(2, tools.check { name = "x", description = "d", cwd = 3,
      command = { "true" } }))
  end)

  it("ships as an example that decodes no JSON with sed", function()
    local text = helpers.slurp("examples/tools/grep.lua")
    assert.is_nil(text:find("sed", 1, true))
    local set = assert(tools.dir("examples/tools", { watch = false }))
    local out = run_tool(set:snapshot().tools.grep, { pattern = "SIGSEGV" }, '{"pattern": "SIGSEGV"}')
    assert.is_nil(out.error, out.content)
    assert.matches("crashes/c%-%d+%.txt:%d+:.*SIGSEGV", out.content)
    local none = run_tool(set:snapshot().tools.grep, { pattern = "no such words here" })
    assert.equal("no match\n", none.content)
  end)
end)

describe("a tool with neither read_only nor idempotent", function()
  local lines
  before_each(function()
    lines = {}
    luagent.configure { log_level = "info", log_sink = function(level, line) lines[#lines + 1] = line end }
  end)
  after_each(function() luagent.configure { log_level = false, log_sink = false } end)

  -- the notes about tool `name` (a set another spec left watching may
  -- note its own tools meanwhile)
  local function notes(name)
    local out = {}
    for _, l in ipairs(lines) do
      if (l:find("tool " .. name .. " (", 1, true) or l:find("tool " .. name .. ":", 1, true))
        and l:find("neither read_only nor idempotent", 1, true) then
        out[#out + 1] = l
      end
    end
    return out
  end

  it("is reported once when its folder is loaded, with the timeout that stops the run", function()
    local dir = helpers.tempdir()
    write(dir .. "/send.lua", 'return { name = "send", description = "sends", timeout = 7, run = function() end }\n')
    write(dir .. "/look.lua", 'return { name = "look", description = "looks", read_only = true, run = function() end }\n')
    local set = assert(luagent.tools.dir(dir, { watch = false }))
    local got = notes("send")
    assert.equal(1, #got, table.concat(lines, "\n"))
    assert.matches("tool send %(" .. dir:gsub("%p", "%%%0") .. "/send%.lua%): neither read_only nor idempotent: "
      .. "a timeout of 7 s will stop the run with outcome_unknown", got[1])
    set:rescan() -- nothing changed: not again
    assert.equal(1, #notes("send"))
    write(dir .. "/send.lua", 'return { name = "send", description = "sends now", run = function() end }\n')
    set:rescan() -- a new definition is loaded: said again, with the policy's timeout
    assert.equal(2, #notes("send"))
    assert.matches("a timeout of 60 s will stop the run", notes("send")[2])
    set:close()
    os.execute("rm -rf " .. helpers.quote(dir))
  end)

  it("is reported once when an agent is given it", function()
    local t = luagent.tools.new { name = "mail", description = "sends mail", run = function() end }
    local model = { kind = "openai", model = "m", base_url = "http://127.0.0.1:9/v1", api_key = "k" }
    luagent.agent { model = model, tools = { t } }
    luagent.agent { model = model, tools = { t } }
    assert.equal(1, #notes("mail"), table.concat(lines, "\n"))
    assert.matches("tool mail: neither read_only nor idempotent: a timeout of 60 s", notes("mail")[1])
  end)

  it("is remembered only while its definition lives: a new one is reported, an old one forgotten", function()
    -- the runtime keys what it noted by the definition's run function
    -- (weakly): a key that outlived it (its address as text) grew with
    -- every reload and could match a new run at the same address
    local said = {}
    local rt = luagent.runtime { log_level = "info", log_sink = function(_, line)
      if line:find("neither read_only nor idempotent", 1, true) then said[#said + 1] = line end
    end }
    local model = { kind = "openai", model = "m", base_url = "http://127.0.0.1:9/v1", api_key = "k" }
    for i = 1, 3 do
      rt:agent { model = model, tools = { { name = "mail", description = "sends mail " .. i, run = function() end } } }
    end
    assert.equal(3, #said, table.concat(said, "\n"))
    collectgarbage()
    collectgarbage()
    assert.is_nil(next(rt.noted), "the runtime forgot the definitions that are gone")
    rt:close()
  end)

  it("is reported on stderr by `luagent run --tools`", function()
    local r = helpers.run("run", "--mock", "--tools", "examples/tools", helpers.tempfile("return 0", ".lua"))
    assert.equal(0, r.code, r.stderr)
    assert.matches("tool create_issue %(examples/tools/create_issue%.lua%): neither read_only nor idempotent: "
      .. "a timeout of 10 s will stop the run with outcome_unknown", r.stderr)
    local _, n = r.stderr:gsub("neither read_only", "")
    assert.equal(1, n, r.stderr)
  end)
end)

describe("the flags of luagent run", function()
  it("--tools DIR gives every agent of the script the folder's tools, without luagent.options", function()
    local script = helpers.tempfile([[
      local luagent = require "luagent"
      local own = luagent.tools.new { name = "own", description = "the agent's own", read_only = true, run = function() end }
      local a = luagent.agent { model = "openai/gpt-4o-mini" }
      local b = luagent.agent { model = "openai/gpt-4o-mini", tools = { own } }
      local function names(agent)
        local n = {}
        for _, s in ipairs(agent:toolbox(function() end).specs) do n[#n + 1] = s.name end
        return table.concat(n, ",")
      end
      print(names(a))
      print(names(b))
      local ev = a:run("go")
      print(ev.stop_reason)
    ]], ".lua")
    local r = helpers.run("run", "--mock", "--log", "off", "--tools", "examples/tools", script)
    os.remove(script)
    assert.equal(0, r.code, r.stderr)
    local lines = {}
    for l in r.stdout:gmatch("[^\n]+") do lines[#lines + 1] = l end
    assert.equal("crash_list,crash_show,create_issue,grep,issue_search", lines[1])
    assert.equal("own,crash_list,crash_show,create_issue,grep,issue_search", lines[2])
    assert.equal("stop", lines[3])
  end)

  it("--retry-safe holds a retried attempt's events from the script's agents and streams", function()
    local script = helpers.tempfile([[
      local luagent = require "luagent"
      local a = luagent.agent { model = "openai/gpt-4o-mini", policy = { backoff = { strategy = "fixed", base = 0.01 } } }
      local starts, resets = 0, 0
      for ev in a:prompt("hi") do
        if ev.type == "message_start" then starts = starts + 1 end
        if ev.type == "stream_reset" then resets = resets + 1 end
      end
      print(starts, resets)
    ]], ".lua")
    local plain = helpers.run("run", "--mock", "--virtual-clock", "--faults", "stream-error:overloaded_error@1", script)
    local safe = helpers.run("run", "--mock", "--virtual-clock", "--faults", "stream-error:overloaded_error@1",
      "--retry-safe", script)
    os.remove(script)
    assert.equal(0, plain.code, plain.stderr)
    assert.equal(0, safe.code, safe.stderr)
    assert.equal("2\t1\n", plain.stdout) -- two attempts, the first reset
    assert.equal("1\t0\n", safe.stdout)  -- the one that succeeded
  end)
end)

describe("an agent's trust_hints", function()
  local FAKE = { "lua5.4", "spec/fixtures/mcp/fake_server.lua" }
  local dir, set
  before_each(function()
    dir = helpers.tempdir()
    set = assert(luagent.tools.mcp { command = { FAKE[1], FAKE[2], dir }, name = "fake" })
  end)
  after_each(function()
    set:close()
    os.execute("rm -rf " .. helpers.quote(dir))
  end)

  local function flags(a)
    local t = a:toolbox(function() end).tools
    return t.read_slow.read_only, t.read_slow.idempotent, t.write_slow.read_only
  end

  it("reach the MCP sets it uses: the server's hints become flags, the agent's overrides win", function()
    local model = { kind = "openai", model = "m", base_url = "http://127.0.0.1:9/v1", api_key = "k" }
    assert.is_false(set:snapshot().tools.read_slow.read_only) -- the set itself trusts nobody
    local plain = luagent.agent { model = model, tools = set }
    assert.same({ false, false, false }, { flags(plain) })
    local trusting = luagent.agent { model = model, tools = set, tool_policy = { trust_hints = { "fake" } } }
    assert.same({ true, false, false }, { flags(trusting) })
    local by_policy = luagent.agent { model = model, tools = set, policy = { tool = { trust_hints = true,
      overrides = { write_slow = { idempotent = true } } } } }
    local t = by_policy:toolbox(function() end).tools
    assert.is_true(t.read_slow.read_only)
    assert.is_true(t.write_slow.idempotent)
    local other = luagent.agent { model = model, tools = set, tool_policy = { trust_hints = { "another" } } }
    assert.same({ false, false, false }, { flags(other) })
    -- the set's own tools are left as they were
    assert.is_false(set:snapshot().tools.read_slow.read_only)
  end)
end)
