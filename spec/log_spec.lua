-- Structured logs (lua/luagent/observe/log.lua): one line per event worth logging,
-- with the same leading fields everywhere (time, level, agent, model or
-- tool and call id, trace and span id, message), JSON or a compact text
-- form; content only when asked, cut and passed through the policy's
-- redact hook; the library's own lines through the same logger. In
-- process against the mock on loopback, and through the real binary
-- (`luagent run --log info examples/triage.lua >/dev/null` prints log
-- lines and nothing else).
local luagent = require "luagent"
local mock = require "luagent.mock"
local retry = require "luagent.model.call"
local log = require "luagent.observe.log"
local policy = require "luagent.model.policy"
local helpers = require "spec.support.helpers"
local cjson = require "cjson"

local ANSWER = "The answer is 42 and the SSN 123-45-6789 stays out of logs."

local function script(_, _, body)
  for _, m in ipairs(body.messages or {}) do
    if m.role == "tool" then return { text = ANSWER } end
  end
  return { text = "looking", tools = { { id = "c1", name = "lookup", arguments = { q = "who is 123-45-6789" } } } }
end

local lookup = { name = "lookup", description = "Looks up", read_only = true,
  params = { type = "object", properties = { q = { type = "string" } } },
  run = function() return "record of 123-45-6789: " .. string.rep("x", 5000) end }

-- The default runtime's logger (the one `luagent run` made).
local function logger() return luagent.default_runtime().log end

