-- The contention simulation (`luagent sim`): deterministic per seed, the
-- book's and AWS's published orderings, the real backoff / budget / breaker
-- / endpoint code driven, and its table, CSV, SVG and command line.
local core = require "luagent.core"
local luagent = require "luagent"
local sim = require "luagent.sim"
local h = require "helpers"

local PLAIN = { "fixed", "exponential", "full_jitter", "equal_jitter", "decorrelated_jitter" }

-- The rows of a result by strategy name.
local function rows_of(result)
  local r = {}
  for _, row in ipairs(result.rows) do r[row.strategy] = row end
  return r
end

-- Runs `fn` with core[name] wrapped so that every call is counted; returns
-- the count and fn's result. The wrapper is removed even when fn raises.
local function counting(name, fn)
  local real, count = core[name], 0
  core[name] = function(...)
    count = count + 1
    return real(...)
  end
  local ok, res = pcall(fn)
  core[name] = real
  if not ok then error(res, 0) end
  return count, res
end

-- Checks that `text` is well-formed enough XML: every tag closes in order.
local function check_xml(text)
  local stack = {}
  for slash, name, rest in text:gmatch("<(/?)([%w:_-]+)([^>]*)>") do
    if slash == "/" then
      assert.equal(table.remove(stack), name)
    elseif rest:sub(-1) ~= "/" then
      stack[#stack + 1] = name
    end
  end
  assert.are.same({}, stack)
  assert.is_nil(text:find("&[^#%w]"), "a bare & in the SVG")
end

local book, aws -- results of the default runs, computed once

describe("luagent sim", function()
  setup(function()
    book = sim.run { scenario = "book", seed = 1 }
    aws = sim.run { scenario = "aws", seed = 1 }
  end)

  describe("runs", function()
    it("every strategy, in table order, on the virtual clock, restoring the real one", function()
      local names = {}
      for i, row in ipairs(book.rows) do names[i] = row.strategy end
      local all = {}
      for i, s in ipairs(sim.strategies) do all[i] = s.name end
      assert.are.same(all, names)
      assert.is_false(luagent.clock.is_virtual())
    end)

    it("gives the same table for the same seed, and another for another seed", function()
      local again = sim.run { scenario = "book", seed = 1 }
      assert.equal(sim.format_table(book), sim.format_table(again))
      assert.equal(sim.csv(aws), sim.csv(sim.run { scenario = "aws", seed = 1 }))
      local other = rows_of(sim.run { scenario = "book", seed = 2, strategies = { "full_jitter" } })
      assert.are_not.equal(rows_of(book).full_jitter.worst, other.full_jitter.worst)
    end)

    it("never lets the provider accept more than its capacity in a window", function()
      for _, result in ipairs({ book, aws }) do
        local C = result.scenario.capacity
        for _, row in ipairs(result.rows) do
          local accepted, calls = 0, 0
          for _, n in ipairs(row.per_window) do
            accepted = accepted + math.min(n, C)
            calls = calls + n
          end
          assert.equal(row.served, accepted)
          assert.equal(row.total, calls)
          assert.equal(row.total - row.served, row.rejected)
          assert.equal(row.clients, row.served + row.gave_up)
        end
      end
    end)

    it("draws every wait from core.backoff_delay, once per 429", function()
      local calls, result = counting("backoff_delay", function()
        return sim.run { scenario = "book", strategies = PLAIN }
      end)
      local rejected = 0
      for _, row in ipairs(result.rows) do rejected = rejected + row.rejected end
      assert.equal(rejected, calls)
      assert.is_true(calls > 0)
    end)

    it("keeps the clients to the horizon, counting those it stops", function()
      local row = sim.run { scenario = "book", horizon = 5, strategies = { "exponential" } }.rows[1]
      assert.is_true(row.gave_up > 0 and row.served > 0)
      assert.is_true(row.worst <= 5)
      assert.equal(row.gave_up, row.gave_up_by.horizon)
    end)
  end)

  describe("the book scenario", function()
    it("reproduces the book: fixed wait ~46 requests per client, full jitter fewer and done in ~2 s", function()
      local r = rows_of(book)
      assert.is_true(r.fixed.mean > 44 and r.fixed.mean < 49, "fixed: " .. r.fixed.mean)
      assert.is_true(r.fixed.worst < 2.1) -- served quickly: 2 s is the provider's limit
      assert.is_true(r.full_jitter.total < r.fixed.total)
      assert.is_true(r.full_jitter.total < r.exponential.total)
      assert.is_true(r.exponential.total < r.fixed.total / 2) -- plain backoff cuts requests sharply
      assert.is_true(r.full_jitter.worst < r.exponential.worst)
      assert.is_true(r.full_jitter.worst < 3, "full jitter: " .. r.full_jitter.worst)
      assert.is_true(r.exponential.worst > 4 * r.full_jitter.worst) -- plain backoff is slow
    end)
  end)

  describe("the aws scenario", function()
    it("reproduces Brooker's findings: full jitter fewest calls, exponential by far the slowest", function()
      local r = rows_of(aws)
      for _, name in ipairs(PLAIN) do
        if name ~= "full_jitter" then
          assert.is_true(r.full_jitter.total < r[name].total, name)
        end
      end
      for _, row in ipairs(aws.rows) do
        if row.strategy ~= "exponential" then
          assert.is_true(r.exponential.worst > 5 * row.worst, row.strategy)
        end
      end
      assert.is_true(r.full_jitter.total < r.exponential.total / 2) -- "more than half"
      assert.is_true(r.decorrelated_jitter.total > r.equal_jitter.total)
      assert.is_true(r.equal_jitter.worst > r.full_jitter.worst)
    end)
  end)

  describe("the shared protection", function()
    it("stops retries once the core retry budget is spent: those clients give up", function()
      local budgets = {}
      local real = core.retry_budget
      core.retry_budget = function(cfg)
        local b = real(cfg)
        budgets[#budgets + 1] = b
        return b
      end
      local ok, result = pcall(sim.run, { scenario = "book", strategies = { "full_jitter+budget" } })
      core.retry_budget = real
      assert(ok, result)
      local row = result.rows[1]
      assert.equal(1, #budgets)
      local tokens, max = budgets[1]:tokens()
      assert.is_true(tokens <= max / 2)
      assert.is_true(row.gave_up > 0)
      assert.equal(row.gave_up, row.gave_up_by.budget)
      assert.equal(row.clients, row.total) -- a refused retry is never sent
    end)

    it("fails calls at once while the core breaker is open: those clients give up", function()
      local breakers = {}
      local real = core.breaker
      core.breaker = function(cfg)
        local b = real(cfg)
        breakers[#breakers + 1] = b
        return b
      end
      local ok, result = pcall(sim.run, { scenario = "book", strategies = { "full_jitter+breaker" } })
      core.breaker = real
      assert(ok, result)
      local row = result.rows[1]
      assert.equal(1, #breakers)
      local _, counts = breakers[1]:state(0)
      assert.equal(1, counts.trips)
      assert.is_true(row.gave_up > 0)
      assert.equal(row.gave_up, row.gave_up_by.breaker)
    end)

    it("holds everyone through the endpoint's cooldown, sending fewer requests than full jitter", function()
      local r = rows_of(book)
      local cd = r["full_jitter+cooldown"]
      assert.equal(0, cd.gave_up)
      assert.is_true(cd.total < r.full_jitter.total)
      local found = false
      for key, state in pairs(require("luagent.sim.model").endpoints:health()) do
        if key:match("^luagent%-sim:book:") and state.cooldown_until then found = true end
      end
      assert.is_true(found)
    end)
  end)

  describe("hosts", function()
    it("runs each guarded strategy with its guards shared between the hosts and local to each", function()
      local breakers = 0
      local real = core.breaker
      core.breaker = function(cfg)
        breakers = breakers + 1
        return real(cfg)
      end
      local ok, result = pcall(sim.run, { scenario = "book", hosts = 4,
        strategies = { "full_jitter", "full_jitter+breaker" } })
      core.breaker = real
      assert(ok, result)
      local names = {}
      for i, row in ipairs(result.rows) do names[i] = row.strategy end
      assert.same({ "full_jitter", "full_jitter+breaker:shared", "full_jitter+breaker:local" }, names)
      assert.equal(1 + 4, breakers) -- one for every host, then one per host
      assert.same({ 4, "local" }, { result.rows[3].hosts, result.rows[3].sharing })
      local text = sim.format_table(result)
      assert.matches("100 clients on 4 hosts", text)
      assert.matches("\nfull_jitter%+breaker:local +", text)
      assert.matches(",4,shared\n", sim.csv(result))
      local svg = sim.svg(result)
      check_xml(svg)
      assert.truthy(svg:find(">full_jitter+breaker:shared<", 1, true))
      -- clients arriving over time: a shared breaker stops every host's new
      -- clients once open, local ones each trip on their own
      result = sim.run { scenario = "book", hosts = 4, clients = 1000, spread = 5,
                         strategies = { "full_jitter+breaker" } }
      assert.matches("1000 clients on 4 hosts .* starting over 5 s", sim.format_table(result))
      local shared_row, local_row = result.rows[1], result.rows[2]
      assert.is_true(local_row.total > 2 * shared_row.total,
        string.format("local %d, shared %d", local_row.total, shared_row.total))
      local o, err = sim.parse_args({ "--hosts", "0" })
      assert.is_nil(o)
      assert.matches("%-%-hosts wants a whole number >= 1", err)
    end)
  end)

  describe("output", function()
    it("prints one table row per strategy with the scenario's parameters", function()
      local text = sim.format_table(book)
      assert.matches("scenario book, seed 1", text)
      assert.matches("100 clients, 5 calls per 100 ms window, 10 ms per call", text)
      local r = rows_of(book)
      assert.matches(string.format("\nfixed +%.1f +%d +%d +%d +0 ", r.fixed.mean, r.fixed.max,
        r.fixed.total, r.fixed.rejected), text)
      local lines = 0
      for _ in text:gmatch("\n") do lines = lines + 1 end
      assert.equal(4 + #book.rows, lines)
    end)

    it("writes the same data as CSV", function()
      local lines = {}
      for line in sim.csv(book):gmatch("[^\n]+") do lines[#lines + 1] = line end
      assert.equal(table.concat(sim.csv_columns, ","), lines[1])
      assert.equal(#book.rows + 1, #lines)
      local r = rows_of(book).full_jitter
      local want = string.format("book,1,full_jitter,100,5,0.1,%.3f,%d,%d,%d,%d,0,%.4f,%.4f,1,",
        r.mean, r.max, r.total, r.rejected, r.served, r.median, r.worst)
      assert.truthy(lines[4] == want, lines[4] .. " ~= " .. want)
    end)

    it("draws a well-formed SVG naming every strategy", function()
      local svg = sim.svg(aws)
      assert.matches("^<svg xmlns=\"http://www.w3.org/2000/svg\"", svg)
      check_xml(svg)
      for _, row in ipairs(aws.rows) do
        assert.truthy(svg:find(">" .. row.strategy .. "<", 1, true), row.strategy)
      end
    end)
  end)

  describe("command line", function()
    it("parses options and refuses bad ones", function()
      local opts = assert(sim.parse_args({ "--scenario", "aws", "--clients=30", "--window", "0.5",
        "--seed", "-3", "--strategies", "fixed,full_jitter" }))
      assert.are.same({ scenario = "aws", clients = 30, window = 0.5, seed = -3,
        strategies = { "fixed", "full_jitter" } }, opts)
      for _, bad in ipairs({
        { { "--clients", "0" }, "%-%-clients wants a whole number >= 1" },
        { { "--clients", "2.5" }, "%-%-clients wants a whole number" },
        { { "--window", "-1" }, "%-%-window wants a number of seconds > 0" },
        { { "--seed", "x" }, "%-%-seed wants an integer" },
        { { "--strategies", "full_jitter,nope" }, "unknown strategy 'nope'" },
        { { "--scenario", "mars" }, "unknown scenario 'mars'" },
        { { "--capacity" }, "needs a value" },
        { { "--frob" }, "unknown argument '%-%-frob'" },
      }) do
        local o, err = sim.parse_args(bad[1])
        assert.is_nil(o)
        assert.matches(bad[2], err)
      end
    end)

    it("runs from the executable, writes --csv and --svg, and explains itself", function()
      local csv, svg = os.tmpname(), os.tmpname()
      local r = h.run("sim", "--clients", "40", "--strategies", "fixed,full_jitter", "--csv", csv,
        "--svg", svg)
      assert.equal(0, r.code)
      assert.matches("40 clients", r.stdout)
      assert.matches("\nfull_jitter ", r.stdout)
      assert.is_nil(r.stdout:find("exponential", 1, true))
      assert.equal(3, select(2, h.slurp(csv):gsub("\n", "")))
      check_xml(h.slurp(svg))
      os.remove(csv)
      os.remove(svg)
      r = h.run("help", "sim")
      assert.equal(0, r.code)
      assert.equal(sim.help, r.stdout)
      r = h.run("sim", "--clients", "none")
      assert.equal(2, r.code)
      assert.matches("luagent sim: %-%-clients wants a whole number", r.stderr)
    end)
  end)
end)
