-- The papercuts of a first hour (issue 26, item 8): `--policy NAME` on
-- `luagent run`, a policy file written in place (truncated, then written:
-- as `cat > f` and editors do), the cost table's line for a call that was
-- refused before any request, `agent_end.usage` after a failed first call,
-- and the README's word on `make peers`. Against the mock provider on
-- loopback (real libcurl, real sockets), on the virtual clock; the policy
-- watcher needs real file events, so its specs poll on the real clock,
-- bounded generously.
local luagent = require "luagent"
local mock = require "luagent.mock"
local h = require "helpers"

local NO_KEYS = { unset = { "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENROUTER_API_KEY" }, within = 120 }

-- A script that makes one call and prints each retry's max_attempts.
local ONE_CALL = [[
local luagent = require "luagent"
for ev in luagent.stream { model = "openai/gpt-4o-mini", messages = { { role = "user", content = "hi" } } } do
  if ev.type == "provider_retry" then print("max_attempts=" .. ev.max_attempts) end
  if ev.type == "message_end" and ev.final then print("stop=" .. ev.stop_reason) end
end
]]

describe("luagent run --policy", function()
  it("takes a bundled policy's name, as policy = 'patient' in a script does", function()
    local path = h.tempfile(ONE_CALL, ".lua")
    local r = h.run_env(NO_KEYS, "run", "--mock", "--fast", "--virtual-clock", "--faults", "503@1",
      "--policy", "patient", path)
    os.remove(path)
    assert.equal(0, r.code, r.stderr)
    assert.matches("max_attempts=13", r.stdout) -- patient.lua: 12 retries
    assert.matches("stop=stop", r.stdout)
  end)

  it("refuses an unknown name, listing the names there are (exit 2)", function()
    local path = h.tempfile(ONE_CALL, ".lua")
    local r = h.run_env(NO_KEYS, "run", "--mock", "--policy", "pateint", path)
    assert.equal(2, r.code, r.stderr)
    assert.matches("run: %-%-policy: no policy named 'pateint'", r.stderr)
    assert.matches("axon, default, full_jitter, patient, sdk, yoagent", r.stderr)
    -- a file that is not there is still named as a file
    r = h.run_env(NO_KEYS, "run", "--mock", "--policy", "no/such/policy.lua", path)
    os.remove(path)
    assert.equal(2, r.code, r.stderr)
    assert.matches("cannot open policy 'no/such/policy%.lua'", r.stderr)
  end)

  it("lists the names in a script's error too", function()
    local ok, err = pcall(luagent.stream, { model = "openai/x", policy = "no-such-policy" })
    assert.is_false(ok)
    assert.equal("usage", err.kind)
    assert.matches("no policy named 'no%-such%-policy' %(looked in .*%); policies there: axon, default, "
      .. "full_jitter, patient, sdk, yoagent", err.message)
  end)
end)

