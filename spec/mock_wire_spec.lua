-- The mock provider on the wire: every fault `luagent help faults` documents
-- is injected into the mock served in-process on loopback and a real request
-- is sent through luagent.http (libcurl, real sockets), in every wire format.
-- What arrives is checked: status, headers, error bodies in each provider's
-- own shape, the bytes before a reset, stall lengths on the virtual clock,
-- the SSE events of stream faults. Then scopes and seeds, and the request
-- log with its masked keys. The checks are keyed by the help's examples, so
-- a fault documented without a wire test fails here.
local luagent = require "luagent"
local core = require "luagent.core"
local http = require "luagent.base.http"
local mock = require "luagent.mock"
local faults = require "luagent.mock.faults"
local help = require "luagent.mock.help"
local cjson = require "cjson"

local USER = "hello over the wire"

-- Endpoint per wire format; every check runs in each of them.
local PATHS = {
  openai = "/v1/chat/completions",
  openrouter = "/api/v1/chat/completions",
  anthropic = "/v1/messages",
  responses = "/v1/responses",
}
local FORMATS = { "openai", "openrouter", "anthropic", "responses" }

-- Safety net on every request: on the virtual clock a hang fails at once.
local TIMEOUT = { connect = 5, total = 300 }

before_each(function() luagent.clock.virtual() end)
after_each(function() luagent.clock.real() end)

------------------------------------------------------------------------------
-- Sending and reading
------------------------------------------------------------------------------

-- The JSON body of a model request in `format` with one user message;
-- stream:true unless opts.stream == false.
local function request_body(format, opts)
  local body = { model = "wire-model", stream = opts.stream ~= false }
  if format == "responses" then
    body.input = { { role = "user", content = USER } }
  else
    body.messages = { { role = "user", content = USER } }
  end
  if format == "anthropic" then body.max_tokens = 256 end
  return cjson.encode(body)
end

