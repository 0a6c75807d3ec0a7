/* Text for a terminal (termtext.h). Names, messages and content in the
 * readable forms come from models, tools and servers: an ESC there (a CSI
 * that clears the screen, an OSC that sets the title or a hyperlink), a
 * C1 control, a bare carriage return or a bidi override would reach the
 * operator's terminal and act, or make a line show what it does not say.
 * Each is written as a visible escape instead:
 *
 *   \n \r \t                 the short forms
 *   \u{1b} \u{7f} \u{9b}     other C0 controls, DEL, C1 controls (U+0080 to
 *                            U+009F, as UTF-8), and the bidi embeddings,
 *                            overrides and isolates (U+202A to U+202E,
 *                            U+2066 to U+2069)
 *   \xff                     a byte that starts no valid UTF-8 sequence (a
 *                            lone 0x9B is a CSI to a terminal in 8-bit mode)
 *
 * Everything else, valid UTF-8 included, is kept; a backslash too (the
 * forms are for reading, not for reading back). A line of a run is written
 * per event: the scan takes 8 plain bytes at a time, and text with nothing
 * to escape is returned as the same string, with no copy. */
#include "termtext.h"

#include <lauxlib.h>
#include <lua.h>
#include <string.h>

#include "utf8.h"
#include "word8.h"

/* True when the 8 bytes at p are printable ASCII (0x20 to 0x7E). */
static inline int terminal_plain8(const char *p) {
  uint64_t v = lg_word8(p);
  /* no high bit, no DEL (see lg_printable8), no byte below 0x20 */
  return ((v | (v + LG_ONES) | ((v - LG_ONES * 0x20) & ~v)) & LG_HIGHS) == 0;
}

/* The code point of the valid sequence s[0, len) (len 2 or 3: the only
 * lengths that hold a character escaped here). */
static unsigned code_point(const unsigned char *s, size_t len) {
  if (len == 2) return ((s[0] & 0x1Fu) << 6) | (s[1] & 0x3Fu);
  return ((s[0] & 0x0Fu) << 12) | ((s[1] & 0x3Fu) << 6) | (s[2] & 0x3Fu);
}

/* Whether code point c is written escaped. */
static int escaped(unsigned c) {
  return c < 0x20 || (c >= 0x7F && c <= 0x9F) || (c >= 0x202A && c <= 0x202E) ||
         (c >= 0x2066 && c <= 0x2069);
}

/* The length of what starts at p, and whether it is escaped (*esc; *cp: its
 * code point, or -1 for a byte that starts no valid sequence). */
static size_t next_char(const unsigned char *p, const unsigned char *end, int *esc, long *cp) {
  unsigned c = *p;
  if (c < 0x80) {
    *esc = c < 0x20 || c == 0x7F;
    *cp = (long)c;
    return 1;
  }
  size_t len = lg_utf8_seq(p, (size_t)(end - p));
  if (len == 0) {
    *esc = 1;
    *cp = -1;
    return 1;
  }
  *esc = 0;
  if (len <= 3) {
    unsigned u = code_point(p, len);
    if (escaped(u)) {
      *esc = 1;
      *cp = (long)u;
    }
  }
  return len;
}

static const char HEX[] = "0123456789abcdef";

/* Appends the escape of what next_char found (cp, or the byte b). */
static void put_escape(luaL_Buffer *b, long cp, unsigned char byte) {
  char text[12];
  size_t n = 0;
  if (cp == '\n' || cp == '\r' || cp == '\t') {
    text[n++] = '\\';
    text[n++] = cp == '\n' ? 'n' : cp == '\r' ? 'r' : 't';
  } else if (cp < 0) {
    text[n++] = '\\';
    text[n++] = 'x';
    text[n++] = HEX[byte >> 4];
    text[n++] = HEX[byte & 15];
  } else {
    text[n++] = '\\';
    text[n++] = 'u';
    text[n++] = '{';
    int shift = 12;
    while (shift > 4 && ((unsigned long)cp >> shift) == 0) shift -= 4; /* two digits at least */
    for (; shift >= 0; shift -= 4) text[n++] = HEX[((unsigned long)cp >> shift) & 15];
    text[n++] = '}';
  }
  luaL_addlstring(b, text, n);
}

/* terminal_text(s [, lines]) -> s with what a terminal would act on
 * escaped (see above); s itself when there is nothing to escape. With
 * `lines`, newlines and tabs are kept (text laid out in lines: a listing,
 * a traceback's indented frames; each line escaped). Numbers are taken as
 * their text (tostring's); anything else raises. */
static int l_terminal_text(lua_State *L) {
  size_t n;
  const char *s = luaL_checklstring(L, 1, &n);
  int lines = lua_toboolean(L, 2);
  const unsigned char *p = (const unsigned char *)s, *end = p + n;
  int esc;
  long cp;
  /* the common case: nothing to escape, no buffer */
  while (p < end) {
    if (end - p >= 8 && terminal_plain8((const char *)p)) {
      p += 8;
      continue;
    }
    size_t len = next_char(p, end, &esc, &cp);
    if (esc && !(lines && (cp == '\n' || cp == '\t'))) break;
    p += len;
  }
  if (p == end) {
    lua_settop(L, 1);
    return 1;
  }
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  const unsigned char *run = (const unsigned char *)s;
  while (p < end) {
    if (end - p >= 8 && terminal_plain8((const char *)p)) {
      p += 8;
      continue;
    }
    size_t len = next_char(p, end, &esc, &cp);
    if (esc && !(lines && (cp == '\n' || cp == '\t'))) {
      luaL_addlstring(&b, (const char *)run, (size_t)(p - run));
      put_escape(&b, cp, *p);
      run = p + len;
    }
    p += len;
  }
  luaL_addlstring(&b, (const char *)run, (size_t)(p - run));
  luaL_pushresult(&b);
  return 1;
}

void lg_termtext_register(lua_State *L) {
  lua_pushcfunction(L, l_terminal_text);
  lua_setfield(L, -2, "terminal_text");
}
