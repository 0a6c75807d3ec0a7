-- A wire format is one adapter table: this spec makes up a tiny one
-- ("tinywire": POST {base}/models/{model}/talk, the model in the path as
-- Gemini and Azure put it, SSE events `say`, `end` and `trouble`),
-- registers it with provider.register from here, and runs calls through the
-- mock provider on loopback against it: the kind, its base URL on the mock,
-- its key header masked, its in-stream error classified and retried, its
-- overflow words, its OpenTelemetry name on the call's events and spans,
-- its cassette fields. No library file names it.
local luagent = require "luagent"
local provider = require "luagent.model.provider"
local common = require "luagent.model.providers.common"
local classify = require "luagent.model.classify"
local errors = require "luagent.base.errors"
local cassette = require "luagent.base.cassette"
local mock = require "luagent.mock"
local replies = require "luagent.mock.replies"
local cjson = require "cjson"
local slurp = require("spec.support.helpers").slurp

------------------------------------------------------------------------------
-- The made-up format, all of it
------------------------------------------------------------------------------

local TINY = {
  name = "tinywire",
  kinds = { tiny = { key_env = "TINY_API_KEY", base_env = "TINY_BASE_URL", otel_name = "tiny.example" } },
  default_base_url = "https://tiny.example/v0",
  path = "/models/{model}/talk",
  stream_errors = { tiny_busy = "overloaded" },
  overflow_phrases = { "tiny head is full" },
  secret_headers = { "x-tiny-key" },
  replay_fields = { "lines" },
}

-- Who says a history message, in tinywire's words.
local FROM = { user = "user", assistant = "bot", tool = "tool" }

