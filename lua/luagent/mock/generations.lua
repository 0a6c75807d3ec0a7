-- OpenRouter's generation lookup on the mock: the generations this server
-- streamed in a format that has them (its adapter's mock.generation_id:
-- OpenRouter's), and the answer to GET
-- /api/v1/generation?id=ID: 404 until `generation_delay` seconds (on the
-- loop's clock) after the generation, as OpenRouter answers for minutes,
-- then its cost. The cost is the mock's own figure: $1 per million prompt
-- tokens and $2 per million completion tokens. Pure: no sockets; the clock
-- is state.clock.
local replies = require "luagent.mock.replies"

local M = {}

-- Remembers the generation `id` of request `ctx.n` (its view and content),
-- the latest state.log_max of them.
function M.record(state, id, ctx, view, content)
  local prompt, completion = view.input_tokens, replies.output_tokens(content)
  state.generations[id] = { at = state.clock(), created = ctx.created, model = view.model, prompt = prompt,
    completion = completion, cost = (prompt * 1 + completion * 2) / 1e6 }
  local order = state.generation_order
  order[#order + 1] = id
  if #order > state.log_max then
    state.generations[table.remove(order, 1)] = nil
  end
end

-- The id a lookup's query asks for (percent-decoded), or nil.
local function asked_id(query)
  local id = ("&" .. (query or "")):match("&id=([^&]*)")
  return id and (id:gsub("%%(%x%x)", function(h) return string.char(tonumber(h, 16)) end))
end

-- answer(state, req) -> status, JSON body.
function M.answer(state, req)
  local id = asked_id(req.query)
  local g = id and state.generations[id]
  if not g or state.clock() < g.at + state.generation_delay then
    return 404, replies.encode(replies.object("error", replies.object("message",
      "Generation " .. tostring(id) .. " not found", "code", 404)))
  end
  return 200, replies.encode(replies.object("data", replies.object("id", id, "model", g.model,
    "created_at", g.created, "total_cost", g.cost, "tokens_prompt", g.prompt, "tokens_completion", g.completion,
    "native_tokens_prompt", g.prompt, "native_tokens_completion", g.completion)))
end

return M
