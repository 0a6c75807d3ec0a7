/* Strict UTF-8, as Lua's utf8.len takes it: no overlong form, no
 * surrogate, nothing past U+10FFFF. Shared by the chunk fast path (which
 * must refuse what cjson and the Lua adapter would treat differently) and
 * the observers' JSON writer (which writes U+FFFD for every byte that does
 * not start a valid sequence). */
#ifndef LG_UTF8_H
#define LG_UTF8_H

#include <stddef.h>

/* The length of the valid sequence at s[0, n) (n >= 1), or 0 when s does
 * not start one. */
static inline size_t lg_utf8_seq(const unsigned char *s, size_t n) {
  unsigned c = s[0], cp;
  size_t len;
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) len = 2, cp = c & 0x1F;
  else if (c >= 0xE0 && c <= 0xEF) len = 3, cp = c & 0x0F;
  else if (c >= 0xF0 && c <= 0xF4) len = 4, cp = c & 0x07;
  else return 0;
  if (n < len) return 0;
  for (size_t k = 1; k < len; k++) {
    if ((s[k] & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (s[k] & 0x3F);
  }
  if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
      (cp >= 0xD800 && cp <= 0xDFFF))
    return 0;
  return len;
}

#endif
