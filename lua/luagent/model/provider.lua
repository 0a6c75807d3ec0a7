-- Providers: one model endpoint with its adapter, key and base URL. One call
-- is one attempt: provider:stream(request) sends it and returns an iterator of
-- normalized events (lua/luagent/EVENTS.md), or nil and an error record.
-- Retries belong to the layer above.
local core = require "luagent.core"
local http = require "luagent.base.http"
local errors = require "luagent.base.errors"
local secrets = require "luagent.base.secrets"
local json = require "luagent.base.json"
local cassette = require "luagent.base.cassette"
local options = require "luagent.base.options"

local M = {}

------------------------------------------------------------------------------
-- The wire formats: a registry of adapters
------------------------------------------------------------------------------

-- An adapter (lua/luagent/model/providers/*.lua) says all there is to know
-- about its wire format in its own table, so that adding one is one file:
--
--   name              its name in the registry (its decoder names the
--                     events' `provider`, EVENTS.md)
--   kinds             {[kind] = {key_env=, base_env=, base_url=, otel_name=}}:
--                     the provider kinds it serves ("kind/model"), the
--                     environment variables of their key and base URL, a
--                     base URL other than default_base_url, and the
--                     kind's OpenTelemetry gen_ai.provider.name (default:
--                     the kind), which calls carry as `provider_name`
--   default_base_url  where it posts when nothing else says
--   path              what it posts to, under the base URL ("/messages";
--                     a {name} segment stands for any one segment)
--   version_path      the API's version segment ("/v1"), which a base URL
--                     may leave out (M.base_url), as base_form says
--   base_form         "root": a base URL is the API's root, as Anthropic's
--                     SDK takes ANTHROPIC_BASE_URL (https://api.anthropic.com):
--                     version_path is added unless the URL ends in it, so
--                     https://api.anthropic.com/v1 works too; "versioned"
--                     (the default): a base URL includes the version, as
--                     OpenAI's SDK takes OPENAI_BASE_URL, and is used as it
--                     is, but a bare host gets version_path
--                     (http://localhost:11434 -> http://localhost:11434/v1)
--   build(req, opts)  the HTTP request; decoder(ctx) the stream's decoder
--   stream_errors     {[type or code] = "rate_limited" | "overloaded"}: its
--                     in-stream errors that are worth another attempt
--                     (lua/luagent/model/classify.lua, rule 4)
--   overflow_phrases  words of its context-overflow errors (rules 3 and 4)
--   in_flight_sources the limit_source of a 402 that refuses only for the
--                     requests in flight (rule 3: retried)
--   secret_headers    headers of its requests or answers never written to a
--                     cassette (lua/luagent/base/cassette.lua)
--   replay_fields     the body fields a cassette replay compares after `model`
--   mock              how the mock provider speaks it (the table is read by
--                     lua/luagent/mock/replies.lua, which says its fields)
--
-- Only name, kinds, path, build and decoder are required. build(req, opts)
-- gets the base URL as M.base_url made it (opts.base_url).

-- Known kinds: kind -> {adapter=<the adapter table>, key_env=, base_env=,
-- base_url=, otel_name=}.
M.kinds = {}

-- What every registered format adds to the classifier's own lists
-- (lua/luagent/model/classify.lua reads them): overflow phrases
-- (lowercased, each once, in order), in-stream error values (lowercased)
-- -> class, and 402 limit sources -> true.
M.wire = { overflow_phrases = {}, stream_errors = {}, in_flight_sources = {} }

local adapters, by_name = {}, {}

-- The classes an in-stream error value may name (rule 4 retries both).
local STREAM_CLASSES = { rate_limited = true, overloaded = true }

-- Raises for the caller of register (helpers of register only).
local function misuse(name, what)
  error("provider.register: " .. (name and name .. ": " or "") .. what, 4)
end

-- The list `field` of an adapter: strings (none when absent).
local function checked_list(adapter, field)
  local list = adapter[field]
  if list == nil then return {} end
  local ok = type(list) == "table"
  for _, v in ipairs(ok and list or {}) do ok = ok and type(v) == "string" and v ~= "" end
  if not ok then misuse(adapter.name, field .. " must be a list of strings") end
  return list
end

-- The kinds an adapter serves, as M.kinds holds them.
local function checked_kinds(adapter)
  local name = adapter.name
  if type(adapter.kinds) ~= "table" or next(adapter.kinds) == nil then
    misuse(name, "kinds must name at least one kind")
  end
  local kinds = {}
  for kind, k in pairs(adapter.kinds) do
    if type(kind) ~= "string" or not kind:match("^[%w_]+$") then
      misuse(name, "a kind is a name of letters, digits and '_'")
    end
    if M.kinds[kind] then misuse(nil, "kind '" .. kind .. "' is registered already") end
    if type(k) ~= "table" then misuse(name, "kinds." .. kind .. " must be a table") end
    for _, f in ipairs({ "key_env", "base_env", "base_url", "otel_name" }) do
      if k[f] ~= nil and type(k[f]) ~= "string" then misuse(name, "kinds." .. kind .. "." .. f .. " must be a string") end
    end
    local base_url = k.base_url or adapter.default_base_url
    if not base_url then misuse(name, "kind '" .. kind .. "' has no base URL") end
    kinds[kind] = { adapter = adapter, key_env = k.key_env, base_env = k.base_env, base_url = base_url,
      otel_name = k.otel_name or kind }
  end
  return kinds
end

-- An adapter's in-stream error values, lowercased -> class.
local function checked_stream_errors(adapter)
  local t = adapter.stream_errors
  if t ~= nil and type(t) ~= "table" then misuse(adapter.name, "stream_errors must be a table") end
  local out = {}
  for v, class in pairs(t or {}) do
    if type(v) ~= "string" or not STREAM_CLASSES[class] then
      misuse(adapter.name, "stream_errors maps a type or code to rate_limited or overloaded")
    end
    local known = M.wire.stream_errors[v:lower()]
    if known and known ~= class then
      misuse(adapter.name, "stream error '" .. v .. "' is " .. known .. " already")
    end
    out[v:lower()] = class
  end
  return out
end

-- register(adapter) adds a wire format: its kinds can be asked for
-- ("kind/model"), and the classifier, the cassette and the mock know it.
-- Misuse raises, and adds nothing: a field of the wrong type, a name or
-- kind already taken, an in-stream value another format classes otherwise.
function M.register(adapter)
  if type(adapter) ~= "table" then error("provider.register: expects an adapter table", 2) end
  local name = adapter.name
  if type(name) ~= "string" or name == "" then error("provider.register: name must be a non-empty string", 2) end
  if by_name[name] then error("provider.register: an adapter named '" .. name .. "' is registered already", 2) end
  if type(adapter.build) ~= "function" or type(adapter.decoder) ~= "function" then
    error("provider.register: " .. name .. ": build and decoder must be functions", 2)
  end
  if type(adapter.path) ~= "string" or adapter.path:sub(1, 1) ~= "/" then
    error("provider.register: " .. name .. ": path must be a string starting with '/'", 2)
  end
  if adapter.default_base_url ~= nil and type(adapter.default_base_url) ~= "string" then
    error("provider.register: " .. name .. ": default_base_url must be a string", 2)
  end
  if adapter.mock ~= nil and type(adapter.mock) ~= "table" then
    error("provider.register: " .. name .. ": mock must be a table", 2)
  end
  local vp = adapter.version_path
  if vp ~= nil and (type(vp) ~= "string" or not vp:match("^/[^/?#]+$")) then
    error("provider.register: " .. name .. ": version_path must be one path segment, as '/v1'", 2)
  end
  if adapter.base_form ~= nil and adapter.base_form ~= "root" and adapter.base_form ~= "versioned" then
    error("provider.register: " .. name .. ": base_form must be 'root' or 'versioned'", 2)
  end
  local kinds, stream_errors = checked_kinds(adapter), checked_stream_errors(adapter)
  local phrases, sources = checked_list(adapter, "overflow_phrases"), checked_list(adapter, "in_flight_sources")
  local secret, replay = checked_list(adapter, "secret_headers"), checked_list(adapter, "replay_fields")
  -- all checked: now all of it is added
  for kind, k in pairs(kinds) do M.kinds[kind] = k end
  for v, class in pairs(stream_errors) do M.wire.stream_errors[v] = class end
  local have = {}
  for _, p in ipairs(M.wire.overflow_phrases) do have[p] = true end
  for _, p in ipairs(phrases) do
    p = p:lower()
    if not have[p] then
      have[p] = true
      M.wire.overflow_phrases[#M.wire.overflow_phrases + 1] = p
    end
  end
  for _, source in ipairs(sources) do M.wire.in_flight_sources[source] = true end
  cassette.add_secret_headers(secret)
  cassette.add_compared_fields(replay)
  adapters[#adapters + 1] = adapter
  by_name[name] = adapter
end

-- adapters() -> the registered adapters, in the order they registered (a copy).
function M.adapters()
  return table.move(adapters, 1, #adapters, 1, {})
end

-- adapter(name) -> the registered adapter of that name, or nil.
function M.adapter(name)
  return by_name[name]
end

-- otel_name(kind) -> the gen_ai.provider.name of a kind, or nil when the
-- kind is not registered.
function M.otel_name(kind)
  local k = M.kinds[kind]
  return k and k.otel_name
end

-- key_variables() -> the environment variables the registered kinds read
-- their keys from, each once, in the order the adapters registered.
function M.key_variables()
  local out, seen = {}, {}
  for _, adapter in ipairs(adapters) do
    local names = {}
    for kind in pairs(adapter.kinds) do names[#names + 1] = kind end
    table.sort(names)
    for _, kind in ipairs(names) do
      local v = M.kinds[kind].key_env
      if v and not seen[v] then
        seen[v] = true
        out[#out + 1] = v
      end
    end
  end
  return out
end

-- The bundled wire formats, registered as any other is. Their order is the
-- order the mock lists its endpoints in.
local BUNDLED = {
  "luagent.model.providers.openai",
  "luagent.model.providers.openrouter",
  "luagent.model.providers.anthropic",
  "luagent.model.providers.openai_responses",
}
for _, module in ipairs(BUNDLED) do M.register(require(module)) end

-- A provider belongs to a runtime (lua/luagent/runtime.lua): two of its
-- settings (lua/luagent/config.lua) reach providers: `providers`, set by
-- `luagent run` when the embedded mock provider stands in for every provider
-- ({base_urls=<kind -> base URL, as the mock gives them>, api_key=
-- <placeholder>}), and `record`, the recorder of `--record FILE`
-- (lua/luagent/observe/record.lua), a tap on every request.

-- base_url(adapter, url) -> the base URL requests go under, from one given
-- (a provider's base_url, its kind's variable): trailing slashes dropped,
-- and the adapter's version_path added as its base_form says (see the
-- adapter fields above). A query the URL carries is kept at its end.
function M.base_url(adapter, url)
  local head, query = url:match("^([^?#]*)(.*)$")
  head = head:gsub("/+$", "")
  local v = adapter.version_path
  if v then
    local path = head:match("^%a[%w+.-]*://[^/]*(.*)$") or head
    if adapter.base_form == "root" then
      if path:sub(-#v) ~= v then head = head .. v end
    elseif path == "" then
      head = head .. v
    end
  end
  return head .. query
end

-- What a base URL of kind `info` (M.kinds) should look like, for a 404's
-- message: its default, and for a "root" form its root too.
local function base_url_shape(info)
  local adapter, default = info.adapter, info.base_url
  local v = adapter.version_path
  if v and adapter.base_form == "root" and default:sub(-#v) == v then
    return default:sub(1, -#v - 1) .. " or " .. default
  end
  return default
end

-- The folder holding the library's folder luagent/ (lua/, or where it is
-- installed), to find the first caller outside it.
local LIBRARY_ROOT = (debug.getinfo(1, "S").source:match("^@(.-)luagent/model/[^/]*$"))

-- Whether source file `path` is one of the library's: under LIBRARY_ROOT's
-- luagent/, named from it or (a module found through a relative path, as
-- a checkout's specs load them) from a folder it ends in.
local function library_file(path)
  local before = path:match("^(.-)luagent/[%w_/]+%.lua$")
  if not before then return false end
  if before == LIBRARY_ROOT then return true end
  return before:sub(1, 1) ~= "/" and LIBRARY_ROOT:sub(-#before - 1) == "/" .. before
end

-- "file:line: " of the first caller outside the library (the script's
-- line that asked for the provider), or "" when none is found.
local function user_position()
  if not LIBRARY_ROOT then return "" end
  for level = 3, 60 do
    local info = debug.getinfo(level, "Sl")
    if not info then break end
    local src = info.source
    if src:sub(1, 1) == "@" and info.currentline > 0 and not library_file(src:sub(2)) then
      return src:sub(2) .. ":" .. info.currentline .. ": "
    end
  end
  return ""
end

-- Raises the usage record of a provider without a key: before any request
-- goes to a public URL without one (which answers 401, or, offline, fails
-- to resolve and is retried for seconds).
local function missing_key(spec, info)
  local var = info.key_env
  local where = user_position()
  local env = info.base_env and " or " .. info.base_env or ""
  error(errors.new("usage", string.format("%s%s/%s: no API key: %s is not set; set it, give the provider"
    .. " api_key= (or base_url=%s for a server that needs no key), or run with --mock to use the"
    .. " embedded mock provider", where, spec.kind, spec.model, var, env),
    { variable = var, provider_kind = spec.kind, model = spec.model,
      file = where ~= "" and where:match("^(.*):%d+: $") or nil,
      line = tonumber(where:match(":(%d+): $")) }), 0)
end

-- Default per-attempt timeouts (seconds); the retry policy may override them.
M.default_timeout = { connect = 10, first_byte = 120, idle = 60 }

-- The keys a provider spec takes (M.new reads them; luagent.ProviderSpec
-- below documents them), and those of its timeout: any other raises,
-- naming the nearest. A new one is added here. (An attempt's whole time is
-- the policy's: attempt_timeout, total_deadline.)
M.SPEC = options.known { "kind", "model", "base_url", "api_key", "headers", "timeout", "http_version" }
M.TIMEOUT = options.known { "connect", "first_byte", "idle" }

---A provider as `luagent.provider{...}` takes it.
---@class luagent.ProviderSpec
---@field kind string "openai", "anthropic", "openai_responses", "openrouter", or a registered adapter's
---@field model string the model's name at the provider
---@field base_url string? where to send requests (default: the kind's variable, `OPENAI_BASE_URL`, ..., else its public URL)
---@field api_key string? the key (default: the kind's variable, `OPENAI_API_KEY`, ...); scrubbed from every output
---@field headers table<string, string>? headers added to every request
---@field timeout {connect: number?, first_byte: number?, idle: number?}? per-attempt timeouts in seconds
---@field http_version string? "2", "1.1" or "2-prior-knowledge" (h2c to a local server)

---A model at an endpoint, with its key (never a field: printing a
---provider cannot show it).
---@class luagent.Provider
---@field kind string its wire format ("openai", "anthropic", ...)
---@field model string the model's name at the provider
---@field base_url string where its requests go
local Provider = {}
Provider.__index = Provider
Provider.__name = "luagent.Provider"

-- Keys live here, keyed by provider, never as a field: printing, logging or
-- encoding a provider cannot reveal its key.
local keys = setmetatable({}, { __mode = "k" })

function Provider:__tostring()
  return string.format("provider %s/%s at %s", self.kind, self.model, self.base_url)
end

-- new(rt, "kind/model") or new(rt, {kind=, model=, base_url=, api_key=, headers=,
-- timeout=, http_version=} -> provider (http_version as luagent.http takes
-- it: "2", "1.1", "2-prior-knowledge"). An unknown kind or a missing model raises.
-- So does a provider with no key (none given, its kind's variable unset or
-- empty) that would go to its public URL: no base URL given nor in its
-- kind's variable, and no embedded mock (the runtime's `providers`): a
-- `usage` record naming the variable (`variable`) and --mock, with the
-- caller's file:line, raised before any request.
function M.new(rt, spec)
  if type(rt) ~= "table" or not rt.settings then error("provider.new: expects a runtime first", 2) end
  if type(spec) == "string" then
    local kind, model = spec:match("^([%w_]+)/(.+)$")
    if not kind then error("provider: expected 'kind/model', got '" .. spec .. "'", 2) end
    spec = { kind = kind, model = model }
  end
  if type(spec) ~= "table" then error("provider: expects a string or a table", 2) end
  options.check(spec, M.SPEC, "provider")
  if spec.timeout ~= nil then
    if type(spec.timeout) ~= "table" then error("provider: timeout must be a table {connect=, first_byte=, idle=}", 2) end
    options.check(spec.timeout, M.TIMEOUT, "provider timeout")
  end
  local info = M.kinds[spec.kind]
  if not info then error("provider: unknown kind '" .. tostring(spec.kind) .. "'", 2) end
  if type(spec.model) ~= "string" or spec.model == "" then error("provider: model is required", 2) end
  local adapter = info.adapter
  -- where the base URL comes from: a 404's message names it (an empty
  -- variable is an unset one)
  local given, source = spec.base_url, "the provider's base_url"
  if given == nil then given, source = info.base_env and os.getenv(info.base_env), info.base_env end
  if given == "" then given = nil end
  local key = spec.api_key or (info.key_env and os.getenv(info.key_env))
  local embedded = rt.settings:get("providers")
  local base_url
  if embedded and not spec.base_url then
    base_url, given = embedded.base_urls[spec.kind], nil
    key = embedded.api_key -- a placeholder, not a secret
  else
    if (key == nil or key == "") and given == nil and info.key_env then missing_key(spec, info) end
    secrets.register(key) -- every output is scrubbed of it from now on
    secrets.register_url(given) -- and of the credentials its URL carries
    base_url = given and M.base_url(adapter, given) or info.base_url
  end
  local p = setmetatable({
    rt = rt,
    kind = spec.kind,
    model = spec.model,
    adapter = adapter,
    base_url = base_url,
    -- the base URL as it was given, and where (nil: the default or the mock)
    given_base_url = given,
    base_source = given and source or nil,
    headers = spec.headers,
    timeout = spec.timeout,
    http_version = spec.http_version,
  }, Provider)
  keys[p] = key
  return p
end

-- provider:has_key() -> whether a key is configured.
---Whether a key is configured.
---@return boolean
function Provider:has_key()
  local k = keys[self]
  return k ~= nil and k ~= ""
end

-- provider:explain(err) -> err, its message told what a 404 on a base URL
-- that was given (not the default, not the mock) should look like, unless
-- the provider's own words say the model is what it did not find (OpenAI's
-- model_not_found, a message naming the model). Sets err.hint.
function Provider:explain(err)
  if not (errors.is(err) and err.kind == "http" and err.status == 404 and self.given_base_url) then return err end
  if err.error_code == "model_not_found" then return err end
  -- the model's name as a word of the message ("model: claude-x", "The
  -- model `gpt-x` does not exist"), not inside one ("m" in "/messages")
  local name = "[%w%-%._/:]"
  local word = "%f" .. name .. self.model:gsub("%p", "%%%0") .. "%f[^" .. name:sub(2)
  if (err.error_message or ""):find(word) then return err end
  err.hint = string.format("check the base URL '%s' (%s): it should look like %s",
    secrets.url(self.given_base_url), self.base_source, base_url_shape(M.kinds[self.kind]))
  err.message = err.message .. "; " .. err.hint
  return err
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
local function unexpected(resp, built)
  local status, h = resp.status, resp.headers
  if status >= 300 and status < 400 then
    local method, url = http.method_of(built), secrets.url(built.url)
    return errors.new("http", string.format("HTTP %d redirect from %s %s to %s: redirects are not followed"
      .. " (check the base URL)", status, method, url, h.location and ("'" .. h.location .. "'") or "nowhere"),
      { status = status, headers = h, body = "", method = method, url = url })
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
  local ok, built = pcall(self.adapter.build, req, { base_url = self.base_url, api_key = key, headers = self.headers,
    extra_body = req.extra_body })
  if not ok then error(secrets.text(tostring(built)), 2) end
  for name, value in pairs(opts and opts.headers or {}) do built.headers[name] = value end -- traceparent
  local resp, err = http.request {
    method = built.method, url = built.url, headers = built.headers, body = built.body,
    timeout = timeouts(self, opts and opts.timeout), http_version = self.http_version,
    tap = self.rt.settings:get("record"),
  }
  if resp then
    err = unexpected(resp, built)
    if err then
      resp:close()
      resp = nil
    end
  end
  if not resp then
    return nil, secrets.scrub(self:explain(err))
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
  local source, state = resp:event_source() -- the transport's reader, when no tap watches
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
    if nevents > 0 or n == 0 or e.kind ~= "truncated" then
      -- a stream cut before its terminator says how far it got, as a
      -- transport failure does (the --trace tree: "stream cut after N bytes")
      if e.kind == "truncated" and e.bytes == nil then e.bytes = n end
      return e
    end
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
        sse = source and source(state, scratch)
        if not sse then sse, serr = next_event(resp, scratch) end
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
