-- API keys never leave the process: a hostile server echoes the key in
-- every place it can (headers of 2xx and 3xx responses, a redirect's
-- Location, SSE event names, the model's text split across deltas, tool
-- arguments, an in-stream error that is retried and logged, an error body
-- cut at 64 KiB, a JSON body), and the key is found
-- in none of the outputs: error records, events, `--events jsonl`, the
-- cassette of `--record`, and the log lines on stderr.
local helpers = require "helpers"

-- The script `luagent run` executes: an echoing server and one call per
-- scenario; it prints every event and error it sees to stderr.
local SCRIPT = [==[
package.path = "spec/support/?.lua;" .. package.path
local luagent = require "luagent"
local server = require "testserver"

-- the key as the server sees it, in its plain and URL-encoded forms
local function echo(req) return req.headers["authorization"] or "" end
local function urlenc(s) return (s:gsub("[^%w%-%._~]", function(c) return string.format("%%%02X", c:byte()) end)) end
local function jsonesc(s) return (s:gsub("/", "\\/")) end

local scenario = {}
function scenario.stream(conn, req)
  local key = echo(req):match("^Bearer (.*)$")
  conn:write(server.head(200, { "Content-Type: text/event-stream", "X-Echo: " .. echo(req),
    "X-Echo-Url: " .. urlenc(echo(req)), "Connection: close" }))
  local half = #key // 2
  local chunks = {
    '{"choices":[{"index":0,"delta":{"content":"the key is ' .. key:sub(1, half) .. '"}}]}',
    '{"choices":[{"index":0,"delta":{"content":"' .. jsonesc(key:sub(half + 1)) .. ', right"}}]}',
    '{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c1","function":{"name":"f","arguments":"{\\"k\\":\\"' .. jsonesc(key) .. '\\"}"}}]}}]}',
    '{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}',
  }
  for _, c in ipairs(chunks) do conn:write("event: " .. key .. "\ndata: " .. c .. "\n\n") end
  conn:write("data: [DONE]\n\n")
end
function scenario.overloaded(conn, req)
  conn:write(server.head(200, { "Content-Type: text/event-stream", "Connection: close" })
    .. 'data: {"error":{"message":"key ' .. jsonesc(echo(req)) .. ' overloaded","type":"overloaded_error"}}\n\n')
end
function scenario.redirect(conn, req)
  conn:write(server.head(302, { "Location: http://127.0.0.1:1/login?auth=" .. urlenc(echo(req)),
    "X-Echo: " .. echo(req), "Content-Length: 0", "Connection: close" }))
end
function scenario.cut(conn, req)
  local key = echo(req):match("^Bearer (.*)$")
  -- the key starts 4 bytes before the 64 KiB cut of error bodies
  local body = string.rep("x", 64 * 1024 - 4) .. key .. string.rep("y", 100)
  conn:write(server.head(401, { "Content-Length: " .. #body, "Connection: close" }) .. body)
end
function scenario.json(conn, req)
  local body = '{"error":{"message":"bad key ' .. jsonesc(echo(req)) .. '"}}'
  conn:write(server.head(200, { "Content-Type: application/json", "Content-Length: " .. #body,
    "Connection: close" }) .. body)
end

local function dump(v, out, seen)
  if type(v) == "table" then
    if seen[v] then return end
    seen[v] = true
    out[#out + 1] = tostring(v)
    for k, x in pairs(v) do dump(k, out, seen); dump(x, out, seen) end
  elseif v ~= nil then
    out[#out + 1] = tostring(v)
  end
end

luagent.configure { log_sink = function(_, line) io.stderr:write("LOG ", line, "\n") end,
                    log_level = "info" } -- retries are logged at info
for _, name in ipairs({ "stream", "overloaded", "redirect", "cut", "json" }) do
  local srv = server.serve(scenario[name])
  local model = { kind = "openai", model = "m", base_url = srv.url .. "/v1" }
  local out = {}
  for ev in luagent.stream { model = model, policy = { max_retries = 1, backoff = { strategy = "fixed", base = 0 } },
                             messages = { { role = "user", content = "hi" } } } do
    dump(ev, out, {})
  end
  io.stderr:write("SCENARIO ", name, "\n", table.concat(out, "\n"), "\n")
  srv.close()
end
]==]

-- The run's outputs, concatenated: stdout (events), stderr (logs, printed
-- events and errors) and the cassette.
local function run_with(key)
  local script = helpers.tempfile(SCRIPT, ".lua")
  local cassette = os.tmpname()
  local cmd = string.format("env -u ANTHROPIC_API_KEY -u OPENROUTER_API_KEY OPENAI_API_KEY=%s %s run"
    .. " --record %s --events jsonl %s", helpers.quote(key), helpers.quote(helpers.bin),
    cassette, script)
  local out, err = os.tmpname(), os.tmpname()
  os.execute(cmd .. " >" .. out .. " 2>" .. err .. " </dev/null")
  local r = { stdout = helpers.slurp(out), stderr = helpers.slurp(err), cassette = helpers.slurp(cassette) }
  for _, p in ipairs({ script, cassette, out, err }) do os.remove(p) end
  return r
end

local function urlenc(s)
  return (s:gsub("[^%w%-%._~]", function(c) return string.format("%%%02X", c:byte()) end))
end

for _, key in ipairs({ "sk-1234", "sk-LEAK/CHECK+0123456789abcdef==" }) do
  describe("a server echoing the key " .. key, function()
    local r
    setup(function() r = run_with(key) end)

    it("ran every scenario, recorded them and printed their events", function()
      for _, name in ipairs({ "stream", "overloaded", "redirect", "cut", "json" }) do
        assert.matches("SCENARIO " .. name, r.stderr)
      end
      local _, lines = r.cassette:gsub("\n", "")
      assert.equal(6, lines) -- the overloaded call was tried twice
      assert.matches('LOG {[^\n]*"level":"info"[^\n]*provider error %(attempt 1/2%).-key Bearer %*%*%* overloaded', r.stderr)
      assert.matches('"type":"message_end"', r.stdout)
      -- the echoes are there, scrubbed
      assert.matches("the key is %*%*%*, right", r.stdout)
      assert.matches('"x%-echo":"Bearer %*%*%*"', r.cassette)
      assert.matches("auth=Bearer%%20%*%*%*", r.cassette)
      assert.matches('"event":"%*%*%*"', r.cassette)
      assert.matches("HTTP 302 redirect", r.stderr)
      assert.matches("HTTP 401", r.stderr)
      assert.matches("application/json", r.stderr)
    end)

    for _, where in ipairs({ "stdout", "stderr", "cassette" }) do
      it("never shows the key, nor a prefix of a cut key, on " .. where, function()
        local text = r[where]
        for _, form in ipairs({ key, urlenc(key), (key:gsub("/", "\\/")) }) do
          assert.is_nil(text:find(form, 1, true), form .. " found in " .. where)
        end
        -- what the 64 KiB cut would leave of a key that starts 4 bytes
        -- before it (the body is x...x then the key)
        assert.is_nil(text:find("xxxx" .. key:sub(1, 4) .. '"', 1, true))
        assert.is_nil(text:find("xxxx" .. key:sub(1, 4), 1, true))
      end)
    end
  end)
end
