-- Recording live model exchanges as a cassette (`luagent run --record FILE`):
-- the request, the status, the headers without secret ones, and the SSE
-- events with their time since the request was sent. Every recorded string
-- (headers, a redirect's Location, event names, data, bodies) is scrubbed
-- of keys (lua/luagent/base/secrets.lua). Each exchange is appended as
-- one JSON line the moment it ends, so a run that dies keeps what it had.
--
-- A recorder is a tap on the transport (see luagent.http.request's `tap`):
-- it sees the raw exchange, whatever the provider then makes of it.
local core = require "luagent.core"
local cassette = require "luagent.base.cassette"
local http = require "luagent.base.http"
local json = require "luagent.base.json"
local secrets = require "luagent.base.secrets"

local M = {}

local Recorder = {}
Recorder.__index = Recorder

-- open(path) -> recorder, or nil, err. The file is truncated.
function M.open(path)
  local f, err = io.open(path, "wb")
  if not f then return nil, "cannot write cassette '" .. path .. "': " .. tostring(err) end
  return setmetatable({ file = f, path = path, count = 0 }, Recorder)
end

local Exchange = {}
Exchange.__index = Exchange

-- rec:begin(opts) -> an exchange for the request `opts` (method, url,
-- body), as http.request's tap.
function Recorder:begin(opts)
  local body = json.decode(opts.body or "") or opts.body
  return setmetatable({
    rec = self, t0 = core.now(), events = {}, raw = {}, raw_size = 0,
    request = { method = opts.method or "GET", path = opts.url:gsub("^%a+://[^/]+", ""), body = body },
  }, Exchange)
end

-- ex:response(status, headers) records what the headers said.
function Exchange:response(status, headers)
  self.status, self.headers = status, headers
end

-- ex:event(sse) records one SSE event with its time.
function Exchange:event(ev)
  self.events[#self.events + 1] = { t = math.floor((core.now() - self.t0) * 1000 + 0.5) / 1000,
                                     event = ev.event, data = ev.data }
end

-- ex:chunk(bytes) records raw body bytes (a body read as bytes, not as
-- SSE): their events, and their first bytes in case they hold none.
function Exchange:chunk(bytes)
  self.parser = self.parser or core.sse_parser()
  local evs = self.parser:feed(bytes)
  for _, ev in ipairs(evs or {}) do self:event(ev) end
  local limit = http.ERROR_BODY_MAX + secrets.margin
  if self.raw_size < limit then
    self.raw[#self.raw + 1] = bytes:sub(1, limit - self.raw_size)
    self.raw_size = self.raw_size + #self.raw[#self.raw]
  end
end

-- ex:finish([err]) writes the exchange; an HTTP error, a redirect or a
-- body that held no event keeps its body.
function Exchange:finish(err)
  if self.done then return end
  self.done = true
  local x = { request = self.request, status = self.status, headers = self.headers }
  if type(err) == "table" and err.status and type(err.body) == "string" then
    x.status, x.headers, x.body = err.status, err.headers, err.body
  elseif self.status and #self.events == 0 and (self.status >= 300 or self.raw_size > 0) then
    x.body = secrets.cut(table.concat(self.raw), http.ERROR_BODY_MAX,
      self.raw_size >= http.ERROR_BODY_MAX + secrets.margin)
  elseif self.status then
    x.events = self.events
  else
    return -- no response at all: nothing a replay could serve
  end
  local rec = self.rec
  rec.file:write(secrets.text(cassette.encode(secrets.scrub(x))), "\n")
  rec.file:flush()
  rec.count = rec.count + 1
end

function Recorder:close()
  if self.file then self.file:close() self.file = nil end
end

return M
