-- provider:stream over loopback: one attempt, normalized events, errors as
-- records, and the API key never in any output.
local luagent = require "luagent"
local server = require "testserver"

local KEY = "sk-LEAKCHECK-0123456789abcdef"

-- Every string reachable from v, concatenated (for leak searches).
local function dump(v, seen, out)
  seen, out = seen or {}, out or {}
  if type(v) == "table" then
    if seen[v] then return out end
    seen[v] = true
    for k, x in pairs(v) do dump(k, seen, out); dump(x, seen, out) end
  elseif v ~= nil then
    out[#out + 1] = tostring(v)
  end
  return out
end

local CHUNKS = {
  '{"id":"c1","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}',
  '{"id":"c1","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"content":"Hel"}}]}',
  '{"id":"c1","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"content":"lo"},"finish_reason":"stop"}]}',
  '{"id":"c1","object":"chat.completion.chunk","model":"m","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2}}',
}

local function stream_handler(opts)
  return function(conn, req)
    opts.seen = req
    conn:write(server.head(200, { "Content-Type: text/event-stream", "Connection: close" }))
    for i, c in ipairs(CHUNKS) do
      if opts.cut_after and i > opts.cut_after then return end
      conn:write("data: " .. c .. "\n\n")
    end
    if opts.error_event then conn:write('data: {"error":{"message":"key ' .. KEY .. ' overloaded","type":"overloaded_error"}}\n\n') return end
    conn:write("data: [DONE]\n\n")
  end
end

describe("provider:stream", function()
  local srv
  after_each(function() if srv then srv.close() srv = nil end end)

  local function provider(url)
    return luagent.provider { kind = "openai", model = "gpt-test", base_url = url .. "/v1", api_key = KEY }
  end

  it("streams normalized events for one attempt", function()
    local state = {}
    srv = server.serve(stream_handler(state))
    local it = assert(provider(srv.url):stream { messages = { { role = "user", content = "hi" } } })
    local types, text = {}, {}
    for ev in it do
      types[#types + 1] = ev.type
      if ev.type == "text_delta" then text[#text + 1] = ev.text end
    end
    assert.are.same({ "message_start", "text_delta", "text_delta", "usage", "message_end" }, types)
    assert.equal("Hello", table.concat(text))
    assert.equal("/v1/chat/completions", state.seen.path)
    assert.equal("Bearer " .. KEY, state.seen.headers["authorization"])
    assert.equal(1, srv.requests)
  end)

  it("raises `truncated` from the iterator when the stream is cut", function()
    srv = server.serve(stream_handler { cut_after = 2 })
    local it = assert(provider(srv.url):stream { messages = { { role = "user", content = "hi" } } })
    local ok, err = pcall(function() for _ in it do end end)
    assert.is_false(ok)
    assert.equal("truncated", err.kind)
  end)

  it("takes key and base URL from the environment names of its kind", function()
    -- (the key from the variable: spec/keys_spec.lua, whose server sees it)
    local p = luagent.provider { kind = "openrouter", model = "some-model", api_key = "k" }
    assert.equal("openrouter", p.kind)
    assert.equal("some-model", p.model)
    assert.matches("openrouter", p.base_url)
    if not os.getenv("OPENROUTER_API_KEY") and not os.getenv("OPENROUTER_BASE_URL") then
      -- no key there, and the public URL: no provider (spec/missing_key_spec.lua)
      local ok, err = pcall(luagent.provider, "openrouter/some-model")
      assert.is_false(ok)
      assert.equal("usage", err.kind)
      assert.equal("OPENROUTER_API_KEY", err.variable)
    end
    assert.has_error(function() luagent.provider("nope/x") end, "provider: unknown kind 'nope'")
    assert.has_error(function() luagent.provider("no-slash") end)
  end)

  it("never shows the API key in events, errors or its own printout", function()
    local outputs = {}
    local p
    -- a normal stream
    srv = server.serve(stream_handler {})
    p = provider(srv.url)
    for ev in assert(p:stream { messages = { { role = "user", content = "hi" } } }) do outputs[#outputs + 1] = ev end
    srv.close()
    -- an in-stream error whose message echoes the key
    srv = server.serve(stream_handler { error_event = true })
    p = provider(srv.url)
    local ok, err = pcall(function() for ev in assert(p:stream { messages = {} }) do outputs[#outputs + 1] = ev end end)
    assert.is_false(ok)
    outputs[#outputs + 1] = err
    outputs[#outputs + 1] = tostring(err)
    srv.close()
    -- a 401 whose body and headers echo the key
    srv = server.serve(function(conn, req)
      local body = '{"error":"invalid key ' .. req.headers["authorization"] .. '"}'
      conn:write(server.head(401, { "X-Echo: " .. KEY, "Content-Length: " .. #body }) .. body)
    end)
    p = provider(srv.url)
    local none, herr = p:stream { messages = {} }
    assert.is_nil(none)
    assert.equal(401, herr.status)
    outputs[#outputs + 1] = herr
    outputs[#outputs + 1] = tostring(herr)
    outputs[#outputs + 1] = tostring(p)
    -- a refused connection
    srv.close()
    local _, rerr = p:stream { messages = {} }
    outputs[#outputs + 1] = rerr
    srv = nil
    -- a recording of the same failures
    local rec_path = os.tmpname()
    local recorder = assert(require("luagent.observe.record").open(rec_path))
    luagent.configure { record = recorder }
    srv = server.serve(stream_handler { error_event = true })
    p = provider(srv.url)
    pcall(function() for _ in assert(p:stream { messages = {} }) do end end)
    srv.close()
    srv = server.serve(function(conn, req)
      local body = '{"error":"invalid key ' .. req.headers["authorization"] .. '"}'
      conn:write(server.head(401, { "Content-Length: " .. #body }) .. body)
    end)
    p = provider(srv.url)
    p:stream { messages = {} }
    luagent.configure { record = false }
    recorder:close()
    local f = assert(io.open(rec_path))
    outputs[#outputs + 1] = f:read("a")
    f:close()
    os.remove(rec_path)
    local _, exchanges = outputs[#outputs]:gsub("\n", "")
    assert.equal(2, exchanges) -- both failures were recorded
    local all = table.concat(dump(outputs), "\n")
    assert.matches("invalid key Bearer %*%*%*", all) -- the echo was there, scrubbed
    assert.is_nil(all:find(KEY, 1, true))
    assert.is_nil(all:find("0123456789abcdef", 1, true))
  end)
end)
