-- `luagent cost settle`: what every OpenRouter generation of a run cost,
-- failed attempts included, looked up after the fact
-- (lua/luagent/observe/generations.lua). The ids come from a durable run's journal
-- or from an events file.
local core = require "luagent.core"
local flags = require "luagent.cli.flags"
local json = require "luagent.base.json"
local journal = require "luagent.agent.journal"
local config = require "luagent.config"
local generations = require "luagent.observe.generations"
local provider = require "luagent.model.provider"

local M = {}

M.HELP = [[
usage: luagent cost settle [--journal FILE] [--wait SECONDS] [--base-url URL] RUN_ID
       luagent cost settle --events FILE [--wait SECONDS] [--base-url URL]

What every OpenRouter generation of a run cost, failed attempts included (a
stream cut before its usage chunk reports no tokens, yet was billed), asked
of OpenRouter's generation endpoint (GET {base}/generation?id=ID) with
OPENROUTER_API_KEY. OpenRouter answers 404 for some minutes after a
generation (4.5 to 8.5 in the book's measurement), so each lookup is asked
again with a doubling wait (15 s up to 60 s) until it answers or --wait
SECONDS (default 600) have passed.

The generation ids are those a durable run journaled (RUN_ID; --journal FILE
as for 'luagent runs'), or those in an events file that
'luagent run --events jsonl:FILE' wrote (the final event of each OpenRouter
call lists every attempt's id, --retry-safe or not).

  --base-url URL  OpenRouter's API, with or without /v1 (default: the endpoint
                  each call used, else $OPENROUTER_BASE_URL, else
                  https://openrouter.ai/api/v1)

Prints one line per generation (its id, its cost or why there is none, where
it came from) and the total. Exit codes: 0 every generation settled; 1 some
are still pending or their lookup failed (run it again later); 2 usage
error, unknown run.
]]

-- Splits args into flags (`wanted`: name -> takes a value) and the rest.
local function parse(args, wanted)
  local opts, i = flags.parse(args, wanted, "settle")
  if not opts or opts.help then return opts, i end
  local rest = {}
  for j = i, #args do rest[#rest + 1] = args[j] end
  return opts, rest
end

-- The generation ids a durable run journaled: {id=, endpoint=, where=}
-- in step order, or nil and the exit code.
local function from_journal(opts, run_id, say, usage_error)
  -- where the default journal is: the home setting (LUAGENT_HOME), read as
  -- a runtime reads it (a bad LUAGENT_ variable is a usage error)
  local env = config.new()
  local read, why = pcall(env.read_env, env)
  if not read then return nil, usage_error("%s", tostring(why)) end
  local home = env:get("home")
  local path = journal.path(opts.journal, home)
  local f = io.open(path, "r") -- (opening a journal that is not there would make one)
  if not f then return nil, usage_error("cost settle: no journal at %s", path) end
  f:close()
  local store, err = journal.open(opts.journal, { readonly = true, home = home }) -- it only reads, on a full disk too
  if not store then
    say("luagent: %s", tostring(err))
    return nil, 1
  end
  local run
  run, err = store:read(run_id)
  store:close()
  if not run then
    if err then
      say("luagent: %s", tostring(err))
      return nil, 1
    end
    return nil, usage_error("cost settle: no run '%s' in journal %s", run_id, journal.path(opts.journal, home))
  end
  local out = {}
  for _, s in ipairs(run.steps) do
    local step = run.by_pos[s.pos] or s
    local d = type(step.data) == "table" and step.data or {}
    if type(d.generation_ids) == "table" then
      local where = (step.pos or "?"):gsub("/failed%-%x+$", " (failed)")
      for _, id in ipairs(d.generation_ids) do
        if type(id) == "string" then out[#out + 1] = { id = id, endpoint = d.endpoint, where = where } end
      end
    end
  end
  return out
end

-- The generation ids of an events file: those on the final event of each
-- OpenRouter call. Nil and the exit code when the file cannot be read.
local function from_events(path, say, usage_error)
  local f, err = io.open(path, "r")
  if not f then return nil, usage_error("cost settle: --events: cannot open '%s': %s", path, err) end
  local out, bad = {}, 0
  for line in f:lines() do
    local ev = json.decode(line)
    if type(ev) ~= "table" then
      bad = bad + 1
    elseif ev.final and ev.provider_kind == "openrouter" and type(ev.response_ids) == "table" then
      for _, id in ipairs(ev.response_ids) do
        if type(id) == "string" then
          out[#out + 1] = { id = id, endpoint = type(ev.endpoint) == "string" and ev.endpoint or nil,
            where = math.tointeger(ev.call) and ("call " .. math.tointeger(ev.call)) or "a call" }
        end
      end
    end
  end
  f:close()
  if bad > 0 then say("luagent: cost settle: %d line(s) of %s are not JSON events; skipped", bad, path) end
  return out
end

-- Writes a line to stdout escaped for the terminal: the ids and the error
-- texts come from an events file, a journal and OpenRouter.
local function out(fmt, ...) io.write(core.terminal_text(string.format(fmt, ...), true)) end

-- Looks every generation up; prints its line and the total. Returns the exit code.
local function settle(list, opts)
  -- the OpenRouter adapter's own variables (lua/luagent/model/providers/openrouter.lua)
  local openrouter = provider.kinds.openrouter
  local env_base = os.getenv(openrouter.base_env)
  if env_base == "" then env_base = nil end
  -- with or without /v1, as a provider takes it (provider.base_url)
  local given = opts["base-url"] or env_base
  given = given and provider.base_url(openrouter.adapter, given)
  local key = os.getenv(openrouter.key_env)
  local wait = tonumber(opts.wait)
  -- one lookup per base URL, in the order the ids came
  local groups, by_base = {}, {}
  for _, g in ipairs(list) do
    local base = opts["base-url"] and given or g.endpoint or given or generations.default_base_url
    local group = by_base[base]
    if not group then
      group = { base = base, ids = {}, entries = {} }
      by_base[base] = group
      groups[#groups + 1] = group
    end
    group.ids[#group.ids + 1] = g.id
    group.entries[#group.entries + 1] = g
  end
  local total, settled, pending, failed = 0, 0, 0, 0
  local width = 12
  for _, g in ipairs(list) do width = math.max(width, #g.id) end
  for _, group in ipairs(groups) do
    local results = generations.settle(group.ids, { base_url = group.base, api_key = key, wait = wait })
    for i, r in ipairs(results) do
      local what
      if r.cost then
        total, settled = total + r.cost, settled + 1
        what = string.format("$%.6f", r.cost)
      elseif r.pending then
        pending = pending + 1
        what = "pending: " .. tostring(r.error and r.error.message or "not found yet")
      else
        failed = failed + 1
        what = "failed: " .. tostring(r.error)
      end
      out("%-" .. width .. "s  %s  %s\n", r.id, what, group.entries[i].where)
    end
  end
  out("total $%.6f for %d generation(s)%s%s\n", total, settled,
    pending > 0 and string.format(", %d pending", pending) or "",
    failed > 0 and string.format(", %d failed", failed) or "")
  return (pending > 0 or failed > 0) and 1 or 0
end

-- main(args, say, usage_error) -> exit code; args[1] is the subcommand.
function M.main(args, say, usage_error)
  local sub = args[1]
  if sub == nil or sub == "-h" or sub == "--help" then
    io.write(M.HELP)
    return sub and 0 or 2
  end
  if sub ~= "settle" then return usage_error("cost: unknown subcommand '%s' (try 'settle')", sub) end
  local rest = {}
  for j = 2, #args do rest[#rest + 1] = args[j] end
  local opts, pos = parse(rest, { journal = true, events = true, wait = true, ["base-url"] = true })
  if not opts then return usage_error("cost %s", pos) end
  if opts.help then
    io.write(M.HELP)
    return 0
  end
  if opts.wait and not (tonumber(opts.wait) and tonumber(opts.wait) >= 0 and tonumber(opts.wait) < math.huge) then
    return usage_error("cost settle: --wait wants seconds >= 0, not '%s'", opts.wait)
  end
  if (#pos == 1) == (opts.events ~= nil) or #pos > 1 then
    return usage_error("cost settle: give RUN_ID or --events FILE")
  end
  local list, code
  if opts.events then
    list, code = from_events(opts.events, say, usage_error)
  else
    list, code = from_journal(opts, pos[1], say, usage_error)
  end
  if not list then return code end
  if #list == 0 then
    out("no OpenRouter generation ids in %s\n", opts.events or ("run " .. pos[1]))
    return 0
  end
  code = 1
  local main = core.spawn(function() code = settle(list, opts) end)
  core.on_sigint(main)
  core.run()
  if main:status() == "failed" then
    local _, e = pcall(main.join, main)
    local stopped, sig = core.interrupted()
    if stopped then return 128 + sig end
    say("luagent: %s", tostring(e))
    return 1
  end
  return code
end

return M