describe("a policy file written in place", function()
  local dir, path, rt, lines

  local function write(mode, text)
    local f = assert(io.open(path, mode))
    f:write(text)
    f:close()
  end

  -- Polls (on the real clock: file events are real) until cond() holds,
  -- for at most `seconds`; returns whether it did.
  local function poll(cond, seconds)
    local t0 = luagent.now()
    while not cond() do
      if luagent.now() - t0 > seconds then return false end
      luagent.sleep(0.01)
    end
    return true
  end

  local function warnings()
    local out = {}
    for _, l in ipairs(lines) do if l:find("policy", 1, true) then out[#out + 1] = l end end
    return out
  end

  before_each(function()
    dir = h.tempdir()
    path = dir .. "/inplace.lua"
    write("w", "return { max_retries = 1 }\n")
    lines = {}
    luagent.clock.real()
    rt = luagent.runtime { log_sink = function(_, line) lines[#lines + 1] = line end, log_level = "warn" }
  end)
  after_each(function()
    rt:close()
    os.execute("rm -rf " .. h.quote(dir))
  end)

  it("logs no warning when the file is emptied and then written, and applies the new text", function()
    local loader = rt.policies:watched(path)
    assert.equal(1, loader:get().max_retries)
    local v, reads = loader.version, loader.reads or 0
    -- `cat > f`, `vim` with backupcopy: open with O_TRUNC (an empty file,
    -- which the watcher sees) ...
    write("w", "")
    assert.is_true(poll(function() return loader.error ~= nil or (loader.reads or 0) > reads end, 30),
      "the watcher never read the emptied file")
    -- ... then the new text
    write("a", "return { max_retries = 4,\n  backoff = { strategy = 'fixed', base = 1 } }\n")
    assert.is_true(poll(function() return loader.version > v end, 30), "the new text was never loaded")
    assert.equal(4, loader:get().max_retries)
    assert.same({}, warnings())
    assert.is_nil(loader.error)
  end)

  it("still warns of a broken file with file:line, once, and keeps the last good policy", function()
    local loader = rt.policies:watched(path)
    local v = loader.version
    write("w", "return { max_retries = 2,\n  backoff = { strategy = = 'fixed' } }\n")
    assert.is_true(poll(function() return #warnings() > 0 end, 30), "no warning came")
    local w = warnings()
    assert.equal(1, #w, table.concat(w, "\n"))
    assert.matches(path:gsub("%p", "%%%0") .. ":2:", w[1])
    assert.matches("previous policy stays", w[1])
    assert.equal(v, loader.version)
    assert.equal(1, loader:get().max_retries)
    -- an empty file left so is no policy either: said, once it stays so
    write("w", "")
    assert.is_true(poll(function() return #warnings() > 1 end, 30), "no warning for the empty file")
    assert.matches("must return a table", warnings()[2])
    assert.equal(1, loader:get().max_retries)
  end)
end)

describe("the cost table", function()
  before_each(function() luagent.clock.virtual() end)
  after_each(function() luagent.clock.real() end)

  it("names the model of a call refused before any request, and says it was not sent", function()
    -- a runtime of its own: its endpoints and its meter are fresh
    local rt = luagent.runtime { log_sink = function() end }
    local meter = rt:meter("cost")
    local srv = assert(mock.start { faults = "503", seed = 1 })
    local model = { kind = "openai", model = "refused-model", base_url = srv.url .. "/v1", api_key = "k" }
    local policy = { max_retries = 0, breaker = { consecutive = 1, open_for = 60 } }
    local _, err1 = rt:complete { model = model, messages = { { role = "user", content = "a" } }, policy = policy }
    local _, err2 = rt:complete { model = model, messages = { { role = "user", content = "b" } }, policy = policy }
    srv:close()
    local text = table.concat(meter:report(), "\n")
    rt:close()
    assert.equal("http", err1.kind)
    assert.equal("circuit_open", err2.kind)
    assert.is_nil(text:find("nil", 1, true), text)
    assert.matches("call %d+  refused%-model  not sent %(circuit_open%)  in 0 out 0", text)
    assert.matches("call %d+  refused%-model  1 attempt  in 0 out 0", text)
  end)
end)

describe("agent_end", function()
  before_each(function()
    luagent.configure { log_sink = function() end }
    luagent.clock.virtual()
  end)
  after_each(function()
    luagent.configure { log_sink = false }
    luagent.clock.real()
  end)

  it("carries usage, zeros, after a first call that failed", function()
    local srv = assert(mock.start { faults = "401", seed = 1 })
    local a = luagent.agent { name = "nokey", policy = { max_retries = 0 },
      model = { kind = "openai", model = "m", base_url = srv.url .. "/v1", api_key = "k" } }
    local last = a:run("hello")
    srv:close()
    assert.equal("error", last.stop_reason)
    assert.same({ input_tokens = 0, output_tokens = 0, cache_read_tokens = 0, cache_write_tokens = 0 }, last.usage)
  end)

  it("carries usage when the run is aborted in its first call's backoff", function()
    local core = require "luagent.core"
    local srv = assert(mock.start { faults = "503", seed = 1 })
    local rt = luagent.runtime { log_sink = function() end }
    local a = rt:agent { name = "closed", policy = { backoff = { strategy = "fixed", base = 30 } },
      model = { kind = "openai", model = "m", base_url = srv.url .. "/v1", api_key = "k" } }
    local last, waiting = nil, false
    -- closed once the first attempt failed and its 30 s backoff began
    rt:subscribe(function() waiting = true end, { "provider_retry" })
    local task = core.spawn(function() last = a:run("go") end)
    local deadline = core.now() + 30
    while not waiting and core.now() < deadline do luagent.sleep(0.01) end
    assert.is_true(waiting, "the first attempt failed and its backoff began")
    rt:close()
    task:join()
    srv:close()
    assert.equal("aborted", last.stop_reason)
    assert.same({ input_tokens = 0, output_tokens = 0, cache_read_tokens = 0, cache_write_tokens = 0 }, last.usage)
  end)
end)

describe("README", function()
  it("says where it explains the tests that `make peers` installs the peers, and which specs skip without", function()
    local readme = h.slurp("README.md")
    local tests = readme:match("\n## Two commands\n(.-)\n## ")
    assert.is_string(tests)
    assert.matches("make peers", tests)
    for _, spec in ipairs({ "aimock_spec", "mcp_spec", "otlp_spec", "sdk_clients_spec" }) do
      assert.matches(spec, tests)
    end
    assert.matches("8 skipped", tests)
  end)
end)
