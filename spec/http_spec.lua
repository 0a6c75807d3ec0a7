-- The HTTP transport over loopback: each way a request can fail has its own
-- error kind and fields; streams, cancellation, flow control and concurrency.
local luagent = require "luagent"
local http = require "luagent.base.http"
local server = require "testserver"

local function sse_head(extra)
  local h = { "Content-Type: text/event-stream", "Connection: close" }
  for _, x in ipairs(extra or {}) do h[#h + 1] = x end
  return server.head(200, h)
end

-- Runs fn on the virtual clock, restoring the real clock afterwards.
local function virtually(fn)
  luagent.clock.virtual()
  local ok, err = pcall(fn)
  luagent.clock.real()
  if not ok then error(err, 0) end
end

-- A keep-alive server answering every request on a connection with
-- `answer` (raw bytes); -> its url, a function counting the connections it
-- accepted, and close().
local function keep_alive(answer)
  local conns = 0
  local listener = assert(require("luagent.core").tcp_listen("127.0.0.1", 0))
  local _, port = listener:address()
  local acceptor = luagent.daemon(function()
    while true do
      local conn = listener:accept()
      if not conn then return end
      conns = conns + 1
      luagent.daemon(function()
        while server.read_request(conn) do conn:write(answer) end
        conn:close()
      end)
    end
  end)
  return "http://127.0.0.1:" .. port .. "/", function() return conns end, function()
    listener:close()
    acceptor:cancel()
  end
end

describe("http.request", function()
  local srv
  after_each(function() if srv then srv.close() srv = nil end end)

  it("streams SSE events from a live server", function()
    srv = server.serve(function(conn)
      conn:write(sse_head())
      for i = 1, 3 do
        conn:write("data: " .. i .. "\n\n")
        luagent.sleep(0.001)
      end
    end)
    local resp = assert(http.request { url = srv.url .. "/s", method = "POST", body = "{}" })
    assert.equal(200, resp.status)
    assert.equal("text/event-stream", resp.headers["content-type"])
    local got = {}
    for ev in resp:events() do got[#got + 1] = ev.data end
    assert.are.same({ "1", "2", "3" }, got)
    assert.is_nil(resp.error)
  end)

  it("reads raw chunks and NDJSON lines", function()
    srv = server.serve(function(conn)
      conn:write(server.head(200, { "Connection: close" }))
      conn:write('{"a":1}\n{"b"')
      luagent.sleep(0.001)
      conn:write(':2}\n{"c":3}')
    end)
    local resp = assert(http.request { url = srv.url })
    local lines = {}
    for line in resp:lines() do lines[#lines + 1] = line end
    assert.are.same({ '{"a":1}', '{"b":2}', '{"c":3}' }, lines)
  end)

  it("sends method, headers and body", function()
    local seen
    srv = server.serve(function(conn, req)
      seen = req
      conn:write(server.head(200, { "Content-Length: 2" }) .. "ok")
    end)
    local r = assert(http.fetch { url = srv.url .. "/v1/x", method = "POST", body = '{"q":1}',
      headers = { ["x-test"] = "yes", "X-Listed: also" } })
    assert.equal("ok", r.body)
    assert.equal("POST", seen.method)
    assert.equal("/v1/x", seen.path)
    assert.equal("yes", seen.headers["x-test"])
    assert.equal("also", seen.headers["x-listed"])
    assert.equal('{"q":1}', seen.body)
  end)

  it("reuses one connection for requests to the same host", function()
    local url, conns, close = keep_alive(server.head(200, { "Content-Length: 2" }) .. "ok")
    for _ = 1, 5 do
      assert.equal("ok", assert(http.fetch { url = url }).body)
    end
    close()
    assert.equal(1, conns())
  end)

  describe("failures, each with its own kind", function()
    -- The table the issue asks for: every failure and its fields.
    local function check(err, kind, fields)
      assert.is_table(err)
      assert.equal(kind, err.kind, tostring(err))
      assert.is_string(err.message)
      assert.is_not_nil(err.curl_code)
      assert.is_number(err.bytes)
      assert.is_boolean(err.delivered)
      for k, v in pairs(fields or {}) do assert.equal(v, err[k], k) end
      assert.equal(kind .. ": " .. err.message, tostring(err))
    end

    it("refused: nothing listens on the port", function()
      local core = require "luagent.core"
      local probe = assert(core.tcp_listen("127.0.0.1", 0))
      local _, port = probe:address()
      probe:close()
      local resp, err = http.request { url = "http://127.0.0.1:" .. port .. "/" }
      assert.is_nil(resp)
      check(err, "refused", { curl_code = 7, bytes = 0, delivered = false })
    end)

    it("dns: a .invalid host does not resolve", function()
      local resp, err = http.request { url = "http://no-such-host.invalid/" }
      assert.is_nil(resp)
      check(err, "dns", { curl_code = 6 })
    end)

    it("dns on the virtual clock: the clock waits for the resolver, no timeout fires first", function()
      -- the resolver thread takes a few real milliseconds, about as long as
      -- the clock used to wait before jumping to the first-byte timeout:
      -- twenty lookups make the race show every time
      virtually(function()
        local t0 = luagent.now()
        for i = 1, 20 do
          local resp, err = http.request { url = "http://no-such-host-" .. i .. ".invalid/",
                                           timeout = { first_byte = 120, total = 600 } }
          assert.is_nil(resp)
          check(err, "dns", { curl_code = 6 })
        end
        assert.equal(t0, luagent.now()) -- not a second of virtual time went by
      end)
    end)

    it("eof: the connection closes before any response", function()
      srv = server.serve(function() end)
      local resp, err = http.request { url = srv.url }
      assert.is_nil(resp)
      check(err, "eof", { curl_code = 52 })
    end)

    it("tls: an https request to a plain server", function()
      srv = server.serve(function(conn) conn:read(); conn:write("this is not TLS\r\n\r\n") end, { raw = true })
      local resp, err = http.request { url = "https://127.0.0.1:" .. srv.port .. "/" }
      assert.is_nil(resp)
      check(err, "tls")
    end)

    it("reset: the peer resets the connection mid-body", function()
      srv = server.serve(function(conn)
        conn:write(sse_head() .. "data: one\n\n")
        luagent.sleep(0.01)
        conn:reset()
      end)
      local resp = assert(http.request { url = srv.url })
      local got = {}
      local ok, err = pcall(function() for ev in resp:events() do got[#got + 1] = ev.data end end)
      assert.is_false(ok)
      assert.are.same({ "one" }, got)
      check(err, "reset", { delivered = true, status = 200 })
      assert.is_true(err.bytes > 0)
      assert.equal(err, resp.error)
    end)

    it("truncated: the body ends before its Content-Length", function()
      srv = server.serve(function(conn)
        conn:write(server.head(200, { "Content-Length: 100" }) .. string.rep("x", 10))
      end)
      local resp = assert(http.request { url = srv.url })
      local ok, err = pcall(resp.body, resp)
      assert.is_false(ok)
      check(err, "truncated", { curl_code = 18, bytes = 10, delivered = true })
    end)

    it("timeout idle: a stalled stream fails on the virtual clock", function()
      virtually(function()
        srv = server.serve(function(conn)
          conn:write(sse_head() .. "data: first\n\n")
          luagent.sleep(3600) -- stall
        end)
        local t0 = luagent.now()
        local resp = assert(http.request { url = srv.url, timeout = { idle = 30 } })
        local ok, err = pcall(function() for _ in resp:events() do end end)
        assert.is_false(ok)
        check(err, "timeout", { which = "idle", delivered = true })
        assert.is_true(math.abs(luagent.now() - t0 - 30) < 1, "fired at virtual 30 s")
        srv.close(); srv = nil
      end)
    end)

    it("timeout idle: measured from the last bytes, however many came before", function()
      virtually(function()
        srv = server.serve(function(conn)
          conn:write(sse_head())
          for i = 1, 10 do conn:write("data: " .. i .. "\n\n"); luagent.sleep(1) end
          luagent.sleep(3600) -- stall after the last event (sent at 9 s)
        end)
        local t0 = luagent.now()
        local resp = assert(http.request { url = srv.url, timeout = { idle = 5 } })
        local n = 0
        local ok, err = pcall(function() for _ in resp:events() do n = n + 1 end end)
        assert.is_false(ok)
        check(err, "timeout", { which = "idle" })
        assert.equal(10, n)
        assert.is_true(math.abs(luagent.now() - t0 - 14) < 0.5, "fired at virtual " .. luagent.now() - t0)
        srv.close(); srv = nil
      end)
    end)

    it("timeout first_byte: headers that never come", function()
      virtually(function()
        srv = server.serve(function() luagent.sleep(3600) end)
        local t0 = luagent.now()
        local resp, err = http.request { url = srv.url, timeout = { first_byte = 20 } }
        assert.is_nil(resp)
        check(err, "timeout", { which = "first_byte", bytes = 0 })
        assert.is_true(math.abs(luagent.now() - t0 - 20) < 1)
        srv.close(); srv = nil
      end)
    end)

    it("timeout total: the whole request took too long", function()
      virtually(function()
        srv = server.serve(function(conn)
          conn:write(sse_head())
          for i = 1, 100 do conn:write("data: " .. i .. "\n\n"); luagent.sleep(1) end
        end)
        local resp = assert(http.request { url = srv.url, timeout = { total = 10, idle = 5 } })
        local n = 0
        local ok, err = pcall(function() for _ in resp:events() do n = n + 1 end end)
        assert.is_false(ok)
        check(err, "timeout", { which = "total" })
        assert.is_true(n >= 5 and n <= 11, "events before the deadline: " .. n)
        srv.close(); srv = nil
      end)
    end)

    it("http: a 429 with a JSON body keeps status, headers and body", function()
      srv = server.serve(function(conn)
        local body = '{"error":{"type":"rate_limit_error","message":"slow down"}}'
        conn:write(server.head(429, { "Retry-After: 7", "Content-Type: application/json",
          "Content-Length: " .. #body }) .. body)
      end)
      local resp, err = http.request { url = srv.url }
      assert.is_nil(resp)
      assert.equal("http", err.kind)
      assert.equal(429, err.status)
      assert.equal("7", err.headers["retry-after"])
      assert.matches("rate_limit_error", err.body)
    end)

    it("http: error bodies are kept up to 64 KiB", function()
      srv = server.serve(function(conn)
        local body = string.rep("e", 200 * 1024)
        conn:write(server.head(500, { "Content-Length: " .. #body }) .. body)
      end)
      local _, err = http.request { url = srv.url }
      assert.equal(500, err.status)
      assert.equal(64 * 1024, #err.body)
    end)

    it("protocol: an SSE line over the limit, with its byte offset", function()
      srv = server.serve(function(conn)
        conn:write(sse_head() .. "data: ok\n\ndata: " .. string.rep("x", 5000) .. "\n\n")
      end)
      local resp = assert(http.request { url = srv.url, sse = { max_line = 1024 } })
      local got = {}
      local ok, err = pcall(function() for ev in resp:events() do got[#got + 1] = ev.data end end)
      assert.is_false(ok)
      assert.are.same({ "ok" }, got)
      check(err, "protocol")
      assert.matches("offset", err.message)
      assert.equal(10 + 1024, err.offset) -- the byte that made the line too long
    end)

    it("protocol: the same when the transfer ended before the bad line was read", function()
      srv = server.serve(function(conn)
        conn:write(sse_head() .. "data: ok\n\ndata: " .. string.rep("x", 5000) .. "\n\n")
      end)
      local resp = assert(http.request { url = srv.url, sse = { max_line = 1024 } })
      while not resp:info().done do luagent.sleep(0.01) end -- curl is done: events are parsed as read
      local got = {}
      local ok, err = pcall(function() for ev in resp:events() do got[#got + 1] = ev.data end end)
      assert.is_false(ok)
      assert.are.same({ "ok" }, got)
      check(err, "protocol")
      assert.equal(10 + 1024, err.offset)
    end)
  end)

  it("aborts the transfer at once when its task is cancelled mid-stream", function()
    srv = server.serve(function(conn)
      conn:write(sse_head())
      for i = 1, 1000 do conn:write("data: " .. i .. "\n\n"); luagent.sleep(0.01) end
    end)
    local seen = 0
    local t = luagent.spawn(function()
      local resp = assert(http.request { url = srv.url })
      for _ in resp:events() do seen = seen + 1 end
    end)
    while seen < 2 do luagent.sleep(0.005) end
    t:cancel("enough")
    local ok, err = pcall(t.join, t)
    assert.is_false(ok)
    assert.equal("cancelled", err.kind)
    assert.equal(0, luagent.stats().busy)
    assert.is_true(seen < 1000)
  end)

  it("pauses a fast sender while Lua is slow, and loses nothing", function()
    local size = 8 * 1024 * 1024
    srv = server.serve(function(conn)
      conn:write(server.head(200, { "Content-Length: " .. size }))
      local block = string.rep("z", 64 * 1024)
      for _ = 1, size / #block do conn:write(block) end
    end)
    local resp = assert(http.request { url = srv.url })
    -- let the buffer fill until the transfer pauses (bounded; no fixed wait)
    for _ = 1, 400 do
      if resp:info().paused then break end
      luagent.sleep(0.005)
    end
    assert.is_true(resp:info().paused)
    local total = 0
    while true do
      local chunk = resp:read()
      if not chunk then break end
      total = total + #chunk
    end
    assert.equal(size, total)
  end)

  it("pauses a fast SSE sender while Lua is slow and resumes it as the events are read", function()
    -- events of 37 bytes never line up with curl's reads: a drained buffer
    -- ends inside an event, and resuming refills it while the reader looks
    local n = 100000
    srv = server.serve(function(conn)
      conn:write(sse_head())
      local batch = {}
      for i = 1, n do
        batch[#batch + 1] = string.format("data: %030d\n\n", i)
        if #batch == 1000 then conn:write(table.concat(batch)) batch = {} end
      end
    end)
    -- a bound under two of curl's reads: a resumed transfer's first read
    -- pauses it again, so the reader is woken by nothing but its own look
    local resp = assert(http.request { url = srv.url, max_buffer = 8192 })
    for _ = 1, 400 do
      if resp:info().paused then break end
      luagent.sleep(0.005)
    end
    assert.is_true(resp:info().paused)
    local count, last = 0, nil
    local reader = luagent.spawn(function()
      for ev in resp:events() do count, last = count + 1, ev.data end
    end)
    -- a lost wake-up would leave the reader waiting on a paused transfer
    for _ = 1, 1000 do
      if reader:status() == "done" or reader:status() == "failed" then break end
      luagent.sleep(0.005)
    end
    if reader:status() ~= "done" then reader:cancel("stuck") end
    assert.equal(n, count)
    assert.equal(string.format("%030d", n), last)
  end)

  it("holds 64 KiB unread per response by default, 16 KiB once responses hold 4 MiB in all", function()
    local size, n = 128 * 1024, 100
    srv = server.serve(function(conn)
      conn:write(server.head(200, { "Connection: close", "Content-Length: " .. size }) .. string.rep("x", size))
    end)
    local resps = {}
    for i = 1, n do resps[i] = assert(http.request { url = srv.url }) end
    local held
    for _ = 1, 400 do -- the bursts arrive while nobody reads
      held = 0
      local paused = 0
      for _, resp in ipairs(resps) do
        local info = resp:info()
        held = held + info.bytes
        if info.paused then paused = paused + 1 end
      end
      if paused == n then break end
      luagent.sleep(0.005)
    end
    -- 64 KiB each until 4 MiB are held, then 16 KiB: 64 KiB each would be 6.4 MB
    assert.is_true(held <= 4 * 1024 * 1024 + n * 16 * 1024, "held " .. held .. " bytes unread")
    for _, resp in ipairs(resps) do
      local total, largest = 0, 0
      while true do
        local chunk = resp:read() -- everything unread at once
        if not chunk then break end
        total, largest = total + #chunk, math.max(largest, #chunk)
      end
      assert.equal(size, total)
      assert.is_true(largest <= 64 * 1024, "held " .. largest .. " bytes unread")
    end
  end)

  it("keeps its connection when a burst paused it and the reader closes at the last event", function()
    -- as the provider does: it closes at the answer's last event, before
    -- it asks for the body's end (the chunked encoding's last chunk); a
    -- transfer paused by max_buffer and aborted there lost its connection
    local parts = {}
    for i = 1, 400 do
      local ev = string.format("data: %099d\n\n", i)
      parts[#parts + 1] = string.format("%x\r\n%s\r\n", #ev, ev)
    end
    parts[#parts + 1] = "0\r\n\r\n"
    local url, conns, close = keep_alive(server.head(200, { "Content-Type: text/event-stream",
      "Transfer-Encoding: chunked" }) .. table.concat(parts))
    for _ = 1, 3 do
      local resp = assert(http.request { url = url, max_buffer = 4096 })
      for _ = 1, 400 do assert.is_table(resp:next_event()) end
      resp:close()
    end
    close()
    assert.equal(1, conns())
  end)

  it("fills the table a reader gives with the next event, fields absent from it cleared", function()
    srv = server.serve(function(conn)
      conn:write(sse_head() .. "retry: 5\nid: 7\ndata: a\n\nevent: x\ndata: b\n\n")
    end)
    local req = assert(require("luagent.core").http_request { url = srv.url })
    local t = {}
    assert.equal(t, req:event(t))
    assert.same({ event = "message", data = "a", id = "7", retry = 5, offset = t.offset }, t)
    assert.equal(t, req:event(t))
    assert.same({ event = "x", data = "b", id = "7", offset = t.offset }, t) -- the last id persists
    assert.is_nil(req:event(t))
    assert.has_error(function() req:event("not a table") end)
    req:close()
  end)

  it("fills a reader's table raw: its metamethods never run inside the parser", function()
    srv = server.serve(function(conn)
      conn:write(sse_head() .. "data: one\n\ndata: two\n\ndata: three\n\n")
    end)
    local req = assert(require("luagent.core").http_request { url = srv.url })
    local t = setmetatable({}, { __newindex = function() error("a metamethod ran") end })
    local got = {}
    while req:event(t) do got[#got + 1] = t.data .. "@" .. t.offset end
    assert.same({ "one@11", "two@22", "three@35" }, got)
    req:close()
  end)

  it("resp:next_event(into) fills the reader's table, unless a tap may keep the events", function()
    srv = server.serve(function(conn)
      conn:write(sse_head() .. "data: a\n\ndata: b\n\n")
    end)
    local resp = assert(http.request { url = srv.url })
    local t = {}
    assert.equal(t, resp:next_event(t))
    assert.same({ event = "message", data = "a", offset = 9 }, t)
    assert.equal(t, resp:next_event(t))
    assert.equal("b", t.data)
    assert.is_nil(resp:next_event(t))
    resp:close()

    local kept = {}
    local tap = { begin = function() return {
      response = function() end, finish = function() end,
      event = function(_, ev) kept[#kept + 1] = ev end,
    } end }
    resp = assert(http.request { url = srv.url, tap = tap })
    local a, b = resp:next_event(t), resp:next_event(t)
    assert.is_nil(resp:next_event(t))
    resp:close()
    assert.are_not.equal(t, a)
    assert.same({ "a", "b" }, { a.data, b.data })
    assert.equal(a, kept[1])
    assert.equal(b, kept[2])
  end)

  it("resp:event_source() reads the events without a Lua call each, and leaves the end and failures to next_event", function()
    srv = server.serve(function(conn)
      conn:write(sse_head() .. "data: a\n\ndata: " .. string.rep("x", 100) .. "\n\n")
    end)
    local resp = assert(http.request { url = srv.url, sse = { max_line = 20 } })
    local read, state = resp:event_source()
    assert.equal("function", type(read))
    local t = {}
    assert.equal(t, read(state, t))
    assert.equal("a", t.data)
    assert.is_nil(read(state, t)) -- the line is too long: next_event says so
    local ev, err = resp:next_event(t)
    assert.is_nil(ev)
    assert.equal("protocol", err.kind)
    assert.equal(err, resp.error)
    resp:close()
    local tap = { begin = function() return { response = function() end, finish = function() end,
      event = function() end } end }
    resp = assert(http.request { url = srv.url, tap = tap })
    assert.is_nil(resp:event_source()) -- a tap sees every event: next_event only
    resp:close()
  end)

  it("resp:next_event names the failure that ends the stream and leaves it in resp.error", function()
    srv = server.serve(function(conn)
      conn:write(sse_head() .. "data: " .. string.rep("x", 100) .. "\n\n")
    end)
    local resp = assert(http.request { url = srv.url, sse = { max_line = 20 } })
    local ev, err = resp:next_event({})
    assert.is_nil(ev)
    assert.equal("protocol", err.kind)
    assert.equal(20, err.offset)
    assert.equal(err, resp.error)
    resp:close()
  end)

  it("runs 1,000 concurrent streams on one loop", function()
    srv = server.serve(function(conn)
      conn:write(sse_head())
      for i = 1, 3 do conn:write("data: " .. i .. "\n\n") end
    end)
    local tasks, sums = {}, {}
    for i = 1, 1000 do
      tasks[i] = luagent.spawn(function()
        local resp = assert(http.request { url = srv.url, timeout = { total = 60 } })
        local sum = 0
        for ev in resp:events() do sum = sum + tonumber(ev.data) end
        sums[i] = sum
      end)
    end
    for i = 1, 1000 do tasks[i]:join() end
    for i = 1, 1000 do assert.equal(6, sums[i]) end
    assert.equal(1000, srv.requests)
    assert.equal(0, luagent.stats().busy)
  end)
end)

describe("core.http_request, one waiting task per request", function()
  local core = require "luagent.core"
  local srv, gate
  -- The server sends the head, then holds the body until gate:cancel().
  before_each(function()
    srv = server.serve(function(conn)
      gate = luagent.current()
      conn:write(server.head(200, { "Content-Length: 10" }))
      pcall(luagent.sleep, 3600)
      conn:write("0123456789")
    end)
  end)
  after_each(function() srv.close() srv = nil end)

  for _, method in ipairs({ "read", "event" }) do
    it(method .. ": a second concurrent reader raises, the first gets the bytes", function()
      local req = assert(core.http_request { url = srv.url })
      local first = luagent.spawn(function() return req:read() end)
      local second = luagent.spawn(function() return req[method](req) end)
      finally(function() first:cancel(); second:cancel(); req:close() end)
      luagent.sleep(0)
      assert.equal("waiting", first:status())
      assert.equal("failed", second:status())
      local ok, err = pcall(second.join, second)
      assert.is_false(ok)
      assert.matches(method .. ": another task is already reading", err)
      gate:cancel()
      assert.equal("0123456789", first:join())
    end)
  end
end)

describe("core.http_request with no time left", function()
  local core = require "luagent.core"
  local srv
  after_each(function() srv.close() srv = nil end)

  it("fails at once with timeout/total for a given total <= 0, before any transfer", function()
    srv = server.serve(function(conn) conn:write(server.head(200, { "Content-Length: 2" }) .. "ok") end)
    for _, total in ipairs({ 0, -1.5 }) do
      local req, err = core.http_request { url = srv.url, timeout = { total = total } }
      assert.is_nil(req)
      assert.equal("timeout", err.kind)
      assert.equal("total", err.which)
      assert.equal(0, err.bytes)
      assert.is_false(err.delivered)
      assert.equal(0, luagent.stats().busy)
    end
    assert.equal(0, srv.requests)
    local req = assert(core.http_request { url = srv.url, timeout = { total = nil, idle = 0 } })
    assert.equal(200, req:status())
    req:close()
  end)
end)

describe("closing a request", function()
  it("wakes a task reading it, which then raises", function()
    local core = require "luagent.core"
    local server = require "testserver"
    local srv = server.serve(function(conn)
      conn:write(server.head(200, { "Content-Length: 100" }) .. "x")
      luagent.sleep(3600)
    end)
    local resp = assert(http.request { url = srv.url })
    assert.equal("x", resp:read())
    local reader = luagent.spawn(function() return resp:read() end)
    luagent.sleep(0)
    resp:close()
    local ok, err = pcall(reader.join, reader)
    assert.is_false(ok)
    assert.matches("read: request is closed", err)
    assert.equal(0, core.stats().busy)
    srv.close()
  end)
end)

describe("an infinite timeout", function()
  it("means no timeout", function()
    local server = require "testserver"
    local srv = server.serve(function(conn) conn:write(server.head(200, { "Content-Length: 2" }) .. "ok") end)
    local r = assert(http.fetch { url = srv.url, timeout = { idle = math.huge, first_byte = math.huge } })
    assert.equal("ok", r.body)
    assert.equal(42, luagent.deadline(math.huge, function() return 42 end))
    srv.close()
  end)
end)
