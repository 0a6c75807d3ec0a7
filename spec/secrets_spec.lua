-- The one key scrubber (lua/luagent/base/secrets.lua): every form of a key,
-- the end of a text that may start a key, and cutting a body so that no
-- prefix of a key survives.
local secrets = require "luagent.base.secrets"
local json = require "luagent.base.json"

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
  -- The scrubber is C (host/scrub.c); this is the rule it keeps, in Lua:
  -- forms longest first, each gsub'd in the text the ones before it left,
  -- and the longest end of a text that starts a form without being one.
  local function ref_text(forms, s)
    for _, f in ipairs(forms) do s = s:gsub(f:gsub("%p", "%%%0"), "***") end
    return s
  end
  local function ref_tail(forms, s)
    local best = 0
    for _, f in ipairs(forms) do
      for i = math.max(1, #s - #f + 2), #s do
        if #s - i + 1 > best and s:sub(i) == f:sub(1, #s - i + 1) then best = #s - i + 1 end
      end
    end
    return best
  end

  it("scrubs, measures held ends and splits deltas as the Lua rule does, on random text", function()
    local core = require "luagent.core"
    local forms = { "sk-ab/cd+ef", "sk-ab%2Fcd", "sk-ab\\/cd", "ab/cd", "cdsk-" }
    table.sort(forms, function(a, b) return #a > #b end)
    local sc = core.scrubber()
    for _, f in ipairs(forms) do sc:add(f) end
    local bits = { "s", "k", "-", "a", "b", "/", "c", "d", "+", "e", "f", "%2F", "\\", "x", "*" }
    for _, f in ipairs(forms) do bits[#bits + 1] = f; bits[#bits + 1] = f:sub(1, 3) end
    local rng = 12345
    local function rand(n) rng = (rng * 1103515245 + 12345) % 2147483648; return rng % n + 1 end
    local function text()
      local t = {}
      for i = 1, rand(12) - 1 do t[i] = bits[rand(#bits)] end
      return table.concat(t)
    end
    for _ = 1, 3000 do
      local held, s = rand(3) == 1 and text() or nil, text()
      assert.equal(ref_text(forms, s), sc:text(s))
      assert.equal(ref_tail(forms, s), sc:tail(s))
      local whole = ref_text(forms, (held or "") .. s)
      local n = ref_tail(forms, whole)
      local got, tail = sc:delta(held, s)
      assert.equal(whole:sub(1, #whole - n), got)
      assert.equal(n > 0 and whole:sub(-n) or nil, tail)
    end
    assert.has_error(function() sc:add("ab") end)
  end)

  it("holds a key's start back across deltas and releases plain text at once", function()
    local text, tail = secrets.delta(nil, "the key is sk-UN")
    assert.equal("the key is ", text)
    assert.equal("sk-UN", tail)
    text, tail = secrets.delta(tail, 'IT/scrub+0123"x, said')
    assert.equal("***, said", text .. (tail or ""))
    assert.is_nil(text:find("UNIT", 1, true))
  end)
end)

describe("credentials of URLs and headers", function()
  it("takes a URL's user info and the values of its credential query parameters, not the others", function()
    secrets.register_url("https://tok-user-77:pa%2Fss-word-88@mcp.example.com/mcp?key=query-key-99"
      .. "&format=plainvalue&access_token=tok%2Bplus-66#frag")
    assert.equal("https://***:***@mcp.example.com/mcp?key=***&format=plainvalue&access_token=***#frag",
      secrets.text("https://tok-user-77:pa%2Fss-word-88@mcp.example.com/mcp?key=query-key-99"
        .. "&format=plainvalue&access_token=tok%2Bplus-66#frag"))
    -- decoded too: a server that echoes the value unencoded
    assert.equal("*** and ***", secrets.text("pa/ss-word-88 and tok+plus-66"))
    assert.equal("plainvalue", secrets.text("plainvalue"))
    secrets.register_url(nil) -- ignored
  end)

  it("takes the values of credential headers and variables, and the token after an auth scheme", function()
    secrets.register_credential("Authorization", "Bearer header-token-55")
    secrets.register_credential("X-Api-Key", "header-key-44")
    secrets.register_credential("Accept", "application/x-unit-type")
    assert.equal("*** *** ***", secrets.text("header-token-55 header-key-44 Bearer header-token-55"))
    assert.equal("application/x-unit-type", secrets.text("application/x-unit-type"))
    secrets.register_credential("GITHUB_TOKEN", "env-token-33")
    secrets.register_credential("LANG", "C.unit-locale")
    secrets.register_url("http://x/?design=unit-modern&accessToken=camel-token-22")
    assert.equal("*** C.unit-locale unit-modern ***",
      secrets.text("env-token-33 C.unit-locale unit-modern camel-token-22"))
  end)
end)

describe("the C scrubber (host/scrub.c)", function()
  it("raises when used after close, rather than let a key through", function()
    local core = require "luagent.core"
    local s = core.scrubber()
    s:add("sk-secret-key")
    local delta = s:delta_function()
    assert.equal("x *** y", s:text("x sk-secret-key y"))
    getmetatable(s).__close(s)
    assert.has_error(function() s:text("x sk-secret-key y") end, "scrubber: used after close")
    assert.has_error(function() delta(nil, "x sk-secret-key y") end, "scrubber: used after close")
  end)
end)
