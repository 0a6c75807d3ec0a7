-- Providers: one model endpoint with its adapter, key and base URL. One call
-- is one attempt: provider:stream(request) sends it and returns an iterator of
-- normalized events (lua/luagent/EVENTS.md), or nil and an error record.
-- Retries belong to the layer above.
local core = require "luagent.core"
local http = require "luagent.base.http"
local errors = require "luagent.base.errors"
local secrets = require "luagent.base.secrets"
local json = require "luagent.base.json"
local config = require "luagent.config"

local M = {}

-- Known kinds: which adapter, where the key and base URL come from.
M.kinds = {
  openai = { adapter = "openai", key_env = "OPENAI_API_KEY", base_env = "OPENAI_BASE_URL" },
  anthropic = { adapter = "anthropic", key_env = "ANTHROPIC_API_KEY", base_env = "ANTHROPIC_BASE_URL" },
  openai_responses = { adapter = "openai_responses", key_env = "OPENAI_API_KEY", base_env = "OPENAI_BASE_URL" },
  openrouter = { adapter = "openai", key_env = "OPENROUTER_API_KEY", base_env = "OPENROUTER_BASE_URL",
                 base_url = "https://openrouter.ai/api/v1" },
}

-- Two settings (lua/luagent/config.lua) reach providers: `providers`, set by
-- `luagent run` when the embedded mock provider stands in for every provider
-- ({base_urls=<kind -> base URL, as the mock gives them>, api_key=
-- <placeholder>}), and `record`, the recorder of `--record FILE`
-- (lua/luagent/observe/record.lua), a tap on every request.

-- Default per-attempt timeouts (seconds); the retry policy may override them.
M.default_timeout = { connect = 10, first_byte = 120, idle = 60 }

local Provider = {}
Provider.__index = Provider
Provider.__name = "luagent.Provider"

-- Keys live here, keyed by provider, never as a field: printing, logging or
-- encoding a provider cannot reveal its key.
local keys = setmetatable({}, { __mode = "k" })

function Provider:__tostring()
  return string.format("provider %s/%s at %s", self.kind, self.model, self.base_url)
end

-- new("kind/model") or new{kind=, model=, base_url=, api_key=, headers=,
-- timeout=, http_version=} -> provider (http_version as luagent.http takes
-- it: "2", "1.1", "2-prior-knowledge"). An unknown kind or a missing model raises.
function M.new(spec)
  if type(spec) == "string" then
    local kind, model = spec:match("^([%w_]+)/(.+)$")
    if not kind then error("provider: expected 'kind/model', got '" .. spec .. "'", 2) end
    spec = { kind = kind, model = model }
  end
  if type(spec) ~= "table" then error("provider: expects a string or a table", 2) end
  local info = M.kinds[spec.kind]
  if not info then error("provider: unknown kind '" .. tostring(spec.kind) .. "'", 2) end
  if type(spec.model) ~= "string" or spec.model == "" then error("provider: model is required", 2) end
  local adapter = require("luagent.model.providers." .. info.adapter)
  local base_url = spec.base_url or os.getenv(info.base_env) or info.base_url or adapter.default_base_url
  local key = spec.api_key or os.getenv(info.key_env)
  local embedded = config.get("providers")
  if embedded and not spec.base_url then
    base_url = embedded.base_urls[spec.kind]
    key = embedded.api_key -- a placeholder, not a secret
  else
    secrets.register(key) -- every output is scrubbed of it from now on
  end
  local p = setmetatable({
    kind = spec.kind,
    model = spec.model,
    adapter = adapter,
    base_url = base_url,
    headers = spec.headers,
    timeout = spec.timeout,
    http_version = spec.http_version,
  }, Provider)
  keys[p] = key
  return p
end

-- provider:has_key() -> whether a key is configured.
function Provider:has_key()
  local k = keys[self]
  return k ~= nil and k ~= ""
end

-- Merges per-call timeouts over the provider's and the defaults.
local function timeouts(self, call)
  local t = {}
  for k, v in pairs(M.default_timeout) do t[k] = v end
  for _, src in ipairs({ self.timeout or {}, call or {} }) do
    for k, v in pairs(src) do t[k] = v end
  end
  return t
end

