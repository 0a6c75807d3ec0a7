-- The public face of require "luagent": an explicit list of names.
local luagent = require "luagent"

describe("the luagent module", function()
  it("raises for a name it does not export, naming it", function()
    local ok, err = pcall(function() return luagent.sleeep end)
    assert.is_false(ok)
    assert.matches("no public name 'sleeep'", err)
  end)

  it("loads its lazy areas on first use and has options everywhere", function()
    assert.equal(require "luagent.http", luagent.http)
    assert.equal(require "luagent.events", luagent.events)
    assert.equal("table", type(luagent.options))
  end)

  it("does not expose the test bench through the face", function()
    assert.is_false(pcall(function() return luagent.mock end))
    assert.is_false(pcall(function() return luagent.sim end))
  end)
end)
