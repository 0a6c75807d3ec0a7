-- The observers' JSON writer in C (host/jsonw.c): json.quote, log lines'
-- objects (core.json_fields) and OTLP spans (core.otlp_span), checked
-- against a plain Lua statement of the same rules over random and hostile
-- input (invalid UTF-8, control bytes, surrogates, non-finite numbers).
local core = require "luagent.core"
local json = require "luagent.base.json"
local cjson = require "cjson"

-- The rules in Lua: every byte that does not start a valid UTF-8
-- sequence becomes U+FFFD, then '"', '\\' and control bytes are escaped.
local SHORT = { ['"'] = '\\"', ["\\"] = "\\\\", ["\b"] = "\\b", ["\f"] = "\\f",
  ["\n"] = "\\n", ["\r"] = "\\r", ["\t"] = "\\t" }
local function reference_quote(s)
  s = json.clean_utf8(s)
  return '"' .. s:gsub('[%c"\\]', function(c) return SHORT[c] or string.format("\\u%04x", c:byte()) end) .. '"'
end

local PIECES = { "a", "Z", " ", '"', "\\", "\n", "\t", "\r", "\b", "\f", "\0", "\127", "\31", "é", "€", "😀",
  "\u{10FFFF}", "\xF4\x90\x80\x80", "\xED\xA0\x80", "\xC0\xAF", "\xE0\x80\x80", "\x80", "\xFF", "\xE2\x82", "/",
  -- runs long enough for the writer's 8-bytes-at-once path, and a DEL or a
  -- quote at each place of a word
  "abcdefgh", "0123456789abcdef~", "abc\127defgh", "abcdefg\"", "~}|{zyxw", "ABCDEF\0G" }

