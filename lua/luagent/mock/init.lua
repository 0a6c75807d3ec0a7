-- The mock provider: an HTTP/1.1 server on loopback that speaks every wire
-- format the provider registry knows (lua/luagent/model/provider.lua; each
-- adapter's `mock` table says how), replays cassettes and injects faults. Part of the test
-- bench: the product (lua/luagent/*.lua) never requires it; `luagent run`
-- starts it on demand and hands the provider its base URLs.
--
-- One job per file:
--   request.lua  bytes -> request (HTTP/1.1 parser)       pure
--   plan.lua     response -> plan of write/sleep/reset/close steps  pure
--   state.lua    faults, cassette player, pacing, request log
--   route.lua    request -> plan (model formats, faults, replay)  pure
--   server.lua   listener and connection tasks executing plans
--   cli.lua      `luagent mock`
--   generations.lua  OpenRouter's generation lookup (GET /api/v1/generation)  pure
--   replies.lua  what every format's replies share; the formats' own parts
--                come from their adapters
--   faults.lua, help.lua: fault specs, help text
-- The cassette format is lua/luagent/base/cassette.lua (recording shares it).
local request = require "luagent.mock.request"
local plan = require "luagent.mock.plan"
local state = require "luagent.mock.state"
local route = require "luagent.mock.route"
local server = require "luagent.mock.server"
local cli = require "luagent.mock.cli"

return {
  -- limits (see the files that own them)
  MAX_HEAD = request.MAX_HEAD,
  MAX_BODY = request.MAX_BODY,
  IDLE_TIMEOUT = server.IDLE_TIMEOUT,
  LOG_MAX = state.LOG_MAX,
  LOG_BYTES = state.LOG_BYTES,
  parse_request = request.parse,     -- bytes -> "ok", req, rest | "more", head | "bad", failure
  bad_request_plan = plan.bad_request_plan,
  mask = state.mask,                 -- headers with secret values masked
  state = state.state,               -- options -> state | nil, err
  handle = route.handle,             -- state, request -> plan
  base_urls = route.base_urls,       -- url -> {[provider kind] = base URL}
  start = server.start,              -- options -> server | nil, err
  parse_args = cli.parse_args,       -- `luagent mock` argv -> options | nil, err
  main = cli.main,                   -- `luagent mock` argv -> exit code
}