-- An error record when a streaming answer's headers say its body cannot
-- be read: a redirect (never followed) or a compressed body (none is asked
-- for). nil when the body may be read.
local function unexpected(resp)
  local status, h = resp.status, resp.headers
  if status >= 300 and status < 400 then
    return errors.new("http", string.format("HTTP %d redirect to %s: redirects are not followed"
      .. " (check the base URL)", status, h.location and ("'" .. h.location .. "'") or "nowhere"),
      { status = status, headers = h, body = "" })
  end
  local enc = h["content-encoding"]
  if enc and enc:lower() ~= "identity" then
    return errors.new("protocol", string.format("HTTP %d: the body is '%s'-encoded; an event"
      .. " stream is expected as plain text (no Accept-Encoding was sent)", status, enc),
      { status = status, headers = h, content_encoding = enc })
  end
end

-- Events of a body whose Content-Type does not say text/event-stream (a
-- JSON error, an HTML page, or a stream a server mislabels, which is still
-- read): parsed here, keeping the body's first bytes so that a body without
-- any event can be shown. Returns the iterator and a function returning
-- the kept text.
local function sniffed_events(resp)
  local parser = core.sse_parser()
  local limit = http.ERROR_BODY_MAX + secrets.margin
  local pending, pos, kept, size = {}, 1, {}, 0
  local function events()
    while true do
      local ev = pending[pos]
      if ev then
        pending[pos], pos = nil, pos + 1
        return ev
      end
      local chunk = resp:read()
      if not chunk then return nil end
      if size < limit then
        kept[#kept + 1] = chunk:sub(1, limit - size)
        size = size + #kept[#kept]
      end
      local evs, err = parser:feed(chunk)
      if not evs then error(err, 0) end
      pending, pos = evs, 1
    end
  end
  return events, function()
    local text = table.concat(kept)
    return secrets.cut(text, http.ERROR_BODY_MAX, #text >= limit)
  end
end

-- Text fields of delta events, per stream of deltas.
local DELTA_FIELD = { text_delta = "text", thinking_delta = "text", tool_call_delta = "arguments" }

-- A filter over one answer's events that scrubs every key from them
-- (lua/luagent/base/secrets.lua). A delta ending with what may be the start of
-- a key keeps that end back until the next delta of its stream shows
-- whether a key goes on there; what is held is released before the next
-- event that is not a delta, so the deltas still add up to the text. The
-- list is filtered in place unless held events must be put back into it.
local function scrubbed_events()
  local held, order = {}, {} -- stream id -> {ev=<template>, text=}; ids in order
  local delta, scrub = secrets.delta, secrets.scrub
  -- appends the held events to out after its first j; returns the new count
  local function flush(out, j)
    for _, id in ipairs(order) do
      local h = held[id]
      held[id] = nil
      h.ev[DELTA_FIELD[h.ev.type]] = h.text
      j = j + 1
      out[j] = h.ev
    end
    order = {}
    return j
  end
  return function(list)
    if order[1] == nil then
      -- the commonest list: one text delta, nothing held back
      local ev = list[1]
      if ev and list[2] == nil and ev.type == "text_delta" then
        local text, tail = delta(nil, ev.text)
        if not tail then
          ev.text = text -- "***" at least: a text delta's text is never ""
          return list
        end
      end
      -- no key registered and nothing held back: nothing to scrub
      if secrets.margin == 0 then return list end
    end
    local out, j, n = list, 0, #list
    for i = 1, n do
      local ev = list[i]
      local field = DELTA_FIELD[ev.type]
      if not field then
        if order[1] ~= nil then
          if out == list then out = table.move(list, 1, j, 1, {}) end
          j = flush(out, j)
        end
        j = j + 1
        out[j] = scrub(ev)
      else
        local index = ev.index
        local id = index and ev.type .. index or ev.type
        local h = held[id]
        local text, tail = delta(h and h.text, ev[field])
        if tail then
          if not h then order[#order + 1] = id end
          local copy = {}
          for k, v in pairs(ev) do copy[k] = v end
          held[id] = { ev = copy, text = tail }
        elseif h then
          held[id] = nil
          for k, o in ipairs(order) do if o == id then table.remove(order, k) break end end
        end
        if text ~= "" then
          ev[field] = text
          j = j + 1
          -- a text or thinking delta has no other field from the server
          out[j] = field == "arguments" and scrub(ev) or ev
        end
      end
    end
    if out == list then
      for k = j + 1, n do list[k] = nil end
    end
    return out
  end
end

-- provider:stream(request [, opts]) -> iterator, nil, nil, response | nil, err.
-- request: {system=, messages=, tools=, max_tokens=, temperature=} (model is
-- the provider's unless given). opts.timeout overrides timeouts;
-- opts.max_bytes caps the bytes of the answer's event data (past it the
-- attempt fails with kind `too_large`); opts.headers are added to the
-- request's (lowercase names: the retry loop's `traceparent`). The iterator raises an error record
-- when the stream fails after it began. The response is the generic for's
-- closing value: leaving the loop early aborts the transfer at once. Keys
-- are scrubbed from every event and error (lua/luagent/base/secrets.lua).
function Provider:stream(request, opts)
  local key = keys[self]
  local req = {}
  for k, v in pairs(request) do req[k] = v end
  req.model = req.model or self.model
  local ok, built = pcall(self.adapter.build, req, { base_url = self.base_url, api_key = key, headers = self.headers })
  if not ok then error(secrets.text(tostring(built)), 2) end
  for name, value in pairs(opts and opts.headers or {}) do built.headers[name] = value end -- traceparent
  local resp, err = http.request {
    method = built.method, url = built.url, headers = built.headers, body = built.body,
    timeout = timeouts(self, opts and opts.timeout), http_version = self.http_version,
    tap = config.get("record"),
  }
  if resp then
    err = unexpected(resp)
    if err then
      resp:close()
      resp = nil
    end
  end
  if not resp then
    return nil, secrets.scrub(err)
  end
  local dec = self.adapter.decoder { model = req.model }
  local content_type = resp.headers["content-type"]
  -- events: nil for an event stream (resp:next_event() reads it), else
  -- the sniffed body's iterator (it raises)
  local events, kept
  if not (content_type or ""):lower():find("text/event-stream", 1, true) then
    events, kept = sniffed_events(resp)
  end
  -- events made, emptied as they are handed out (then filled again), and
  -- the next one to hand out
  local batch, pos, finished = {}, 1, false
  local max_bytes = opts and opts.max_bytes
  local bytes, nevents = 0, 0
  local scrub = scrubbed_events()
  local next_event, feed = resp.next_event, dec.feed -- looked up once, called per event
  local scratch = {} -- each SSE event is decoded before the next is read: one table serves

  local function fail(e)
    resp:close()
    finished = true
    batch = {} -- what the failing feed made is dropped
    error(secrets.scrub(e), 0)
  end

  -- The body ended without any event: say what it held instead.
  local function not_a_stream(e)
    local n = resp:info().bytes
    if nevents > 0 or n == 0 or e.kind ~= "truncated" then return e end
    local fields = { status = resp.status, headers = resp.headers, bytes = n,
      content_type = content_type, provider = e.provider }
    if not kept then
      return errors.new("protocol", string.format("HTTP %d: the body (%d bytes) held no"
        .. " server-sent event", resp.status, n), fields)
    end
    fields.body = kept()
    local said = json.decode(fields.body)
    said = type(said) == "table" and type(said.error) == "table" and said.error.message
    return errors.new("protocol", string.format("HTTP %d: expected an event stream"
      .. " (text/event-stream), got %s of %d bytes without any event%s", resp.status,
      content_type and "a '" .. content_type .. "' body" or "a body without Content-Type", n,
      type(said) == "string" and ": " .. said or ""), fields)
  end

  return function()
    local ev = batch[pos]
    if ev then
      batch[pos], pos = nil, pos + 1
      return ev
    end
    while not finished do
      local sse, serr
      if events then
        local got
        got, sse = pcall(events)
        if not got then sse, serr = nil, sse end
      else
        sse, serr = next_event(resp, scratch)
      end
      if serr then fail(serr) end
      local out, derr
      if sse then
        nevents = nevents + 1
        bytes = bytes + #sse.data
        if max_bytes and bytes > max_bytes then
          fail(errors.new("too_large", string.format("the answer passed max_answer_bytes = %d"
            .. " (event data, at byte offset %d of the body)", max_bytes, sse.offset or 0),
            { limit = max_bytes, bytes = bytes, offset = sse.offset, delivered = dec.delivered }))
        end
        out, derr = feed(dec, sse, batch) -- batch is empty here
      else
        out, derr = dec:finish()
        if not out then derr = not_a_stream(derr) end
        finished = true
        resp:close()
      end
      if not out then fail(derr) end
      out = scrub(out)
      ev = out[1]
      if ev then
        -- the answer is complete at its message_end: release the transfer
        -- now (a caller may stop pulling here; a recording ends with it)
        local last = out[#out]
        if last.type == "message_end" and not finished then
          finished = true
          resp:close()
        end
        batch, pos = out, 2
        out[1] = nil
        return ev
      end
    end
    return nil
  end, nil, nil, resp
end

M.Provider = Provider
return M
