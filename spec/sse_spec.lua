-- The SSE parser through its Lua binding (host/sse.c, host/sse_lua.c):
-- WHATWG event-stream rules, any split of the input, limits and errors.
local core = require "luagent.core"

local FIXTURES = "spec/fixtures/sse/"

local function read_fixture(name)
  local f = assert(io.open(FIXTURES .. name, "rb"))
  local s = f:read("a")
  f:close()
  return s
end

-- Feeds `chunks` in order; returns every event, and the first error (the
-- events that feed completed before it included, as the binding promises).
local function feed_chunks(chunks, opts)
  local p = core.sse_parser(opts)
  local all = {}
  for _, chunk in ipairs(chunks) do
    local evs, err = p:feed(chunk)
    if not evs then
      for _, ev in ipairs(err.events) do all[#all + 1] = ev end
      return all, err, p
    end
    for _, ev in ipairs(evs) do all[#all + 1] = ev end
  end
  return all, nil, p
end

local function one_shot(s, opts) return feed_chunks({s}, opts) end

local function bytes(s)
  local t = {}
  for i = 1, #s do t[i] = s:sub(i, i) end
  return t
end

-- Splits `s` at random positions (seeded), with some empty chunks.
local function random_chunks(s, seed)
  math.randomseed(seed)
  local t, i = {}, 1
  while i <= #s do
    local n = math.random(0, 9)
    t[#t + 1] = s:sub(i, i + n - 1)
    i = i + n
  end
  return t
end

local function ev(event, data, id, retry)
  return {event = event, data = data, id = id, retry = retry}
end

describe("sse parser", function()
  describe("line ends", function()
    local lf = "event: a\ndata: 1\ndata: 2\n\ndata: 3\n\n"
    local want = {ev("a", "1\n2"), ev("message", "3")}

    it("accepts LF, CRLF and lone CR alike", function()
      assert.same(want, (one_shot(lf)))
      assert.same(want, (one_shot((lf:gsub("\n", "\r\n")))))
      assert.same(want, (one_shot((lf:gsub("\n", "\r")))))
    end)

    it("accepts mixed line ends in one stream", function()
      assert.same(want, (one_shot("event: a\r\ndata: 1\rdata: 2\n\r\ndata: 3\r\r")))
    end)

    it("treats CR at the end of a feed and LF at the start of the next as one line end", function()
      assert.same({ev("message", "a\nb")},
        (feed_chunks({"data: a\r", "\ndata: b\r", "\n\r", "\n"})))
      -- two lone CRs split the same way are a blank line: a dispatch
      assert.same({ev("message", "a"), ev("message", "b")},
        (feed_chunks({"data: a\r", "\r", "data: b\r", "\r"})))
    end)

    it("keeps the pending CR across empty feeds", function()
      assert.same({ev("message", "a\nb")},
        (feed_chunks({"data: a\r", "", "", "\ndata: b\n", "", "\n"})))
    end)
  end)

  describe("byte order mark", function()
    it("skips a leading UTF-8 BOM, even split byte by byte", function()
      local s = "\239\187\191data: x\n\n"
      assert.same({ev("message", "x")}, (one_shot(s)))
      assert.same({ev("message", "x")}, (feed_chunks(bytes(s))))
    end)

    it("skips only one BOM, only at the very start", function()
      -- the second BOM belongs to the field name, which is then unknown
      local s = "\239\187\191\239\187\191data: x\n\ndata: y\n\n\239\187\191data: z\n\n"
      assert.same({ev("message", "y")}, (one_shot(s)))
      assert.same({ev("message", "y")}, (feed_chunks(bytes(s))))
    end)

    it("keeps a BOM prefix that is not a BOM as ordinary bytes", function()
      -- "\239\187" + "abc" is a 5-byte line: with max_line 4 it fails at 4
      local opts = {max_line = 4}
      local _, err = feed_chunks({"\239", "\187", "abc\n"}, opts)
      assert.equal(4, err.offset)
      local _, err2 = one_shot("\239\187abc\n", opts)
      assert.equal(4, err2.offset)
      -- and they shift later lines: "data: 1" starts at 3 and fails at 3 + 4
      local _, err3 = feed_chunks({"\239", "\187", "\ndata: 1\n"}, opts)
      assert.equal(7, err3.offset)
    end)

    it("reports a pending BOM prefix as partial", function()
      local p = core.sse_parser()
      assert.same({}, p:feed("\239\187"))
      assert.is_true(p:has_partial())
      assert.same({}, p:feed("\191"))
      assert.is_false(p:has_partial())
    end)
  end)

  describe("fields", function()
    it("ignores comment lines", function()
      assert.same({ev("message", "a")},
        (one_shot(": hello\n:\ndata: a\n: inside\n\n: only a comment\n\n")))
    end)

    it("joins several data lines with LF", function()
      assert.same({ev("message", "a\n\nb")}, (one_shot("data: a\ndata\ndata: b\n\n")))
    end)

    it("dispatches an event whose only data line is empty", function()
      assert.same({ev("message", "")}, (one_shot("data\n\n")))
      assert.same({ev("message", "")}, (one_shot("data:\n\n")))
    end)

    it("strips exactly one space after the colon", function()
      assert.same({ev("message", "x"), ev("message", " x"), ev("message", "x ")},
        (one_shot("data:x\n\ndata:  x\n\ndata: x \n\n")))
    end)

    it("splits at the first colon only", function()
      assert.same({ev("message", "a: b:c")}, (one_shot("data: a: b:c\n\n")))
    end)

    it("treats a line without a colon as a field with an empty value", function()
      assert.same({ev("message", "")}, (one_shot("event\ndata\n\n")))
    end)

    it("ignores unknown and wrongly cased field names", function()
      assert.same({ev("message", "a")}, (one_shot("Data: no\nfoo: bar\ndata: a\nEVENT: x\n\n")))
    end)

    it("sets the event type, defaults to message and resets it after each dispatch", function()
      assert.same({ev("x", "1"), ev("message", "2"), ev("message", "3")},
        (one_shot("event: x\ndata: 1\n\ndata: 2\n\nevent:\ndata: 3\n\n")))
    end)

    it("dispatches nothing for a blank line without data, but resets the event type", function()
      assert.same({ev("message", "a")}, (one_shot("event: x\n\n\n\ndata: a\n\n")))
    end)

    it("keeps the last event id across events until it changes", function()
      assert.same({ev("message", "1", "7"), ev("message", "2", "7"), ev("message", "3", "8")},
        (one_shot("id: 7\ndata: 1\n\ndata: 2\n\ndata: 3\nid: 8\n\n")))
    end)

    it("keeps an id set in a block that dispatched nothing", function()
      assert.same({ev("message", "a", "5")}, (one_shot("id: 5\n\ndata: a\n\n")))
    end)

    it("clears the id with an empty id field", function()
      assert.same({ev("message", "1", "7"), ev("message", "2")},
        (one_shot("id: 7\ndata: 1\n\nid\ndata: 2\n\n")))
    end)

    it("ignores an id containing NUL", function()
      assert.same({ev("message", "1", "7"), ev("message", "2", "7")},
        (one_shot("id: 7\ndata: 1\n\nid: 8\0009\ndata: 2\n\n")))
    end)

    it("takes retry only when it is all ASCII digits, once, with the next event", function()
      assert.same({ev("message", "1", nil, 3000), ev("message", "2"), ev("message", "3"),
                   ev("message", "4", nil, 0)},
        (one_shot("retry: 3000\ndata: 1\n\ndata: 2\n\nretry: 12a\nretry: -1\nretry: \n"
          .. "retry: 1.5\ndata: 3\n\nretry: 0\ndata: 4\n\n")))
    end)

    it("carries a retry-only block over to the next event", function()
      assert.same({ev("message", "a", nil, 10)}, (one_shot("retry: 10\n\ndata: a\n\n")))
    end)

    it("keeps NUL bytes and non-UTF-8 bytes of data as they are", function()
      assert.same({ev("message", "a\0b\255")}, (one_shot("data: a\0b\255\n\n")))
    end)
  end)

  describe("end of stream", function()
    it("does not dispatch a partial event and reports it", function()
      local p = core.sse_parser()
      assert.same({}, p:feed("data: a\n"))
      assert.is_true(p:has_partial())
      assert.same({ev("message", "a")}, p:feed("\n"))
      assert.is_false(p:has_partial())
    end)

    it("reports a partial line", function()
      local p = core.sse_parser()
      assert.same({}, p:feed("data: a"))
      assert.is_true(p:has_partial())
    end)

    it("reports a partial event without data", function()
      local p = core.sse_parser()
      p:feed("event: x\n")
      assert.is_true(p:has_partial())
    end)

    it("does not count comments or whole events as partial", function()
      local p = core.sse_parser()
      assert.is_false(p:has_partial())
      p:feed("data: a\n\n: keep-alive\n")
      assert.is_false(p:has_partial())
    end)

    it("leaves an unterminated last event of a fixture undispatched", function()
      local evs, err, p = one_shot(read_fixture("mixed.sse"))
      assert.is_nil(err)
      for _, e in ipairs(evs) do assert.not_equal("tail without blank line", e.data) end
      assert.is_true(p:has_partial())
    end)
  end)

  describe("splitting", function()
    local fixtures = {"openai.sse", "anthropic.sse", "mixed.sse"}

    it("parses the fixtures as expected", function()
      local evs = one_shot(read_fixture("openai.sse"))
      assert.equal(5, #evs)
      assert.equal("[DONE]", evs[5].data)
      evs = one_shot(read_fixture("anthropic.sse"))
      assert.equal(7, #evs)
      assert.same("message_start", evs[1].event)
      assert.same("message_stop", evs[7].event)
      assert.same({
        ev("message", "first\n second", "1", 3000),
        ev("update", "\nx", "1"),
        ev("message", "after empty id"),
        ev("message", "nul id ignored"),
      }, (one_shot(read_fixture("mixed.sse"))))
    end)

    for _, name in ipairs(fixtures) do
      for _, eol in ipairs({"\n", "\r\n", "\r"}) do
        it(("gives the same events byte by byte as in one feed: %s, %q"):format(name, eol), function()
          local s = read_fixture(name):gsub("\r\n", "\n"):gsub("\r", "\n"):gsub("\n", eol)
          local want = one_shot(s)
          assert.is_true(#want > 0)
          assert.same(want, (feed_chunks(bytes(s))))
          for seed = 1, 20 do
            assert.same(want, (feed_chunks(random_chunks(s, seed))))
          end
        end)
      end
    end
  end)

  describe("limits", function()
    it("accepts a line of exactly max_line bytes", function()
      assert.same({ev("message", "123")}, (one_shot("data: 123\n\n", {max_line = 9})))
    end)

    it("fails a line longer than max_line at the offending byte", function()
      local s = "data: 1\n\ndata: 1234567890\n\n"
      local evs, err = one_shot(s, {max_line = 12})
      assert.equal("protocol", err.kind)
      assert.equal(9 + 12, err.offset)
      assert.matches("max_line", err.message)
      assert.matches("offset 21", err.message)
      assert.same({ev("message", "1")}, evs) -- the event before the error survives
    end)

    it("fails an overlong line byte by byte at the same offset, when that byte arrives", function()
      local s = "data: 1\n\ndata: 1234567890\n\n"
      local p = core.sse_parser({max_line = 12})
      for i = 1, 21 do assert.is_table((p:feed(s:sub(i, i)))) end
      local evs, err = p:feed(s:sub(22, 22))
      assert.is_nil(evs)
      assert.equal(21, err.offset)
    end)

    it("bounds a line that never ends", function()
      local p = core.sse_parser({max_line = 100})
      local evs, err
      for _ = 1, 50 do
        evs, err = p:feed(("x"):rep(10))
        if not evs then break end
      end
      assert.equal(100, err.offset)
    end)

    it("counts the BOM in offsets", function()
      local s = "\239\187\191data: 123456\n"
      assert.equal(3 + 8, select(2, one_shot(s, {max_line = 8})).offset)
      assert.equal(3 + 8, select(2, feed_chunks(bytes(s), {max_line = 8})).offset)
    end)

    it("accepts event data of exactly max_event bytes", function()
      assert.same({ev("message", "12345\n6789")},
        (one_shot("data: 12345\ndata: 6789\n\n", {max_event = 10})))
    end)

    it("fails event data longer than max_event at the offending byte", function()
      local evs, err = one_shot("data: a\n\ndata: 12345\ndata: 67890\n\n", {max_event = 10})
      assert.equal("protocol", err.kind)
      -- "data: 67890" starts at 21; its value at 27; 6 bytes of room ("12345\n")
      assert.equal(27 + 4, err.offset)
      assert.matches("max_event", err.message)
      assert.matches("offset 31", err.message)
      assert.same({ev("message", "a")}, evs)
    end)

    it("blames the line start when the joining LF alone overflows", function()
      local _, err = one_shot("data: 1234567890\ndata\n\n", {max_event = 10})
      assert.equal(17, err.offset)
    end)

    it("reports the same errors whatever the split", function()
      for _, opts in ipairs({{max_line = 12}, {max_event = 7}}) do
        local s = read_fixture("mixed.sse") .. "data: 0123456789abcdef\n\n"
        local want, werr = one_shot(s, opts)
        local got, gerr = feed_chunks(bytes(s), opts)
        assert.same(want, got)
        assert.equal(werr.offset, gerr.offset)
        assert.equal(werr.message, gerr.message)
      end
    end)

    it("stays in error: later feeds return the same error", function()
      local p = core.sse_parser({max_line = 4})
      local _, err = p:feed("data: x\n\n")
      local evs, err2 = p:feed("data\n\n")
      assert.is_nil(evs)
      assert.equal(err.offset, err2.offset)
      assert.equal(err.message, err2.message)
      assert.same({}, err2.events)
    end)

    it("makes error records with the shared metatable when there is one", function()
      local _, err = one_shot("data: 123456\n", {max_line = 2})
      assert.equal(debug.getregistry()["luagent.Error"], getmetatable(err))
    end)
  end)

  describe("lifetime and misuse", function()
    it("closes idempotently, and raises on use after close", function()
      local p = core.sse_parser()
      p:close()
      p:close()
      assert.has_error(function() p:feed("data: x\n\n") end, "sse_parser:feed: parser is closed")
      assert.has_error(function() p:has_partial() end)
    end)

    it("closes at the end of a to-be-closed variable", function()
      local outer
      do
        local p <close> = core.sse_parser()
        outer = p
        p:feed("data: x\n")
      end
      assert.has_error(function() outer:feed("") end, "sse_parser:feed: parser is closed")
    end)

    it("raises on bad options and arguments", function()
      local msg = "sse_parser: opts.max_line must be a positive integer"
      assert.has_error(function() core.sse_parser({max_line = 0}) end, msg)
      assert.has_error(function() core.sse_parser({max_line = 1.5}) end, msg)
      assert.has_error(function() core.sse_parser({max_line = "10"}) end, msg)
      assert.has_error(function() core.sse_parser({max_event = "big"}) end,
        "sse_parser: opts.max_event must be a positive integer")
      assert.has_error(function() core.sse_parser(42) end)
      assert.has_error(function() core.sse_parser():feed({}) end)
    end)

    it("returns an empty array for bytes that complete nothing", function()
      local p = core.sse_parser()
      assert.same({}, p:feed(""))
      assert.same({}, p:feed(": hi\n"))
    end)
  end)
end)
