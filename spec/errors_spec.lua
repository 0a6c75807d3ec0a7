-- Error records have one owner in C (host/errors.c): one metatable and one
-- "kind: message" for records made in C and in Lua, and every kind the core
-- can make is in errors.kinds and documented in EVENTS.md.
local core = require "luagent.core"
local errors = require "luagent.base.errors"
local luagent = require "luagent"

-- The kinds of EVENTS.md's "Error records" table.
local function documented_kinds()
  local f = assert(io.open("lua/luagent/EVENTS.md"))
  local text = f:read("a")
  f:close()
  local section = assert(text:match("## Error records\n(.-)\n##"), "EVENTS.md has an Error records section")
  local kinds = {}
  for kind in section:gmatch("\n| ([%w_]+) |") do kinds[kind] = true end
  return kinds
end

describe("error records", function()
  it("every kind the core can make is in errors.kinds and in EVENTS.md", function()
    assert.is_table(core.error_kinds)
    assert.is_true(#core.error_kinds >= 8)
    local documented = documented_kinds()
    for _, kind in ipairs(core.error_kinds) do
      assert.is_true(errors.kinds[kind], kind .. " is not in errors.kinds")
      assert.is_true(documented[kind], kind .. " is not documented in EVENTS.md")
    end
  end)

  it("records made in C and in Lua share the core's metatable and its C __tostring", function()
    local mt = core.error_metatable
    assert.equal(mt, errors.metatable)
    assert.equal("luagent.Error", mt.__name)
    assert.equal("C", debug.getinfo(mt.__tostring, "S").what)
    local lua_made = errors.new("usage", "bad flag --x")
    assert.equal(mt, getmetatable(lua_made))
    assert.equal("usage: bad flag --x", tostring(lua_made))
    -- C records from several bindings: a TCP connect, a child process, a cancel
    local probe = assert(core.tcp_listen("127.0.0.1", 0))
    local _, port = probe:address()
    probe:close()
    local conn, cerr = core.tcp_connect("127.0.0.1", port)
    assert.is_nil(conn)
    assert.equal(mt, getmetatable(cerr))
    assert.equal("refused: " .. cerr.message, tostring(cerr))
    local p, perr = core.process_spawn({ "/nonexistent/luagent-tool" })
    assert.is_nil(p)
    assert.equal(mt, getmetatable(perr))
    assert.equal("process: " .. perr.message, tostring(perr))
    local t = luagent.spawn(function() luagent.sleep(10) end)
    luagent.spawn(function() t:cancel() end)
    local ok, jerr = pcall(t.join, t)
    assert.is_false(ok)
    assert.equal(mt, getmetatable(jerr))
    assert.equal("cancelled", jerr.kind)
    -- any message prints as tostring would, a number or nil included
    assert.equal("timeout: 5", tostring(errors.new("timeout", 5)))
    local rec = setmetatable({ kind = "transport" }, core.error_metatable)
    assert.equal("transport: nil", tostring(rec))
  end)
end)
