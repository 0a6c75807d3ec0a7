-- Cassettes: recorded model exchanges, one JSON object per line:
--
--   {"request":{"method":"POST","path":"/v1/messages","body":{...}},
--    "status":200,"headers":{"content-type":"text/event-stream"},
--    "events":[{"t":0.31,"event":"message_start","data":"{...}"},...]}
--
-- `t` is seconds since the request was sent. A reply that was not a stream
-- has "body":"<text>" instead of "events". Replay serves exchanges in order
-- and reports where an incoming request diverges from the recorded one.
--
-- The format belongs to recording (lua/luagent/observe/record.lua) and replay (the
-- mock provider, lua/luagent/mock/) alike; it requires neither.
local errors = require "luagent.base.errors"
local json = require "luagent.base.json"
local sandbox = require "luagent.base.sandbox"

local M = {}

-- Headers never written to a cassette (secrets and per-connection state):
-- these, which carry keys in many services, and those a wire format adds
-- (its adapter's secret_headers, lua/luagent/model/provider.lua).
M.secret_headers = {
  authorization = true, ["proxy-authorization"] = true, ["x-api-key"] = true,
  ["api-key"] = true, cookie = true, ["set-cookie"] = true,
}

-- add_secret_headers(names) adds header names (any case) to M.secret_headers.
function M.add_secret_headers(names)
  for _, name in ipairs(names) do M.secret_headers[name:lower()] = true end
end

-- The request body fields a replay compares, in order (see M.compare): the
-- model, then the conversation as each wire format names it (its adapter's
-- replay_fields: "system", "messages", "input", ...).
M.compared_fields = { "model" }

-- add_compared_fields(names) adds body fields to M.compared_fields. Each
-- name not there yet goes before the first name after it in `names` that
-- is there already, else last: the fields keep the order each format
-- lists them in.
function M.add_compared_fields(names)
  local list = M.compared_fields
  local function index(name)
    for i, n in ipairs(list) do if n == name then return i end end
  end
  for i, name in ipairs(names) do
    if not index(name) then
      local at = #list + 1
      for j = i + 1, #names do
        local k = index(names[j])
        if k then at = k break end
      end
      table.insert(list, at, name)
    end
  end
end

-- Hop-by-hop and framing headers: recorded for information, never replayed.
M.hop_headers = {
  connection = true, ["keep-alive"] = true, ["transfer-encoding"] = true,
  ["content-length"] = true, ["content-encoding"] = true, date = true,
}

------------------------------------------------------------------------------
-- Reading
------------------------------------------------------------------------------

-- Checks one decoded exchange; nil when well formed, else what is wrong.
local function invalid(x)
  if type(x) ~= "table" then return "an exchange must be a JSON object" end
  local req = x.request
  if type(req) ~= "table" then return "missing \"request\"" end
  if type(req.method) ~= "string" then return "request.method must be a string" end
  if type(req.path) ~= "string" then return "request.path must be a string" end
  if math.type(x.status) ~= "integer" and not (type(x.status) == "number"
      and x.status == math.floor(x.status)) then
    return "\"status\" must be an integer"
  end
  if x.status < 100 or x.status > 599 then return "\"status\" must be 100..599" end
  if x.headers ~= nil then
    if type(x.headers) ~= "table" then return "\"headers\" must be an object" end
    for k, v in pairs(x.headers) do
      if type(k) ~= "string" or type(v) ~= "string" then
        return "\"headers\" values must be strings"
      end
      if k:find("[\r\n]") or v:find("[\r\n]") then
        return "header \"" .. k:gsub("[\r\n]", "\\n") .. "\" contains CR or LF (it would inject headers)"
      end
    end
  end
  if x.events ~= nil and x.body ~= nil then return "has both \"events\" and \"body\"" end
  if x.body ~= nil and type(x.body) ~= "string" then return "\"body\" must be a string" end
  if x.events ~= nil then
    if type(x.events) ~= "table" then return "\"events\" must be an array" end
    for i, e in ipairs(x.events) do
      if type(e) ~= "table" then return "events[" .. i .. "] must be an object" end
      if type(e.data) ~= "string" then return "events[" .. i .. "].data must be a string" end
      if e.event ~= nil and type(e.event) ~= "string" then
        return "events[" .. i .. "].event must be a string"
      end
      if type(e.t) ~= "number" or e.t < 0 then
        return "events[" .. i .. "].t must be a number of seconds >= 0"
      end
    end
  end
  return nil
end

-- Decodes cassette text. `name` names it in errors ("file:line: ...").
-- Blank lines are skipped. Returns the list of exchanges, or nil, err
-- (kind "usage").
function M.decode(text, name)
  name = name or "cassette"
  local list, lineno = {}, 0
  for line in (text .. "\n"):gmatch("(.-)\r?\n") do
    lineno = lineno + 1
    if line:match("%S") then
      local x, jerr = json.decode(line)
      local problem = x == nil and ("invalid JSON: " .. jerr) or invalid(x)
      if problem then
        return nil, errors.new("usage", name .. ":" .. lineno .. ": " .. problem,
          { file = name, line = lineno })
      end
      x.status = math.tointeger(x.status)
      x.line = lineno
      list[#list + 1] = x
    end
  end
  return list
end

-- Loads a cassette file into a player (see M.player), or nil, err.
function M.load(path)
  local text, rerr = sandbox.read_file(path)
  if not text then return nil, errors.new("usage", "cannot open cassette: " .. rerr, { file = path }) end
  local list, err = M.decode(text, path)
  if not list then return nil, err end
  return M.player(list, path)
end

------------------------------------------------------------------------------
-- Writing
------------------------------------------------------------------------------

-- A copy of `headers` (name -> value) with lowercased names and no secrets.
function M.strip(headers)
  local out = {}
  for k, v in pairs(headers or {}) do
    k = k:lower()
    if not M.secret_headers[k] then out[k] = v end
  end
  return out
end

-- One exchange as its JSON line (no newline), keys in a fixed order and
-- secrets removed.
function M.encode(x)
  local O = json.object
  local events
  if x.events then
    events = json.array()
    for _, e in ipairs(x.events) do
      events[#events + 1] = O("t", e.t or 0, "event", e.event, "data", e.data)
    end
  end
  local req = x.request or {}
  return json.encode(O(
    "request", O("method", req.method, "path", req.path, "body", req.body),
    "status", x.status, "headers", M.strip(x.headers), "events", events, "body", x.body))
end

-- Writes exchanges to `path`, one line each. true, or nil, err.
function M.save(path, exchanges)
  local f, oerr = io.open(path, "wb")
  if not f then return nil, errors.new("usage", "cannot write cassette: " .. oerr, { file = path }) end
  for _, x in ipairs(exchanges) do f:write(M.encode(x), "\n") end
  f:close()
  return true
end

------------------------------------------------------------------------------
-- Divergence
------------------------------------------------------------------------------

-- A value as shown in a divergence message: strings in quotes, the rest as
-- JSON, long ones shortened.
local function show(v)
  if v == nil then return "nothing" end
  local s = type(v) == "string" and v or json.encode(v)
  if #s > 60 then s = s:sub(1, 57):gsub("[\128-\191]*$", ""):gsub("[\192-\255]$", "") .. "..." end
  return "'" .. s .. "'"
end

-- How a key extends a path: .name for identifiers, [n] for indices
-- (1-based, like exchange numbers), ["key"] otherwise.
local function step(path, k)
  if math.type(k) == "integer" then return path .. "[" .. k .. "]" end
  if type(k) == "string" and k:match("^[%a_][%w_]*$") then return path .. "." .. k end
  return path .. "[" .. json.encode(tostring(k)) .. "]"
end

-- The path of the first difference between a and b (keys in sorted order),
-- and the two values there; nil when equal.
local function diff(a, b, path)
  if type(a) ~= "table" or type(b) ~= "table" then
    if a == b then return nil end
    return path, a, b
  end
  local keys, seen = {}, {}
  for k in pairs(a) do if not seen[k] then seen[k] = true; keys[#keys + 1] = k end end
  for k in pairs(b) do if not seen[k] then seen[k] = true; keys[#keys + 1] = k end end
  table.sort(keys, function(x, y)
    if type(x) == type(y) then return x < y end
    return type(x) == "number"
  end)
  for _, k in ipairs(keys) do
    local p, va, vb = diff(a[k], b[k], step(path, k))
    if p then return p, va, vb end
  end
  return nil
end

-- Compares an incoming request (method, path and decoded body) with a
-- recorded one: its path, model and conversation (M.compared_fields). nil
-- when they match, else a message like
-- "exchange 3: messages[2].content differs: recorded 'a' got 'b'".
function M.compare(recorded, path, body, index)
  local rbody = type(recorded.body) == "table" and recorded.body or {}
  body = type(body) == "table" and body or {}
  local p, want, got
  if recorded.path ~= path then
    p, want, got = "path", recorded.path, path
  else
    for _, key in ipairs(M.compared_fields) do
      p, want, got = diff(rbody[key], body[key], key)
      if p then break end
    end
  end
  if not p then return nil end
  return "exchange " .. index .. ": " .. p .. " differs: recorded " .. show(want)
    .. " got " .. show(got)
end

------------------------------------------------------------------------------
-- Replay
------------------------------------------------------------------------------

local Player = {}
Player.__index = Player

-- A player over a list of exchanges; `name` is where they came from.
function M.player(exchanges, name)
  return setmetatable({ exchanges = exchanges, name = name or "cassette", pos = 1 }, Player)
end

-- The next exchange if the request matches it: exchange, index; or nil,
-- message when the request diverges or the cassette is used up. Does not
-- advance (see :advance), so a faulted request and its retry both meet the
-- same recorded exchange. A player with `seek` set (a resumed durable run)
-- jumps to any exchange the request matches.
function Player:match(path, body)
  local x = self.exchanges[self.pos]
  if not x then
    return nil, "exchange " .. self.pos .. ": not in " .. self.name .. " (it has "
      .. #self.exchanges .. " exchanges)"
  end
  local message = M.compare(x.request, path, body, self.pos)
  if message and self.seek then
    for i, other in ipairs(self.exchanges) do
      if M.compare(other.request, path, body, i) == nil then
        self.pos = i
        return other, i
      end
    end
  end
  if message then return nil, message end
  return x, self.pos
end

-- Moves on to the next exchange.
function Player:advance()
  self.pos = self.pos + 1
end

return M