-- Sends one model request in `format` to `srv` and reads all that arrives.
-- opts: stream=, timeout=, headers=. Returns {status=, headers=, body=<raw
-- body bytes>, err=<the request's error, or the one raised while reading>,
-- elapsed=<clock seconds until the end>, arrivals={{at=, size=}...}}.
local function send(srv, format, opts)
  opts = opts or {}
  local headers = { ["Content-Type"] = "application/json" }
  for k, v in pairs(opts.headers or {}) do headers[k] = v end
  local t0 = luagent.now()
  local resp, err = http.request { method = "POST", url = srv.url .. PATHS[format],
    headers = headers, body = request_body(format, opts), http_errors = false,
    timeout = opts.timeout or TIMEOUT }
  if not resp then return { err = err, elapsed = luagent.now() - t0 } end
  local parts, arrivals = {}, {}
  local ok, rerr = pcall(function()
    while true do
      local chunk = resp:read()
      if not chunk then break end
      parts[#parts + 1] = chunk
      arrivals[#arrivals + 1] = { at = luagent.now() - t0, size = #chunk }
    end
  end)
  resp:close()
  return { status = resp.status, headers = resp.headers, body = table.concat(parts),
    err = not ok and rerr or nil, elapsed = luagent.now() - t0, arrivals = arrivals }
end

-- Runs fn(srv) against a fresh mock started with `opts`; closes it after.
local function with_mock(opts, fn)
  local srv = assert(mock.start(opts))
  local ok, err = pcall(fn, srv)
  srv:close()
  if not ok then error(err, 0) end
end

-- The SSE events of a raw body, through the core's parser, each with `json`
-- (its decoded data, or nil when the data is not JSON).
local function events(body)
  local list, err = core.sse_parser():feed(body)
  assert(list, err and err.message)
  for _, e in ipairs(list) do
    local ok, v = pcall(cjson.decode, e.data)
    e.json = ok and v or nil
  end
  return list
end

-- True when some event satisfies pred(e).
local function any(list, pred)
  for _, e in ipairs(list) do if pred(e) then return true end end
  return false
end

-- The first choice of an OpenAI chunk (or an empty table).
local function choice(e)
  local c = type(e.json) == "table" and type(e.json.choices) == "table" and e.json.choices[1]
  return type(c) == "table" and c or {}
end

-- The text deltas of a stream in `format`, in order.
local function deltas(format, list)
  local out = {}
  for _, e in ipairs(list) do
    local t
    if format == "anthropic" then
      if e.event == "content_block_delta" and e.json and e.json.delta.type == "text_delta" then
        t = e.json.delta.text
      end
    elseif format == "responses" then
      if e.event == "response.output_text.delta" and e.json then t = e.json.delta end
    else
      local d = choice(e).delta
      if type(d) == "table" and type(d.content) == "string" and d.content ~= "" then
        t = d.content
      end
    end
    if t then out[#out + 1] = t end
  end
  return out
end

-- Whether the stream in `format` carries its terminator ([DONE],
-- message_stop, response.completed).
local function terminated(format, list)
  if format == "anthropic" then
    return any(list, function(e) return e.event == "message_stop" end)
  elseif format == "responses" then
    return any(list, function(e) return e.event == "response.completed" end)
  end
  return any(list, function(e) return e.data == "[DONE]" end)
end

-- Whether the stream in `format` carries a finish reason (a chunk with a
-- finish_reason, message_delta with a stop_reason, a completed output item).
local function finished(format, list)
  if format == "anthropic" then
    return any(list, function(e)
      return e.event == "message_delta" and e.json.delta.stop_reason == "end_turn"
    end)
  elseif format == "responses" then
    return any(list, function(e)
      return e.event == "response.output_item.done" and e.json.item.status == "completed"
    end)
  end
  return any(list, function(e)
    local f = choice(e).finish_reason
    return f ~= nil and f ~= cjson.null
  end)
end

-- Asserts a 200 SSE response that arrived whole; returns its events.
local function sse_200(r)
  assert(not r.err, r.err and tostring(r.err))
  assert.equal(200, r.status)
  assert.matches("^text/event%-stream", r.headers["content-type"])
  return events(r.body)
end

-- Asserts a normal, complete stream echoing the user's message.
local function check_ok(format, r)
  local list = sse_200(r)
  assert.equal(USER, table.concat(deltas(format, list)))
  assert.is_true(finished(format, list), "no finish reason")
  assert.is_true(terminated(format, list), "no terminator")
  for _, e in ipairs(list) do
    assert.is_truthy(e.json or e.data == "[DONE]", "not JSON: " .. e.data)
  end
  return list
end

------------------------------------------------------------------------------
-- Error responses
------------------------------------------------------------------------------

-- Per status, the error type a provider sends: Anthropic's, OpenAI's (chat
-- and responses) and OpenAI's code.
local STATUS = {
  [400] = { "invalid_request_error", "invalid_request_error" },
  [401] = { "authentication_error", "invalid_request_error", "invalid_api_key" },
  [429] = { "rate_limit_error", "requests", "rate_limit_exceeded" },
  [500] = { "api_error", "server_error" },
  [502] = { "api_error", "server_error" },
  [503] = { "overloaded_error", "server_error" },
  [504] = { "timeout_error", "server_error" },
  [529] = { "overloaded_error", "server_error" },
}

-- Asserts an error response of `status` in `format`'s own shape (402 takes
-- OpenRouter's everywhere), with the request id in the provider's header;
-- `code` overrides OpenAI's expected error code. Returns the decoded body.
local function check_error(format, r, status, code)
  assert(not r.err, r.err and tostring(r.err))
  assert.equal(status, r.status)
  assert.equal("application/json", r.headers["content-type"])
  local id = r.headers[format == "anthropic" and "request-id" or "x-request-id"]
  assert.matches("^req_", id)
  local body = cjson.decode(r.body)
  assert.is_string(body.error.message)
  if status == 402 or format == "openrouter" then
    assert.equal(status, body.error.code)
    assert.is_string(body.user_id)
  elseif format == "anthropic" then
    assert.equal("error", body.type)
    assert.equal(STATUS[status][1], body.error.type)
    assert.equal(id, body.request_id)
  else
    assert.equal(STATUS[status][2], body.error.type)
    assert.equal(code or STATUS[status][3] or cjson.null, body.error.code)
  end
  return body
end

------------------------------------------------------------------------------
-- Stream faults
------------------------------------------------------------------------------

-- Asserts a stream ended by an error event of type `etype` in `format`'s
-- shape after `after` text deltas, with no terminator.
local function check_stream_error(format, r, etype, after)
  local list = sse_200(r)
  assert.equal(after, #deltas(format, list))
  assert.is_false(terminated(format, list), "terminator after the error")
  local last = list[#list]
  local j = last.json
  if format == "anthropic" then
    assert.equal("error", last.event)
    assert.equal("error", j.type)
    assert.equal(etype, j.error.type)
    assert.is_string(j.error.message)
  elseif format == "responses" then
    assert.equal("error", last.event)
    assert.equal("error", j.type)
    assert.equal(etype, j.code)
    assert.is_string(j.message)
    assert.is_false(any(list, function(e) return e.event == "response.failed" end))
  elseif format == "openrouter" then
    assert.equal("message", last.event)
    assert.equal(etype, j.error.code)
    assert.is_string(j.error.message)
    assert.equal("error", j.choices[1].finish_reason)
  else
    assert.equal("message", last.event)
    assert.equal(etype, j.error.type)
    assert.equal(etype, j.error.code)
    assert.is_string(j.error.message)
  end
end

-- The HTTP-date `secs` after unix time `t`.
local function http_date(t, secs)
  return os.date("!%a, %d %b %Y %H:%M:%S GMT", t + secs)
end

-- Asserts r arrived after `secs` of clock time (to the millisecond).
local function took(r, secs)
  assert.is_true(math.abs(r.elapsed - secs) < 0.01,
    string.format("took %.3f s, want %g s", r.elapsed, secs))
end

------------------------------------------------------------------------------
-- One check per example of `luagent help faults`: check(format, srv, spec)
-- runs against a mock started with that example as its faults.
------------------------------------------------------------------------------

local CHECKS = {}

CHECKS["429:retry-after=2@1-2"] = function(format, srv)
  for _ = 1, 2 do
    local r = send(srv, format)
    check_error(format, r, 429)
    assert.equal("2", r.headers["retry-after"])
    assert.is_nil(r.headers["retry-after-ms"])
  end
  check_ok(format, send(srv, format))
end

CHECKS["429:retry-after-ms=1500"] = function(format, srv)
  for _ = 1, 2 do
    local r = send(srv, format)
    check_error(format, r, 429)
    assert.equal("1500", r.headers["retry-after-ms"])
    assert.is_nil(r.headers["retry-after"])
  end
end

CHECKS["429:retry-after-date=+5"] = function(format, srv)
  local before = os.time()
  local r = send(srv, format)
  local after = os.time()
  check_error(format, r, 429)
  local got = r.headers["retry-after"]
  assert.is_truthy(got == http_date(before, 5) or got == http_date(after, 5),
    "Retry-After: " .. tostring(got))
end

CHECKS["500:x-should-retry=false"] = function(format, srv)
  local r = send(srv, format)
  check_error(format, r, 500)
  assert.equal("false", r.headers["x-should-retry"])
  assert.is_nil(r.headers["retry-after"])
end

-- A status on the first request only, then normal replies.
local function first_only(status)
  return function(format, srv)
    local r = send(srv, format)
    check_error(format, r, status)
    assert.is_nil(r.headers["x-should-retry"])
    check_ok(format, send(srv, format))
  end
end
CHECKS["502@1"] = first_only(502)
CHECKS["503@1"] = first_only(503)

CHECKS["504@2"] = function(format, srv)
  check_ok(format, send(srv, format))
  check_error(format, send(srv, format), 504)
  check_ok(format, send(srv, format))
end

CHECKS["529@p:0.5"] = function(format, srv, spec)
  local rng, list = faults.rng(7), assert(faults.parse(spec))
  local seen = {}
  for n = 1, 12 do
    local r = send(srv, format)
    local want = faults.pick(list, n, rng) and 529 or 200
    seen[want] = true
    if want == 529 then
      local body = check_error(format, r, 529)
      if format == "anthropic" then assert.equal("Overloaded", body.error.message) end
    else
      check_ok(format, r)
    end
  end
  assert.is_true(seen[529] and seen[200], "12 requests at p=0.5 (seed 7) should mix")
end

CHECKS["401"] = function(format, srv)
  for _ = 1, 2 do check_error(format, send(srv, format), 401) end
end

-- Each provider's wording of a context overflow.
local OVERFLOW = {
  openai = "maximum context length is 200000 tokens",
  openrouter = "maximum context length is 200000 tokens",
  anthropic = "^prompt is too long: 210000 tokens > 200000 maximum$",
  responses = "exceeds the context window",
}

CHECKS["400:overflow@1"] = function(format, srv)
  local body = check_error(format, send(srv, format), 400, "context_length_exceeded")
  assert.matches(OVERFLOW[format], body.error.message)
  check_ok(format, send(srv, format))
end

CHECKS["402:in-flight@1"] = function(format, srv)
  local body = check_error(format, send(srv, format), 402)
  assert.equal("openrouter_in_flight_budget", body.error.metadata.limit_source)
  assert.equal("in_flight_budget_exhausted", body.error.metadata.reason)
  check_ok(format, send(srv, format))
end

CHECKS["402"] = function(format, srv)
  for _ = 1, 2 do
    local body = check_error(format, send(srv, format), 402)
    assert.is_nil(body.error.metadata)
    assert.matches("credits", body.error.message)
  end
end

CHECKS["close@1"] = function(format, srv)
  local r = send(srv, format)
  assert.is_nil(r.status)
  assert.equal("eof", r.err.kind)
  assert.equal(0, r.err.bytes)
  check_ok(format, send(srv, format))
end

CHECKS["reset:bytes=200@2"] = function(format, srv)
  check_ok(format, send(srv, format))
  local r = send(srv, format)
  assert.equal(200, r.status)
  assert.equal("reset", r.err.kind)
  assert.equal(200, r.err.bytes)
  assert.is_true(r.err.delivered)
  assert.equal(200, #r.body)
  assert.matches(format == "anthropic" and "^event: message_start\n" or
    format == "responses" and "^event: response.created\n" or "^data: {", r.body)
  check_ok(format, send(srv, format))
end

CHECKS["stall:secs=30@1"] = function(format, srv, spec)
  local r = send(srv, format, { timeout = { first_byte = 60, total = 300 } })
  check_ok(format, r)
  took(r, 30)
  assert.is_true(math.abs(r.arrivals[1].at - 30) < 0.01, "first byte at " .. r.arrivals[1].at)
  local again = send(srv, format, { timeout = { first_byte = 60, total = 300 } })
  check_ok(format, again)
  took(again, 0)
  -- a client with a shorter first-byte timeout gives up at its own limit
  with_mock({ faults = spec }, function(other)
    local t = send(other, format, { timeout = { first_byte = 10, total = 300 } })
    assert.is_nil(t.status)
    assert.equal("timeout", t.err.kind)
    assert.equal("first_byte", t.err.which)
    took(t, 10)
  end)
end

CHECKS["stall:secs=30:after=200"] = function(format, srv)
  local r = send(srv, format, { timeout = { first_byte = 10, idle = 60, total = 300 } })
  check_ok(format, r)
  took(r, 30)
  local early = 0
  for _, a in ipairs(r.arrivals) do
    if a.at < 1 then early = early + a.size
    else assert.is_true(math.abs(a.at - 30) < 0.01, "late bytes at " .. a.at) end
  end
  assert.equal(200, early)
  -- a client with a shorter idle timeout gives up after those 200 bytes
  local t = send(srv, format, { timeout = { first_byte = 10, idle = 10, total = 300 } })
  assert.equal(200, t.status)
  assert.equal("timeout", t.err.kind)
  assert.equal("idle", t.err.which)
  assert.equal(200, t.err.bytes)
  assert.equal(200, #t.body)
  took(t, 10)
end

CHECKS["stream-error:overloaded_error@1"] = function(format, srv)
  check_stream_error(format, send(srv, format), "overloaded_error", 1)
  check_ok(format, send(srv, format))
end

CHECKS["stream-error:rate_limit_error"] = function(format, srv)
  for _ = 1, 2 do check_stream_error(format, send(srv, format), "rate_limit_error", 1) end
end

CHECKS["stream-error:no_capacity:after=0"] = function(format, srv)
  check_stream_error(format, send(srv, format), "no_capacity", 0)
end

CHECKS["cut@1"] = function(format, srv)
  local list = sse_200(send(srv, format))
  assert.equal(USER, table.concat(deltas(format, list)))
  assert.is_false(finished(format, list), "finish reason in a cut stream")
  assert.is_false(terminated(format, list), "terminator in a cut stream")
  if format == "anthropic" then
    assert.is_false(any(list, function(e) return e.event == "message_delta" end))
  elseif format == "responses" then
    assert.is_false(any(list, function(e) return e.event:match("%.done$") ~= nil end))
  end
  check_ok(format, send(srv, format))
end

CHECKS["cut:finished@1"] = function(format, srv)
  local list = sse_200(send(srv, format))
  assert.equal(USER, table.concat(deltas(format, list)))
  assert.is_true(finished(format, list), "no finish reason")
  assert.is_false(terminated(format, list), "terminator in a cut stream")
  check_ok(format, send(srv, format))
end

CHECKS["bad-json@1"] = function(format, srv)
  local list = sse_200(send(srv, format))
  local bad = {}
  for i, e in ipairs(list) do
    if not e.json and e.data ~= "[DONE]" then bad[#bad + 1] = i end
  end
  assert.equal(1, #bad, "one data line that is not JSON")
  local i = bad[1]
  local first = list[i - 1]
  assert.equal(1, #deltas(format, { first }), "the bad chunk follows the first delta")
  assert.equal(first.event, list[i].event)
  assert.equal(first.data:sub(1, #list[i].data), list[i].data)
  assert.equal(USER, table.concat(deltas(format, list)))
  check_ok(format, send(srv, format))
end

CHECKS["empty@1"] = function(format, srv)
  local list = sse_200(send(srv, format))
  assert.same({}, deltas(format, list))
  assert.is_true(finished(format, list), "no finish reason")
  assert.is_true(terminated(format, list), "no terminator")
  check_ok(format, send(srv, format))
end

CHECKS["leak@1"] = function(format, srv)
  local list = sse_200(send(srv, format))
  assert.is_true(terminated(format, list), "no terminator")
  local text = table.concat(deltas(format, list))
  local inner = text:match("^<tool_call>(.*)</tool_call>$")
  assert(inner, "not leaked tool-call markup: " .. text)
  assert.same({ name = "search", arguments = { query = USER } }, cjson.decode(inner))
  assert.is_false(any(list, function(e)
    local d = choice(e).delta
    return (type(d) == "table" and d.tool_calls ~= nil)
      or (e.json and e.json.content_block and e.json.content_block.type == "tool_use")
      or (e.json and e.json.item and e.json.item.type == "function_call")
  end), "a real tool call besides the leak")
  check_ok(format, send(srv, format))
end

------------------------------------------------------------------------------
-- The specs
------------------------------------------------------------------------------

describe("every fault of `luagent help faults`, on the wire", function()
  local examples = {}
  for _, section in ipairs(help.sections) do
    for _, entry in ipairs(section.entries) do examples[#examples + 1] = entry[1] end
  end

  it("has a wire check for each example, and none for a fault not documented", function()
    local documented = {}
    for _, ex in ipairs(examples) do documented[ex] = true end
    for ex in pairs(CHECKS) do
      assert.is_true(documented[ex], "wire check for an undocumented example: " .. ex)
    end
  end)

  it("covers every fault kind of faults.lua, each argument and flag, each status of the issue", function()
    local kinds, args, statuses = {}, {}, {}
    for _, ex in ipairs(examples) do
      local f = assert(faults.parse(ex))[1]
      if CHECKS[ex] then
        kinds[f.kind] = true
        for k in pairs(f.args) do args[f.kind .. ":" .. k] = true end
        if f.status then statuses[f.status] = true end
      end
    end
    for kind, def in pairs(faults.kinds) do
      assert.is_true(kinds[kind], "no wire check for fault kind '" .. kind .. "'")
      for _, set in ipairs({ def.args or {}, def.flags or {} }) do
        for k in pairs(set) do
          assert.is_true(args[kind .. ":" .. k], "no wire check for '" .. kind .. ":" .. k .. "'")
        end
      end
    end
    for _, status in ipairs({ 400, 401, 402, 429, 500, 502, 503, 504, 529 }) do
      assert.is_true(statuses[status], "no wire check for status " .. status)
    end
  end)

  for _, section in ipairs(help.sections) do
    describe(section.title, function()
      for _, entry in ipairs(section.entries) do
        local spec = entry[1]
        it(spec .. " in every wire format", function()
          local check = CHECKS[spec]
          assert(check, "no wire check for the documented fault '" .. spec .. "'")
          for _, format in ipairs(FORMATS) do
            local ok, err = pcall(with_mock, { faults = spec, seed = 7 }, function(srv)
              check(format, srv, spec)
            end)
            if not ok then error(format .. ": " .. tostring(err), 0) end
          end
        end)
      end
    end)
  end
end)

describe("faults on stream:false requests", function()
  local function plain(spec, format)
    local r
    with_mock({ faults = spec }, function(srv) r = send(srv, format, { stream = false }) end)
    return r
  end

  it("cut sends half the body and closes: truncated", function()
    local r = plain("cut", "openai")
    assert.equal(200, r.status)
    assert.equal("truncated", r.err.kind)
    local whole = tonumber(r.headers["content-length"])
    assert.equal(whole // 2, r.err.bytes)
    assert.equal(whole // 2, #r.body)
  end)

  it("bad-json sends a body that is not JSON", function()
    local r = plain("bad-json", "anthropic")
    assert.equal(200, r.status)
    assert.is_nil(r.err)
    assert.is_false(pcall(cjson.decode, r.body))
  end)

  it("stream-error answers 200 with the error as the body", function()
    local r = plain("stream-error:overloaded_error", "anthropic")
    assert.equal(200, r.status)
    assert.same({ type = "error", error = { type = "overloaded_error", message = "Overloaded" } },
      cjson.decode(r.body))
  end)

  it("reset:bytes=N sends N bytes of the JSON body, then resets", function()
    local r = plain("reset:bytes=50", "responses")
    assert.equal("reset", r.err.kind)
    assert.equal(50, r.err.bytes)
    assert.equal(50, #r.body)
  end)

  it("empty answers an empty message", function()
    local r = plain("empty", "openai")
    assert.equal("", cjson.decode(r.body).choices[1].message.content)
  end)
end)

describe("fault scopes on the wire", function()
  -- The statuses of `count` requests against a mock with `spec` and `seed`.
  local function statuses(spec, count, seed)
    local out = {}
    with_mock({ faults = spec, seed = seed }, function(srv)
      for n = 1, count do
        local r = send(srv, "openai")
        assert(not r.err, r.err and tostring(r.err))
        out[n] = r.status
      end
    end)
    return out
  end

  it("@N fails request N only", function()
    assert.same({ 200, 503, 200 }, statuses("503@2", 3))
  end)

  it("@N-M fails requests N to M", function()
    assert.same({ 200, 503, 503, 200 }, statuses("503@2-3", 4))
  end)

  it("@every:K fails every Kth request", function()
    assert.same({ 200, 200, 503, 200, 200, 503, 200 }, statuses("503@every:3", 7))
  end)

  it("@p:X picks the same requests for the same seed, others for another", function()
    local a = statuses("503@p:0.4", 20, 11)
    assert.same(a, statuses("503@p:0.4", 20, 11))
    assert.are_not.same(a, statuses("503@p:0.4", 20, 12))
    local fails = 0
    for _, s in ipairs(a) do if s == 503 then fails = fails + 1 end end
    assert.is_true(fails > 0 and fails < 20, fails .. " of 20 failed at p=0.4")
  end)

  it("the first matching fault wins", function()
    assert.same({ 503, 429, 200 }, statuses("503@1,429@1-2", 3))
  end)
end)

describe("GET /__luagent/requests", function()
  it("counts every request, failed ones too, and masks keys", function()
    with_mock({ faults = "503@1" }, function(srv)
      local keys = { Authorization = "Bearer sk-secret-wire-1", ["x-api-key"] = "sk-ant-secret-wire-2" }
      check_error("openai", send(srv, "openai", { headers = keys }), 503)
      check_ok("anthropic", send(srv, "anthropic", { headers = keys }))
      local miss = assert(http.fetch { url = srv.url .. "/nowhere", http_errors = false, timeout = TIMEOUT })
      assert.equal(404, miss.status)

      local r = assert(http.fetch { url = srv.url .. "/__luagent/requests", timeout = TIMEOUT })
      assert.equal(200, r.status)
      assert.equal("application/json", r.headers["content-type"])
      assert.is_nil(r.body:find("secret", 1, true), "a key leaked into the log")
      local log = cjson.decode(r.body)
      assert.equal(3, #log)
      assert.same({ 1, "POST", PATHS.openai }, { log[1].n, log[1].method, log[1].path })
      assert.same({ 2, "POST", PATHS.anthropic }, { log[2].n, log[2].method, log[2].path })
      assert.same({ "GET", "/nowhere" }, { log[3].method, log[3].path })
      assert.is_nil(log[3].n)
      for i = 1, 2 do
        assert.equal("Bearer ***", log[i].headers.authorization)
        assert.equal("***", log[i].headers["x-api-key"])
        assert.equal("application/json", log[i].headers["content-type"])
        assert.equal(USER, log[i].body.messages[1].content)
        assert.is_true(log[i].body.stream)
      end
      -- reading the log is not itself logged
      local again = cjson.decode(assert(http.fetch { url = srv.url .. "/__luagent/requests",
        timeout = TIMEOUT }).body)
      assert.equal(3, #again)
      assert.equal(3, #srv:requests())
    end)
  end)
end)
