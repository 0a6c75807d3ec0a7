-- HTTP/2 failures end to end, against a tiny h2c server on loopback
-- (spec/support/h2server.lua) and real libcurl: the core reports what curl
-- saw (kind `transport`, curl's code, the phase), luagent.http names the
-- kind, and the classifier alone decides to retry. A stream reset by a
-- provider's edge (RST_STREAM, curl code 92) and a connection it shuts with
-- an error before answering (GOAWAY, curl code 16) are retried.
local luagent = require "luagent"
local core = require "luagent.core"
local http = require "luagent.base.http"
local classify = require "luagent.model.classify"
local h2 = require "h2server"
local server = require "testserver"
local helpers = require "helpers"

local H2 = "2-prior-knowledge"
local RESET = { { "rst", h2.errors.INTERNAL_ERROR } }
local GOAWAY = { { "goaway", h2.errors.INTERNAL_ERROR, 0 } } -- no stream was processed
local SSE = 'data: {"choices":[{"index":0,"delta":{"content":"hello"}}]}\n\n'
  .. 'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'

-- One luagent.stream call to `srv` over h2c on the virtual clock, whose
-- first attempt fails: checks that a second request answered it in full,
-- and returns the provider_retry event.
local function stream_through(srv)
  luagent.clock.virtual()
  local evs = {}
  local ok, err = pcall(function()
    for ev in luagent.stream {
      model = { kind = "openai", model = "m", base_url = srv.url .. "/v1", api_key = "k", http_version = H2 },
      messages = { { role = "user", content = "hi" } }, seed = 3,
    } do evs[#evs + 1] = ev end
  end)
  luagent.clock.real()
  assert(ok, tostring(err))
  assert.equal(2, srv.streams)
  local retried, text
  for _, ev in ipairs(evs) do
    if ev.type == "provider_retry" then retried = ev end
    if ev.type == "text_delta" then text = (text or "") .. ev.text end
  end
  assert.is_table(retried, "a provider_retry event")
  assert.equal("transport", retried.class)
  assert.equal("hello", text)
  assert.equal("message_end", evs[#evs].type)
  assert.is_nil(evs[#evs].error)
  return retried
end

-- The two ways an edge breaks a request before it answers.
local BREAKS = {
  { what = "a stream reset (RST_STREAM)", plan = RESET, code = 92,
    message = "^HTTP/2 stream 1 was not closed cleanly: INTERNAL_ERROR" },
  { what = "a GOAWAY with an error", plan = GOAWAY, code = 16, message = "HTTP2 framing layer" },
}

for _, b in ipairs(BREAKS) do
  describe("HTTP/2, " .. b.what .. " before the answer", function()
    local srv
    after_each(function() if srv then srv.close() srv = nil end end)

    it("is reported by the core as facts: kind transport, curl code " .. b.code .. ", the phase", function()
      srv = h2.serve(function() return b.plan end)
      local req, err = core.http_request { url = srv.url .. "/v1/x", method = "POST", body = "{}",
                                           http_version = H2, timeout = { total = 10 } }
      assert.is_nil(req)
      assert.equal("transport", err.kind)
      assert.equal(b.code, err.curl_code)
      assert.equal("headers", err.phase)
      assert.equal(0, err.bytes)
      assert.is_false(err.delivered)
      assert.is_nil(err.retryable)
      assert.matches(b.message, err.message)
      assert.is_string(err.curl_message)
      assert.equal(1, srv.streams)
    end)

    it("is kind protocol from luagent.http (as before), and the classifier retries it", function()
      srv = h2.serve(function() return b.plan end)
      local resp, err = http.request { url = srv.url, http_version = H2, timeout = { total = 10 } }
      assert.is_nil(resp)
      assert.equal("protocol", err.kind)
      assert.equal(b.code, err.curl_code)
      assert.equal("protocol: " .. err.message, tostring(err))
      local d = classify.classify(err)
      assert.equal("transport", d.class)
      assert.is_true(d.retryable)
    end)

    it("is retried by luagent.stream, and the next attempt answers", function()
      srv = h2.serve(function(n) return n == 1 and b.plan or h2.answer(SSE) end)
      local retried = stream_through(srv)
      assert.matches("^protocol: ", retried.error)
      assert.matches(b.message:gsub("^%^", ""), retried.error)
    end)
  end)
end

describe("HTTP/2, a stream reset in the body", function()
  it("is reported with phase body, the status and the bytes delivered", function()
    local srv = h2.serve(function()
      return { { "headers", 200, "text/event-stream" }, { "data", "data: one\n\n" },
               { "rst", h2.errors.INTERNAL_ERROR } }
    end)
    local req = assert(core.http_request { url = srv.url, http_version = H2, timeout = { total = 10 } })
    assert.equal(200, req:status())
    assert.equal("one", assert(req:event()).data)
    local ev, err = req:event()
    assert.is_nil(ev)
    assert.equal("transport", err.kind)
    assert.equal(92, err.curl_code)
    assert.equal("body", err.phase)
    assert.equal(200, err.status)
    assert.equal(#"data: one\n\n", err.bytes)
    assert.is_true(err.delivered)
    req:close()
    srv.close()
  end)
end)

describe("h2c (http_version 2-prior-knowledge)", function()
  it("serves request after request: each on a connection of its own", function()
    -- libcurl 7.88 fails any reuse of an h2c connection with curl code 16
    local srv = h2.serve(function() return h2.answer("data: x\n\n") end)
    for i = 1, 3 do
      local r, err = http.fetch { url = srv.url .. "/" .. i, http_version = H2, timeout = { total = 10 } }
      assert(r, tostring(err))
      assert.equal("data: x\n\n", r.body)
    end
    assert.equal(3, srv.streams)
    srv.close()
  end)
end)

describe("http.request options", function()
  local srv
  after_each(function() if srv then srv.close() srv = nil end end)

  it("http_version must be one the core knows", function()
    local ok, err = pcall(http.request, { url = "http://127.0.0.1:1/", http_version = "3" })
    assert.is_false(ok)
    assert.matches("http_version must be", err)
  end)

  it("ca_file: the CA bundle for TLS, as given (a missing file fails the handshake)", function()
    srv = server.serve(function(conn) conn:read() end, { raw = true })
    local resp, err = http.request { url = "https://127.0.0.1:" .. srv.port .. "/",
                                     ca_file = "/nonexistent/ca.pem", timeout = { total = 10 } }
    assert.is_nil(resp)
    assert.equal("tls", err.kind)
    assert.equal(77, err.curl_code)
    assert.equal("connect", err.phase)
  end)

  it("ca_file defaults to $CURL_CA_BUNDLE in luagent.http; the core reads no environment", function()
    local script = [[
      package.path = "spec/support/?.lua;" .. package.path
      local core = require "luagent.core"
      local http = require "luagent.base.http"
      local srv = require("testserver").serve(function(conn) conn:read(); conn:write("not TLS\r\n\r\n") end, { raw = true })
      local url = "https://127.0.0.1:" .. srv.port .. "/"
      local _, err = http.request { url = url, timeout = { total = 10 } }
      local _, cerr = core.http_request { url = url, timeout = { total = 10 } }
      print(err.kind, err.curl_code, cerr.curl_code)
      srv.close()
    ]]
    local path = helpers.tempfile(script, ".lua")
    local out = io.popen("env CURL_CA_BUNDLE=/nonexistent/ca.pem " .. helpers.quote(helpers.bin) .. " run "
                         .. helpers.quote(path) .. " 2>&1"):read("a")
    os.remove(path)
    -- 77: the CA file could not be read; 35: the handshake met a server that is no TLS
    assert.equal("tls\t77\t35\n", out)
  end)
end)
