/* Lua 5.4 patterns (the manual's section 6.4.1) with a step budget: the
 * matcher calls `tick` every few thousand steps and gives up when it says
 * so. Lua's own matcher cannot be stopped inside one call, and a pattern
 * such as '"(.-)".-"(.-)"' backtracks for hours on a 64 KiB subject; this
 * one is what sandboxed code gets (host/sandbox.c). Pure C: no Lua header. */
#ifndef LG_PATTERN_H
#define LG_PATTERN_H

#include <setjmp.h>
#include <stddef.h>

#define LG_PATTERN_MAXCAPTURES 32
#define LG_PATTERN_POSITION (-2) /* capture length of a position capture () */
#define LG_PATTERN_UNFINISHED (-1)

typedef struct {
  const char *src, *src_end; /* the subject */
  const char *p_end;         /* end of the pattern */
  int level;                 /* captures so far */
  int depth;                 /* recursion left */
  struct {
    const char *init;
    ptrdiff_t len;           /* or LG_PATTERN_POSITION / _UNFINISHED */
  } capture[LG_PATTERN_MAXCAPTURES];
  long until_tick;           /* steps left before the next tick */
  int (*tick)(void *ud);     /* non-zero: stop; NULL: no budget */
  void *ud;
  const char *error;         /* set when lg_pattern_* returns -1 */
  jmp_buf jump;
} lg_match;

/* Prepares m for the subject s[0..len) (steps and errors reset once). */
void lg_pattern_init(lg_match *m, const char *s, size_t len, int (*tick)(void *), void *ud);

/* Finds the first position >= s where p matches with an end other than
 * `avoid` (NULL: any); only at s when `anchored`. Returns 1 and sets *start
 * and *end, 0 for no match, -1 when the pattern is malformed or tick
 * stopped it (m->error says which); captures are in m. */
int lg_pattern_search(lg_match *m, const char *s, const char *p, size_t plen, int anchored,
                      const char *avoid, const char **start, const char **end);

/* Plain substring search of needle in m's subject from s, counting steps.
 * 1 (found, *start), 0, or -1 when stopped. */
int lg_pattern_plain(lg_match *m, const char *s, const char *needle, size_t nlen,
                     const char **start);

#endif
