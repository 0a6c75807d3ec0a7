-- OpenRouter: the OpenAI chat format (lua/luagent/model/providers/openai.lua
-- builds its requests and decodes its streams, so its events name "openai")
-- at its own address, with its own key, error shapes and in-flight budget.
-- A dialect of a format is a file like this one. Pure Lua, no I/O.
local common = require "luagent.model.providers.common"
local openai = require "luagent.model.providers.openai"

local M = {
  name = "openrouter",
  kinds = { openrouter = { key_env = "OPENROUTER_API_KEY", base_env = "OPENROUTER_BASE_URL" } },
  default_base_url = "https://openrouter.ai/api/v1",
  -- a base URL with or without /v1 (provider.base_url): https://openrouter.ai/api/v1
  -- as the OpenAI SDK takes it, or https://openrouter.ai/api as the Anthropic SDK does
  version_path = "/v1", base_form = "root",
  path = openai.path,
  -- its own reasoning object and files by URL (openai.build_dialect)
  build = function(req, opts) return openai.build_dialect("openrouter", req, opts) end,
  decoder = openai.decoder,
  stream_errors = openai.stream_errors,
  -- it relays its upstreams' words too
  overflow_phrases = {
    "maximum context length",
    "input is too long",                    -- AWS Bedrock
    "exceeds the maximum number of tokens", -- Gemini
  },
  -- a 402 that says so refuses for the requests in flight only: retried
  in_flight_sources = { "openrouter_in_flight_budget" },
  secret_headers = openai.secret_headers,
  replay_fields = openai.replay_fields,
}

------------------------------------------------------------------------------
-- The mock's side (lua/luagent/mock/replies.lua says what each field is):
-- OpenAI's replies, OpenRouter's errors
------------------------------------------------------------------------------

local O, array = common.object, common.array

local mock = {
  title = "OpenRouter",
  read = openai.mock.read, stream = openai.mock.stream, complete = openai.mock.complete,
  phase = openai.mock.phase,
  -- its generations can be looked up by id (lua/luagent/mock/generations.lua)
  generation_id = openai.mock.message_id,
  -- 402 is OpenRouter's (OpenAI and Anthropic refuse credit otherwise): it
  -- takes this shape on every endpoint
  own_statuses = { [402] = true },
}
M.mock = mock

local IN_FLIGHT = "This request would exceed your available credits given your current in-flight"
  .. " requests. Retry after in-flight requests settle, or add credits."

function mock.error_body(status, e)
  local metadata, message = nil, e.message
  if e.in_flight then
    if not e.message_given then message = IN_FLIGHT end
    metadata = O("reason", "in_flight_budget_exhausted",
      "limit_source", "openrouter_in_flight_budget",
      "remedy_hint", "Retry after your in-flight requests settle (see the Retry-After header).")
  end
  return common.encode(O("error", O("code", status, "message", message, "metadata", metadata),
    "user_id", "user_mock"))
end

mock.overflow_message = "This endpoint's maximum context length is 200000 tokens. However, you "
  .. "requested about 210000 tokens. Please reduce the length of the messages."

-- A chunk whose error ends the stream, as OpenRouter sends one.
function mock.stream_error(etype, message, view, ctx)
  return common.event(nil, O("id", openai.mock.message_id(ctx), "object", "chat.completion.chunk",
    "created", ctx.created, "model", view.model, "provider", "Mock",
    "error", O("code", etype, "message", message),
    "choices", array { O("index", 0, "delta", O("content", ""), "finish_reason", "error") }))
end

return M
