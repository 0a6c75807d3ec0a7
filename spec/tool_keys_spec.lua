-- Keys reach no tool and come back out of none (issue 24, item 3). The real
-- binary runs a durable agent with the three provider keys in its
-- environment and a key-leaking tool of every kind: a command tool that
-- prints its environment and a key read from a file, one that fails with
-- the key on stderr, a Lua tool that raises with it, one that reports it as
-- progress and returns it, and a stdio MCP server (given a key through its
-- `env =`) whose JSON-RPC error carries it in a URL's query, whose isError
-- result and plain result hold it, and whose tool list has a broken entry
-- naming it; an MCP server that dies with the key on stderr, and an MCP URL
-- whose `?key=` is a credential. The children's environments hold no
-- provider key but what they were given; no key is in the events the
-- script iterates and prints, the history, `--events jsonl`, the log lines,
-- the request bodies the model got, the journal's file or `luagent runs
-- show`; a script's own top-level error and `luagent mcp list` print none.
local helpers = require "spec.support.helpers"

local q = helpers.quote

local KEYS = {
  OPENAI_API_KEY = "sk-TOOL/LEAK+openai0123456789",
  ANTHROPIC_API_KEY = "sk-ant-TOOLLEAK-anthropic9876",
  OPENROUTER_API_KEY = "sk-or-TOOLLEAK-openrouter5555",
}
-- a credential in an MCP server's URL (in no environment variable of a key)
local URL_TOKEN = "mcpurltoken-4242-secret"

local SCRIPT = [==[
local luagent = require "luagent"
local mock = require "luagent.mock"
local json = require "luagent.base.json"
local K1, K2, K3 = os.getenv("OPENAI_API_KEY"), os.getenv("ANTHROPIC_API_KEY"), os.getenv("OPENROUTER_API_KEY")
local dir = assert(os.getenv("TOOL_KEYS_DIR"))

-- what the script sees, printed on one line: every string reachable from v
local function dump(label, v)
  local out, seen = {}, {}
  local function walk(x)
    if type(x) == "table" then
      if seen[x] then return end
      seen[x] = true
      for k, y in pairs(x) do walk(k) walk(y) end
    elseif x ~= nil then
      out[#out + 1] = (tostring(x):gsub("\n", "\\n"))
    end
  end
  walk(v)
  print(label .. " " .. table.concat(out, " | "))
end

local f = assert(io.open(dir .. "/keyfile", "w"))
f:write(K1)
f:close()
local bodies = assert(io.open(dir .. "/bodies", "w"))
local function call(id, name) return { id = id, name = name, arguments = {} } end
local srv = assert(mock.start { seed = 1, script = function(_, n, body)
  bodies:write(json.encode(body), "\n")
  bodies:flush()
  if n == 1 then
    return { text = "calling", tools = { call("c1", "env_dump"), call("c2", "fail_cmd"), call("c3", "raise"),
      call("c4", "echo"), call("c5", "m_leak_error"), call("c6", "m_leak_is_error"), call("c7", "m_leak_text") } }
  end
  return { text = "done" }
end })

local keyfile = dir .. "/keyfile"
local env_dump = { name = "env_dump", description = "Shows its environment",
  command = { "sh", "-c", 'env >"$1"; env; echo "file key: $(cat "$2")"', "sh", dir .. "/tool_env", keyfile } }
local fail_cmd = { name = "fail_cmd", description = "Fails",
  command = { "sh", "-c", 'echo "denied: $(cat "$1")" >&2; exit 3', "sh", keyfile } }
local raise = { name = "raise", description = "Raises", run = function() error("boom with " .. K1) end }
local echo = { name = "echo", description = "Echoes", run = function(_, ctx)
  ctx:progress { note = "halfway " .. K3 }
  return "echo " .. K3
end }

local set = assert(luagent.tools.mcp { command = { "lua5.4", "spec/fixtures/mcp/leaky_server.lua", dir .. "/mcp_env" },
  name = "leaky", prefix = "m_", env = { LEAK = K2 }, ping_interval = false })

local none, err = luagent.tools.mcp { url = "http://127.0.0.1:1/mcp?key=" .. os.getenv("MCP_URL_TOKEN"),
  init_timeout = 5 }
assert(not none)
dump("MCP_URL", err)
none, err = luagent.tools.mcp { command = { "sh", "-c", 'read -r _; echo "no auth for token $LEAK" >&2; exit 3' },
  env = { LEAK = K1 }, name = "failing" }
assert(not none)
dump("MCP_STDERR", err)

local a = luagent.agent { name = "leaky", model = { kind = "openai", model = "m", base_url = srv.url .. "/v1" },
  tools = { env_dump, fail_cmd, raise, echo, set } }
local last
for ev in a:prompt("go") do
  dump("EVENT " .. ev.type, ev)
  last = ev
end
dump("HISTORY", a.messages)
dump("STATUS", set:status())
print("RUN " .. tostring(last.stop_reason) .. " " .. tostring(last.turns))
set:close()
srv:close()
bodies:close()
]==]

local forms = helpers.key_forms

local tempdir = helpers.tempdir

-- sh(env, args...) -> {code, stdout, stderr}: the binary with these
-- environment assignments, the provider keys of this shell unset.
local function sh(env, ...)
  local e = { unset = { "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENROUTER_API_KEY" } }
  for k, v in pairs(env or {}) do e[k] = v end
  return helpers.run_env(e, ...)
end

-- run_script(env, source) -> as sh, for `luagent run` of `source`.
local function run_script(env, source)
  local path = helpers.tempfile(source, ".lua")
  local r = sh(env, "run", path)
  os.remove(path)
  return r
end

-- The keys' environment, with `extra` laid over it.
local function with_keys(extra)
  local env = {}
  for k, v in pairs(KEYS) do env[k] = v end
  for k, v in pairs(extra or {}) do env[k] = v end
  return env
end

-- Asserts that no form of any key (the URL's token too) is in `text`.
local function no_key(text, where)
  local all = { URL_TOKEN }
  for _, v in pairs(KEYS) do all[#all + 1] = v end
  for _, key in ipairs(all) do
    for _, f in ipairs(forms(key)) do
      assert.is_nil(text:find(f, 1, true), "a key (" .. f .. ") is in " .. where)
    end
    -- nor a piece of it long enough to tell
    assert.is_nil(text:find(key:sub(4, 16), 1, true), "part of a key (" .. key:sub(4, 16) .. ") is in " .. where)
  end
end

describe("tools that leak keys, in a durable agent run", function()
  local dir, r, show, files
  setup(function()
    dir = tempdir()
    local script = helpers.tempfile(SCRIPT, ".lua")
    r = sh(with_keys { LUAGENT_HOME = dir, TOOL_KEYS_DIR = dir, MCP_URL_TOKEN = URL_TOKEN },
      "run", "--durable", "--events", "jsonl:" .. dir .. "/events", "--log", "info", "--log-content", script)
    os.remove(script)
    local id = r.stderr:match("luagent: durable run (%S+)")
    -- read back by a process that knows no key: what the journal holds
    show = id and sh({ LUAGENT_HOME = dir }, "runs", "show", id) or { stdout = "", stderr = "no run id" }
    files = {}
    for _, name in ipairs({ "events", "bodies", "tool_env", "mcp_env", "runs.db" }) do
      files[name] = helpers.slurp(dir .. "/" .. name)
    end
    -- the journal's rows, wherever SQLite left them: the file, and a WAL
    -- not yet checkpointed back into it
    files["runs.db"] = (files["runs.db"] or "") .. (helpers.slurp(dir .. "/runs.db-wal") or "")
  end)
  teardown(function() os.execute("rm -rf " .. q(dir)) end)

  it("ran every tool, and their output reached the script and the model, scrubbed", function()
    assert.equal(0, r.code, r.stderr)
    assert.matches("\nRUN stop 2\n", r.stdout)
    local out = r.stdout
    assert.matches("EVENT tool_execution_end [^\n]*file key: %*%*%*", out)
    assert.matches("EVENT tool_execution_end [^\n]*fail_cmd exited with code 3: denied: %*%*%*", out)
    assert.matches("EVENT tool_execution_end [^\n]*boom with %*%*%*", out)
    assert.matches("EVENT tool_execution_update [^\n]*halfway %*%*%*", out)
    assert.matches("EVENT tool_execution_end [^\n]*echo %*%*%*", out)
    assert.matches("EVENT tool_execution_end [^\n]*upstream https://api%.example%.com/v1/search%?key=%*%*%* refused", out)
    assert.matches("EVENT tool_execution_end [^\n]*denied for token %*%*%*", out)
    assert.matches("EVENT tool_execution_end [^\n]*the token is %*%*%*", out)
    assert.matches("EVENT tools_reload_failed [^\n]*a tool without a name[^\n]*token %*%*%*", out)
    assert.matches("HISTORY [^\n]*file key: %*%*%*", out)
    -- the MCP servers that failed to start: their records are scrubbed
    assert.matches("MCP_URL [^\n]*http://127%.0%.0%.1:1/mcp%?key=%*%*%*", out)
    assert.matches("MCP_STDERR [^\n]*no auth for token %*%*%*", out)
    -- the second request carried the tool results to the model
    assert.matches("boom with %*%*%*", files.bodies)
    assert.matches("the token is %*%*%*", files.bodies)
    -- the journal has every call
    assert.matches("fail_cmd {} failed: fail_cmd exited with code 3: denied: %*%*%*", show.stdout)
    assert.matches("raise {} failed: raise failed: [^\n]*boom with %*%*%*", show.stdout)
    assert.matches("echo {} %-> echo %*%*%*", show.stdout)
    assert.matches("m_leak_text {} %-> the token is %*%*%*", show.stdout)
  end)

  it("gives a command tool a reduced environment: no provider key", function()
    local env = files.tool_env
    assert.matches("\nPATH=", "\n" .. env)
    for name in pairs(KEYS) do assert.not_matches(name, env) end
    assert.not_matches("TOOL_KEYS_DIR", env)
    assert.not_matches("MCP_URL_TOKEN", env)
  end)

  it("gives a stdio MCP server the default environment and what its env = adds", function()
    local env = files.mcp_env
    assert.matches("\nPATH=", "\n" .. env)
    assert.matches("\nLEAK=" .. KEYS.ANTHROPIC_API_KEY:gsub("%p", "%%%0") .. "\n", "\n" .. env)
    for name in pairs(KEYS) do assert.not_matches(name, env) end
    assert.not_matches("TOOL_KEYS_DIR", env)
  end)

  for _, where in ipairs({ "stdout", "stderr" }) do
    it("leaves every key out of " .. where, function() no_key(r[where], where) end)
  end
  for _, name in ipairs({ "events", "bodies", "runs.db" }) do
    it("leaves every key out of " .. name, function() no_key(files[name], name) end)
  end
  it("leaves every key out of luagent runs show", function()
    assert.equal(0, show.code, show.stderr)
    no_key(show.stdout .. show.stderr, "runs show")
  end)
end)

describe("a command tool's env =", function()
  it("adds to the reduced environment, false takes a variable out, and a credential given is scrubbed", function()
    local r = helpers.tempfile([[
local luagent = require "luagent"
local tools = require "luagent.agent.tools"
local policy = require "luagent.model.policy"
local t = tools.new { name = "env", description = "Its environment", command = { "env" },
  env = { GIVEN = os.getenv("ANTHROPIC_API_KEY"), GITHUB_TOKEN = "ghp-given-on-purpose-0042", HOME = false,
    EXTRA = "plain" } }
local o = tools.execute(t, { id = "1", name = "env", arguments = {} }, { policy = policy.tool_section(nil) })
io.write(o.content)
]], ".lua")
    local out = sh(with_keys(), "run", r)
    os.remove(r)
    assert.equal(0, out.code, out.stderr)
    local env = "\n" .. out.stdout
    assert.matches("\nGIVEN=%*%*%*\n", env) -- given, so it is there; scrubbed on its way back
    assert.matches("\nEXTRA=plain\n", env)
    -- a credential given through env is a secret too: the child printing it leaks nothing
    assert.matches("\nGITHUB_TOKEN=%*%*%*\n", env)
    assert.matches("\nPATH=", env)
    assert.not_matches("\nHOME=", env)
    for name in pairs(KEYS) do assert.not_matches(name, env) end
  end)
end)

describe("a script's own top-level error", function()
  it("is printed scrubbed, any provider key of the environment included", function()
    local r = run_script(with_keys(), [[
error("cannot go on with " .. os.getenv("OPENAI_API_KEY") .. " and " .. os.getenv("OPENROUTER_API_KEY"))
]])
    assert.equal(1, r.code)
    assert.matches("luagent: [^\n]*cannot go on with %*%*%* and %*%*%*", r.stderr)
    no_key(r.stdout .. r.stderr, "the printed error")
  end)

  it("is printed scrubbed when it cannot even be printed (the executable's last resort)", function()
    local r = run_script(with_keys(), [[
error(setmetatable({}, { __tostring = function() error("cannot print " .. os.getenv("ANTHROPIC_API_KEY")) end }))
]])
    assert.equal(1, r.code)
    assert.matches("cannot print %*%*%*", r.stderr)
    no_key(r.stdout .. r.stderr, "the printed error")
  end)
end)

describe("luagent mcp list", function()
  it("prints an MCP URL's credentials scrubbed", function()
    local r = sh({}, "mcp", "list", "--timeout", "5", "--url", "http://127.0.0.1:1/mcp?key=" .. URL_TOKEN)
    assert.equal(1, r.code)
    assert.matches("luagent mcp: [^\n]*127%.0%.0%.1:1/mcp%?key=%*%*%*", r.stderr)
    no_key(r.stdout .. r.stderr, "mcp list")
  end)
end)
