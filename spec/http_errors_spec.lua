-- HTTP failures that say what to fix (issue 26, item 1): the message of an
-- HTTP error names the method, the URL (scrubbed of credentials), the status
-- and the provider's own error type and message from the body; a 404 adds
-- what the base URL should look like. Base URLs take the SDKs' conventions,
-- with or without /v1, for every bundled provider: the requests go to the
-- embedded mock provider and to raw test servers over loopback.
local luagent = require "luagent"
local server = require "testserver"
local mock = require "luagent.mock"

local KEY = "sk-HTTPERR-0123456789abcdef"
local HI = { { role = "user", content = "hi" } }
local ONCE = { max_retries = 0 }

-- A server answering every request with `status`, `content_type` and
-- `body`; `seen` gets the last request.
local function answering(status, content_type, body, seen)
  return server.serve(function(conn, req)
    if seen then seen.req = req end
    conn:write(server.head(status, { "Content-Type: " .. content_type,
      "Content-Length: " .. #body, "Connection: close" }) .. body)
  end)
end

-- The error record of one attempt of `p`.
local function failure(p)
  local it, err = p:stream { messages = HI }
  assert.is_nil(it, "expected a failure")
  return err
end

local function plain(s) return (s:gsub("%p", "%%%0")) end

describe("an HTTP failure's message", function()
  local srv
  after_each(function() if srv then srv.close() srv = nil end end)

  it("names the method, the URL, the status and Anthropic's own error type and message", function()
    srv = answering(400, "application/json", '{"type":"error","error":{"type":"invalid_request_error",'
      .. '"message":"max_tokens: must be greater than 0"},"request_id":"req_011"}')
    local p = luagent.provider { kind = "anthropic", model = "claude-x", base_url = srv.url .. "/v1", api_key = KEY }
    local err = failure(p)
    assert.equal("http", err.kind)
    assert.equal(400, err.status)
    assert.matches("^HTTP 400 from POST " .. plain(srv.url) .. "/v1/messages: invalid_request_error: "
      .. "max_tokens: must be greater than 0$", err.message)
    assert.equal("POST", err.method)
    assert.equal(srv.url .. "/v1/messages", err.url)
  end)

  it("names OpenAI's error type, code and message, and the final error after the call says them too", function()
    srv = answering(429, "application/json", '{"error":{"message":"You exceeded your current quota.",'
      .. '"type":"insufficient_quota","param":null,"code":"insufficient_quota"}}')
    local msg, err = luagent.complete { model = { kind = "openai", model = "gpt-x", base_url = srv.url .. "/v1",
      api_key = KEY }, policy = ONCE, messages = HI }
    assert.is_nil(msg)
    assert.matches("^HTTP 429 from POST " .. plain(srv.url) .. "/v1/chat/completions: insufficient_quota: "
      .. "You exceeded your current quota%. %(final after 1 attempt", err.message)
  end)

  it("shows the first line of a text body, and says what a body without text was", function()
    srv = answering(502, "text/plain", "upstream connect error\nreset reason: overflow\n")
    local p = luagent.provider { kind = "openai", model = "m", base_url = srv.url .. "/v1", api_key = KEY }
    assert.matches("^HTTP 502 from POST " .. plain(srv.url) .. "/v1/chat/completions: upstream connect error$",
      failure(p).message)
    srv.close()
    srv = answering(500, "text/html", "<html><head><title>500 Internal Server Error</title></head><body>x</body></html>")
    p = luagent.provider { kind = "openai", model = "m", base_url = srv.url .. "/v1", api_key = KEY }
    assert.matches(": 500 Internal Server Error$", failure(p).message)
  end)

  it("never shows a key: not the provider's, not one in the URL's user info or query", function()
    srv = answering(401, "application/json", '{"error":{"type":"authentication_error","message":"invalid x-api-key '
      .. KEY .. '"}}')
    local p = luagent.provider { kind = "anthropic", model = "m", api_key = KEY,
      base_url = srv.url:gsub("//", "//proxyuser:pr0xy-SECRET-pass@") .. "/v1?api_key=q-SECRET-0123456" }
    local err = failure(p)
    assert.matches("^HTTP 401 from POST http://%*%*%*@127%.0%.0%.1:%d+/v1/messages%?api_key=%*%*%*: "
      .. "authentication_error: invalid x%-api%-key %*%*%*$", err.message)
    for _, secret in ipairs({ KEY, "pr0xy-SECRET-pass", "q-SECRET-0123456" }) do
      assert.is_nil(err.message:find(secret, 1, true), secret)
      assert.is_nil(tostring(err.url):find(secret, 1, true), secret)
    end
  end)

  it("adds what the base URL should look like to a 404 on the base URL, for each provider", function()
    local cases = {
      { kind = "anthropic", shape = "https://api.anthropic.com or https://api.anthropic.com/v1" },
      { kind = "openai", shape = "https://api.openai.com/v1" },
      { kind = "openai_responses", shape = "https://api.openai.com/v1" },
      { kind = "openrouter", shape = "https://openrouter.ai/api or https://openrouter.ai/api/v1" },
    }
    local m = assert(mock.start {})
    for _, c in ipairs(cases) do
      local p = luagent.provider { kind = c.kind, model = "m", base_url = m.url .. "/wrong/v1", api_key = KEY }
      local err = failure(p)
      assert.equal(404, err.status)
      assert.matches("^HTTP 404 from POST " .. plain(m.url) .. "/wrong/v1/", err.message)
      -- the mock's own words, then the hint
      assert.matches("not_found_error: no route for POST /wrong/v1/", err.message)
      assert.matches("check the base URL '" .. plain(m.url) .. "/wrong/v1' %(the provider's base_url%): it should look like "
        .. plain(c.shape), err.message)
    end
    m:close()
  end)

  it("adds no base URL hint when the 404 is the provider's word on the model", function()
    srv = answering(404, "application/json", '{"error":{"message":"The model `gpt-nope` does not exist or you do '
      .. 'not have access to it.","type":"invalid_request_error","param":null,"code":"model_not_found"}}')
    local p = luagent.provider { kind = "openai", model = "gpt-nope", base_url = srv.url .. "/v1", api_key = KEY }
    local err = failure(p)
    assert.matches("invalid_request_error %(model_not_found%): The model `gpt%-nope` does not exist", err.message)
    assert.is_nil(err.message:find("base URL", 1, true))
  end)
end)

describe("base URLs with or without /v1", function()
  local m
  before_each(function() m = assert(mock.start {}) end)
  after_each(function() m:close() end)

  -- each: the base URL's path as given -> the path the request went to
  local CASES = {
    { kind = "anthropic", given = "", path = "/v1/messages" },              -- the Anthropic SDK's form
    { kind = "anthropic", given = "/", path = "/v1/messages" },
    { kind = "anthropic", given = "/v1", path = "/v1/messages" },           -- luagent's and the AI SDK's
    { kind = "anthropic", given = "/v1/", path = "/v1/messages" },
    { kind = "openai", given = "", path = "/v1/chat/completions" },
    { kind = "openai", given = "/v1", path = "/v1/chat/completions" },      -- the OpenAI SDK's form
    { kind = "openai_responses", given = "", path = "/v1/responses" },
    { kind = "openai_responses", given = "/v1/", path = "/v1/responses" },
    { kind = "openrouter", given = "/api", path = "/api/v1/chat/completions" },
    { kind = "openrouter", given = "/api/v1", path = "/api/v1/chat/completions" },
  }
  for _, c in ipairs(CASES) do
    it(string.format("%s takes a base URL ending in '%s'", c.kind, c.given == "" and "the host" or c.given), function()
      local p = luagent.provider { kind = c.kind, model = "m", base_url = m.url .. c.given, api_key = KEY }
      local msg, err = luagent.complete { model = p, policy = ONCE, messages = HI }
      assert.is_truthy(msg, err and tostring(err))
      local log = m:requests()
      assert.equal(c.path, log[#log].path)
    end)
  end

  it("keeps an OpenAI-compatible base URL with a path of its own as it is (as the OpenAI SDK does)", function()
    local seen = {}
    local srv = answering(418, "application/json", '{"error":{"message":"teapot"}}', seen)
    for _, given in ipairs({ "/v1beta/openai", "/openai", "/inference" }) do
      local p = luagent.provider { kind = "openai", model = "m", base_url = srv.url .. given, api_key = KEY }
      failure(p)
      assert.equal(given .. "/chat/completions", seen.req.path)
    end
    srv.close()
  end)

  it("puts a proxy's prefix before Anthropic's /v1, as the Anthropic SDK does", function()
    local seen = {}
    local srv = answering(418, "application/json", '{"error":{"message":"teapot"}}', seen)
    local p = luagent.provider { kind = "anthropic", model = "m", base_url = srv.url .. "/gateway/anthropic", api_key = KEY }
    failure(p)
    assert.equal("/gateway/anthropic/v1/messages", seen.req.path)
    srv.close()
  end)
end)
