-- The one key scrubber (lua/luagent/secrets.lua): every form of a key,
-- the end of a text that may start a key, and cutting a body so that no
-- prefix of a key survives.
local secrets = require "luagent.secrets"
local json = require "luagent.json"

-- A key no other spec registers (the registry lasts the whole process).
local KEY = 'sk-UNIT/scrub+0123"x'

describe("secrets", function()
  setup(function() secrets.register(KEY) end)

  it("replaces the key in its plain, percent-encoded and JSON-escaped forms", function()
    local pct = KEY:gsub("[^%w%-%._~]", function(c) return string.format("%%%02X", c:byte()) end)
    for _, text in ipairs({ KEY, pct, pct:lower(), json.encode(KEY), (json.encode(KEY):gsub("/", "\\/")) }) do
      local out = secrets.text("a " .. text .. " b")
      assert.is_nil(out:find("UNIT", 1, true), out)
    end
    assert.equal("a *** b", secrets.text("a " .. KEY .. " b"))
  end)

  it("ignores keys shorter than MIN_LENGTH", function()
    secrets.register("abcd")
    assert.equal("abcd", secrets.text("abcd"))
    secrets.register("sk-1234") -- 7 characters: a secret
    assert.equal("key ***", secrets.text("key sk-1234"))
  end)

  it("measures the end of a text that may be the start of a key", function()
    assert.equal(0, secrets.tail("nothing here"))
    assert.equal(#"sk-UNIT/", secrets.tail("the key sk-UNIT/"))
    assert.equal(0, secrets.tail("the key " .. KEY)) -- a whole key is no start
  end)

  it("cuts a body without leaving a prefix of a key, however many keys came before", function()
    local max = 1000
    -- many whole keys shrink to *** and pull the text after them forward:
    -- a key cut at the end of what was read must not slide into the kept part
    local limit = max + secrets.margin
    local body = string.rep(KEY, 40) .. string.rep("x", limit - 4 - 40 * #KEY) .. KEY
    local read = body:sub(1, limit)
    assert.equal("sk-U", read:sub(-4)) -- the read ends inside a key
    local out = secrets.cut(read, max, true)
    assert.is_true(#out <= max)
    assert.is_nil(out:find("sk-U", 1, true), out)
    assert.equal(string.rep("***", 40), out:sub(1, 120))
  end)
end)
