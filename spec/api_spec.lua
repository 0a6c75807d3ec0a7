-- The public face of require "luagent": an explicit list of names.
local luagent = require "luagent"

describe("the luagent module", function()
  it("raises for a name it does not export, naming it", function()
    local ok, err = pcall(function() return luagent.sleeep end)
    assert.is_false(ok)
    assert.matches("no public name 'sleeep'", err)
  end)

  it("loads its lazy areas on first use and has options everywhere", function()
    assert.equal(require "luagent.base.http", luagent.http)
    assert.equal(luagent.events, luagent.events) -- made once
    assert.equal("function", type(luagent.events.subscribe))
    assert.equal("table", type(luagent.options))
  end)

  it("does not expose the test bench through the face", function()
    assert.is_false(pcall(function() return luagent.mock end))
    assert.is_false(pcall(function() return luagent.sim end))
  end)
end)

-- One configuration surface: luagent.configure{...} (lua/luagent/config.lua).
describe("luagent.configure", function()
  it("sets settings, returns the previous values, and configure() reads them all", function()
    local before = luagent.configure()
    assert.equal("default", before.policy)
    local old = luagent.configure { seed = 42, policy = "yoagent" }
    assert.same({ seed = false, policy = "default" }, old)
    local now = luagent.configure()
    assert.equal(42, now.seed)
    assert.equal("yoagent", now.policy)
    luagent.configure(old)
    assert.is_nil(luagent.configure().seed)
    assert.equal("default", luagent.configure().policy)
  end)

  it("raises for an unknown setting or a bad value, naming it, and changes nothing", function()
    local ok, err = pcall(luagent.configure, { seed = 1, sede = 2 })
    assert.is_false(ok)
    assert.matches("no setting 'sede'", err)
    ok, err = pcall(luagent.configure, { seed = "x" })
    assert.is_false(ok)
    assert.matches("seed must be an integer, got 'x'", err)
    ok, err = pcall(luagent.configure, { log_level = "loud" })
    assert.is_false(ok)
    assert.matches("log_level must be debug, info, warn, error or off", err)
    assert.is_nil(luagent.configure().seed)
  end)

  it("is what luagent.options reads, and luagent.options cannot be replaced", function()
    local opts = { retry_safe = true }
    local old = luagent.configure { options = opts }
    assert.equal(opts, luagent.options)
    luagent.configure(old)
    assert.equal(old.options, luagent.options)
    local ok, err = pcall(function() luagent.options = {} end)
    assert.is_false(ok)
    assert.matches("luagent.configure{options=", err, 1, true)
  end)

  it("routes the library's lines to log_sink at log_level", function()
    local lines = {}
    local old = luagent.configure { log_sink = function(level, line) lines[#lines + 1] = level .. " " .. line end,
                                    log_level = "info" }
    luagent.log.write("info", "hello")
    luagent.log.write("debug", "hidden")
    luagent.configure(old)
    assert.equal(1, #lines)
    assert.matches('^info {.*"level":"info","msg":"hello"}$', lines[1])
    assert.equal(old.log_level, luagent.log.level())
  end)

  it("points providers made without a base URL at the configured ones", function()
    local old = luagent.configure { providers = { base_urls = { anthropic = "http://127.0.0.1:9/x" }, api_key = "k" } }
    local p = luagent.provider("anthropic/claude")
    luagent.configure(old)
    assert.equal("http://127.0.0.1:9/x", p.base_url)
    -- (a key given: without one, a provider for the public URL raises)
    local base = os.getenv("ANTHROPIC_BASE_URL")
    assert.equal(base and require("luagent.model.provider").base_url(p.adapter, base) or "https://api.anthropic.com/v1",
      luagent.provider({ kind = "anthropic", model = "claude", api_key = "k" }).base_url)
  end)
end)
