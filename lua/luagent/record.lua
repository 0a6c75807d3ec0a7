-- Recording live model exchanges as a cassette (`luagent run --record FILE`):
-- the request, the status, the headers without secret ones, and the SSE
-- events with their time since the request was sent. Every recorded string
-- (headers, a redirect's Location, event names, data, bodies) is scrubbed
-- of keys (lua/luagent/secrets.lua). Each exchange is appended as
-- one JSON line the moment it ends, so a run that dies keeps what it had.
local core = require "luagent.core"
local cassette = require "luagent.mock.cassette"
local json = require "luagent.json"
local secrets = require "luagent.secrets"

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

-- rec:begin(built) -> an exchange for the request `built` (method, url,
-- body).
function Recorder:begin(built)
  local body = json.decode(built.body or "") or built.body
  return setmetatable({
    rec = self, t0 = core.now(), events = {},
    request = { method = built.method, path = built.url:gsub("^%a+://[^/]+", ""), body = body },
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

-- ex:finish([err]) writes the exchange; an HTTP error (or a body that was
-- no event stream) keeps its body.
function Exchange:finish(err)
  if self.done then return end
  self.done = true
  local x = { request = self.request, status = self.status, headers = self.headers }
  if err and err.status and type(err.body) == "string" then
    x.status, x.headers, x.body = err.status, err.headers, err.body
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
