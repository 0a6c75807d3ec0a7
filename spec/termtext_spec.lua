-- Text for a terminal (host/termtext.c, core.terminal_text): what the
-- readable forms print (the log's text form, the --trace tree, the cost
-- table) comes partly from models, tools and servers; every byte or
-- character a terminal would act on is written as a visible escape, and
-- text with none is returned as it is. Checked against a plain Lua
-- statement of the same rules over random hostile input.
local core = require "luagent.core"

-- The rules in Lua, one character (or stray byte) at a time.
local SHORT = { [10] = "\\n", [13] = "\\r", [9] = "\\t" }
local function escaped(c)
  return c < 0x20 or (c >= 0x7F and c <= 0x9F) or (c >= 0x202A and c <= 0x202E) or (c >= 0x2066 and c <= 0x2069)
end
local function reference(s, lines)
  local out, i = {}, 1
  while i <= #s do
    local n = utf8.len(s, i, i) -- 1 when a valid sequence starts at i
    if n then
      local c = utf8.codepoint(s, i)
      local len = #utf8.char(c)
      if escaped(c) and not (lines and (c == 10 or c == 9)) then
        out[#out + 1] = SHORT[c] or string.format("\\u{%02x}", c)
      else
        out[#out + 1] = s:sub(i, i + len - 1)
      end
      i = i + len
    else
      out[#out + 1] = string.format("\\x%02x", s:byte(i))
      i = i + 1
    end
  end
  return table.concat(out)
end

local PIECES = { "a", "Z", " ", '"', "\\", "\n", "\t", "\r", "\0", "\7", "\27", "\27[2J", "\27]0;title\7",
  "\127", "\31", "é", "€", "😀", "\u{9b}", "\u{80}", "\u{9f}", "\u{a0}", "\u{202a}", "\u{202e}", "\u{202f}",
  "\u{2066}", "\u{2069}", "\u{2029}", "\u{10FFFF}", "\xF4\x90\x80\x80", "\xED\xA0\x80", "\xC0\xAF", "\xE0\x80\x80",
  "\x80", "\x9b", "\xFF", "\xE2\x80", "abcdefgh", "0123456789abcdef~", "abc\27defgh", "abcdefg\127", "~}|{zyxw" }

describe("core.terminal_text", function()
  it("escapes C0 controls, DEL, C1 controls, bidi overrides and stray bytes; keeps the rest", function()
    assert.equal("a\\u{1b}[31mred\\u{1b}[0m", core.terminal_text("a\27[31mred\27[0m"))
    assert.equal("\\u{1b}]0;pwned\\u{07}", core.terminal_text("\27]0;pwned\7"))
    assert.equal("one\\ntwo\\rthree\\tfour", core.terminal_text("one\ntwo\rthree\tfour"))
    assert.equal("x\\u{9b}2Jy", core.terminal_text("x\u{9b}2Jy"))
    assert.equal("\\u{202e}txt.exe", core.terminal_text("\u{202e}txt.exe"))
    assert.equal("\\u{2066}a\\u{2069}", core.terminal_text("\u{2066}a\u{2069}"))
    assert.equal("\\xff\\x9b\\u{7f}\\u{00}", core.terminal_text("\xff\x9b\127\0"))
    assert.equal("é€😀 \u{a0}\u{202f} \\ \"", core.terminal_text("é€😀 \u{a0}\u{202f} \\ \""))
  end)

  it("keeps newlines and tabs when asked (text of several lines, each escaped)", function()
    assert.equal("one\\u{1b}[2J\ntwo\\r\n", core.terminal_text("one\27[2J\ntwo\r\n", true))
    assert.equal("stack traceback:\n\tx.lua:1: in main chunk", core.terminal_text("stack traceback:\n\tx.lua:1: in main chunk", true))
    assert.equal("a\nb", core.terminal_text("a\nb", true))
    assert.equal("a\\nb", core.terminal_text("a\nb", false))
  end)

  it("returns text with nothing to escape as it is, and numbers as their text", function()
    local s = "plain text, long enough for the eight-byte scan: 0123456789"
    assert.equal(s, core.terminal_text(s))
    assert.equal("", core.terminal_text(""))
    assert.equal("12", core.terminal_text(12))
    assert.has_error(function() core.terminal_text({}) end)
  end)

  it("writes what the Lua rules write, for 20,000 random strings of hostile pieces", function()
    math.randomseed(20261201)
    for _ = 1, 20000 do
      local parts = {}
      for i = 1, math.random(0, 12) do parts[i] = PIECES[math.random(#PIECES)] end
      local s = table.concat(parts)
      local got = core.terminal_text(s)
      assert.equal(reference(s), got)
      assert.truthy(utf8.len(got)) -- valid UTF-8, whatever came in
      assert.is_nil(got:find("[%c\127]")) -- and no control byte left
      assert.equal(reference(s, true), core.terminal_text(s, true))
    end
  end)
end)
