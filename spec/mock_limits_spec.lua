-- The mock provider holds up against careless and hostile clients: its
-- request log is a bounded window, a connection that is idle or slow is
-- dropped after the idle timeout (a request begun gets a 408), a body over
-- the cap is refused at once, cassette headers cannot inject headers, and a
-- bad --faults scope is a usage error.
local luagent = require "luagent"
local core = require "luagent.core"
local mock = require "luagent.mock"
local cassette = require "luagent.base.cassette"
local helpers = require "helpers"

-- Reads from conn until EOF (or `limit` seconds); returns what came.
local function read_all(conn)
  local parts = {}
  while true do
    local chunk = conn:read()
    if not chunk then break end
    parts[#parts + 1] = chunk
  end
  return table.concat(parts)
end

describe("the mock's request log", function()
  local function get(path, body)
    return { method = "POST", path = path, target = path, headers = {}, body = body or "" }
  end

  it("keeps the latest LOG_MAX requests", function()
    local state = assert(mock.state {})
    for i = 1, mock.LOG_MAX + 10 do mock.handle(state, get("/nowhere/" .. i)) end
    assert.equal(mock.LOG_MAX, #state.log)
    assert.equal("/nowhere/11", state.log[1].path)
    assert.equal("/nowhere/" .. (mock.LOG_MAX + 10), state.log[#state.log].path)
  end)

  it("drops old bodies past LOG_BYTES, keeping the newest request", function()
    local state = assert(mock.state {})
    local big = string.rep("b", mock.LOG_BYTES // 3 + 1)
    for i = 1, 5 do mock.handle(state, get("/nowhere/" .. i, big)) end
    assert.equal(2, #state.log)
    assert.equal("/nowhere/5", state.log[2].path)
    assert.is_true(state.log_bytes <= mock.LOG_BYTES)
    local huge = string.rep("h", mock.LOG_BYTES + 1)
    mock.handle(state, get("/nowhere/6", huge))
    assert.equal(1, #state.log)
    assert.equal("/nowhere/6", state.log[1].path)
  end)
end)

describe("a mock connection", function()
  local srv
  before_each(function() luagent.clock.virtual() end)
  after_each(function()
    if srv then srv:close() srv = nil end
    luagent.clock.real()
  end)

  local function connect()
    srv = assert(mock.start {})
    local host, port = srv.url:match("^http://(.-):(%d+)$")
    return assert(core.tcp_connect(host, tonumber(port)))
  end

  it("that stays idle is closed after the idle timeout", function()
    local conn = connect()
    local t0 = luagent.now()
    assert.equal("", luagent.deadline(10 * mock.IDLE_TIMEOUT, read_all, conn))
    local waited = luagent.now() - t0
    assert.is_true(waited >= mock.IDLE_TIMEOUT and waited < mock.IDLE_TIMEOUT + 1, tostring(waited))
    conn:close()
  end)

  it("that sends half a request gets a 408 after the idle timeout", function()
    local conn = connect()
    assert(conn:write("POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 100\r\n\r\n{\"mod"))
    local reply = luagent.deadline(10 * mock.IDLE_TIMEOUT, read_all, conn)
    assert.matches("^HTTP/1.1 408 ", reply)
    assert.matches("did not arrive within", reply)
    conn:close()
  end)

  it("announcing a body over the cap gets a 413 at once", function()
    local conn = connect()
    assert(conn:write("POST /v1/chat/completions HTTP/1.1\r\nContent-Length: "
      .. (mock.MAX_BODY + 1) .. "\r\n\r\n"))
    local t0 = luagent.now()
    local reply = luagent.deadline(10 * mock.IDLE_TIMEOUT, read_all, conn)
    assert.matches("^HTTP/1.1 413 ", reply)
    assert.equal(t0, luagent.now())
    assert.is_true(mock.MAX_BODY <= 16 * 1024 * 1024)
    conn:close()
  end)
end)

describe("luagent mock --help", function()
  it("states the limits the mock enforces", function()
    local text = require("luagent.mock.help").mock
    local MiB = 1024 * 1024
    -- words of a phrase may be split across lines
    local function says(phrase) assert.matches((phrase:gsub(" ", "%%s+")), text) end
    says("headers up to " .. mock.MAX_HEAD // 1024 .. " KiB")
    says("body up to " .. mock.MAX_BODY // MiB .. " MiB")
    says("over " .. mock.IDLE_TIMEOUT .. " s")
    says("latest " .. mock.LOG_MAX .. " requests")
    says("pass " .. mock.LOG_BYTES // MiB .. " MiB together")
  end)
end)

describe("cassette headers", function()
  local line = '{"request":{"method":"POST","path":"/v1/chat/completions"},"status":200,'
    .. '"headers":{"x-a":"b\\r\\nSet-Cookie: evil=1"},"body":"{}"}'

  it("with CR or LF are refused when the cassette loads, with file:line", function()
    local list, err = cassette.decode("\n" .. line, "c.jsonl")
    assert.is_nil(list)
    assert.equal("usage", err.kind)
    assert.matches("^c.jsonl:2: header \"x%-a\" contains CR or LF", err.message)
  end)

  it("never reach the wire as a header of their own", function()
    local x = assert(require("luagent.base.json").decode(line))
    x.status = 200
    local state = assert(mock.state { cassette = cassette.player({ x }, "c.jsonl") })
    local plan = mock.handle(state, { method = "POST", path = "/v1/chat/completions",
      target = "/v1/chat/completions", headers = {}, body = "{}" })
    local wire = plan[1].write
    assert.is_nil(wire:find("\r\nSet-Cookie", 1, true))
    assert.matches("\r\nx%-a: b  Set%-Cookie: evil=1\r\n", wire)
  end)
end)

describe("--faults with a scope too large for a number", function()
  it("is a usage error for luagent mock and luagent run", function()
    local r = helpers.run("mock", "--faults", "503@99999999999999999999")
    assert.equal(2, r.code)
    assert.matches("bad scope '@99999999999999999999'", r.stderr)
    assert.is_nil(r.stderr:find("traceback", 1, true))
    r = helpers.run("run", "--faults", "503@1-99999999999999999999", "examples/hello.lua")
    assert.equal(2, r.code)
    assert.matches("bad scope", r.stderr)
    assert.is_nil(r.stderr:find("traceback", 1, true))
  end)
end)
