-- Unknown options are errors: every table luagent takes from a user (an
-- agent's options, a call's, a tool's definition, a policy, a runtime's
-- settings, tools.mcp's and tools.dir's options, a provider's spec) is
-- checked against the one list of its known keys, and an unknown key
-- raises naming the key, the table and the nearest known name
-- (lua/luagent/base/options.lua).
local luagent = require "luagent"
local helpers = require "helpers"

local MODEL = { kind = "openai", model = "m", base_url = "http://127.0.0.1:9/v1", api_key = "k" }

-- The message of what fn raised (a string or an error record).
local function raised(fn, ...)
  local args = table.pack(...)
  -- called from a line of this file (not a tail call): a misuse error names it
  local ok, err = pcall(function() local r = fn(table.unpack(args, 1, args.n)) return r end)
  assert.is_false(ok, "expected an error")
  return type(err) == "table" and tostring(err.message or err) or tostring(err)
end

local function plain(s) return (s:gsub("%p", "%%%0")) end

-- `msg` names the table `what`, the key and the suggestion (nil: none).
local function names(msg, what, key, suggestion)
  assert.matches(plain(what .. ": unknown "), msg)
  assert.matches(plain("'" .. key .. "'"), msg)
  if suggestion then
    assert.matches(plain("(did you mean '" .. suggestion .. "'?)"), msg)
  else
    assert.does_not.match("did you mean", msg, 1, true)
  end
end

describe("the nearest known name", function()
  local options = require "luagent.base.options"

  it("is the known name at the smallest edit distance, when it is near", function()
    local known = { "model", "max_turns", "max_tokens", "max_parallel_tools", "system", "tools" }
    assert.equals("max_turns", options.nearest("max_turn", known))
    assert.equals("max_tokens", options.nearest("max_token", known))
    assert.equals("model", options.nearest("modle", known)) -- a swap is one edit
    assert.equals("system", options.nearest("System", known)) -- case is no edit
    assert.equals("max_turns", options.nearest("max-turns", known))
    assert.equals("tools", options.nearest("tool", known))
    assert.is_nil(options.nearest("output_schema", known))
    assert.is_nil(options.nearest("xyz", known))
    assert.equals(1, options.distance("max_turn", "max_turns"))
    assert.equals(1, options.distance("ab", "ba"))
    assert.equals(3, options.distance("kitten", "sitting"))
  end)

  it("the message names the table, the key and the nearest; or lists the known ones", function()
    local known = { "model", "max_turns" }
    assert.equals("agent: unknown option 'max_turn' (did you mean 'max_turns'?)",
      options.unknown("agent", "max_turn", known))
    assert.equals("agent: unknown option 'output_schema' (known: model, max_turns)",
      options.unknown("agent", "output_schema", known))
    assert.equals("agent: unknown option [1] (known: model, max_turns)", options.unknown("agent", 1, known))
    assert.is_nil(options.first_unknown({ model = 1, max_turns = 2 }, options.set(known)))
    assert.equals("max_turn", options.first_unknown({ model = 1, max_turn = 2 }, options.set(known)))
  end)
end)

describe("unknown options are errors", function()
  before_each(function() luagent.configure { log_sink = function() end } end)
  after_each(function() luagent.configure { log_sink = false } end)

  it("luagent.agent{max_turn = 3} raises naming max_turns", function()
    local msg = raised(luagent.agent, { model = MODEL, max_turn = 3 })
    names(msg, "agent", "max_turn", "max_turns")
    assert.matches("options_spec.lua:%d+:", msg) -- the caller's line
    names(raised(luagent.agent, { model = MODEL, output_schema = {} }), "agent", "output_schema", nil)
  end)

  it("a call's unknown option raises, in stream and in complete, before any request", function()
    local msg = raised(luagent.stream, { model = MODEL, messages = {}, max_token = 5 })
    names(msg, "stream", "max_token", "max_tokens")
    assert.matches("options_spec.lua:%d+:", msg)
    msg = raised(luagent.complete, { model = MODEL, messages = {}, response_format = {} })
    names(msg, "complete", "response_format", nil)
    assert.matches("options_spec.lua:%d+:", msg)
    names(raised(luagent.complete, { model = MODEL, messages = {}, temprature = 0 }), "complete", "temprature",
      "temperature")
  end)

  it("a tool's unknown field raises naming the nearest one", function()
    local def = { name = "t", description = "d", read_onyl = true, run = function() return "" end }
    local msg = raised(luagent.tools.new, def)
    names(msg, "tool", "read_onyl", "read_only")
    assert.matches("options_spec.lua:%d+:", msg)
    -- in an agent's tools, the same
    msg = raised(luagent.agent, { model = MODEL, tools = { def } })
    assert.matches(plain("tools[1]: unknown field 'read_onyl' (did you mean 'read_only'?)"), msg)
    -- as a value: the message and the field
    local t, why, field = luagent.tools.check(def)
    assert.is_nil(t)
    assert.equals("read_onyl", field)
    assert.equals("unknown field 'read_onyl' (did you mean 'read_only'?)", why)
  end)

  it("a policy's unknown field names the nearest one, at every level", function()
    local msg = raised(luagent.agent, { model = MODEL, policy = { max_retry = 2 } })
    assert.matches(plain("unknown field 'max_retry' (did you mean 'max_retries'?)"), msg)
    msg = raised(luagent.agent, { model = MODEL, policy = { backoff = { stratgy = "fixed" } } })
    assert.matches(plain("unknown field 'backoff.stratgy' (did you mean 'backoff.strategy'?)"), msg)
    msg = raised(luagent.agent, { model = MODEL, tool_policy = { time_out = 3 } })
    assert.matches(plain("unknown field 'time_out' (did you mean 'timeout'?)"), msg)
    -- a far one still points at the list
    msg = raised(luagent.agent, { model = MODEL, policy = { fallback_models = {} } })
    assert.matches(plain("unknown field 'fallback_models' (policies/README.md lists the fields)"), msg)
  end)

  it("a policy file's unknown field names its line and the nearest one", function()
    local dir = helpers.tempdir()
    local path = dir .. "/p.lua"
    local fh = assert(io.open(path, "w"))
    fh:write("return {\n  max_retries = 1,\n  atempt_timeout = 5,\n}\n")
    fh:close()
    -- a call resolves its policy before anything is sent
    local msg = raised(luagent.stream, { model = MODEL, messages = {}, policy = path })
    assert.matches(plain(path .. ":3: unknown field 'atempt_timeout' (did you mean 'attempt_timeout'?)"), msg)
    os.remove(path)
    os.remove(dir)
  end)

  it("a runtime's unknown setting names the nearest one", function()
    local msg = raised(luagent.runtime, { log_levl = "info" })
    assert.matches(plain("luagent.runtime: no setting 'log_levl' (did you mean 'log_level'?)"), msg)
    assert.matches("options_spec.lua:%d+:", msg)
    msg = raised(luagent.configure, { max_cots = 1 })
    assert.matches(plain("luagent.configure: no setting 'max_cots' (did you mean 'max_cost'?)"), msg)
    msg = raised(luagent.configure, { output_schema = 1 })
    assert.matches(plain("luagent.configure: no setting 'output_schema'") .. "$", msg)
  end)

  it("a provider spec's unknown key names the nearest one", function()
    local msg = raised(luagent.provider, { kind = "openai", model = "m", base_ur = "http://127.0.0.1:9", api_key = "k" })
    names(msg, "provider", "base_ur", "base_url")
    assert.matches("options_spec.lua:%d+:", msg)
    msg = raised(luagent.agent, { model = { kind = "openai", model = "m", apikey = "k", base_url = "http://127.0.0.1:9" } })
    names(msg, "provider", "apikey", "api_key")
    msg = raised(luagent.provider, { kind = "openai", model = "m", api_key = "k", base_url = "http://127.0.0.1:9",
      timeout = { frist_byte = 3 } })
    names(msg, "provider timeout", "frist_byte", "first_byte")
  end)

  it("tools.mcp's unknown option names the nearest one", function()
    local msg = raised(luagent.tools.mcp, { command = { "true" }, init_timout = 1 })
    names(msg, "tools.mcp", "init_timout", "init_timeout")
    assert.matches("options_spec.lua:%d+:", msg)
    msg = raised(luagent.tools.mcp, { command = { "true" }, restart = { bse = 1 } })
    names(msg, "tools.mcp restart", "bse", "base")
  end)

  it("tools.dir's unknown option names the nearest one", function()
    local dir = helpers.tempdir()
    local msg = raised(luagent.tools.dir, dir, { wacth = false })
    names(msg, "tools.dir", "wacth", "watch")
    assert.matches("options_spec.lua:%d+:", msg)
    os.remove(dir)
  end)
end)

-- Each list of known keys is the one its table's LuaLS class documents
-- (docs/api.md is made from those): an option added to a list and not
-- documented, or documented and not in its list, fails here.
describe("each list of known keys", function()
  -- The fields of `---@class <class>` in `file`, in order.
  local function class_fields(file, class)
    local out, inside = {}, false
    for line in io.lines(file) do
      local c = line:match("^%-%-%-@class ([%w_.]+)")
      if c then inside = c == class
      elseif inside then
        local f = line:match("^%-%-%-@field ([%w_]+)")
        if f then out[#out + 1] = f elseif not line:match("^%-%-%-") then inside = false end
      end
    end
    return out
  end

  local function same(list, fields, extra)
    local want = {}
    for _, k in ipairs(fields) do want[#want + 1] = k end
    for _, k in ipairs(extra or {}) do want[#want + 1] = k end
    local got = {}
    for _, k in ipairs(list) do got[#got + 1] = k end
    table.sort(want)
    table.sort(got)
    assert.same(want, got)
  end

  it("is what its class documents", function()
    same(require("luagent.agent.loop").OPTIONS, class_fields("lua/luagent/agent/loop.lua", "luagent.AgentOptions"))
    -- the call's last four are the agent layer's, not documented for users
    same(require("luagent.model.call").OPTIONS, class_fields("lua/luagent/model/call.lua", "luagent.StreamOptions"),
      { "before_publish", "agent", "agent_id", "max_cost" })
    same(require("luagent.agent.tools.tool").FIELDS, class_fields("lua/luagent/agent/tools/tool.lua", "luagent.ToolDef"))
    same(require("luagent.model.provider").SPEC, class_fields("lua/luagent/model/provider.lua", "luagent.ProviderSpec"))
    same(require("luagent.agent.tools.mcp").OPTIONS,
      class_fields("lua/luagent/agent/tools/mcp/init.lua", "luagent.McpOptions"))
  end)
end)
