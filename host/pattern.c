/* Lua 5.4 patterns with a step budget (see pattern.h). A backtracking
 * matcher over (pointer, length) subjects; errors and a stopped budget leave
 * through m->jump, since nothing here owns memory. */
#include "pattern.h"

#include <ctype.h>
#include <string.h>

#define MAX_DEPTH 200 /* nested matches, as Lua's MAXCCALLS */
#define TICK_EVERY 4096

static const char *do_match(lg_match *m, const char *s, const char *p);

/* Leaves the current lg_pattern_* call with -1 and `msg`. */
static void fail(lg_match *m, const char *msg) {
  m->error = msg;
  longjmp(m->jump, 1);
}

/* Counts one step; every TICK_EVERY steps asks tick whether to go on. */
static void step(lg_match *m) {
  if (--m->until_tick > 0) return;
  m->until_tick = TICK_EVERY;
  if (m->tick && m->tick(m->ud)) fail(m, "time limit exceeded");
}

void lg_pattern_init(lg_match *m, const char *s, size_t len, int (*tick)(void *), void *ud) {
  m->src = s;
  m->src_end = s + len;
  m->tick = tick;
  m->ud = ud;
  m->until_tick = TICK_EVERY;
  m->error = NULL;
  m->level = 0;
}

/* Whether c is in the class named by letter cl (%a, %D, ...); any other
 * cl stands for itself. */
static int in_class(unsigned char c, unsigned char cl) {
  int yes;
  switch (tolower(cl)) {
    case 'a': yes = isalpha(c); break;
    case 'c': yes = iscntrl(c); break;
    case 'd': yes = isdigit(c); break;
    case 'g': yes = isgraph(c); break;
    case 'l': yes = islower(c); break;
    case 'p': yes = ispunct(c); break;
    case 's': yes = isspace(c); break;
    case 'u': yes = isupper(c); break;
    case 'w': yes = isalnum(c); break;
    case 'x': yes = isxdigit(c); break;
    case 'z': yes = c == 0; break; /* deprecated in Lua, still understood */
    default: return cl == c;
  }
  if (isupper(cl)) yes = !yes;
  return yes != 0;
}

/* Whether c is in the set [ ... ] that runs from p (at '[') to last (at its
 * closing ']'). */
static int in_set(unsigned char c, const char *p, const char *last) {
  int want = 1;
  p++;
  if (*p == '^') {
    want = 0;
    p++;
  }
  for (; p < last; p++) {
    if (*p == '%' && p + 1 < last) {
      p++;
      if (in_class(c, (unsigned char)*p)) return want;
    } else if (p + 2 < last && p[1] == '-') {
      if ((unsigned char)p[0] <= c && c <= (unsigned char)p[2]) return want;
      p += 2;
    } else if ((unsigned char)*p == c) {
      return want;
    }
  }
  return !want;
}

/* The end of the single-character class starting at p. */
static const char *class_end(lg_match *m, const char *p) {
  char c = *p++;
  if (c == '%') {
    if (p >= m->p_end) fail(m, "malformed pattern (ends with '%')");
    return p + 1;
  }
  if (c == '[') {
    if (p < m->p_end && *p == '^') p++;
    do { /* the first character after [ or [^ is never the closing ] */
      if (p >= m->p_end) fail(m, "malformed pattern (missing ']')");
      c = *p++;
      if (c == '%' && p < m->p_end) p++;
    } while (p >= m->p_end || *p != ']');
    return p + 1;
  }
  return p;
}

/* Whether the character at s (s < src_end) matches the class p..ep. */
static int single(const char *s, const char *p, const char *ep) {
  unsigned char c = (unsigned char)*s;
  switch (*p) {
    case '.': return 1;
    case '%': return in_class(c, (unsigned char)p[1]);
    case '[': return in_set(c, p, ep - 1);
    default: return (unsigned char)*p == c;
  }
}

/* %bxy at s: the end of a balanced x...y run, or NULL. */
static const char *balance(lg_match *m, const char *s, const char *p) {
  if (p + 1 >= m->p_end) fail(m, "malformed pattern (missing arguments to '%b')");
  if (s >= m->src_end || *s != p[0]) return NULL;
  int open = 1;
  while (++s < m->src_end) {
    step(m);
    if (*s == p[1]) {
      if (--open == 0) return s + 1;
    } else if (*s == p[0]) {
      open++;
    }
  }
  return NULL;
}

/* Greedy x*: the longest run first, giving back one at a time. */
static const char *max_expand(lg_match *m, const char *s, const char *p, const char *ep) {
  ptrdiff_t i = 0;
  while (s + i < m->src_end && single(s + i, p, ep)) {
    step(m);
    i++;
  }
  for (; i >= 0; i--) {
    const char *r = do_match(m, s + i, ep + 1);
    if (r) return r;
  }
  return NULL;
}

/* Lazy x-: the shortest run first, taking one more at a time. */
static const char *min_expand(lg_match *m, const char *s, const char *p, const char *ep) {
  for (;;) {
    const char *r = do_match(m, s, ep + 1);
    if (r) return r;
    if (s < m->src_end && single(s, p, ep)) s++;
    else return NULL;
  }
}

