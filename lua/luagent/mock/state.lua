-- The mock provider's state: faults, jitter, cassette player, pacing, the
-- request count and the request log window. M.handle
-- (lua/luagent/mock/route.lua) reads and updates it.
local core = require "luagent.core"
local errors = require "luagent.base.errors"
local faults = require "luagent.mock.faults"
local cassette = require "luagent.base.cassette"
local chat = require "luagent.mock.chat"

local M = {}

-- The request log is a window: the latest LOG_MAX requests, fewer when
-- their bodies pass LOG_BYTES together (the newest is always kept).
M.LOG_MAX = 1000
M.LOG_BYTES = 16 * 1024 * 1024

-- Headers with secret values masked: "Bearer sk-abc" -> "Bearer ***",
-- "sk-ant-xyz" -> "***".
function M.mask(headers)
  local out = {}
  for k, v in pairs(headers or {}) do
    if cassette.secret_headers[k] then -- the one list of secret headers
      local scheme = v:match("^(%a+) %S")
      v = scheme and (scheme .. " ***") or "***"
    end
    out[k] = v
  end
  return out
end

-- The server state that M.handle reads and updates, from start options:
-- faults=<spec string or parsed list>, seed=, cassette=<path, or a player
-- from cassette.player>, ttft=, tps=, recorded_speed=, now=<wall clock
-- function, default os.time>, on_divergence=<function(message)>,
-- script=<function(view, n, body) -> content or nil: what the model says
-- to request n (see replies.content for the shape; `tools` may list
-- several calls; `output = value` answers it as JSON text: structured
-- output)>, seek=<the cassette replay may jump to the exchange a
-- request matches>, generation_delay=<seconds OpenRouter's generation
-- lookup answers 404 after a generation, default 0>, clock=<the loop's
-- clock for it, default luagent.now>, chat=<true: with no script, the
-- replies of lua/luagent/mock/chat.lua (`luagent chat`)>.
-- Returns the state, or nil, err (kind "usage").
function M.state(opts)
  opts = opts or {}
  local list, err = opts.faults, nil
  if type(list) ~= "table" then
    list, err = faults.parse(opts.faults)
    if not list then return nil, err end
  end
  local seed = opts.seed or 0
  if math.tointeger(seed) == nil then
    return nil, errors.new("usage", "--seed must be an integer, got '" .. tostring(seed) .. "'")
  end
  local ttft, tps = opts.ttft, opts.tps
  if ttft ~= nil and (type(ttft) ~= "number" or ttft < 0) then
    return nil, errors.new("usage", "--ttft must be seconds >= 0, got '" .. tostring(ttft) .. "'")
  end
  if tps ~= nil and (type(tps) ~= "number" or tps <= 0) then
    return nil, errors.new("usage", "--tps must be a number > 0, got '" .. tostring(tps) .. "'")
  end
  local delay = opts.generation_delay or 0
  if type(delay) ~= "number" or not (delay >= 0) then
    return nil, errors.new("usage", "--generation-delay must be seconds >= 0, got '" .. tostring(delay) .. "'")
  end
  local player = opts.cassette
  if type(player) == "string" then
    player, err = cassette.load(player)
    if not player then return nil, err end
  end
  -- seek: a resumed durable run starts mid-cassette; the replay jumps to
  -- the exchange its request matches
  if player and opts.seek then player.seek = true end
  return {
    faults = list, rng = faults.rng(math.tointeger(seed)), player = player,
    ttft = ttft, tps = tps, recorded_speed = opts.recorded_speed,
    now = opts.now or os.time, on_divergence = opts.on_divergence, script = opts.script or (opts.chat and chat.script) or nil,
    count = 0, log = {}, log_sizes = {}, log_bytes = 0, divergences = {},
    log_max = opts.log_max or M.LOG_MAX, log_bytes_max = opts.log_bytes or M.LOG_BYTES,
    generations = {}, generation_order = {}, generation_delay = delay, clock = opts.clock or core.now,
  }
end

-- Adds a request of `size` body bytes to the log window, dropping the
-- oldest entries past its limits.
function M.remember(state, entry, size)
  local log, sizes = state.log, state.log_sizes
  log[#log + 1], sizes[#sizes + 1] = entry, size
  state.log_bytes = state.log_bytes + size
  local drop = 0
  while #log - drop > 1 and (#log - drop > state.log_max or state.log_bytes > state.log_bytes_max) do
    drop = drop + 1
    state.log_bytes = state.log_bytes - sizes[drop]
  end
  if drop > 0 then
    local n = #log
    table.move(log, drop + 1, n, 1)
    table.move(sizes, drop + 1, n, 1)
    for i = n - drop + 1, n do log[i], sizes[i] = nil, nil end
  end
end


return M