-- Runs the agent with the log consumer on; returns the lines written.
local function logged(level, opts)
  opts = opts or {}
  local lines, levels = {}, {}
  local saved = luagent.configure { log_sink = function(lvl, line) lines[#lines + 1] = line levels[#levels + 1] = lvl end,
    log_level = level, log_format = opts.format or "json", log_content = opts.content or false,
    policy = opts.redact and { redact = opts.redact } or false }
  local tracer = assert(luagent.default_runtime():trace())
  logger():start() -- as under `luagent run`: the retry's own line is left to its event
  local srv = assert(mock.start { faults = "503@1", seed = 1, script = script })
  local ok, err = pcall(function()
    local a = luagent.agent { name = "triage", tools = { lookup }, policy = { backoff = { strategy = "fixed", base = 0.5 } },
      model = { kind = "openai", model = "gpt-4o-mini", base_url = srv.url .. "/v1", api_key = "k" } }
    a:run("go")
    logger():library("luagent: a library message") -- the library's own line
  end)
  srv:close()
  logger():stop()
  tracer:stop()
  luagent.configure(saved)
  assert(ok, err)
  return lines, levels
end

local function decode_all(lines)
  local out = {}
  for i, l in ipairs(lines) do out[i] = cjson.decode(l) end
  return out
end

local function find(recs, msg, last)
  local found
  for _, r in ipairs(recs) do
    if r.msg:find(msg, 1, true) then
      found = r
      if not last then return r end
    end
  end
  return found
end

describe("log lines", function()
  before_each(function()
    luagent.clock.virtual()
    luagent.default_runtime().endpoints:reset()
  end)
  after_each(function()
    luagent.clock.real()
  end)

  it("are JSON with the same leading fields, the event's own fields, and trace ids", function()
    local lines = logged("info")
    local recs = decode_all(lines)
    for i, l in ipairs(lines) do
      assert.matches('^{"time":"%d%d%d%d%-%d%d%-%d%dT%d%d:%d%d:%d%d%.%d%d%dZ","level":"%a+",', l)
      assert.is_string(recs[i].msg)
    end
    local retry_line = find(recs, "provider error (attempt 1/6), retrying in 0.50s: http: HTTP 503")
    assert.is_table(retry_line)
    assert.equal("info", retry_line.level)
    assert.equal("triage", retry_line.agent)
    assert.equal("gpt-4o-mini", retry_line.model)
    assert.is_number(retry_line.call)
    assert.matches("^%x+$", retry_line.trace_id)
    assert.equal(32, #retry_line.trace_id)
    assert.equal(16, #retry_line.span_id)
    assert.equal("provider_retry", retry_line.event)
    assert.equal(503, retry_line.status)
    assert.equal(500, retry_line.delay_ms)
    assert.equal("overloaded", retry_line.class)
    -- the order: the leading fields first
    assert.matches('^{"time":"[^"]+","level":"info","agent":"triage","trace_id":', lines[1])
    local tool_end = find(recs, "tool call done")
    assert.equal("lookup", tool_end.tool)
    assert.matches("^call_mock", tool_end.call_id)
    assert.equal(retry_line.trace_id, tool_end.trace_id) -- one trace per agent run
    assert.are_not.equal(retry_line.span_id, tool_end.span_id)
    local done = find(recs, "model call done")
    assert.equal(2, done.attempts)
    assert.equal(200, done.status)
    assert.is_true(done.total_input_tokens > 0)
    local ended = find(recs, "agent ended: stop")
    assert.equal(2, ended.turns)
    assert.is_true(ended.cost == nil or type(ended.cost) == "number")
    -- the library's own line, with its level
    local lib = find(recs, "a library message")
    assert.equal("warn", lib.level)
    -- metadata only: no content anywhere
    for _, l in ipairs(lines) do
      assert.not_matches("123%-45%-6789", l)
      assert.not_matches("The answer is", l)
      assert.not_matches('"content"', l)
    end
    assert.is_nil(table.concat(lines):find("text_delta")) -- deltas are never logged
  end)

  it("carry content only when asked: cut to the bound and passed through redact", function()
    local redacted = 0
    local lines = logged("info", { content = true, redact = function(text)
      redacted = redacted + 1
      return (text:gsub("%d%d%d%-%d%d%-%d%d%d%d", "[ssn]"))
    end })
    local recs = decode_all(lines)
    assert.equal("looking", find(recs, "model call done").content)
    local done = find(recs, "model call done", true)
    assert.equal("The answer is 42 and the SSN [ssn] stays out of logs.", done.content)
    local started = find(recs, "tool call started")
    assert.equal('{"q":"who is [ssn]"}', started.content)
    local tool_end = find(recs, "tool call done")
    assert.equal("record of [ssn]: " .. string.rep("x", logger().content_max - #"record of 123-45-6789: ")
      .. "...[5023 bytes]", tool_end.content)
    assert.is_true(redacted >= 3)
    for _, l in ipairs(lines) do assert.not_matches("123%-45%-6789", l) end
  end)

  it("drop the content when the redact hook fails, and say so once", function()
    local lines = logged("info", { content = true, redact = function() error("boom") end })
    local recs = decode_all(lines)
    assert.equal("[redact failed]", find(recs, "model call done").content)
    local n = 0
    for _, r in ipairs(recs) do if r.msg:find("redact hook failed", 1, true) then n = n + 1 end end
    assert.equal(1, n)
  end)

  it("follow the level: warn hides info, debug adds the attempts' details, off silences all", function()
    local lines = logged("warn")
    assert.equal(1, #lines) -- the library's warning only
    local recs = decode_all(logged("debug"))
    assert.is_table(find(recs, "answer started"))
    assert.is_table(find(recs, "turn started"))
    assert.equal(0, #logged("off"))
  end)

  it("have a compact text form", function()
    local lines = logged("info", { format = "text" })
    local retry_line
    for _, l in ipairs(lines) do if l:find("provider error", 1, true) then retry_line = l end end
    assert.matches("^%d%d:%d%d:%d%d%.%d%d%d  INFO   triage gpt%-4o%-mini #%d+  provider error %(attempt 1/6%), "
      .. "retrying in 0%.50s: http: HTTP 503 from POST http://127%.0%.0%.1:%d+/v1/chat/completions: server_error: The engine is currently overloaded, please try again later%.  attempt=1 class=overloaded delay_ms=500 ", retry_line)
    assert.not_matches("\27", table.concat(lines)) -- no colour when stderr is no terminal
  end)

  it("carry a failed tool's error text as content when asked", function()
    local lines = {}
    local saved = luagent.configure { log_sink = function(_, line) lines[#lines + 1] = line end, log_level = "info",
      log_format = "json", log_content = true }
    logger():start()
    require("luagent").events.publish { type = "tool_execution_end", name = "lookup", call_id = "c9",
      attempts = 1, duration = 0.01, error = { kind = "tool_error", message = "no such record 123" } }
    logger():stop()
    luagent.configure(saved)
    assert.equal(1, #lines)
    local rec = cjson.decode(lines[1])
    assert.equal("tool call failed", rec.msg)
    assert.equal("no such record 123", rec.content)
  end)

  it("take redact from the policy, checked like every field", function()
    local p = assert(policy.new { redact = function(t) return t end })
    assert.is_function(p.redact)
    local _, err = policy.new({ redact = "mask" }, "p.lua", "return {\n  redact = \"mask\",\n}")
    assert.equal('p.lua:2: redact must be a function (got "mask")', err.message)
    _, err = policy.new({ traceparent = 1 }, "p.lua")
    assert.equal("p.lua: traceparent must be true or false (got 1)", err.message)
  end)
end)

describe("the default sink's lines", function()
  -- Publishes a failed call's final event, then two answered ones, to a
  -- log consumer writing with the default sink in `format`; returns the
  -- text written to stderr.
  local function three_lines(format)
    local events = require("luagent").events
    local written = {}
    local stderr = io.stderr
    io.stderr = { write = function(_, ...) for _, s in ipairs({ ... }) do written[#written + 1] = s end end }
    local saved = luagent.configure { log_level = "info", log_format = format, log_sink = false }
    local stop = events.subscribe(logger():consumer(), { types = log.TYPES })
    local ok, err = pcall(function()
      events.publish { type = "message_end", call = 1, final = true, attempts = 2, stop_reason = "error",
        request_model = "m", reason = "gave up", error = "overloaded: HTTP 529" }
      events.publish { type = "message_end", call = 2, final = true, attempts = 1, stop_reason = "stop",
        request_model = "m", started = 0 }
      events.publish { type = "message_end", call = 3, final = true, attempts = 1, stop_reason = "stop",
        request_model = "m", started = 0 }
    end)
    stop()
    io.stderr = stderr
    luagent.configure(saved)
    assert(ok, err)
    return table.concat(written)
  end

  it("carry no field of the line before (the record is emptied as its line is written)", function()
    local lines = {}
    for line in three_lines("json"):gmatch("[^\n]+") do lines[#lines + 1] = cjson.decode(line) end
    assert.equal(3, #lines)
    assert.equal("gave up", lines[1].reason)
    assert.equal("overloaded: HTTP 529", lines[1].error)
    for i = 2, 3 do
      assert.is_nil(lines[i].reason)
      assert.is_nil(lines[i].error)
      assert.equal(i, lines[i].call)
      assert.equal(1, lines[i].attempts)
      assert.equal("info", lines[i].level)
    end
  end)

  it("carry no field of the line before in the text form either", function()
    local lines = {}
    for line in three_lines("text"):gmatch("[^\n]+") do lines[#lines + 1] = line end
    assert.equal(3, #lines)
    assert.matches("reason=\"gave up\"", lines[1])
    for i = 2, 3 do
      assert.not_matches("%sreason=", lines[i])
      assert.not_matches("%serror=", lines[i])
      assert.matches("#" .. i, lines[i])
    end
  end)
end)

describe("the text form, for a terminal", function()
  -- What a model, a tool or a server may put in a name, an id, a message or
  -- content: an OSC that sets the title, a CSI that clears the screen, a C1
  -- CSI, a bare carriage return, a bidi override, a stray byte.
  local HOSTILE = "x\27]0;pwned\7\27[2J\u{9b}1;1H\r\u{202e}\xff"

  -- The text lines of the events published, at info, content on.
  local function text_lines(evs)
    local lines = {}
    local saved = luagent.configure { log_sink = function(_, line) lines[#lines + 1] = line end, log_level = "info",
      log_format = "text", log_content = true }
    logger():start()
    local ok, err = pcall(function()
      for _, ev in ipairs(evs) do require("luagent").events.publish(ev) end
      logger():write("warn", "a library message about " .. HOSTILE, { file = HOSTILE })
    end)
    logger():stop()
    luagent.configure(saved)
    assert(ok, err)
    return lines
  end

  it("escapes what a terminal would act on, in names, ids, messages, fields and content", function()
    local lines = text_lines {
      { type = "tool_execution_start", agent = "a" .. HOSTILE, name = "look" .. HOSTILE, call_id = "c" .. HOSTILE,
        arguments = { q = HOSTILE } },
      { type = "tool_execution_end", agent = "a", name = "look" .. HOSTILE, call_id = "c1", attempts = 1,
        duration = 0.01, error = { kind = "tool_error", message = "failed: " .. HOSTILE } },
      { type = "tools_reload_failed", file = HOSTILE, line = 1, message = HOSTILE },
      { type = "message_end", call = 1, final = true, attempts = 1, stop_reason = "stop", request_model = "m" .. HOSTILE,
        started = 0, message = { role = "assistant", content = "answer " .. HOSTILE } },
    }
    assert.equal(5, #lines)
    for _, l in ipairs(lines) do
      assert.is_nil(l:find("[%c\127]"), l) -- no control byte at all (no colour: not a terminal)
      assert.is_nil(l:find("\u{9b}", 1, true), l)
      assert.is_nil(l:find("\u{202e}", 1, true), l)
      assert.truthy(utf8.len(l), l)
    end
    assert.matches(" lookx\\u{1b}]0;pwned\\u{07}\\u{1b}%[2J\\u{9b}1;1H\\r\\u{202e}\\xff ", lines[1])
    assert.matches("a library message about x\\u{1b}", lines[5])
  end)
end)

describe("luagent run --log", function()
  it("with stdout thrown away, prints log lines and nothing else", function()
    local out, err = os.tmpname(), os.tmpname()
    os.execute(string.format("env -u OPENAI_API_KEY -u ANTHROPIC_API_KEY -u OPENROUTER_API_KEY -u LUAGENT_LOG"
      .. " %s run --log info --faults 503@1 examples/triage.lua >/dev/null 2>%s", helpers.quote(helpers.bin), err))
    local text = helpers.slurp(err)
    os.remove(out)
    os.remove(err)
    local n, kinds = 0, {}
    for line in text:gmatch("[^\n]+") do
      n = n + 1
      local ok, rec = pcall(cjson.decode, line)
      assert(ok and type(rec) == "table" and rec.time and rec.level and rec.msg, "not a log line: " .. line)
      kinds[rec.event or "library"] = true
    end
    assert.is_true(n > 10)
    for _, k in ipairs({ "agent_start", "provider_retry", "message_end", "tool_execution_start",
                         "tool_execution_end", "agent_end", "library" }) do
      assert.is_true(kinds[k] or false, k)
    end
  end)

  it("passes content through the --policy file's redact hook with --log-content; --log off is silent", function()
    local pol = helpers.tempfile('return { redact = function(t) return (t:gsub("c%-10%d%d", "c-XXXX")) end }\n', ".lua")
    local r = helpers.run("run", "--policy", pol, "--log", "info", "--log-content", "examples/triage.lua")
    assert.equal(0, r.code, r.stderr)
    assert.matches('"content":"[^"]*c%-XXXX', r.stderr)
    assert.not_matches("c%-10%d%d", r.stderr)
    assert.matches("c%-1041", r.stdout) -- the script's own output is the script's
    r = helpers.run("run", "--policy", pol, "--log", "info", "examples/triage.lua")
    assert.not_matches('"content"', r.stderr)
    r = helpers.run("run", "--log", "off", "--faults", "503@1", "examples/triage.lua")
    assert.equal(0, r.code)
    assert.equal("", r.stderr)
    os.remove(pol)
  end)

  it("on a terminal, writes the compact form in colour, without colour under NO_COLOR", function()
    if not os.execute("command -v script >/dev/null 2>&1") then
      pending("skipped: script(1) (util-linux) is not installed: no terminal to test on")
      return
    end
    local function on_tty(env)
      local out = os.tmpname()
      os.execute(string.format("env -u LUAGENT_LOG %s script -qec %s /dev/null >%s 2>&1 </dev/null", env,
        helpers.quote(helpers.quote(helpers.bin) .. " run --log info --faults 503@1 examples/triage.lua"), out))
      local text = helpers.slurp(out)
      os.remove(out)
      return text:match("[^\n]*provider error[^\n]*") or text
    end
    local line = on_tty("NO_COLOR=")
    assert.matches("^%d%d:%d%d:%d%d%.%d%d%d  \27%[36mINFO \27%[0m  triage gpt%-4o%-mini #1  provider error", line)
    line = on_tty("NO_COLOR=1")
    assert.matches("^%d%d:%d%d:%d%d%.%d%d%d  INFO   triage gpt%-4o%-mini #1  provider error", line)
  end)

  it("rejects an unknown format", function()
    local r = helpers.run("run", "--log-format", "xml", "examples/triage.lua")
    assert.equal(2, r.code)
    assert.matches("%-%-log%-format wants json, text or auto, not 'xml'", r.stderr)
  end)
end)

describe("log.duration", function()
  local log = require "luagent.observe.log"
  it("writes seconds, milliseconds or microseconds, rounded as the float formats round", function()
    assert.equal("37.968s", log.duration(37.968))
    assert.equal("1.000s", log.duration(1))
    assert.equal("2.000s", log.duration(1.9999))
    assert.equal("1.3ms", log.duration(0.0013))
    assert.equal("1.0ms", log.duration(0.001))
    assert.equal("1000.0ms", log.duration(0.99996))
    assert.equal("191µs", log.duration(0.000191))
    assert.equal("0µs", log.duration(0))
    assert.equal("?", log.duration(nil))
    -- the same text as string.format's float formats, for 100,000 random durations
    math.randomseed(11)
    for _ = 1, 100000 do
      local d = math.random() * 10 ^ math.random(-6, 3)
      local want = d >= 1 and string.format("%.3fs", d) or d >= 0.001 and string.format("%.1fms", d * 1000)
        or string.format("%dµs", math.floor(d * 1e6 + 0.5))
      assert.equal(want, log.duration(d))
    end
    assert.equal("-5µs", log.duration(-0.000005))
    assert.equal("?", log.duration(0 / 0))
    assert.equal("?", log.duration(math.huge))
  end)
end)

describe("core.iso_time (a log line's time)", function()
  local core = require "luagent.core"
  it("writes UTC to the millisecond, as os.date and string.format write it, across seconds and days", function()
    math.randomseed(12)
    local t = 1796086862.0
    for _ = 1, 20000 do
      t = t + math.random() * (math.random() < 0.01 and 100000 or 0.7)
      local s = math.floor(t)
      local want = os.date("!%Y-%m-%dT%H:%M:%S", s) .. string.format(".%03dZ", math.floor((t - s) * 1000))
      assert.equal(want, core.iso_time(t))
    end
    assert.equal("1970-01-01T00:00:00.000Z", core.iso_time(0))
    assert.equal("1969-12-31T23:59:59.500Z", core.iso_time(-0.5))
    -- four digits of year always (strftime's %Y would write 385)
    assert.equal("0385-07-25T07:06:40.250Z", core.iso_time(-50000000000 + 0.25))
    assert.equal("9999-12-31T23:59:59.000Z", core.iso_time(253402300799))
    assert.has_error(function() core.iso_time(253402300800) end)
    assert.has_error(function() core.iso_time(0 / 0) end)
    assert.has_error(function() core.iso_time(1e300) end)
  end)
end)
