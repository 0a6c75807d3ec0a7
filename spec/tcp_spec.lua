-- TCP on the loop (core.tcp_listen, core.tcp_connect): real loopback
-- sockets, accept queueing, EOF and reset, cancellation, backpressure.
local luagent = require "luagent"
local core = require "luagent.core"

-- Reads until `n` bytes arrived; returns them, and the error or EOF that
-- came first.
local function read_n(conn, n)
  local parts, have = {}, 0
  while have < n do
    local chunk, err = conn:read()
    if not chunk then return table.concat(parts), err end
    parts[#parts + 1] = chunk
    have = have + #chunk
  end
  return table.concat(parts)
end

-- Reads until EOF; returns the bytes and the error that ended them, if any.
local function read_all(conn)
  local parts = {}
  while true do
    local chunk, err = conn:read()
    if not chunk then return table.concat(parts), err end
    parts[#parts + 1] = chunk
  end
end

-- A server on a free loopback port and both ends of one connection to it.
local function pair()
  local srv = assert(core.tcp_listen("127.0.0.1", 0))
  local client = assert(core.tcp_connect(srv:address()))
  local peer = assert(srv:accept())
  return srv, client, peer
end

-- Lets every ready task run until it waits.
local function settle()
  luagent.sleep(0)
end

describe("tcp_listen", function()
  it("picks a free port and reports its address", function()
    local srv = assert(core.tcp_listen("127.0.0.1", 0))
    local host, port = srv:address()
    assert.equal("127.0.0.1", host)
    assert.is_true(math.type(port) == "integer" and port > 0)
    srv:close()
    srv:close() -- idempotent
    assert.are.same({ host, port }, { srv:address() })
  end)

  it("returns a transport error when the address is in use", function()
    local srv = assert(core.tcp_listen("127.0.0.1", 0))
    local _, port = srv:address()
    local again, err = core.tcp_listen("127.0.0.1", port)
    assert.is_nil(again)
    assert.equal("transport", err.kind)
    assert.matches("tcp_listen 127.0.0.1:" .. port .. ": address already in use", err.message)
    assert.matches("^transport: ", tostring(err))
    srv:close()
  end)

  it("raises for an address it cannot use (a misuse), naming it", function()
    for _, a in ipairs({ { "example.com", 0 }, { "127.0.0.1", 65536 }, { "", 80 }, { "127.0.0.1", -1 } }) do
      local ok, err = pcall(core.tcp_listen, a[1], a[2])
      assert.is_false(ok)
      assert.matches("tcp_listen: bad address '" .. a[1]:gsub("%p", "%%%0") .. "'", err)
    end
    local ok, err = pcall(core.tcp_connect, "no.such.host", 80)
    assert.is_false(ok)
    assert.matches("tcp_connect: bad address 'no.such.host'", err)
  end)

  it("accepts localhost and raises on wrong argument types", function()
    local srv = assert(core.tcp_listen("localhost", 0))
    assert.equal("127.0.0.1", (srv:address()))
    srv:close()
    assert.has_error(function() core.tcp_listen(nil, 0) end)
    assert.has_error(function() core.tcp_listen("127.0.0.1", "any") end)
    assert.has_error(function() core.tcp_listen("127.0.0.1", 0, 0) end)
  end)
end)

describe("a connection", function()
  it("carries bytes both ways and knows its peer", function()
    local srv, client, peer = pair()
    local host, port = srv:address()
    assert.are.same({ host, port }, { client:peer() })
    assert.equal("127.0.0.1", (peer:peer()))
    assert.is_true(client:write("ping"))
    assert.equal("ping", read_n(peer, 4))
    assert.is_true(peer:write("pong"))
    assert.equal("pong", read_n(client, 4))
    client:close()
    peer:close()
    srv:close()
  end)

  it("reads the last bytes, then nil at EOF, with no error", function()
    local srv, client, peer = pair()
    assert.is_true(client:write("last words"))
    client:close()
    client:close() -- idempotent
    local data, err = read_all(peer)
    assert.equal("last words", data)
    assert.is_nil(err)
    assert.equal(1, select("#", peer:read()))
    peer:close()
    srv:close()
  end)

  it("shows a reset to the peer as kind reset, on read and on write", function()
    local srv, client, peer = pair()
    client:reset()
    local data, err = peer:read()
    assert.is_nil(data)
    assert.equal("reset", err.kind)
    local ok, werr = peer:write("anyone there?")
    assert.is_nil(ok)
    assert.equal("reset", werr.kind)
    peer:close()
    srv:close()
  end)

  it("raises on use after close here, as every luagent handle does", function()
    local srv, client, peer = pair()
    client:close()
    client:close() -- close itself is idempotent
    local ok, err = pcall(client.write, client, "x")
    assert.is_false(ok)
    assert.matches("write: connection is closed", err)
    ok, err = pcall(client.read, client)
    assert.is_false(ok)
    assert.matches("read: connection is closed", err)
    peer:close()
    srv:close()
  end)

  it("closes on leaving a <close> scope and when collected", function()
    local srv, client, peer = pair()
    do
      local c <close> = client
    end
    assert.is_false(pcall(client.write, client, "x"))
    assert.equal("", read_all(peer))
    local other = assert(core.tcp_connect(srv:address()))
    local other_peer = assert(srv:accept())
    assert.is_true(other:write("bye"))
    other = nil -- luacheck: ignore
    collectgarbage()
    collectgarbage()
    assert.equal("bye", luagent.deadline(5, read_all, other_peer))
    peer:close()
    other_peer:close()
    srv:close()
  end)

  it("is refused by a closed port with kind refused", function()
    local srv = assert(core.tcp_listen("127.0.0.1", 0))
    local host, port = srv:address()
    srv:close()
    local conn, err = core.tcp_connect(host, port)
    assert.is_nil(conn)
    assert.equal("refused", err.kind)
    assert.matches("tcp_connect 127.0.0.1:" .. port .. ": connection refused", err.message)
  end)

  it("delivers an 8 MiB write whole and in order", function()
    local srv, client, peer = pair()
    local lines = {}
    for i = 1, 1024 * 1024 do lines[i] = string.format("%07d\n", i) end
    local big = table.concat(lines)
    assert.equal(8 * 1024 * 1024, #big)
    local writer = luagent.spawn(function()
      local ok, err = client:write(big)
      client:close()
      return ok, err
    end)
    local got, err = read_all(peer)
    assert.is_nil(err)
    assert.equal(#big, #got)
    assert.is_true(got == big)
    assert.is_true(writer:join())
    peer:close()
    srv:close()
  end)
end)

describe("accept", function()
  it("queues connections that arrive while nobody accepts, in order", function()
    local srv = assert(core.tcp_listen("127.0.0.1", 0))
    local clients = {}
    for i = 1, 100 do -- more than the C queue holds: the rest wait in the kernel
      clients[i] = assert(core.tcp_connect(srv:address()))
      assert.is_true(clients[i]:write(tostring(i) .. "\n"))
    end
    for i = 1, 100 do
      local conn = assert(srv:accept())
      assert.equal(tostring(i) .. "\n", read_n(conn, #tostring(i) + 1))
      conn:close()
      clients[i]:close()
    end
    srv:close()
  end)

  it("serves 200 clients at once, one task each", function()
    local srv = assert(core.tcp_listen("127.0.0.1", 0))
    local host, port = srv:address()
    local handlers = {}
    local acceptor = luagent.spawn(function()
      while true do
        local conn, err = srv:accept()
        if not conn then return err end
        handlers[#handlers + 1] = luagent.spawn(function()
          while true do
            local data = conn:read()
            if not data then break end
            assert(conn:write(data))
          end
          conn:close()
        end)
      end
    end)
    local clients = {}
    for i = 1, 200 do
      clients[i] = luagent.spawn(function()
        local conn = assert(core.tcp_connect(host, port))
        local msg = "hello from client " .. i
        assert(conn:write(msg))
        local echo = read_n(conn, #msg)
        conn:close()
        return echo
      end)
    end
    for i = 1, 200 do
      assert.equal("hello from client " .. i, clients[i]:join())
    end
    srv:close()
    local err = acceptor:join()
    assert.equal("transport", err.kind)
    assert.equal("server closed", err.message)
    assert.equal(200, #handlers)
    for _, h in ipairs(handlers) do h:join() end
  end)

  it("wakes a blocked accept with nil, err when the server closes", function()
    local srv = assert(core.tcp_listen("127.0.0.1", 0))
    local t = luagent.spawn(function() return srv:accept() end)
    settle()
    assert.equal("waiting", t:status())
    srv:close()
    local conn, err = t:join()
    assert.is_nil(conn)
    assert.equal("transport", err.kind)
    assert.equal("server closed", err.message)
    local again, aerr = pcall(srv.accept, srv)
    assert.is_false(again)
    assert.matches("accept: server is closed", aerr)
  end)

  it("is cancellable, and the server keeps working after", function()
    local srv = assert(core.tcp_listen("127.0.0.1", 0))
    local t = luagent.spawn(function() return srv:accept() end)
    settle()
    assert.equal("waiting", t:status())
    assert.equal(0, luagent.stats().busy) -- a listener does not hold virtual time
    t:cancel()
    local ok, err = pcall(t.join, t)
    assert.is_false(ok)
    assert.equal("cancelled", err.kind)
    local client = assert(core.tcp_connect(srv:address()))
    local peer = assert(srv:accept())
    assert.is_true(client:write("still here"))
    assert.equal("still here", read_n(peer, 10))
    client:close()
    peer:close()
    srv:close()
  end)

  it("refuses a second task accepting at the same time", function()
    local srv = assert(core.tcp_listen("127.0.0.1", 0))
    local t = luagent.spawn(function() return srv:accept() end)
    settle()
    assert.has_error(function() srv:accept() end, "accept: another task is already accepting")
    srv:close()
    assert.is_nil((t:join()))
  end)
end)

describe("read", function()
  it("is cancellable without losing the bytes that come after", function()
    local srv, client, peer = pair()
    local t = luagent.spawn(function() return peer:read() end)
    settle()
    assert.equal("waiting", t:status())
    t:cancel("enough")
    local ok, err = pcall(t.join, t)
    assert.is_false(ok)
    assert.equal("cancelled", err.kind)
    assert.is_true(client:write("after"))
    assert.equal("after", read_n(peer, 5))
    client:close()
    peer:close()
    srv:close()
  end)

  it("wakes a blocked read with nil, err when closed from another task", function()
    local srv, client, peer = pair()
    local t = luagent.spawn(function() return peer:read() end)
    settle()
    peer:close()
    local data, err = t:join()
    assert.is_nil(data)
    assert.equal("transport", err.kind)
    assert.is_nil(client:read()) -- the close reached the other end as EOF
    client:close()
    srv:close()
  end)
end)

describe("write", function()
  it("stops reading a peer that does not keep up; a cancelled write still completes", function()
    local srv, client, peer = pair()
    local size = 64 * 1024 * 1024
    local writer
    luagent.clock.virtual()
    finally(function() luagent.clock.real() end)
    writer = luagent.spawn(function() return client:write(string.rep("x", size)) end)
    -- Virtual time moves on only once no bytes move: the peer stopped
    -- reading at its buffer limit, so the write cannot have finished.
    luagent.sleep(1)
    assert.equal("waiting", writer:status())
    assert.equal(1, luagent.stats().busy)
    writer:cancel()
    local ok, err = pcall(writer.join, writer)
    assert.is_false(ok)
    assert.equal("cancelled", err.kind)
    -- The request stays with libuv: every byte still arrives.
    local have, bad = 0, false
    while have < size do
      local chunk = assert(peer:read())
      have = have + #chunk
      bad = bad or chunk:find("[^x]") ~= nil
    end
    assert.equal(size, have)
    assert.is_false(bad)
    assert.equal(0, luagent.stats().busy)
    client:close()
    assert.is_nil(peer:read())
    peer:close()
    srv:close()
  end)

  it("writes nothing for an empty string", function()
    local srv, client, peer = pair()
    assert.is_true(client:write(""))
    client:close()
    assert.equal("", read_all(peer))
    peer:close()
    srv:close()
  end)
end)