function TINY.build(req, opts)
  common.check_request(TINY.name, req)
  local lines = common.array()
  if req.system then lines[1] = { from = "rules", text = req.system } end
  for _, m in ipairs(req.messages) do
    lines[#lines + 1] = { from = FROM[m.role], text = common.result_text(m.content) }
  end
  local headers = { ["content-type"] = "application/json", ["x-tiny-key"] = opts.api_key }
  local path = TINY.path:gsub("{model}", (req.model:gsub("[^%w._-]", "")))
  return common.post(TINY, opts, path, headers, { stream = true, lines = lines }, true)
end

local handlers = {}
function handlers.say(dec, p) dec:add_text(common.want(p.text, "string", "text")) end
function handlers.trouble(dec, p) return dec:stream_error({ code = p.code, message = p.message }, nil, p) end
handlers["end"] = function(dec, p)
  local used = common.want(p.used, "object", "used") or {}
  dec:set_usage(common.usage(used["in"], used.out))
  dec:set_stop("stop", common.want(p.why, "string", "why"))
  dec:complete()
end
local handle = common.dispatch(handlers)

function TINY.decoder(ctx)
  return common.decoder(TINY.name, ctx, handle, nil, "end")
end

-- Its mock side (lua/luagent/mock/replies.lua says what each field is).
TINY.mock = { title = "Tiny talk", request_id_header = "tiny-request" }

function TINY.mock.read(body, path)
  local messages = {}
  for _, l in ipairs(type(body.lines) == "table" and body.lines or {}) do
    if l.from ~= "rules" then
      messages[#messages + 1] = { role = l.from == "bot" and "assistant" or l.from, text = l.text,
        tool_result = l.from == "tool" }
    end
  end
  return { messages = messages, tools = {}, model = path and path:match("/models/([^/]+)/talk$") }
end

function TINY.mock.stream(view, reply)
  local events = {}
  for _, w in ipairs(reply.words) do events[#events + 1] = common.event("say", { text = w }) end
  events[#events + 1] = common.event("end", common.object("why", "done",
    "used", common.object("in", view.input_tokens, "out", reply.output_tokens)))
  return events
end

function TINY.mock.complete(_, reply)
  return common.encode(common.object("text", reply.text, "why", "done"))
end

function TINY.mock.error_body(status, e)
  return common.encode(common.object("trouble", common.object("code", e.type or ("tiny_" .. status),
    "message", e.message)))
end

TINY.mock.overflow_message = "Sorry: tiny head is full (210000 words)"

function TINY.mock.stream_error(etype, message)
  return common.event("trouble", common.object("code", etype, "message", message))
end

local PHASES = { say = "delta", ["end"] = "end", trouble = "open" }
function TINY.mock.phase(e) return e.event and PHASES[e.event] end

provider.register(TINY)

------------------------------------------------------------------------------
-- Calls
------------------------------------------------------------------------------

local USER = "hello tiny world"

before_each(function()
  luagent.configure { log_sink = function() end }
  luagent.clock.virtual()
  luagent.default_runtime().endpoints:reset()
end)
after_each(function()
  luagent.configure { log_sink = false }
  luagent.clock.real()
end)

-- One streamed call of kind tiny against a fresh mock with `faults`:
-- the events, the requests the mock received.
local function call(faults)
  local srv = assert(mock.start { faults = faults, seed = 1 })
  local evs = {}
  local ok, err = pcall(function()
    for ev in luagent.stream {
      model = { kind = "tiny", model = "tiny-1", base_url = srv.base_urls.tiny, api_key = "tiny-secret-key" },
      messages = { { role = "user", content = USER } },
      policy = { backoff = { strategy = "fixed", base = 0.5 } },
    } do evs[#evs + 1] = ev end
  end)
  local requests = srv:requests()
  srv:close()
  if not ok then error(err, 0) end
  return evs, requests
end

local function find(evs, type)
  for _, e in ipairs(evs) do if e.type == type then return e end end
end

describe("a wire format registered from a spec", function()
  it("is known to no library file", function()
    local p = io.popen("grep -rl tinywire lua")
    local found = p:read("a")
    p:close()
    assert.equal("", found)
  end)

  it("is a provider kind, with its key variable and its base URL on the mock", function()
    local p = luagent.provider { kind = "tiny", model = "tiny-1", api_key = "k" }
    assert.equal(TINY, p.adapter)
    assert.equal("https://tiny.example/v0", p.base_url)
    assert.truthy(table.concat(provider.key_variables(), " "):find("TINY_API_KEY", 1, true))
    local srv = assert(mock.start {})
    assert.equal(srv.url .. "/v0", srv.base_urls.tiny)
    srv:close()
    assert.equal("tinywire", replies.formats["/v0/models/any-model/talk"])
    assert.is_nil(replies.formats["/v0/models/a/b/talk"])
    local listed = false
    for _, e in ipairs(replies.endpoints()) do
      listed = listed or (e.path == "/v0/models/{model}/talk" and e.title == "Tiny talk")
    end
    assert.is_true(listed)
  end)

  it("answers a call end to end through the mock, in its own events", function()
    local evs, requests = call(nil)
    assert.equal(1, #requests)
    local req = requests[1]
    assert.equal("/v0/models/tiny-1/talk", req.path)
    assert.equal("***", req.headers["x-tiny-key"]) -- its key header, masked in the log
    assert.same({ { from = "user", text = USER } }, req.body.lines)
    local start = find(evs, "message_start")
    assert.equal("tinywire", start.provider)
    assert.equal("tiny-1", start.model)
    local last = evs[#evs]
    assert.equal("message_end", last.type)
    assert.is_true(last.final)
    assert.equal("stop", last.stop_reason)
    assert.equal("done", last.raw_stop_reason)
    assert.equal(USER, last.message.content)
    assert.equal(3, last.usage.output_tokens)
    assert.equal("tiny", last.provider_kind)
    assert.equal("tiny.example", last.provider_name)
  end)

  it("has its in-stream error code classified by the classifier, and retried", function()
    local evs, requests = call("stream-error:tiny_busy@1")
    assert.equal(2, #requests)
    local retry = assert(find(evs, "provider_retry"))
    assert.equal("overloaded", retry.class)
    assert.equal("stream_error", retry.error.kind)
    assert.equal("tiny_busy", retry.error.code)
    local last = evs[#evs]
    assert.equal("stop", last.stop_reason)
    assert.equal(USER, last.message.content)
    -- the same, asked of the classifier directly
    local d = classify.classify(errors.new("stream_error", "busy", { code = "TINY_BUSY" }))
    assert.equal("overloaded", d.class)
    assert.is_true(d.retryable)
    assert.equal("rule 4: in-stream tiny_busy", d.reason)
  end)

  it("has its overflow words read as a context overflow, in its error shape", function()
    local evs = call("400:overflow@1")
    local last = evs[#evs]
    assert.equal("error", last.stop_reason)
    assert.equal("context_overflow", last.error.class)
    local body = cjson.decode(last.error.cause.body)
    assert.equal("tiny_400", body.trouble.code)
    assert.equal(TINY.mock.overflow_message, body.trouble.message)
  end)

  it("names itself to OpenTelemetry through the call's events", function()
    local file = os.tmpname()
    local tracer = assert(luagent.default_runtime():trace { file = file })
    call(nil)
    tracer:stop()
    local line = cjson.decode(slurp(file):match("^[^\n]+"))
    os.remove(file)
    local names = {}
    for _, span in ipairs(line.resourceSpans[1].scopeSpans[1].spans) do
      for _, kv in ipairs(span.attributes or {}) do
        if kv.key == "gen_ai.provider.name" then names[#names + 1] = kv.value.stringValue end
      end
    end
    assert.same({ "tiny.example" }, names)
  end)

  it("tells a cassette what to compare and what to keep out", function()
    local path = "/v0/models/tiny-1/talk"
    local recorded = { method = "POST", path = path, body = { lines = { { from = "user", text = "a" } } } }
    assert.equal("exchange 1: lines[1].text differs: recorded 'a' got 'b'", cassette.compare(recorded,
      path, { stream = false, lines = { { from = "user", text = "b" } } }, 1))
    assert.same({ ["content-type"] = "text/event-stream" },
      cassette.strip { ["X-Tiny-Key"] = "k", ["Content-Type"] = "text/event-stream" })
  end)

  it("is refused when it takes a kind that is taken, or lacks what a format needs", function()
    assert.has_error(function()
      provider.register { name = "other", kinds = { tiny = {} }, path = "/x", default_base_url = "http://x",
        build = TINY.build, decoder = TINY.decoder }
    end, "provider.register: kind 'tiny' is registered already")
    assert.has_error(function() provider.register { name = "nothing" } end,
      "provider.register: nothing: build and decoder must be functions")
    assert.has_error(function()
      provider.register { name = "clash", kinds = { clash = {} }, path = "/x", default_base_url = "http://x",
        build = TINY.build, decoder = TINY.decoder, stream_errors = { tiny_busy = "rate_limited" } }
    end, "provider.register: clash: stream error 'tiny_busy' is overloaded already")
    assert.is_nil(provider.kinds.clash)
  end)
end)

describe("the bundled wire formats", function()
  it("register as any other does, each overflow phrase read as an overflow", function()
    local names = {}
    for _, a in ipairs(provider.adapters()) do
      names[#names + 1] = a.name
      for _, phrase in ipairs(a.overflow_phrases or {}) do
        local d = classify.classify(errors.new("http", "HTTP 400", { status = 400, body = "x " .. phrase:upper() }))
        assert.equal("context_overflow", d.class, a.name .. ": " .. phrase)
      end
    end
    assert.same({ "openai", "openrouter", "anthropic", "openai_responses" }, { table.unpack(names, 1, 4) })
  end)
end)
