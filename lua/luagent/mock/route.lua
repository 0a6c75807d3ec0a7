-- Routing: one parsed request -> the plan that answers it. Model requests
-- are answered in their wire format (a script's content, the canned reply
-- or a cassette's recorded exchange) with the faults that pick them; the
-- request log has an endpoint of its own. Pure: no sockets, no clock but
-- state.now.
local faults = require "luagent.mock.faults"
local replies = require "luagent.mock.replies"
local cassette = require "luagent.base.cassette"
local plan = require "luagent.mock.plan"
local mstate = require "luagent.mock.state"
local generations = require "luagent.mock.generations"
local registry = require "luagent.model.provider"

local M = {}

local respond, json = plan.respond, plan.json

-- The base URL of each registered provider kind (lua/luagent/model/provider.lua)
-- on the server at `url`: its base URL's path under the server's, where
-- its endpoints are (see replies.wire_at).
function M.base_urls(url)
  local out = {}
  for kind, k in pairs(registry.kinds) do out[kind] = url .. replies.base_path(k.base_url) end
  return out
end

-- The reply for a recorded exchange, as a replies response: status, the
-- recorded headers minus hop-by-hop and secret ones, and the events (each
-- with its t) or body.
local function recorded_response(x)
  local headers, names = {}, {}
  for k in pairs(x.headers or {}) do names[#names + 1] = k end
  table.sort(names)
  local has_type = false
  for _, k in ipairs(names) do
    if not cassette.hop_headers[k:lower()] and not cassette.secret_headers[k:lower()] then
      headers[#headers + 1] = { k, x.headers[k] }
      has_type = has_type or k:lower() == "content-type"
    end
  end
  if not has_type then
    headers[#headers + 1] = { "Content-Type", x.events and replies.sse_type or replies.json_type }
  end
  if x.events then
    local events = {}
    for i, e in ipairs(x.events) do events[i] = { event = e.event, data = e.data, t = e.t } end
    return { status = x.status, headers = headers, events = events, recorded = true }
  end
  return { status = x.status, headers = headers, body = x.body or "" }
end


-- Faults that reshape the reply's events or body.
local reshaping = { cut = true, ["bad-json"] = true, ["stream-error"] = true }

-- The plan for a model request in `format`.
local function model(state, req, format, body)
  state.count = state.count + 1
  local n = state.count
  local ctx = { n = n, created = state.now(), now = state.now() }
  if type(body) ~= "table" then
    return respond(state, req, { status = 400, headers = { { "Content-Type", replies.json_type } },
      body = replies.error_body(format, 400, { message = "the request body is not a JSON object" }) })
  end
  local view = replies.view(format, body, req.body, req.path)
  local fault = faults.pick(state.faults, n, state.rng)
  local recorded
  if state.player then
    local message
    recorded, message = state.player:match(req.path, body)
    if not recorded then
      state.divergences[#state.divergences + 1] = message
      if state.on_divergence then state.on_divergence(message) end
      -- 422: a permanent client error, so no retry policy resends it
      return respond(state, req, { status = 422, headers = {
        { "Content-Type", replies.json_type }, { "x-should-retry", "false" } },
        body = replies.error_body(format, 422, { type = "cassette_divergence", message = message }) })
    end
  end
  local kind = fault and fault.kind
  if kind == "status" then return respond(state, req, replies.status_error(format, fault, ctx)) end
  if kind == "close" then return { { close = true } } end
  local resp
  if recorded and kind ~= "empty" and kind ~= "leak" then
    resp = recorded_response(recorded)
    if not fault then state.player:advance() end
  else
    -- a script (specs, examples) decides what the model says: a content
    -- {text=, tools={{id=, name=, arguments=}...}, output=<a value, sent as
    -- JSON text>, stop="length" (cut at the token limit: Chat Completions and
    -- Anthropic)}, or nil for the canned one
    local content = state.script and kind ~= "empty" and kind ~= "leak" and state.script(view, n, body)
    content = content or replies.content(view, fault, n)
    resp = replies.reply(format, view, content, ctx)
    -- a generation the provider bills, cut or not: its cost can be looked up
    local generation_id = replies.wire(format).mock.generation_id
    if generation_id and resp.events then generations.record(state, generation_id(ctx), ctx, view, content) end
  end
  if reshaping[kind] then replies.apply(format, resp, fault, view, ctx) end
  return respond(state, req, resp, fault)
end

-- The request log as JSON.
local function log_json(state)
  local O = replies.object
  local out = replies.array()
  for _, r in ipairs(state.log) do
    out[#out + 1] = O("n", r.n, "method", r.method, "path", r.path,
      "headers", r.headers, "body", r.body)
  end
  return replies.encode(out)
end

-- Answers one parsed request: logs it (except the log endpoint itself) and
-- returns the plan. Model requests are numbered from 1 for fault scopes.
function M.handle(state, req)
  if req.method == "GET" and req.path == "/__luagent/requests" then
    return json(req, 200, log_json(state))
  end
  if req.method == "GET" and req.path == "/api/v1/generation" then
    mstate.remember(state, { method = req.method, path = req.path, headers = mstate.mask(req.headers),
      body = req.body }, #req.body)
    return json(req, generations.answer(state, req))
  end
  local format = replies.format_at(req.path)
  local body = req.body ~= "" and replies.decode(req.body) or nil
  local entry = { method = req.method, path = req.path, headers = mstate.mask(req.headers),
    body = body == nil and req.body or body }
  mstate.remember(state, entry, #req.body)
  if not format then
    return json(req, 404, replies.encode(replies.object("error", replies.object(
      "message", "no route for " .. req.method .. " " .. req.path, "type", "not_found_error"))))
  end
  if req.method ~= "POST" then
    return json(req, 405, replies.encode(replies.object("error", replies.object(
      "message", req.path .. " takes POST", "type", "invalid_request_error"))),
      { { "Allow", "POST" } })
  end
  entry.n = state.count + 1
  return model(state, req, format, body)
end


return M
