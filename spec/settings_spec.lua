-- One configuration surface (issue 25): every setting of a runtime is
-- listed once, in lua/luagent/config.lua's SETTINGS, and the checks, the
-- environment, `luagent run`'s flags and help, and README.md's table are
-- made from it or checked against it. No layer reads a variable of its
-- own, and no module field is a setting: nothing outside a module assigns
-- its fields.
local luagent = require "luagent"
local config = require "luagent.config"
local h = require "helpers"

-- An environment for read_env: name -> value.
local function env_of(t) return function(name) return t[name] end end

-- Every .lua file under `dir`, sorted.
local function lua_files(dir)
  local p = io.popen("find " .. h.quote(dir) .. " -name '*.lua' | sort")
  local out = {}
  for line in p:lines() do out[#out + 1] = line end
  p:close()
  return out
end

-- A line without its comment ("--" outside a quoted string).
local function uncommented(line)
  local quote, i = nil, 1
  while i <= #line do
    local c = line:sub(i, i)
    if quote then
      if c == "\\" then i = i + 1 elseif c == quote then quote = nil end
    elseif c == '"' or c == "'" then quote = c
    elseif line:sub(i, i + 1) == "--" then return line:sub(1, i - 1) end
    i = i + 1
  end
  return line
end

-- A file's lines with their comments cut (long comments and long strings
-- are left as they are: the checks below look at one-line statements).
local function code_lines(path)
  local out = {}
  for line in io.lines(path) do out[#out + 1] = uncommented(line) end
  return out
end

-- What each `os.getenv` of a line is given: the text between its
-- parentheses, or "<reference>" when it is not called there.
local function getenv_args(line)
  local out, from = {}, 1
  while true do
    local _, e = line:find("os%.getenv", from)
    if not e then return out end
    local args = line:match("^%s*(%b())", e + 1)
    out[#out + 1] = args and args:sub(2, -2):match("^%s*(.-)%s*$") or "<reference>"
    from = e + 1
  end
end

describe("the table of settings (lua/luagent/config.lua)", function()
  it("lists each setting and each flag once, every entry with its help", function()
    local names, flags = {}, {}
    for _, e in ipairs(config.SETTINGS) do
      assert.is_string(e.help, "help of " .. tostring(e.name or e.flag))
      assert.is_nil(e.help:find("\n"), "one line")
      if e.name then
        assert.is_nil(names[e.name], "listed twice: " .. e.name)
        names[e.name] = true
        assert.is_function(e.check, e.name)
        assert.is_string(e.want, e.name)
        assert.is_false(e.run_only or false, e.name .. " is a setting, not run-only")
        if e.default ~= nil then assert.is_true(e.check(e.default), "the default of " .. e.name) end
      else
        assert.is_true(e.run_only, "an entry with no setting is a run-only flag")
        assert.is_string(e.flag)
      end
      if e.flag then
        assert.is_nil(flags[e.flag], "flag listed twice: " .. e.flag)
        flags[e.flag] = true
      end
    end
    -- the settings luagent.configure took before the table, all still there
    for _, name in ipairs { "policy", "seed", "providers", "record", "policy_path", "options", "log_level",
                            "log_sink", "log_format", "log_content", "max_cost", "durable", "journal_file",
                            "run_info" } do
      assert.is_truthy(config.entry(name), name)
    end
  end)

  it("checks a runtime's settings: an unknown name or a bad value raises, naming it", function()
    local ok, err = pcall(luagent.runtime, { redis_retry_evry = 1 })
    assert.is_false(ok)
    assert.matches("luagent.runtime: no setting 'redis_retry_evry'", err)
    ok, err = pcall(luagent.runtime, { redis_retry_every = 0 })
    assert.is_false(ok)
    assert.matches("redis_retry_every must be a number of seconds > 0, got 0", err)
    ok, err = pcall(luagent.runtime, { otlp_batch = 2.5 })
    assert.is_false(ok)
    assert.matches("otlp_batch must be a whole number >= 1, got 2.5", err)
    local rt = luagent.runtime { otlp_timeout = 2, service_name = "svc" }
    assert.equal(2, rt.settings:get("otlp_timeout"))
    assert.equal("svc", rt.settings:get("service_name"))
    assert.equal("set", rt.settings:source("service_name"))
    assert.equal(512, rt.settings:get("otlp_batch"))
    assert.equal("default", rt.settings:source("otlp_batch"))
    rt:close()
  end)
end)

describe("the environment, read through the table when a runtime is made", function()
  it("gives settings their starting values; what the runtime is made with wins", function()
    local s = config.new()
    local ignored = s:read_env({ log_format = "json" }, env_of {
      LUAGENT_LOG = "debug", LUAGENT_REDIS_URL = "redis://127.0.0.1:6379/2", LUAGENT_HOME = "/tmp/home",
      OTEL_EXPORTER_OTLP_ENDPOINT = "http://collector:4318", OTEL_EXPORTER_OTLP_TRACES_ENDPOINT = "",
      OTEL_EXPORTER_OTLP_TIMEOUT = "250", OTEL_BSP_MAX_QUEUE_SIZE = "8", OTEL_SERVICE_NAME = "svc",
    })
    assert.same({}, ignored)
    assert.equal("debug", s:get("log_level"))
    assert.equal("LUAGENT_LOG", s:source("log_level"))
    assert.equal("redis://127.0.0.1:6379/2", s:get("redis_url"))
    assert.equal("/tmp/home", s:get("home"))
    -- an empty variable counts as unset: the next one of the list gives it
    assert.equal("http://collector:4318", s:get("otlp_endpoint"))
    assert.equal("OTEL_EXPORTER_OTLP_ENDPOINT", s:source("otlp_endpoint"))
    assert.equal(0.25, s:get("otlp_timeout")) -- milliseconds in the variable, seconds in the setting
    assert.equal(8, s:get("otlp_max_queue"))
    assert.equal("svc", s:get("service_name"))
    -- the first variable of a list wins
    s = config.new()
    s:read_env(nil, env_of { OTEL_EXPORTER_OTLP_TRACES_ENDPOINT = "http://a", OTEL_EXPORTER_OTLP_ENDPOINT = "http://b" })
    assert.equal("http://a", s:get("otlp_endpoint"))
    -- given to the runtime: the variable is not read at all (a bad one does not raise)
    s = config.new()
    s:read_env({ log_level = "warn" }, env_of { LUAGENT_LOG = "chatty" })
    assert.equal("warn", s:get("log_level"))
  end)

  it("raises for a bad value of luagent's own variables, naming it; ignores OpenTelemetry's, saying so", function()
    local ok, err = pcall(config.new().read_env, config.new(), nil, env_of { LUAGENT_LOG = "chatty" })
    assert.is_false(ok)
    assert.equal("LUAGENT_LOG must be debug, info, warn, error or off (got 'chatty')", err)
    ok, err = pcall(config.new().read_env, config.new(), nil, env_of { LUAGENT_REDIS_URL = "http://u:s3cret@x/0" })
    assert.is_false(ok)
    assert.equal("LUAGENT_REDIS_URL must be a URL that starts with redis:// (got 'http://u:***@x/0')", err)
    local s = config.new()
    local ignored = s:read_env(nil, env_of { OTEL_EXPORTER_OTLP_TIMEOUT = "soon", OTEL_BSP_MAX_QUEUE_SIZE = "0" })
    table.sort(ignored)
    assert.same({ "OTEL_BSP_MAX_QUEUE_SIZE must be a whole number >= 1 (got '0'); ignored",
                  "OTEL_EXPORTER_OTLP_TIMEOUT must be a number of milliseconds > 0 (got 'soon'); ignored" }, ignored)
    assert.equal(5, s:get("otlp_timeout"))
    assert.equal(2048, s:get("otlp_max_queue"))
  end)

  it("is read by luagent.runtime{} and by luagent run, which names a bad variable and exits 2", function()
    local script = h.tempfile([[
      local luagent = require "luagent"
      local rt = luagent.runtime {}
      print(rt.settings:get("redis_url"), rt.settings:source("redis_url"), rt.settings:get("otlp_batch"))
      print(luagent.configure().log_level, luagent.default_runtime().settings:source("log_level"))
      print(luagent.runtime({ redis_url = false }).settings:get("redis_url"))
    ]], ".lua")
    local r = h.run_env({ LUAGENT_REDIS_URL = "redis://127.0.0.1:1/0", OTEL_BSP_MAX_EXPORT_BATCH_SIZE = "7",
                          LUAGENT_LOG = "error" }, "run", script)
    assert.equal(0, r.code, r.stderr)
    assert.equal("redis://127.0.0.1:1/0\tLUAGENT_REDIS_URL\t7\nerror\tLUAGENT_LOG\nnil\n", r.stdout)
    -- --log wins over LUAGENT_LOG
    r = h.run_env({ LUAGENT_LOG = "error" }, "run", "--log", "info", script)
    assert.matches("\ninfo\tset\n", r.stdout)
    r = h.run_env({ LUAGENT_LOG = "chatty" }, "run", script)
    assert.equal(2, r.code)
    assert.matches("^luagent: LUAGENT_LOG must be debug, info, warn, error or off %(got 'chatty'%)\n", r.stderr)
    os.remove(script)
  end)
end)

describe("luagent run's flags, made from the table", function()
  it("lists every flag of the table in its help, and every variable a flag's help names is the flag's", function()
    local r = h.run("help", "run")
    assert.equal(0, r.code)
    assert.truthy(r.stdout:find(config.flag_lines(), 1, true), "the option lines, generated")
    assert.truthy(r.stdout:find(config.env_lines(), 1, true), "the environment lines, generated")
    for _, e in ipairs(config.SETTINGS) do
      if e.flag and e.env then
        for _, var in ipairs(config.variables(e)) do
          assert.truthy((e.help .. (e.more or "")):find(var, 1, true), "--" .. e.flag .. " names " .. var)
        end
      end
    end
  end)

  it("takes every flag of the table, and no other; a bad value is named with what it wants", function()
    for flag, takes in pairs(config.run_flags()) do
      local r = takes and h.run("run", "--" .. flag, "x", "--nope") or h.run("run", "--" .. flag, "--nope")
      assert.matches("run: unknown flag '%-%-nope'", r.stderr, 1, false)
    end
    local cases = {
      { { "--max-cost", "-1" }, "run: --max-cost wants a number of dollars >= 0, not '-1'" },
      { { "--seed", "1.5" }, "run: --seed wants an integer, not '1.5'" },
      { { "--log-format", "xml" }, "run: --log-format wants json, text or auto, not 'xml'" },
      { { "--events", "csv:x" }, "run: --events wants 'jsonl:FILE' or 'jsonl:-', not 'csv:x'" },
    }
    for _, c in ipairs(cases) do
      local r = h.run("run", c[1][1], c[1][2], "x.lua")
      assert.equal(2, r.code)
      assert.truthy(r.stderr:find(c[2], 1, true), r.stderr)
    end
    assert.same({ "policy", "cassette", "fast", "mock", "seed", "retry-safe", "tools", "durable" },
      config.recorded_flags())
  end)

  it("turns the flags into the settings of the runtime it makes with luagent.runtime", function()
    local policy = h.tempfile("return { max_retries = 1 }", ".lua")
    local script = h.tempfile([[
      local luagent = require "luagent"
      local s = luagent.configure()
      local rt = luagent.default_runtime()
      print(s.policy:match("[^/]*$"), s.seed, s.log_format, s.log_content, s.max_cost, s.durable,
        s.options.seed, s.options.retry_safe, rt.settings:source("seed"), rt.settings:source("log_format"))
    ]], ".lua")
    local r = h.run("run", "--policy", policy, "--seed", "7", "--log-format", "text", "--log-content",
      "--max-cost", "2", "--retry-safe", "--log", "off", script)
    assert.equal(0, r.code, r.stderr)
    assert.equal(policy:match("[^/]*$") .. "\t7\ttext\ttrue\t2\tnil\t7\ttrue\tset\tset\n", r.stdout)
    os.remove(policy)
    os.remove(script)
  end)
end)

describe("README.md's table of settings", function()
  it("is the table's (run 'make settings' after changing lua/luagent/config.lua)", function()
    local text = h.slurp("README.md")
    local BEGIN = "<!-- settings: generated from lua/luagent/config.lua by `make settings` -->\n"
    local _, b = text:find(BEGIN, 1, true)
    local c = text:find("<!-- end of settings -->", b or 1, true)
    assert.truthy(b and c, "README.md has the settings markers")
    assert.equal(config.markdown(), text:sub(b + 1, c - 1), "README.md's table differs: run 'make settings'")
  end)
end)

-- Where the library reads the environment, and why: file -> {what os.getenv
-- is given -> why}. A setting's variable is read once, by config.lua when
-- a runtime is made; the rest are no setting of a runtime.
local READS = {
  ["lua/luagent/config.lua"] = { ["<reference>"] = "the one place a runtime's variables are read" },
  ["lua/luagent/model/provider.lua"] = {
    ["info.base_env"] = "an adapter's base-URL variable (OPENAI_BASE_URL, ...): the adapter's own",
    ["info.key_env"] = "an adapter's key variable (OPENAI_API_KEY, ...): the adapter's own",
  },
  ["lua/luagent/cli/cost.lua"] = {
    ["openrouter.base_env"] = "the OpenRouter adapter's variables, read through the adapter",
    ["openrouter.key_env"] = "the OpenRouter adapter's variables, read through the adapter",
  },
  ["lua/luagent/cli/init.lua"] = {
    ["name"] = "whether a key of any adapter is set (provider.key_variables()): the embedded mock or not",
    ['"PWD"'] = "the folder a durable run started in: a fact of the process, recorded, no setting",
    ['"HOME"'] = "where `luagent chat` keeps its line history without LUAGENT_HOME: the user's home, as a shell's",
  },
  ["lua/luagent/cli/chat.lua"] = {
    ["var"] = "whether the key of the chat's model is set (the adapter's key_env): the embedded mock or not",
  },
  ["lua/luagent/base/http.lua"] = {
    ['"CURL_CA_BUNDLE"'] = "the TLS trust store, curl's own convention: the machine's, no runtime's",
    ['"SSL_CERT_FILE"'] = "the TLS trust store, OpenSSL's convention: the machine's, no runtime's",
  },
  ["lua/luagent/base/child_env.lua"] = { ["name"] = "the variables a child process inherits, passed on" },
  ["lua/luagent/agent/journal/owner.lua"] = { ['"HOSTNAME"'] = "who holds a run's claim: the host's name" },
  ["lua/luagent/agent/journal/init.lua"] = {
    ['"PWD"'] = "the folder a durable run started in: a fact of the process, recorded, no setting",
  },
  ["lua/luagent/observe/log.lua"] = {
    ['"NO_COLOR"'] = "whether the terminal the lines go to wants colour: the terminal's, as isatty is",
  },
}

describe("the environment, read in one place", function()
  it("is read nowhere in the library but where READS says why (the bench's own variables aside)", function()
    local found = {}
    for _, path in ipairs(lua_files("lua/luagent")) do
      if not path:find("^lua/luagent/mock/") and not path:find("^lua/luagent/sim/") then
        for n, line in ipairs(code_lines(path)) do
          for _, what in ipairs(getenv_args(line)) do
            local why = READS[path] and READS[path][what]
            if not why then found[#found + 1] = path .. ":" .. n .. ": os.getenv(" .. what .. ")" end
          end
        end
      end
    end
    assert.same({}, found)
  end)

  it("leaves every pending read a setting to read instead", function()
    for _, reads in pairs(READS) do
      for var, why in pairs(reads) do
        local name = why:match("^pending: setting (%S+)$")
        if name then
          local e = assert(config.entry(name), name)
          local listed = false
          for _, v in ipairs(config.variables(e)) do listed = listed or ('"' .. v .. '"' == var) end
          assert.is_true(listed, var .. " is the variable of setting " .. name)
        end
      end
    end
  end)
end)

-- Module fields assigned from outside the module, and why each may be:
-- "module.field" -> why. A setting is a runtime's (the table), never a
-- module field.
local ASSIGNED = {
  -- test doubles: a spec swaps a function to watch it or make it fail, and puts it back
  ["luagent.model.policy.find"] = "a spy: the policy cache looks a name up once",
  ["luagent.core.breaker"] = "a spy: the simulation makes one breaker per strategy",
  ["luagent.core.retry_budget"] = "a spy: the simulation makes one budget per strategy",
  ["luagent.agent.tools.mcp.Set.make_tool"] = "a double: a tool set whose tools fail to build",
  ["luagent.options"] = "the face refuses it (the spec checks that it raises)",
}

-- The fields of required luagent modules a file assigns: a list of
-- {module.field, "path:line"}.
local KEYWORDS = { ["and"] = true, ["or"] = true, ["not"] = true, ["if"] = true, ["return"] = true,
                   ["local"] = true, ["for"] = true, ["in"] = true, ["while"] = true, ["until"] = true,
                   ["function"] = true, ["elseif"] = true }

-- The names a file binds to a luagent module: var -> module (`x =
-- require "luagent.y"` and `x = require("luagent.y")`, not `x =
-- require("luagent").z`).
local function required(text)
  local mods, from = {}, 1
  while true do
    local a, e, var = text:find("([%w_]+)%s*=%s*require%f[%W]", from)
    if not a then return mods end
    local rest = text:sub(e + 1)
    local mod, tail = rest:match("^%s*%(%s*[\"'](luagent[%w_.]*[%w_])[\"']%s*%)(.?)")
    if not mod then mod, tail = rest:match("^%s*[\"'](luagent[%w_.]*[%w_])[\"'](.?)") end
    if mod and tail ~= "." and tail ~= ":" then mods[var] = mod end
    from = e + 1
  end
end

local function assignments(path)
  local lines = code_lines(path)
  local mods = required(table.concat(lines, "\n"))
  local out = {}
  for n, line in ipairs(lines) do
    -- the statements of the line (cut at `then`, `do`, `else` and `;`),
    -- and the left side of each assignment: names and fields, comma-separated
    local cut = line
    for _, kw in ipairs { "then", "do", "else" } do cut = cut:gsub("%f[%w]" .. kw .. "%f[%W]", ";") end
    for statement in cut:gmatch("[^;]+") do
      local lhs = statement:match("^%s*([%w_.,%s]-)%s*=[^=]") or statement:match("^%s*([%w_.,%s]-)%s*=$")
      for word in (lhs or ""):gmatch("[%w_]+") do
        if KEYWORDS[word] then lhs = nil break end
      end
      for target in (lhs or ""):gmatch("[^,%s]+") do
        local var, field = target:match("^([%w_]+)%.([%w_.]+)$")
        if var and mods[var] then out[#out + 1] = { mods[var] .. "." .. field, path .. ":" .. n } end
      end
    end
    for mod, field in line:gmatch("require%s*%(%s*[\"'](luagent[%w_.]*)[\"']%s*%)%.([%w_.]+)%s*=[^=]") do
      out[#out + 1] = { mod .. "." .. field, path .. ":" .. n }
    end
  end
  return out
end

describe("module fields", function()
  it("are assigned by nobody outside their module (spies and pending owners aside, named in ASSIGNED)", function()
    local found = {}
    local files = lua_files("spec")
    for _, f in ipairs(lua_files("lua/luagent")) do files[#files + 1] = f end
    for _, f in ipairs(lua_files("examples")) do files[#files + 1] = f end
    for _, path in ipairs(files) do
      for _, a in ipairs(assignments(path)) do
        if not ASSIGNED[a[1]] then found[#found + 1] = a[2] .. ": " .. a[1] end
      end
    end
    assert.same({}, found)
  end)

  it("are found by the check (it sees what it must)", function()
    local path = h.tempfile(table.concat({
      'local shared = require "luagent.model.endpoint.redis"',
      'local log = require("luagent.observe.log")',
      "shared.retry_every = 0.05",
      "log.sink, shared.ttl = print, 1",
      'require("luagent.model.call")' .. ".log = nil", -- (cut in two: this file is scanned too)
      "if shared.ttl == 1 then end",
      "local t = { shared.ttl }",
      "if shared.ttl and log.level then x = 1 end",
      'local rec, err = require("luagent.observe.record").open("f")',
      "err.message = nil",
      "for i = 1, 2 do log" .. ".format = i end",
    }, "\n"), ".lua")
    local got = {}
    for _, a in ipairs(assignments(path)) do got[#got + 1] = a[1] end
    os.remove(path)
    assert.same({ "luagent.model.endpoint.redis.retry_every", "luagent.observe.log.sink",
                  "luagent.model.endpoint.redis.ttl", "luagent.model.call.log", "luagent.observe.log.format" }, got)
  end)
end)
