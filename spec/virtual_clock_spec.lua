-- The virtual clock beside real work (host/loop.c, "The virtual clock"):
-- against a server outside the process (a `luagent mock` child answering
-- after real delays), a child process, and `luagent run --virtual-clock`,
-- virtual time follows real time while the outside work is waited on, so
-- a reply slower than a few milliseconds is not taken for a timeout; a
-- timeout guarding outside work still fires, after its time in real
-- seconds; the loop's own server still lets time jump. Margins are wide:
-- the machine may be loaded.
local luagent = require "luagent"
local core = require "luagent.core"
local http = require "luagent.base.http"
local mock = require "luagent.mock"
local cjson = require "cjson"
local helpers = require "helpers"

-- Starts `luagent mock` with `args` as a child process (its own clock, the
-- real one) and returns {url=, proc=}.
local function start_outside_mock(...)
  local proc = assert(core.process_spawn({ helpers.bin, "mock", "--listen", "127.0.0.1:0", ... },
                                         { stream = true }))
  local line = assert(proc:read_line())
  local url = assert(line:match("listening on (http://%S+)"), line)
  return { url = url, proc = proc }
end

local function stop_outside_mock(m)
  m.proc:kill(0)
  m.proc:wait()
  m.proc:close()
end

-- The model requests (POSTs) an outside mock received so far.
local function posts(m)
  local r = assert(http.fetch { url = m.url .. "/__luagent/requests", timeout = { total = 10 } })
  local n = 0
  for _, e in ipairs(cjson.decode(r.body)) do if e.method == "POST" then n = n + 1 end end
  return n
end

local function model_at(url)
  return { kind = "openai", model = "m", base_url = url .. "/v1", api_key = "k" }
end

local HI = { { role = "user", content = "hi" } }

-- Runs fn on the virtual clock, restoring the real clock afterwards.
local function virtually(fn)
  luagent.clock.virtual()
  local ok, err = pcall(fn)
  luagent.clock.real()
  if not ok then error(err, 0) end
end