/* Opens capture number m->level at s and matches the rest from p. */
static const char *open_capture(lg_match *m, const char *s, const char *p, ptrdiff_t what) {
  if (m->level >= LG_PATTERN_MAXCAPTURES) fail(m, "too many captures");
  m->capture[m->level].init = s;
  m->capture[m->level].len = what;
  m->level++;
  const char *r = do_match(m, s, p);
  if (!r) m->level--;
  return r;
}

/* Closes the innermost open capture at s and matches the rest from p. */
static const char *close_capture(lg_match *m, const char *s, const char *p) {
  int l = m->level - 1;
  while (l >= 0 && m->capture[l].len != LG_PATTERN_UNFINISHED) l--;
  if (l < 0) fail(m, "invalid pattern capture");
  m->capture[l].len = s - m->capture[l].init;
  const char *r = do_match(m, s, p);
  if (!r) m->capture[l].len = LG_PATTERN_UNFINISHED;
  return r;
}

/* %1..%9 at s: the text of that capture again, or NULL. */
static const char *back_reference(lg_match *m, const char *s, char digit) {
  int l = digit - '1';
  if (l < 0 || l >= m->level || m->capture[l].len == LG_PATTERN_UNFINISHED)
    fail(m, "invalid capture index in pattern");
  ptrdiff_t len = m->capture[l].len;
  if (len < 0 || m->src_end - s < len) return NULL;
  step(m);
  return memcmp(m->capture[l].init, s, (size_t)len) == 0 ? s + len : NULL;
}

/* Matches p (to m->p_end) at s; the end of the match, or NULL. */
static const char *do_match(lg_match *m, const char *s, const char *p) {
  if (m->depth-- == 0) fail(m, "pattern too complex");
  for (;;) {
    step(m);
    if (p >= m->p_end) break;
    if (*p == '(') {
      if (p + 1 < m->p_end && p[1] == ')') s = open_capture(m, s, p + 2, LG_PATTERN_POSITION);
      else s = open_capture(m, s, p + 1, LG_PATTERN_UNFINISHED);
      break;
    }
    if (*p == ')') {
      s = close_capture(m, s, p + 1);
      break;
    }
    if (*p == '$' && p + 1 == m->p_end) {
      if (s != m->src_end) s = NULL;
      break;
    }
    if (*p == '%' && p + 1 < m->p_end) {
      char c = p[1];
      if (c == 'b') {
        s = balance(m, s, p + 2);
        if (!s) break;
        p += 4;
        continue;
      }
      if (c == 'f') {
        p += 2;
        if (p >= m->p_end || *p != '[') fail(m, "missing '[' after '%f' in pattern");
        const char *ep = class_end(m, p);
        unsigned char prev = s == m->src ? '\0' : (unsigned char)s[-1];
        unsigned char cur = s < m->src_end ? (unsigned char)*s : '\0';
        if (!in_set(prev, p, ep - 1) && in_set(cur, p, ep - 1)) {
          p = ep;
          continue;
        }
        s = NULL;
        break;
      }
      if (isdigit((unsigned char)c)) {
        s = back_reference(m, s, c);
        if (!s) break;
        p += 2;
        continue;
      }
    }
    const char *ep = class_end(m, p);
    int hit = s < m->src_end && single(s, p, ep);
    char q = ep < m->p_end ? *ep : '\0';
    if (q == '?') {
      const char *r;
      if (hit && (r = do_match(m, s + 1, ep + 1))) {
        s = r;
        break;
      }
      p = ep + 1;
      continue;
    }
    if (q == '+') {
      s = hit ? max_expand(m, s + 1, p, ep) : NULL;
      break;
    }
    if (q == '*') {
      s = max_expand(m, s, p, ep);
      break;
    }
    if (q == '-') {
      s = min_expand(m, s, p, ep);
      break;
    }
    if (!hit) {
      s = NULL;
      break;
    }
    s++;
    p = ep;
  }
  m->depth++;
  return s;
}

/* The search loop of lg_pattern_search, outside the frame of its setjmp. */
static int search(lg_match *m, const char *s, const char *p, int anchored, const char *avoid,
                  const char **start, const char **end) {
  do {
    m->level = 0;
    m->depth = MAX_DEPTH;
    const char *e = do_match(m, s, p);
    if (e && e != avoid) {
      *start = s;
      *end = e;
      return 1;
    }
  } while (s++ < m->src_end && !anchored);
  return 0;
}

int lg_pattern_search(lg_match *m, const char *s, const char *p, size_t plen, int anchored,
                      const char *avoid, const char **start, const char **end) {
  m->p_end = p + plen;
  if (setjmp(m->jump)) return -1;
  return search(m, s, p, anchored, avoid, start, end);
}

/* The loop of lg_pattern_plain, outside the frame of its setjmp. */
static int plain(lg_match *m, const char *s, const char *needle, size_t nlen,
                 const char **start) {
  if (nlen == 0) {
    *start = s;
    return 1;
  }
  for (; (size_t)(m->src_end - s) >= nlen; s++) {
    m->until_tick -= (long)(nlen / 64); /* a long compare costs more than one step */
    step(m);
    if (*s == *needle && memcmp(s, needle, nlen) == 0) {
      *start = s;
      return 1;
    }
  }
  return 0;
}

int lg_pattern_plain(lg_match *m, const char *s, const char *needle, size_t nlen,
                     const char **start) {
  const char *volatile from = s; /* read after setjmp */
  m->level = 0;
  if (setjmp(m->jump)) return -1;
  return plain(m, from, needle, nlen, start);
}
