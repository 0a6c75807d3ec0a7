/* Tests of 8 bytes at once, for the scans of JSON strings in the chunk
 * fast path (chunk.c, reading) and the observers' writer (jsonw.c): most
 * bytes of a string need nothing, and a word-wide test passes them 8 at a
 * time. Each test is exact when it says "none"; a false "some" only sends
 * the caller to its byte loop. */
#ifndef LG_WORD8_H
#define LG_WORD8_H

#include <stdint.h>
#include <string.h>

#define LG_ONES ((uint64_t)0x0101010101010101)
#define LG_HIGHS ((uint64_t)0x8080808080808080)

/* The 8 bytes at p as one word (any alignment). */
static inline uint64_t lg_word8(const void *p) {
  uint64_t v;
  memcpy(&v, p, sizeof v);
  return v;
}

/* True when none of the 8 bytes at p is '"', '\\' or a control character
 * (the bytes a JSON string scan stops at). */
static inline int lg_plain8(const char *p) {
  uint64_t v = lg_word8(p), q = v ^ (LG_ONES * '"'), b = v ^ (LG_ONES * '\\');
  uint64_t t = ((q - LG_ONES) & ~q) | ((b - LG_ONES) & ~b) | ((v - LG_ONES * 0x20) & ~v);
  return (t & LG_HIGHS) == 0;
}

/* True when the 8 bytes at p are ASCII below DEL (0x7F) and plain: what a
 * JSON writer copies as it is. (With no high bit in v, v + 1 per byte
 * carries into no other byte, and sets a high bit only for DEL.) */
static inline int lg_printable8(const char *p) {
  uint64_t v = lg_word8(p);
  return ((v | (v + LG_ONES)) & LG_HIGHS) == 0 && lg_plain8(p);
}

#endif
