-- The shipped compaction strategy (lua/luagent/model/compact.lua): which messages
-- go, which stay, and that a tool call never loses its result.
local compact = require "luagent.model.compact"

local function U(text) return { role = "user", content = text } end
local function A(text) return { role = "assistant", content = text } end
local function S(text) return { role = "system", content = text } end
local function call(id) return { role = "assistant", content = "", tool_calls = { { id = id, name = "t", arguments = {} } } } end
local function result(id) return { role = "tool", tool_call_id = id, name = "t", content = "r" .. id } end

-- "role:content" of each message, joined, for readable comparisons.
local function show(list)
  local out = {}
  for _, m in ipairs(list) do
    out[#out + 1] = m.role .. ":" .. (m.tool_call_id or (m.tool_calls and m.tool_calls[1].id) or m.content)
  end
  return table.concat(out, " ")
end

describe("compact.drop_oldest", function()
  it("drops the oldest half of what may go, keeping the system prompt and the last two", function()
    local msgs = { S("sys"), U("1"), A("2"), U("3"), A("4"), U("5"), A("6") }
    local out, dropped = compact.drop_oldest(msgs)
    assert.equal("system:sys user:3 assistant:4 user:5 assistant:6", show(out))
    assert.equal(2, dropped)
    assert.equal(7, #msgs) -- the list it was given is untouched
  end)

  it("keeps a tool call and its results together", function()
    local msgs = { U("task"), call("c1"), result("c1"), call("c2"), result("c2"), A("done"), U("next") }
    -- units: task | c1+result | c2+result | done | next: 3 may go, half
    -- of them (2) do, then c2 too so that no assistant message opens
    local out, dropped = compact.drop_oldest(msgs)
    assert.equal(5, dropped)
    assert.equal("user:" .. compact.marker .. " assistant:done user:next", show(out))
    out = compact.drop_oldest(msgs, { fraction = 0.1 }) -- one unit, then the assistant ones that may go
    assert.equal("user:" .. compact.marker .. " assistant:done user:next", show(out))
    out = compact.drop_oldest(msgs, { fraction = 0.1, keep_last = 4 })
    assert.equal("user:" .. compact.marker .. " assistant:c1 tool:c1 assistant:c2 tool:c2 assistant:done user:next", show(out))
    for i, m in ipairs(out) do
      if m.role == "tool" then assert.equal(m.tool_call_id, out[i - 1].tool_calls[1].id) end
    end
  end)

  it("opens with a user message: the marker when an assistant message would come first", function()
    local out = compact.drop_oldest({ S("s"), U("1"), A("2"), A("3"), U("4") }, { fraction = 0.1, keep_last = 1 })
    assert.equal("system:s user:4", show(out)) -- the assistant replies after the cut go too
    out = compact.drop_oldest({ S("s"), U("1"), A("2"), A("3"), U("4") }, { fraction = 0.1, keep_last = 3 })
    assert.equal("system:s user:" .. compact.marker .. " assistant:2 assistant:3 user:4", show(out))
  end)

  it("keeps the first request with keep_first", function()
    local out = compact.drop_oldest({ U("task"), A("a"), U("b"), A("c"), U("d") }, { keep_first = 1, fraction = 1 })
    assert.equal("user:task assistant:c user:d", show(out))
  end)

  it("returns nil when nothing may go", function()
    assert.is_nil(compact.drop_oldest({ S("s"), U("1"), A("2") }))
    assert.is_nil(compact.drop_oldest({}))
    assert.is_nil(compact.drop_oldest({ U("1"), call("c"), result("c") }, { keep_last = 1, keep_first = 1 }))
  end)

  it("names a bad option", function()
    assert.has_error(function() compact.drop_oldest({}, { fraction = 2 }) end,
      "compact: opts.fraction must be a number from 0 to 1 (got 2)")
    assert.has_error(function() compact.drop_oldest({}, { keep_last = 1.5 }) end)
    assert.has_error(function() compact.drop_oldest("x") end, "compact.drop_oldest: messages must be a list")
  end)

  it("is a hook by name", function()
    local hook = compact.hook("drop_oldest", { keep_last = 1 })
    local out = hook { request = { messages = { U("1"), A("2"), U("3") } } }
    assert.equal("user:3", show(out))
    assert.equal("user:3 assistant:4", show(compact.hook("drop_oldest")({ messages = { U("1"), A("2"), U("3"), A("4") } })))
    assert.has_error(function() compact.hook("nope") end, "compact.hook: no strategy named 'nope'")
  end)
end)