describe("the virtual clock against a server outside the process", function()
  local slow, stalled -- first token after 0.2 s; headers after 30 s
  setup(function()
    luagent.configure { log_sink = function() end }
    slow = start_outside_mock("--ttft", "0.2")
    stalled = start_outside_mock("--faults", "stall:secs=30")
  end)
  after_each(function()
    assert.equal(0, luagent.stats().real, "no real work left counted")
  end)
  teardown(function()
    stop_outside_mock(slow)
    stop_outside_mock(stalled)
    luagent.configure { log_sink = false }
  end)

  it("follows real time while a model call waits for it: the first attempt succeeds", function()
    local before = posts(slow)
    virtually(function()
      local t0, started = luagent.now(), os.time()
      local msg, err = luagent.complete { model = model_at(slow.url), messages = HI }
      assert.is_nil(err, tostring(err))
      assert.equal(1, msg.attempts)
      local took = luagent.now() - t0
      -- about the 0.2 s the reply took in real time; nowhere near an
      -- attempt's timeout (idle 120 s, attempt 600 s)
      assert.is_true(took >= 0.15, "virtual time went by as real time did: " .. took)
      assert.is_true(took < 60, "no timeout's jump: " .. took)
      assert.is_true(os.time() - started < 60)
    end)
    assert.equal(1, posts(slow) - before, "one request reached the server")
  end)

  it("waits for the headers of a raw request as long as the reply takes, within its timeout", function()
    virtually(function()
      local t0 = luagent.now()
      local resp, err = http.request { url = slow.url .. "/v1/chat/completions", method = "POST",
        headers = { ["Content-Type"] = "application/json", Authorization = "Bearer k" },
        body = cjson.encode { model = "m", messages = HI, stream = false },
        timeout = { first_byte = 600, total = 900 } }
      assert.is_nil(err, tostring(err))
      assert.equal(200, resp.status)
      assert.truthy(resp:body():find("hi", 1, true))
      local took = luagent.now() - t0
      assert.is_true(took >= 0.15 and took < 60, "virtual time as real: " .. took)
    end)
  end)

  it("still fires a timeout that guards the outside work, after its time in real seconds", function()
    virtually(function()
      local t0 = luagent.now()
      local resp, err = http.request { url = stalled.url .. "/v1/chat/completions", method = "POST",
        headers = { ["Content-Type"] = "application/json", Authorization = "Bearer k" },
        body = cjson.encode { model = "m", messages = HI, stream = false },
        timeout = { first_byte = 0.3 } }
      assert.is_nil(resp)
      assert.equal("timeout", err.kind)
      assert.equal("first_byte", err.which)
      local took = luagent.now() - t0
      assert.is_true(took >= 0.3 and took < 30, "fired at virtual " .. took)
    end)
  end)

  it("counts a transfer to an outside server as real work, one to the loop's own server not", function()
    local own = assert(mock.start { ttft = 5 })
    virtually(function()
      -- the most real work the loop counted while the request was in flight
      local function real_while(url)
        local seen = -1
        local t = luagent.spawn(function()
          local resp = assert(http.request { url = url .. "/v1/chat/completions", method = "POST",
            headers = { ["Content-Type"] = "application/json", Authorization = "Bearer k" },
            body = cjson.encode { model = "m", messages = HI, stream = true }, timeout = { idle = 600 } })
          for _ in resp:events() do end
        end)
        while t:status() ~= "done" and t:status() ~= "failed" do
          local s = luagent.stats()
          if s.busy > 0 then seen = math.max(seen, s.real or -1) end
          luagent.sleep(0.01)
        end
        t:join()
        return seen
      end
      local ok, err = pcall(function()
        assert.equal(1, real_while(slow.url))
        local t0 = luagent.now()
        assert.equal(0, real_while(own.url))
        assert.is_true(luagent.now() - t0 >= 5, "the own server's 5 s went by on the virtual clock")
      end)
      own:close() -- its timers are on the virtual clock
      luagent.sleep(0)
      assert(ok, err)
    end)
  end)

  it("waits for a reply read on a TCP connection to it: a deadline around the read does not fire first", function()
    local host, port = slow.url:match("^http://([%d.]+):(%d+)$")
    local body = cjson.encode { model = "m", messages = HI, stream = false }
    virtually(function()
      local t0 = luagent.now()
      local head = luagent.deadline(30, function()
        local conn = assert(core.tcp_connect(host, tonumber(port)))
        assert(conn:write("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\n"
          .. "Content-Type: application/json\r\nContent-Length: " .. #body .. "\r\n\r\n" .. body))
        local got = assert(conn:read())
        conn:close()
        return got
      end)
      assert.matches("^HTTP/1.1 200", head)
      local took = luagent.now() - t0
      assert.is_true(took >= 0.15 and took < 30, "virtual time as real: " .. took)
    end)
  end)

  it("waits for a child process as the real clock does: a deadline around it does not fire first", function()
    virtually(function()
      local t0 = luagent.now()
      local res = luagent.deadline(30, function()
        local p = assert(core.process_spawn({ "sh", "-c", "sleep 0.2; echo done" }))
        return p:wait()
      end)
      assert.equal("done\n", res.stdout)
      local took = luagent.now() - t0
      assert.is_true(took >= 0.15 and took < 30, "virtual time as real: " .. took)
    end)
  end)

  it("luagent run --virtual-clock against it: one attempt, as on the real clock", function()
    local script = helpers.tempfile([[
      local luagent = require "luagent"
      local t0 = luagent.now()
      local msg, err = luagent.complete { model = { kind = "openai", model = "m", base_url = arg[1] .. "/v1",
        api_key = "k" }, messages = { { role = "user", content = "hi" } } }
      assert(msg, tostring(err))
      print(luagent.clock.is_virtual(), msg.attempts, luagent.now() - t0 < 60)
    ]], ".lua")
    local r = helpers.run("run", "--virtual-clock", "--log", "off", script, slow.url)
    os.remove(script)
    assert.equal(0, r.code, r.stderr)
    assert.equal("true\t1\ttrue\n", r.stdout)
  end)
end)
