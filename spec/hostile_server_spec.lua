-- Unbounded or malformed input from a server: every case ends the call with
-- a clear error record (its own kind and message, never a raw Lua error nor
-- a misleading `truncated`) and a final message_end; text that is not
-- UTF-8 becomes U+FFFD; event lines survive non-finite numbers.
local luagent = require "luagent"
local server = require "testserver"
local helpers = require "helpers"
local policy = require "luagent.model.policy"

local SSE = { "Content-Type: text/event-stream", "Connection: close" }

local function chunk(delta, finish)
  return '{"id":"c1","model":"m","choices":[{"index":0,"delta":' .. delta .. ',"finish_reason":'
    .. (finish and '"' .. finish .. '"' or "null") .. "}]}"
end

-- Serves `write(conn)` to every request; returns the server.
local function serve(write)
  return server.serve(function(conn) write(conn) end)
end

-- One call through the retry loop against `srv`; returns its events and
-- the final message_end.
local function call(srv, pol)
  local evs = {}
  for ev in luagent.stream { model = { kind = "openai", model = "m", base_url = srv.url .. "/v1", api_key = "k" },
                             policy = pol or { max_retries = 0 }, messages = { { role = "user", content = "hi" } } } do
    evs[#evs + 1] = ev
  end
  return evs, evs[#evs]
end

describe("a hostile server", function()
  local srv
  after_each(function() if srv then srv.close() srv = nil end end)

  it("sending a payload of the wrong shape gets a protocol error with its byte offset", function()
    local first = "data: " .. chunk('{"content":"hi"}') .. "\n\n"
    srv = serve(function(conn)
      conn:write(server.head(200, SSE) .. first .. 'data: {"choices":[null]}\n\n')
    end)
    local _, last = call(srv)
    assert.equal("message_end", last.type)
    assert.is_true(last.final)
    assert.equal("error", last.stop_reason)
    assert.equal("protocol", last.error.kind)
    assert.equal(#first, last.error.offset)
    assert.matches("at event 2: .* %(byte offset " .. #first .. "%)", last.error.message)
  end)

  it("streaming past max_answer_bytes fails the attempt with kind too_large", function()
    srv = serve(function(conn)
      conn:write(server.head(200, SSE))
      local piece = "data: " .. chunk('{"content":"' .. string.rep("a", 1000) .. '"}') .. "\n\n"
      for _ = 1, 200 do
        if not conn:write(piece) then return end
      end
      conn:write("data: [DONE]\n\n")
    end)
    local _, last = call(srv, { max_retries = 2, max_answer_bytes = 64 * 1024 })
    assert.equal("too_large", last.error.kind)
    assert.equal(64 * 1024, last.error.limit)
    assert.matches("max_answer_bytes", last.error.message)
    assert.equal(1, last.attempts) -- the same answer would be too large again
    assert.equal(1, srv.requests)
  end)

  it("checks max_answer_bytes when a policy loads", function()
    assert.is_nil((policy.new({ max_answer_bytes = 10 }, "p.lua")))
    local _, err = policy.new({ max_answer_bytes = "big" }, "p.lua")
    assert.matches("max_answer_bytes", tostring(err))
    assert.equal(false, policy.new({ max_answer_bytes = false }, "p.lua").max_answer_bytes)
    assert.equal(64 * 1024 * 1024, policy.new({}, "p.lua").max_answer_bytes)
  end)

  it("answering with a redirect gets an http error naming the status and the target", function()
    srv = serve(function(conn)
      conn:write(server.head(302, { "Location: https://elsewhere.example/v1", "Content-Length: 0", "Connection: close" }))
    end)
    local _, last = call(srv, { max_retries = 3 })
    assert.equal("http", last.error.kind)
    assert.equal(302, last.error.status)
    assert.matches("HTTP 302 redirect from POST " .. srv.url:gsub("%p", "%%%0") .. "/v1/chat/completions to "
      .. "'https://elsewhere%.example/v1'", last.error.message)
    assert.equal(1, srv.requests) -- not retried
  end)

  it("answering a streaming request with JSON gets a protocol error naming the content type", function()
    local body = '{"choices":[{"message":{"content":"hi"}}]}'
    srv = serve(function(conn)
      conn:write(server.head(200, { "Content-Type: application/json", "Content-Length: " .. #body, "Connection: close" }) .. body)
    end)
    local _, last = call(srv)
    assert.equal("protocol", last.error.kind)
    assert.equal(200, last.error.status)
    assert.matches("expected an event stream %(text/event%-stream%), got a 'application/json' body", last.error.message)
    assert.equal(body, last.error.body)
  end)

  it("sending a gzip body gets a protocol error naming the encoding", function()
    srv = serve(function(conn)
      conn:write(server.head(200, { "Content-Type: text/event-stream", "Content-Encoding: gzip",
        "Content-Length: 10", "Connection: close" }) .. "\31\139\8\0\0\0\0\0\0\3")
    end)
    local _, last = call(srv)
    assert.equal("protocol", last.error.kind)
    assert.matches("'gzip'%-encoded", last.error.message)
  end)

  it("sending a body with no event at all gets a protocol error, not truncated", function()
    srv = serve(function(conn)
      conn:write(server.head(200, { "Content-Type: text/event-stream", "Content-Length: 11", "Connection: close" }) .. "hello world")
    end)
    local _, last = call(srv)
    assert.equal("protocol", last.error.kind)
    assert.matches("HTTP 200: the body %(11 bytes%) held no server%-sent event", last.error.message)
  end)

  it("answering JSON with an error gets a protocol error quoting it", function()
    local body = '{"error":{"message":"model is loading"}}'
    srv = serve(function(conn)
      conn:write(server.head(200, { "Content-Length: " .. #body, "Connection: close" }) .. body)
    end)
    local _, last = call(srv)
    assert.equal("protocol", last.error.kind)
    assert.matches("got a body without Content%-Type of " .. #body .. " bytes without any event: model is loading",
      last.error.message)
  end)

  it("labelling a good stream application/json is still read (as the SDKs do)", function()
    srv = serve(function(conn)
      conn:write(server.head(200, { "Content-Type: application/json", "Connection: close" })
        .. "data: " .. chunk('{"content":"fine"}', "stop") .. "\n\ndata: [DONE]\n\n")
    end)
    local _, last = call(srv)
    assert.equal("stop", last.stop_reason)
    assert.equal("fine", last.message.content)
  end)

  it("sending chunked-encoding garbage gets a protocol error", function()
    srv = serve(function(conn)
      conn:write("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\nzzzz\r\nhello\r\n")
    end)
    local _, last = call(srv)
    assert.equal("protocol", last.error.kind)
    assert.matches("chunked", last.error.message)
  end)

  it("sending headers over 300 KB gets a protocol error", function()
    srv = serve(function(conn)
      local h = { "Content-Type: text/event-stream" }
      for i = 1, 40 do h[#h + 1] = "X-Big-" .. i .. ": " .. string.rep("a", 9000) end
      conn:write(server.head(200, h))
    end)
    local _, last = call(srv)
    assert.equal("protocol", last.error.kind)
    assert.matches("headers", last.error.message)
  end)

  it("sending a lone surrogate escape and bytes that are not UTF-8 gets U+FFFD", function()
    srv = serve(function(conn)
      conn:write(server.head(200, SSE)
        .. "data: " .. chunk('{"content":"a\\ud800b"}') .. "\n\n"
        .. "data: " .. chunk('{"content":"c\xff\xfed"}', "stop") .. "\n\n"
        .. "data: [DONE]\n\n")
    end)
    local evs, last = call(srv)
    assert.equal("stop", last.stop_reason)
    assert.equal("a\u{FFFD}bc\u{FFFD}\u{FFFD}d", last.message.content)
    local deltas = 0
    for _, ev in ipairs(evs) do
      if ev.type == "text_delta" then
        deltas = deltas + 1
        assert.truthy(utf8.len(ev.text))
      end
    end
    assert.is_true(deltas > 0, "the stream gave text deltas to check")
  end)
end)

describe("--events jsonl against a hostile server", function()
  it("writes non-finite numbers as null and text as UTF-8, and keeps writing", function()
    assert.equal('{"n":null,"type":"x"}', require("luagent.base.bus").to_json { type = "x", n = 1 / 0 })
    local script = [[
      package.path = "spec/support/?.lua;" .. package.path
      local luagent = require "luagent"
      local server = require "testserver"
      local srv = server.serve(function(conn)
        conn:write(server.head(200, { "Content-Type: text/event-stream", "Connection: close" }))
        conn:write('data: {"choices":[{"index":0,"delta":{"content":"x\255y","tool_calls":[{"index":0,"id":"c1","function":{"name":"f","arguments":"{\\"n\\":1e999}"}}]}}]}\n\n')
        conn:write('data: {"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}\n\ndata: [DONE]\n\n')
      end)
      for _ = 1, 2 do
        for _ in luagent.stream { model = { kind = "openai", model = "m", base_url = srv.url .. "/v1", api_key = "k" },
                                  messages = { { role = "user", content = "hi" } } } do end
      end
      srv.close()
    ]]
    local path = helpers.tempfile(script, ".lua")
    local r = helpers.run("run", "--events", "jsonl", path)
    os.remove(path)
    assert.equal(0, r.code, r.stderr)
    local ends = 0
    for line in r.stdout:gmatch("[^\n]+") do
      assert.truthy(utf8.len(line), "a line that is not UTF-8: " .. line)
      if line:find('"type":"message_end"', 1, true) then ends = ends + 1 end
    end
    assert.equal(2, ends) -- both calls reached the output
    -- tool arguments that hold one are refused as the call's error (EVENTS.md, tool_call_end)
    assert.matches('"error":"invalid JSON arguments: arguments.n: not a finite number', r.stdout, nil, true)
    assert.matches('x\u{FFFD}y', r.stdout)
    assert.equal("", r.stderr:match("consumer failed.*") or "")
  end)
end)