local function random_string(rng)
  local parts = {}
  for i = 1, rng(0, 12) do parts[i] = PIECES[rng(#PIECES)] end
  return table.concat(parts)
end

describe("json.quote (C)", function()
  it("writes what the Lua rules write, for 20,000 random strings of hostile pieces", function()
    local rng = math.random
    math.randomseed(20261130)
    for _ = 1, 20000 do
      local s = random_string(rng)
      assert.equal(reference_quote(s), json.quote(s))
    end
  end)

  it("gives valid UTF-8 that decodes back to the cleaned text", function()
    local s = "ok \xFF\xED\xA0\x80 \"q\" \0 end"
    local q = json.quote(s)
    assert.truthy(utf8.len(q))
    assert.equal(json.clean_utf8(s), cjson.decode(q))
  end)
end)

describe("core.json_fields (log lines)", function()
  local function encode(v) return json.encode(v, { nonfinite = "null" }) end

  it("puts the head keys first, in order, then the others sorted", function()
    local line = core.json_fields({ msg = "hi", level = "info", z = 1, a = true, list = { 1, 2 }, time = "T",
      [3] = "not a string key" }, { "time", "level", "agent", "msg" }, encode)
    assert.equal('{"time":"T","level":"info","msg":"hi","a":true,"list":[1,2],"z":1}', line)
  end)

  it("writes durations (whole microseconds) as json.encode does, for 20,000 of them and the edges", function()
    math.randomseed(7)
    local xs = { 1e-4, 0.0001, 0.000099, 0.5, 1.0, 1.5, 10.25, 999999999.999999, 1e9, 123.000001, 0.001, 0.1 + 0.2 }
    for _ = 1, 20000 do
      local k = math.random(0, 1000000000)
      xs[#xs + 1] = k / 1e6
      xs[#xs + 1] = math.random(100, 10 ^ 15) / 1e6
    end
    for _, x in ipairs(xs) do
      assert.equal('{"v":' .. encode(x) .. "}", core.json_fields({ v = x }, {}, encode))
    end
  end)

  it("writes numbers as json.encode does: integers exactly, floats shortest, non-finite as null", function()
    for _, x in ipairs({ 0, -1, 1.5, 0.1, 1e300, -1e-300, 2 ^ 53, 2 ^ 63, 3.0, 123456789.123456789,
                         math.mininteger, math.maxinteger, math.huge, -math.huge, 0 / 0 }) do
      local want = math.type(x) == "integer" and tostring(x) or encode(x)
      assert.equal('{"v":' .. want .. "}", core.json_fields({ v = x }, {}, encode))
    end
  end)

  it("hands other values to the encoder and reports one that returns no string", function()
    assert.equal('{"f":"ENC"}', core.json_fields({ f = {} }, {}, function() return '"ENC"' end))
    assert.has_error(function() core.json_fields({ f = {} }, {}, function() return 1 end) end,
      "json_fields: the encoder returned no string")
  end)

  it("takes head keys that are strings only", function()
    assert.has_error(function() core.json_fields({ x = 1 }, { "x", 12 }, encode) end,
      "json_fields: head[2] is not a string")
  end)

  it("writes an empty table as {} and many fields in order", function()
    assert.equal("{}", core.json_fields({}, { "a" }, encode))
    local t, want = {}, {}
    for i = 1, 300 do t[("k%03d"):format(i)] = i end
    for i = 1, 300 do want[i] = ('"k%03d":%d'):format(i, i) end
    assert.equal("{" .. table.concat(want, ",") .. "}", core.json_fields(t, {}, encode))
  end)

  it("finds head keys among many (a long name too) and keeps every string alive while the encoder runs", function()
    local long = string.rep("h", 50)
    local t = { time = "T", [long] = "L" }
    for i = 1, 150 do t[("k%03d"):format(i)] = i % 7 == 0 and { i } or ("v" .. i) end
    -- what it must write: the head names present, in order, then the rest sorted
    local head = { "time", string.rep("h", 25) .. string.rep("h", 25), "absent" }
    local want = { '"time":"T"', '"' .. long .. '":"L"' }
    for i = 1, 150 do
      want[#want + 1] = ('"k%03d":%s'):format(i, i % 7 == 0 and ("[" .. i .. "]") or ('"v' .. i .. '"'))
    end
    -- an encoder that empties the table and collects: the strings read
    -- from it must still be there
    local function emptying(v)
      for k in pairs(t) do t[k] = nil end
      collectgarbage()
      return encode(v)
    end
    assert.equal("{" .. table.concat(want, ",") .. "}", core.json_fields(t, head, emptying))
  end)

  it("empties the table's string keys as it reads them when asked (the same text)", function()
    local function record() return { time = "T", level = "info", msg = "m", b = 2, a = { 1 }, [1] = "kept" } end
    local want = core.json_fields(record(), { "time", "level", "msg" }, encode)
    local t = record()
    assert.equal(want, core.json_fields(t, { "time", "level", "msg" }, encode, true))
    assert.same({ [1] = "kept" }, t)
  end)

  it("takes at most 32 head names", function()
    local head = {}
    for i = 1, 33 do head[i] = "h" .. i end
    assert.has_error(function() core.json_fields({}, head, encode) end, "json_fields: head holds more than 32 names")
  end)
end)

describe("core.otlp_span", function()
  -- a span as trace.lua makes one: attributes as a list of names and values
  local function span(attrs, keys, extra)
    local list = {}
    for i, k in ipairs(keys) do list[2 * i - 1], list[2 * i] = k, attrs[k] end
    local s = { trace_id = string.rep("a", 32), span_id = string.rep("b", 16), name = "chat \"m\"\xFF",
      kind = 3, start = 10.25, stop = 11.5, status = 2, status_message = "boom", attrs = list, nattrs = 2 * #keys,
      parent = { span_id = string.rep("c", 16) } }
    for k, v in pairs(extra or {}) do s[k] = v end
    return s
  end

  it("writes ids, parent, name, kind, times, attributes in order (a nil one left out) and the status", function()
    local attrs = { s = "x\ny", i = 42, f = 2.5, whole = 7.0, big = 2 ^ 60, t = true, no = false,
      list = { "stop", 1, { "deep" } }, inf = math.huge }
    local keys = { "s", "i", "f", "whole", "big", "t", "no", "list", "inf", "missing" }
    local d = cjson.decode(core.otlp_span(span(attrs, keys), 1000))
    assert.equal(string.rep("a", 32), d.traceId)
    assert.equal(string.rep("b", 16), d.spanId)
    assert.equal(string.rep("c", 16), d.parentSpanId)
    assert.equal('chat "m"\u{FFFD}', d.name)
    assert.equal(3, d.kind)
    assert.equal("1010250000000", d.startTimeUnixNano)
    assert.equal("1011500000000", d.endTimeUnixNano)
    assert.same({ code = 2, message = "boom" }, d.status)
    local got = {}
    for i, kv in ipairs(d.attributes) do got[i] = kv.key end
    assert.same({ "s", "i", "f", "whole", "big", "t", "no", "list", "inf" }, got)
    local v = {}
    for _, kv in ipairs(d.attributes) do v[kv.key] = kv.value end
    assert.same({ stringValue = "x\ny" }, v.s)
    assert.same({ intValue = "42" }, v.i)
    assert.same({ doubleValue = 2.5 }, v.f)
    assert.same({ intValue = "7" }, v.whole)
    assert.same({ doubleValue = 2 ^ 60 }, v.big) -- past 2^53: not exact as an integer
    assert.same({ boolValue = true }, v.t)
    assert.same({ boolValue = false }, v.no)
    assert.same({ arrayValue = { values = { { stringValue = "stop" }, { intValue = "1" },
      { arrayValue = { values = { { stringValue = "deep" } } } } } } }, v.list)
    assert.same({ stringValue = "inf" }, v.inf)
  end)

  it("leaves out parentSpanId and the message when there are none; stop defaults to start", function()
    local s = span({}, {}, { parent = false, status_message = false, stop = false })
    local d = cjson.decode(core.otlp_span(s, 0))
    assert.is_nil(d.parentSpanId)
    assert.same({ code = 2 }, d.status)
    assert.equal(d.startTimeUnixNano, d.endTimeUnixNano)
    assert.same({}, d.attributes)
  end)

  it("writes attributes nested to the bound inside a task (a coroutine's small stack)", function()
    local deep = { "leaf" }
    for _ = 1, 30 do deep = { deep } end
    local text = coroutine.wrap(function() return core.otlp_span(span({ d = deep }, { "d" }), 0) end)()
    local v = cjson.decode(text).attributes[1].value
    for _ = 1, 31 do v = v.arrayValue.values[1] end
    assert.same({ stringValue = "leaf" }, v)
  end)

  it("refuses what is not a span, and an attribute nested past the bound", function()
    assert.has_error(function() core.otlp_span({}, 0) end, "otlp_span: not a span (trace_id, span_id, name, attrs)")
    local bad = span({}, {})
    bad.attrs, bad.nattrs = { "ok", 1, 42, "x" }, 4
    assert.has_error(function() core.otlp_span(bad, 0) end, "otlp_span: attribute name 3 is not a string")
    local deep = {}
    local t = deep
    for _ = 1, 40 do t[1] = {} t = t[1] end
    assert.has_error(function() core.otlp_span(span({ d = deep }, { "d" }), 0) end,
      "otlp_span: an attribute nests deeper than 32")
  end)
end)

describe("core.otlp_traces", function()
  local function node(id, parent)
    local s = { trace_id = string.rep("a", 32), span_id = id, name = "span " .. id, kind = 1, start = 1,
      stop = 2, status = 0, attrs = { "n", id }, nattrs = 2, parent = parent, children = {} }
    if parent then parent.children[#parent.children + 1] = s end
    return s
  end

  it("writes a tree's spans in one text, parents before children, and counts them", function()
    local root = node("0000000000000001")
    local a = node("000000000000000a", root)
    local b = node("000000000000000b", root)
    local a1 = node("00000000000000a1", a)
    local text, n = core.otlp_traces({ root }, 0)
    assert.equal(4, n)
    local spans = cjson.decode("[" .. text .. "]")
    local ids = {}
    for i, d in ipairs(spans) do ids[i] = d.spanId end
    assert.same({ root.span_id, a.span_id, b.span_id, a1.span_id }, ids)
    -- each one exactly as otlp_span writes it alone
    for i, s in ipairs({ root, a, b, a1 }) do assert.same(cjson.decode(core.otlp_span(s, 0)), spans[i]) end
    assert.equal(a.span_id, spans[4].parentSpanId)
  end)

  it("writes the trees of a list one after the other, and refuses a root that is no span", function()
    local r1, r2 = node("0000000000000001"), node("0000000000000002")
    local c1, c2 = node("00000000000000c1", r1), node("00000000000000c2", r2)
    local text, n = core.otlp_traces({ r1, r2 }, 0)
    assert.equal(4, n)
    local ids = {}
    for i, d in ipairs(cjson.decode("[" .. text .. "]")) do ids[i] = d.spanId end
    assert.same({ r1.span_id, c1.span_id, r2.span_id, c2.span_id }, ids)
    assert.same({ "", 0 }, { core.otlp_traces({}, 0) })
    assert.has_error(function() core.otlp_traces({ r1, "x" }, 0) end, "otlp_traces: roots[2] is not a span")
  end)

  it("writes a lone span (no children list) as otlp_span does, inside a task too", function()
    local s = node("0000000000000001")
    s.children = nil
    local text, n = coroutine.wrap(function() return core.otlp_traces({ s }, 5) end)()
    assert.equal(1, n)
    assert.equal(core.otlp_span(s, 5), text)
  end)

  it("writes a wide tree (a root with 50 children) inside a task", function()
    local root = node("0000000000000001")
    for i = 1, 50 do node(string.format("%016x", 100 + i), root) end
    local text, n = coroutine.wrap(function() return core.otlp_traces({ root }, 0) end)()
    assert.equal(51, n)
    assert.equal(51, #cjson.decode("[" .. text .. "]"))
  end)

  it("refuses an attribute count that is no count, and writes no time for a start that is none", function()
    local s = node("0000000000000001")
    s.nattrs = 0 / 0
    assert.has_error(function() core.otlp_span(s, 0) end, "otlp_span: a span's nattrs must be an integer")
    s.nattrs = -2
    assert.has_error(function() core.otlp_span(s, 0) end, "otlp_span: nattrs must be a count up to 1048576")
    s.nattrs, s.start, s.stop = 2, 0 / 0, math.huge
    local d = cjson.decode(core.otlp_span(s, 0))
    assert.equal("0", d.startTimeUnixNano)
    assert.equal("0", d.endTimeUnixNano)
  end)

  it("raises for a child that is not a span, naming what is wrong", function()
    local root = node("0000000000000001")
    root.children[1] = { name = "x" }
    assert.has_error(function() core.otlp_traces({ root }, 0) end, "otlp_span: not a span (trace_id, span_id, name, attrs)")
  end)
end)
