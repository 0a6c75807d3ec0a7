-- Provider-neutral content parts and the provider knobs (cache, thinking,
-- reasoning, extra_body) as each wire format sends them: the request
-- bodies the mock received.
local luagent = require "luagent"
local mock = require "luagent.mock"
local json = require "luagent.base.json"

local srv
before_each(function()
  luagent.configure { log_sink = function() end }
  luagent.clock.virtual()
  srv = assert(mock.start { script = function() return { text = "ok" } end })
end)
after_each(function()
  srv:close()
  luagent.configure { log_sink = false }
  luagent.clock.real()
end)

local function model(kind)
  return { kind = kind, model = "m", base_url = srv.url .. "/v1", api_key = "k" }
end

-- The body of the one request a call of `opts` on `kind` sent.
local function body_of(kind, opts)
  opts.model = model(kind)
  opts.messages = opts.messages or { { role = "user", content = "hi" } }
  local msg, err = luagent.complete(opts)
  assert(msg, tostring(err))
  local reqs = srv:requests()
  return reqs[#reqs].body
end

local PNG = "iVBORw0KGgo="
local PARTS = { { type = "text", text = "What is this?" },
  { type = "image", url = "https://example.com/cat.png" },
  { type = "image", data = PNG, mime = "image/png" },
  { type = "file", data = "JVBERi0x", mime = "application/pdf", name = "doc.pdf" } }

describe("content parts", function()
  it("are rendered in the OpenAI chat format", function()
    local b = body_of("openai", { messages = { { role = "user", content = PARTS } } })
    assert.same({
      { type = "text", text = "What is this?" },
      { type = "image_url", image_url = { url = "https://example.com/cat.png" } },
      { type = "image_url", image_url = { url = "data:image/png;base64," .. PNG } },
      { type = "file", file = { filename = "doc.pdf", file_data = "data:application/pdf;base64,JVBERi0x" } },
    }, b.messages[1].content)
  end)

  it("are rendered in the OpenRouter format (a file may be a URL)", function()
    local b = body_of("openrouter", { messages = { { role = "user", content = {
      { type = "text", text = "Read" }, { type = "file", url = "https://example.com/a.pdf" } } } } })
    assert.same({ { type = "text", text = "Read" },
      { type = "file", file = { filename = "a.pdf", file_data = "https://example.com/a.pdf" } } }, b.messages[1].content)
  end)

  it("are rendered in the OpenAI responses format", function()
    local b = body_of("openai_responses", { messages = { { role = "user", content = PARTS } } })
    assert.same({
      { type = "input_text", text = "What is this?" },
      { type = "input_image", image_url = "https://example.com/cat.png" },
      { type = "input_image", image_url = "data:image/png;base64," .. PNG },
      { type = "input_file", filename = "doc.pdf", file_data = "data:application/pdf;base64,JVBERi0x" },
    }, b.input[1].content)
  end)

  it("are rendered in the Anthropic format", function()
    local b = body_of("anthropic", { messages = { { role = "user", content = PARTS } } })
    assert.same({
      { type = "text", text = "What is this?" },
      { type = "image", source = { type = "url", url = "https://example.com/cat.png" } },
      { type = "image", source = { type = "base64", media_type = "image/png", data = PNG } },
      { type = "document", title = "doc.pdf", source = { type = "base64", media_type = "application/pdf", data = "JVBERi0x" } },
    }, b.messages[1].content)
  end)

  it("are checked: a part of no known type, an image with neither url nor data, data without mime", function()
    local function try(parts)
      return select(2, pcall(luagent.complete, { model = model("openai"), messages = { { role = "user", content = parts } } }))
    end
    assert.matches("messages%[1%]%.content%[1%]: unknown part type 'img' %(text, image, file%)", try { { type = "img" } })
    assert.matches("messages%[1%]%.content%[1%]: an image needs url or data", try { { type = "image" } })
    assert.matches("messages%[1%]%.content%[1%]: data needs mime", try { { type = "image", data = PNG } })
    assert.equal(0, #srv:requests())
  end)

  it("a file by url raises on Chat Completions, which takes none; a bad prompt part raises at prompt", function()
    local ok, err = pcall(luagent.complete, { model = model("openai"), messages = { { role = "user", content = {
      { type = "file", url = "https://example.com/a.pdf" } } } } })
    assert.is_false(ok)
    assert.matches("openai%.build: messages%[1%]: a file part by url is not sent by Chat Completions", err)
    local a = luagent.agent { model = model("openai") }
    assert.has_error(function() a:prompt { { type = "image", url = "u", data = "d" } } end,
      "agent:prompt: content[1]: an image needs url or data (one of them)")
    assert.equal(0, #srv:requests())
  end)

  it("reach the model from agent:prompt with a list of parts", function()
    local a = luagent.agent { model = model("anthropic") }
    local last = a:run { { type = "text", text = "see" }, { type = "image", url = "https://example.com/x.png" } }
    assert.equal("stop", last.stop_reason)
    assert.same({ type = "image", source = { type = "url", url = "https://example.com/x.png" } },
      srv:requests()[1].body.messages[1].content[2])
  end)

  it("are copied into the history: the caller changing its table later changes nothing", function()
    local a = luagent.agent { model = model("anthropic") }
    local list = { { type = "text", text = "see" } }
    assert.equal("stop", a:run(list).stop_reason)
    list[1].text = "changed"
    list[2] = { type = "text", text = "added" }
    assert.same({ { type = "text", text = "see" } }, a.messages[1].content)
    assert.is_false(rawequal(list, a.messages[1].content))
    a:run("again")
    assert.same({ { type = "text", text = "see" } }, srv:requests()[2].body.messages[1].content)
  end)
end)

describe("cache = true (Anthropic)", function()
  it("puts cache_control on the system prompt, the tool list and the last user turn", function()
    local b = body_of("anthropic", { cache = true, system = "be brief",
      tools = { { name = "t1", description = "one" }, { name = "t2", description = "two" } },
      messages = { { role = "user", content = "first" }, { role = "assistant", content = "ok" },
                   { role = "user", content = "second" } } })
    local eph = { type = "ephemeral" }
    assert.same({ { type = "text", text = "be brief", cache_control = eph } }, b.system)
    assert.is_nil(b.tools[1].cache_control)
    assert.same(eph, b.tools[2].cache_control)
    assert.equal("first", b.messages[1].content) -- only the last user turn
    assert.same({ { type = "text", text = "second", cache_control = eph } }, b.messages[3].content)
  end)

  it("marks the last block of a user turn of tool results, and takes a ttl", function()
    local b = body_of("anthropic", { cache = { ttl = "1h" }, messages = {
      { role = "user", content = "go" },
      { role = "assistant", content = "", tool_calls = { { id = "c1", name = "t", arguments = {} } } },
      { role = "tool", tool_call_id = "c1", name = "t", content = "done" } } })
    local last = b.messages[3].content
    assert.equal("tool_result", last[1].type)
    assert.same({ type = "ephemeral", ttl = "1h" }, last[#last].cache_control)
    assert.is_nil(b.system)
  end)

  it("is left out of the other formats' bodies", function()
    for _, kind in ipairs { "openai", "openai_responses", "openrouter" } do
      local text = json.encode(body_of(kind, { cache = true, system = "s" }))
      assert.not_matches("cache_control", text, kind)
    end
  end)

  it("comes from the agent's options", function()
    local a = luagent.agent { model = model("anthropic"), system = "sys", cache = true }
    a:run("hello")
    assert.same({ type = "ephemeral" }, srv:requests()[1].body.system[1].cache_control)
  end)
end)

describe("thinking and reasoning", function()
  it("Anthropic: thinking = {budget_tokens = N} with max_tokens above it", function()
    local b = body_of("anthropic", { thinking = { budget_tokens = 2048 } })
    assert.same({ type = "enabled", budget_tokens = 2048 }, b.thinking)
    assert.is_true(b.max_tokens > 2048)
    b = body_of("anthropic", { thinking = { budget_tokens = 2048 }, max_tokens = 8000 })
    assert.equal(8000, b.max_tokens)
    b = body_of("anthropic", { thinking = { type = "adaptive" } })
    assert.same({ type = "adaptive" }, b.thinking)
  end)

  it("a budget not below max_tokens is refused before any request", function()
    assert.has_error(function()
      luagent.complete { model = model("anthropic"), messages = { { role = "user", content = "x" } },
        thinking = { budget_tokens = 4096 }, max_tokens = 1000 }
    end, "complete: thinking.budget_tokens (4096) must be less than max_tokens (1000)")
    assert.has_error(function() luagent.agent { model = model("openai"), reasoning = "high" } end,
      "agent: reasoning must be a table {effort = \"low\" | \"medium\" | \"high\" | ...}")
  end)

  it("OpenAI chat: reasoning_effort; responses: reasoning.effort; OpenRouter: reasoning", function()
    assert.equal("low", body_of("openai", { reasoning = { effort = "low" } }).reasoning_effort)
    assert.same({ effort = "high", summary = "auto" },
      body_of("openai_responses", { reasoning = { effort = "high", summary = "auto" } }).reasoning)
    assert.same({ effort = "medium" }, body_of("openrouter", { reasoning = { effort = "medium" } }).reasoning)
    assert.same({ max_tokens = 3000 }, body_of("openrouter", { thinking = { budget_tokens = 3000 } }).reasoning)
    assert.is_nil(body_of("anthropic", { reasoning = { effort = "low" } }).reasoning_effort)
    assert.is_nil(body_of("openai", { thinking = { budget_tokens = 3000 } }).thinking)
  end)

  it("come from the agent's options", function()
    local a = luagent.agent { model = model("openai"), reasoning = { effort = "minimal" } }
    a:run("hi")
    assert.equal("minimal", srv:requests()[1].body.reasoning_effort)
  end)
end)

describe("extra_body", function()
  for _, kind in ipairs { "openai", "anthropic", "openai_responses", "openrouter" } do
    it("is merged deep into the " .. kind .. " body, over what luagent built", function()
      local b = body_of(kind, { temperature = 0.5, extra_body = {
        top_k = 5, metadata = { user_id = "u1" }, temperature = json.null,
        stream_options = kind ~= "anthropic" and kind ~= "openai_responses" and { extra = true } or nil } })
      assert.equal(5, b.top_k)
      assert.same({ user_id = "u1" }, b.metadata)
      assert.is_nil(b.temperature) -- removed
      assert.is_true(b.stream)
      if b.stream_options then
        assert.same({ include_usage = true, extra = true }, b.stream_options) -- deep: both kept
      end
    end)
  end

  it("replaces lists and comes from the agent, which it does not change", function()
    local extra = { provider = { order = { "a", "b" } } }
    local a = luagent.agent { model = model("openrouter"), extra_body = extra }
    a:run("hi")
    assert.same({ order = { "a", "b" } }, srv:requests()[1].body.provider)
    assert.same({ provider = { order = { "a", "b" } } }, extra)
  end)
end)
