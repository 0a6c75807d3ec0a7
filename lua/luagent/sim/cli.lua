-- luagent.sim.cli: `luagent sim`: its help, its flags, and main.
local model = require "luagent.sim.model"
local report = require "luagent.sim.report"

local M = {}

local fmt = string.format
local by_name = {}
for _, s in ipairs(model.strategies) do by_name[s.name] = s end

------------------------------------------------------------------------------
-- Command line
------------------------------------------------------------------------------

M.help = [[
usage: luagent sim [options]

A deterministic simulation of many clients contending for one rate-limited
provider, on the virtual clock (a run of thousands of clients takes
seconds). N clients each need one successful call; the provider accepts at
most C calls per window of W seconds and answers the rest with 429. It runs
the real backoff, retry budget, circuit breaker and cooldown code, and
prints one row per strategy: requests per client (mean and max), total
requests, rejected requests (429s), clients that gave up, and when the
served clients got their success (median and worst, seconds).

strategies (wait before retry n; c = min(base × 2^(n-1), cap)):
  fixed                 a fixed short wait
  exponential           c, without jitter
  full_jitter           U × c (U uniform in [0, 1))
  equal_jitter          c/2 + U × c/2
  decorrelated_jitter   min(cap, base + U × (3 × previous wait − base))
  full_jitter+budget    plus a shared retry budget (gRPC retry throttling)
  full_jitter+breaker   plus a shared circuit breaker
  full_jitter+cooldown  the provider's Retry-After in place of the backoff,
                        and a shared cooldown released with jitter
A retry refused by the budget, or a call refused by the open breaker, is
not sent: the client's call fails ("gave up"), as in gRPC and the book.

hosts: with --hosts N the clients are spread over N hosts (luagent
processes), and each guarded strategy runs twice: ":shared", one budget,
breaker and cooldown for every host (the endpoint state shared through
Redis, policy field `shared`), and ":local", one per host. With --spread S
the clients start over S seconds instead of all at once, which is where a
shared breaker shows: once open, it stops every host's new clients.

scenarios:
  book  100 clients, 5 calls per 0.1 s window, 10 ms per call, fixed wait
        11 ms, backoff base 0.1 s, cap 1 s. The book reports that a fixed
        short wait costs about 46 requests per client, plain backoff is
        slow, and full jitter sends the fewest and is done in about two
        seconds, but not its parameters: these were chosen to reproduce
        those figures.
  aws   Marc Brooker's AWS "Exponential Backoff And Jitter" experiment (100
        clients, 10 ms network hops, base 5 ms, cap 2 s) mapped onto this
        model: 1 call per 20 ms window, 40 ms ± 20 % per call, base 10 ms
        (AWS's first ceiling; decorrelated keeps 5 ms), cap 2 s, fixed
        wait 0 (AWS's "no backoff").
The top of lua/luagent/sim/model.lua explains both mappings.

options:
  --scenario NAME     book (default) or aws
  --clients N         number of clients
  --capacity C        calls accepted per window
  --window W          window length, seconds
  --hosts N           spread the clients over N hosts (default 1)
  --spread S          start the clients over S seconds (default 0: at once)
  --seed S            seed of the clients' jitter (default 1)
  --strategies LIST   comma-separated names (default: all)
  --csv FILE          also write the table as CSV
  --svg FILE          also write a plot (SVG)
  -h, --help          show this help

example:
  luagent sim --scenario aws --svg aws.svg
  luagent sim --hosts 4 --clients 1000 --spread 5 --svg hosts.svg
]]

-- Options: name -> the kind of value.
local FLAGS = {
  scenario = "string", clients = "count", capacity = "count", window = "seconds", hosts = "count",
  spread = "seconds",
  seed = "integer", strategies = "list", csv = "string", svg = "string",
}

-- parse_args(args) -> opts | nil, message.
function M.parse_args(args)
  local opts, i = {}, 1
  while args[i] do
    local a = args[i]
    if a == "-h" or a == "--help" then
      opts.help = true
      return opts
    end
    local name, value = a:match("^%-%-([%w%-]+)=(.*)$")
    name = name or a:match("^%-%-([%w%-]+)$")
    local kind = name and FLAGS[name]
    if not kind then return nil, fmt("unknown argument '%s'", a) end
    if value == nil then
      i = i + 1
      value = args[i]
      if value == nil then return nil, fmt("flag '--%s' needs a value", name) end
    end
    local v
    if kind == "string" then
      v = value
    elseif kind == "list" then
      v = {}
      for s in value:gmatch("[^,%s]+") do v[#v + 1] = s end
      if #v == 0 then return nil, "--strategies: empty list" end
      for _, s in ipairs(v) do
        if not by_name[s] then return nil, fmt("--strategies: unknown strategy '%s'", s) end
      end
    else
      v = tonumber(value)
      local int = v and math.tointeger(v)
      if kind == "seconds" and not (v and v > 0 and v < math.huge) then
        return nil, fmt("--%s wants a number of seconds > 0, got '%s'", name, value)
      elseif kind == "count" and not (int and int >= 1) then
        return nil, fmt("--%s wants a whole number >= 1, got '%s'", name, value)
      elseif kind == "integer" and not int then
        return nil, fmt("--%s wants an integer, got '%s'", name, value)
      end
      if kind ~= "seconds" then v = int end
    end
    opts[name] = v
    i = i + 1
  end
  if opts.scenario and not model.scenarios[opts.scenario] then
    return nil, fmt("--scenario: unknown scenario '%s' (book, aws)", opts.scenario)
  end
  return opts
end

-- Writes `text` to `path`; true, or nil and a message.
local function write_file(path, text)
  local fh, err = io.open(path, "w")
  if not fh then return nil, err end
  local ok, werr = fh:write(text)
  fh:close()
  if not ok then return nil, werr end
  return true
end

-- main(args, out, err) -> exit code: 0 done, 1 a file could not be
-- written, 2 usage error.
function M.main(args, out, err)
  out, err = out or io.stdout, err or io.stderr
  local opts, perr = M.parse_args(args or {})
  if not opts then
    err:write("luagent sim: ", perr, "\nRun 'luagent sim --help' for usage.\n")
    return 2
  end
  if opts.help then
    out:write(M.help)
    return 0
  end
  local result = model.run(opts)
  out:write(report.format_table(result))
  for _, f in ipairs({ { "csv", report.csv }, { "svg", report.svg } }) do
    local path = opts[f[1]]
    if path then
      local ok, werr = write_file(path, f[2](result))
      if not ok then
        err:write("luagent sim: cannot write ", path, ": ", tostring(werr), "\n")
        return 1
      end
      err:write("luagent sim: wrote ", path, "\n")
    end
  end
  return 0
end

return M
