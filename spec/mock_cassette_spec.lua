-- Cassettes: reading and writing JSON lines, errors that name file:line,
-- divergence messages, and replay through mock.handle (byte-identical
-- events, order, faults on top of a recording, recorded pacing).
local cjson = require "cjson"
local cassette = require "luagent.base.cassette"
local replies = require "luagent.mock.replies"
local mock = require "luagent.mock"

-- Removes chunked framing.
local function dechunk(s)
  local out, pos = {}, 1
  while true do
    local size, from = s:match("^(%x+)\r\n()", pos)
    if not size or tonumber(size, 16) == 0 then return table.concat(out) end
    size = tonumber(size, 16)
    out[#out + 1] = s:sub(from, from + size - 1)
    pos = from + size + 2
  end
end

-- What a client receives from a plan: {status=, headers=, body=, sleeps=}.
local function receive(plan)
  local raw, sleeps = {}, {}
  for _, s in ipairs(plan) do
    if s.write then raw[#raw + 1] = s.write end
    if s.sleep then sleeps[#sleeps + 1] = s.sleep end
  end
  local head, body = table.concat(raw):match("^(.-\r\n)\r\n(.*)$")
  local r = { status = tonumber(head:match("^HTTP/1%.1 (%d+)")), headers = {}, sleeps = sleeps }
  for k, v in head:gmatch("\n([^:\r\n]+): ([^\r\n]*)") do r.headers[k:lower()] = v end
  r.body = r.headers["transfer-encoding"] == "chunked" and dechunk(body) or body
  return r
end

-- A parsed POST of the JSON `body` to `path`.
local function request(path, body)
  local text = cjson.encode(body)
  local status, req = mock.parse_request("POST " .. path .. " HTTP/1.1\r\nContent-Length: "
    .. #text .. "\r\n\r\n" .. text)
  assert.equal("ok", status)
  return req
end

-- A conversation of `n` user turns, as an Anthropic request body.
local function convo(...)
  local messages = {}
  for i, text in ipairs({ ... }) do
    messages[i] = { role = i % 2 == 1 and "user" or "assistant", content = text }
  end
  return { model = "claude-x", max_tokens = 64, stream = true, messages = messages }
end

-- A recorded streamed exchange answering `body` with `text`.
local function recorded(body, text, t0)
  t0 = t0 or 0
  local O = replies.object
  return {
    request = { method = "POST", path = "/v1/messages", body = body },
    status = 200,
    headers = { ["content-type"] = "text/event-stream", ["request-id"] = "req_live",
      ["transfer-encoding"] = "chunked", ["set-cookie"] = "session=secret" },
    events = {
      { t = t0 + 0.5, event = "message_start", data = replies.encode(O("type", "message_start",
        "message", O("id", "msg_live", "type", "message", "role", "assistant",
          "model", "claude-x", "content", replies.array(), "usage",
          O("input_tokens", 9, "output_tokens", 1)))) },
      { t = t0 + 0.5, event = "content_block_start",
        data = '{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}' },
      { t = t0 + 0.75, event = "content_block_delta", data = replies.encode(O("type",
        "content_block_delta", "index", 0, "delta", O("type", "text_delta", "text", text))) },
      { t = t0 + 1, event = "content_block_stop", data = '{"type":"content_block_stop","index":0}' },
      { t = t0 + 1, event = "message_delta",
        data = '{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":3}}' },
      { t = t0 + 1.25, event = "message_stop", data = '{"type":"message_stop"}' },
    },
  }
end

-- The cassette text of a list of exchanges.
local function text_of(list)
  local lines = {}
  for i, x in ipairs(list) do lines[i] = cassette.encode(x) end
  return table.concat(lines, "\n") .. "\n"
end

local first = convo("hi")
local second = convo("hi", "Hello!", "what is 2+2?")
local tape = { recorded(first, "Hello!"), recorded(second, "4") }

describe("cassette.encode and cassette.decode", function()
  it("round-trips exchanges as one JSON object per line", function()
    local text = text_of(tape)
    local _, lines = text:gsub("\n", "")
    assert.equal(2, lines)
    local list = assert(cassette.decode(text, "t.jsonl"))
    assert.equal(2, #list)
    assert.same(tape[2].request, list[2].request)
    assert.equal(200, list[1].status)
    assert.equal("integer", math.type(list[1].status))
    assert.equal(tape[1].events[3].data, list[1].events[3].data)
    assert.equal(0.75, list[1].events[3].t)
    assert.equal(2, list[2].line)
  end)

  it("writes keys in a fixed, readable order and no secrets", function()
    local line = cassette.encode(tape[1])
    assert.matches('^{"request":{"method":"POST","path":"/v1/messages","body":{', line)
    assert.matches('},"status":200,"headers":{', line)
    assert.matches('"events":%[{"t":0.5,"event":"message_start","data":"{', line)
    assert.is_nil(line:find("secret", 1, true))
    assert.equal(line, cassette.encode(assert(cassette.decode(line))[1]))
  end)

  it("keeps a non-streamed reply as its body", function()
    local x = { request = { method = "POST", path = "/v1/messages", body = first },
      status = 529, headers = {}, body = '{"type":"error"}' }
    local back = assert(cassette.decode(cassette.encode(x)))[1]
    assert.equal('{"type":"error"}', back.body)
    assert.is_nil(back.events)
  end)

  it("skips blank lines", function()
    local list = assert(cassette.decode("\n" .. text_of(tape) .. "\n\n"))
    assert.equal(2, #list)
    assert.equal(2, list[1].line)
  end)

  it("names the file and line of a malformed exchange", function()
    local good = cassette.encode(tape[1])
    local cases = {
      { good .. "\n{nope", "t.jsonl:2: invalid JSON: " },
      { good .. "\n\n[1,2]", "t.jsonl:3: missing \"request\"" },
      { '{"request":{"method":"POST"},"status":200}', "t.jsonl:1: request.path must be a string" },
      { '{"request":{"method":"POST","path":"/"},"status":"200"}',
        "t.jsonl:1: \"status\" must be an integer" },
      { '{"request":{"method":"POST","path":"/"},"status":200.5}',
        "t.jsonl:1: \"status\" must be an integer" },
      { '{"request":{"method":"POST","path":"/"},"status":200,"events":[{"t":0,"data":1}]}',
        "t.jsonl:1: events[1].data must be a string" },
      { '{"request":{"method":"POST","path":"/"},"status":200,"events":[{"t":-1,"data":""}]}',
        "t.jsonl:1: events[1].t must be a number of seconds >= 0" },
      { '{"request":{"method":"POST","path":"/"},"status":200,"body":"x","events":[]}',
        "t.jsonl:1: has both \"events\" and \"body\"" },
      { '{"request":{"method":"POST","path":"/"},"status":200,"headers":{"a":1}}',
        "t.jsonl:1: \"headers\" values must be strings" },
    }
    for _, case in ipairs(cases) do
      local list, err = cassette.decode(case[1], "t.jsonl")
      assert.is_nil(list)
      assert.equal("usage", err.kind)
      assert.equal(case[2], err.message:sub(1, #case[2]))
      assert.equal("t.jsonl", err.file)
    end
  end)
end)

describe("cassette.save and cassette.load", function()
  it("write a file and read it back as a player", function()
    local path = os.tmpname()
    assert.is_true(cassette.save(path, tape))
    local player = assert(cassette.load(path))
    os.remove(path)
    assert.equal(path, player.name)
    assert.equal(2, #player.exchanges)
    assert.equal(tape[2].events[3].data, player.exchanges[2].events[3].data)
  end)

  it("report a missing or malformed file by name", function()
    local _, err = cassette.load("/nonexistent/tape.jsonl")
    assert.equal("usage", err.kind)
    assert.matches("cannot open cassette: /nonexistent/tape.jsonl", err.message)
    _, err = cassette.load("spec/fixtures")
    assert.equal("cannot open cassette: spec/fixtures: Is a directory", err.message)
    local path = os.tmpname()
    local f = assert(io.open(path, "w"))
    f:write(cassette.encode(tape[1]), "\n", "oops\n")
    f:close()
    _, err = cassette.load(path)
    os.remove(path)
    assert.matches("^" .. path:gsub("%p", "%%%0") .. ":2: invalid JSON", err.message)
  end)
end)

describe("cassette.compare", function()
  local rec = tape[2].request

  it("accepts the recorded request", function()
    assert.is_nil(cassette.compare(rec, "/v1/messages", cjson.decode(cjson.encode(second)), 2))
  end)

  it("ignores what is not the path, model or conversation", function()
    local body = cjson.decode(cjson.encode(second))
    body.max_tokens, body.stream, body.temperature = 1, false, 0.5
    assert.is_nil(cassette.compare(rec, "/v1/messages", body, 2))
  end)

  it("says which exchange, where, and both values", function()
    local body = convo("hi", "Hello!", "what is 2+3?")
    assert.equal("exchange 3: messages[3].content differs: recorded 'what is 2+2?' got 'what is 2+3?'",
      cassette.compare(rec, "/v1/messages", body, 3))
    body = convo("hi", "Hello!", "what is 2+2?", "and more")
    assert.equal("exchange 2: messages[4] differs: recorded nothing got "
      .. "'{\"content\":\"and more\",\"role\":\"assistant\"}'", cassette.compare(rec, "/v1/messages", body, 2))
    body = cjson.decode(cjson.encode(second))
    body.model = "claude-y"
    assert.equal("exchange 1: model differs: recorded 'claude-x' got 'claude-y'",
      cassette.compare(rec, "/v1/messages", body, 1))
    body.system = "be brief"
    assert.equal("exchange 1: model differs: recorded 'claude-x' got 'claude-y'",
      cassette.compare(rec, "/v1/messages", body, 1))
    assert.equal("exchange 1: path differs: recorded '/v1/messages' got '/v1/chat/completions'",
      cassette.compare(rec, "/v1/chat/completions", second, 1))
  end)

  it("shortens long values", function()
    local long = ("x"):rep(200)
    local msg = cassette.compare(rec, "/v1/messages", convo("hi", "Hello!", long), 2)
    assert.matches("got 'x+%.%.%.'$", msg)
    assert.is_true(#msg < 160)
  end)
end)

describe("replay through mock.handle", function()
  -- A mock state replaying `list`.
  local function replay(list, opts)
    opts = opts or {}
    opts.cassette = cassette.player(list, "tape.jsonl")
    return assert(mock.state(opts))
  end

  it("serves the recorded events byte for byte, in order", function()
    local st = replay(tape)
    local r1 = receive(mock.handle(st, request("/v1/messages", first)))
    local r2 = receive(mock.handle(st, request("/v1/messages", second)))
    assert.equal(200, r1.status)
    assert.equal(replies.sse(tape[1].events), r1.body)
    assert.equal(replies.sse(tape[2].events), r2.body)
    assert.equal("req_live", r1.headers["request-id"])
    assert.equal("text/event-stream", r1.headers["content-type"])
    assert.is_nil(r1.headers["set-cookie"])
    assert.same({}, r1.sleeps)
    assert.same({}, st.divergences)
  end)

  it("reports a diverging request with a 422 that says where", function()
    local seen = {}
    local st = replay(tape, { on_divergence = function(m) seen[#seen + 1] = m end })
    mock.handle(st, request("/v1/messages", first))
    local r = receive(mock.handle(st, request("/v1/messages", convo("hi", "Hello!", "what?"))))
    local want = "exchange 2: messages[3].content differs: recorded 'what is 2+2?' got 'what?'"
    assert.equal(422, r.status)
    assert.equal("false", r.headers["x-should-retry"])
    local j = cjson.decode(r.body)
    assert.equal("cassette_divergence", j.error.type)
    assert.equal(want, j.error.message)
    assert.same({ want }, st.divergences)
    assert.same({ want }, seen)
    -- The cassette did not move: the right request still gets exchange 2.
    r = receive(mock.handle(st, request("/v1/messages", second)))
    assert.equal(replies.sse(tape[2].events), r.body)
  end)

  it("says so when the cassette is used up", function()
    local st = replay({ tape[1] })
    mock.handle(st, request("/v1/messages", first))
    local r = receive(mock.handle(st, request("/v1/messages", second)))
    assert.equal(422, r.status)
    assert.equal("exchange 2: not in tape.jsonl (it has 1 exchanges)",
      cjson.decode(r.body).error.message)
  end)

  it("injects faults on top without consuming the recording", function()
    local st = replay(tape, { faults = "503@1,cut@3" })
    local r = receive(mock.handle(st, request("/v1/messages", first)))
    assert.equal(503, r.status)
    assert.equal("overloaded_error", cjson.decode(r.body).error.type)
    r = receive(mock.handle(st, request("/v1/messages", first)))
    assert.equal(replies.sse(tape[1].events), r.body)
    -- Request 3 is cut: the recorded events up to the deltas, no more.
    r = receive(mock.handle(st, request("/v1/messages", second)))
    local cut = { table.unpack(tape[2].events, 1, 3) }
    assert.equal(replies.sse(cut), r.body)
    r = receive(mock.handle(st, request("/v1/messages", second)))
    assert.equal(replies.sse(tape[2].events), r.body)
  end)

  it("replays at the recorded pace when asked", function()
    local st = replay(tape, { recorded_speed = true })
    local r = receive(mock.handle(st, request("/v1/messages", first)))
    assert.same({ 0.5, 0.25, 0.25, 0.25 }, r.sleeps)
    assert.equal(replies.sse(tape[1].events), r.body)
  end)

  it("replays a recorded JSON reply with its status and length", function()
    local x = { request = { method = "POST", path = "/v1/messages", body = first },
      status = 529, headers = { ["content-type"] = "application/json", ["content-length"] = "99" },
      body = '{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}' }
    local r = receive(mock.handle(replay({ x }), request("/v1/messages", first)))
    assert.equal(529, r.status)
    assert.equal(x.body, r.body)
    assert.equal(tostring(#x.body), r.headers["content-length"])
  end)
end)
