-- luagent's own printers of what models, tools and servers said, through
-- the real binary: `luagent runs` and `luagent runs show` (a durable run's
-- answers, agent names and errors) and `luagent mcp list` (a server's name
-- and version) write every escape sequence and control character from
-- them as a visible escape (host/termtext.c), as the log's text form, the
-- --trace tree and the cost table do (spec/log_spec.lua, spec/trace_spec.lua,
-- spec/cost_spec.lua).
local helpers = require "spec.support.helpers"

local q = helpers.quote

-- An OSC that sets the terminal's title, a CSI that clears the screen, a C1
-- CSI, a bare carriage return, a bidi override.
local HOSTILE = "\27]0;pwned\7\27[2J\u{9b}H\r\u{202e}"
-- A Lua literal of it, for the scripts below.
local HOSTILE_LUA = string.format("%q", HOSTILE):gsub("\\\n", "\\n")

-- Whether `text` holds nothing a terminal would act on (newlines apart).
local function inert(text)
  return not text:find("[\0-\9\11-\31\127]") and not text:find("\u{9b}", 1, true)
    and not text:find("\u{202e}", 1, true)
end

-- sh(env, args...) -> {code, stdout, stderr}: the binary with environment
-- assignments (a table) before it.
local sh = helpers.run_env

describe("luagent runs and runs show", function()
  it("print a durable run's answers and agent names escaped for the terminal", function()
    local dir = os.tmpname()
    os.remove(dir)
    assert(os.execute("mkdir -p " .. q(dir)))
    local script = helpers.tempfile([[
      local luagent = require "luagent"
      local mock = require "luagent.mock"
      local hostile = ]] .. HOSTILE_LUA .. [[
      local srv = assert(mock.start { script = function() return { text = "the answer" .. hostile } end })
      local a = luagent.agent { name = "agent" .. hostile, durable = true,
        model = { kind = "openai", model = "gpt-4o-mini", base_url = srv.url .. "/v1", api_key = "k" } }
      assert(a:run("go").stop_reason == "stop")
      srv:close()
    ]], ".lua")
    local env = { LUAGENT_HOME = dir }
    local r = sh(env, "run", script)
    os.remove(script)
    assert.equal(0, r.code, r.stderr)
    local id = assert(r.stderr:match("luagent: durable run (%S+)"), r.stderr)
    local list = sh(env, "runs")
    local show = sh(env, "runs", "show", id)
    os.execute("rm -rf " .. q(dir))
    assert.equal(0, list.code, list.stderr)
    assert.equal(0, show.code, show.stderr)
    assert.is_true(inert(list.stdout), list.stdout)
    assert.is_true(inert(show.stdout), show.stdout)
    assert.matches("answers: the answer\\u{1b}%]0;pwned\\u{07}\\u{1b}%[2J\\u{9b}H", show.stdout)
    assert.matches("agent\\u{1b}", show.stdout)
  end)
end)

describe("luagent mcp list", function()
  it("prints a server's name and version escaped for the terminal", function()
    local server = helpers.tempfile([[
      local cjson = require "cjson"
      local hostile = ]] .. HOSTILE_LUA .. [[
      for line in io.lines() do
        local msg = cjson.decode(line)
        local result
        if msg.method == "initialize" then
          result = { protocolVersion = msg.params.protocolVersion, capabilities = { tools = {} },
            serverInfo = { name = "srv" .. hostile, version = "1" .. hostile } }
        elseif msg.method == "tools/list" then
          result = { tools = { { name = "look", description = "Looks" .. hostile, inputSchema = { type = "object" } } } }
        elseif msg.method == "ping" then
          result = {}
        end
        if result and msg.id then
          io.write(cjson.encode { jsonrpc = "2.0", id = msg.id, result = result }, "\n")
          io.flush()
        end
      end
    ]], ".lua")
    local r = sh(nil, "mcp", "list", "--", "lua5.4", server)
    os.remove(server)
    assert.equal(0, r.code, r.stderr)
    assert.is_true(inert(r.stdout), r.stdout)
    assert.matches("^srv\\u{1b}%]0;pwned\\u{07}\\u{1b}%[2J\\u{9b}H\\r\\u{202e} 1\\u{1b}", r.stdout)
    assert.matches("\nlook ", r.stdout)
  end)
end)
