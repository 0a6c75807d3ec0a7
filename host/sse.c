/* Incremental Server-Sent Events parser; see sse.h. Lines are found with
 * memchr; bytes are copied only when a line spans feeds (into `line`) and
 * when they become part of an event (data, type, id). */
#include "sse.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

static const unsigned char utf8_bom[3] = {0xEF, 0xBB, 0xBF};

/* ---- buffers ---------------------------------------------------------- */

/* Ensures room for `need` bytes, growing by doubling but never past `limit`
 * (callers check need <= limit first). 0, or -1 when out of memory. */
static int buf_reserve(lg_sse_buf *b, size_t need, size_t limit) {
  if (need <= b->cap) return 0;
  size_t cap = b->cap ? b->cap : 256;
  while (cap < need) cap = cap > limit / 2 ? limit : cap * 2;
  char *p = realloc(b->p, cap);
  if (!p) return -1;
  b->p = p;
  b->cap = cap;
  return 0;
}

/* Appends n bytes to `b`, which stays within `limit`. 0 or -1. */
static int buf_append(lg_sse_buf *b, const char *s, size_t n, size_t limit) {
  if (n == 0) return 0;
  if (buf_reserve(b, b->len + n, limit)) return -1;
  memcpy(b->p + b->len, s, n);
  b->len += n;
  return 0;
}

/* ---- state ------------------------------------------------------------ */

/* Sets `p` up with its limits; allocates nothing. */
void lg_sse_init(lg_sse *p, size_t max_line, size_t max_event) {
  memset(p, 0, sizeof *p);
  p->max_line = max_line ? max_line : LG_SSE_DEFAULT_MAX;
  p->max_event = max_event ? max_event : LG_SSE_DEFAULT_MAX;
  p->retry = -1;
}

/* Frees every buffer and leaves `p` zeroed, so a second free is harmless. */
void lg_sse_free(lg_sse *p) {
  free(p->line.p);
  free(p->data.p);
  free(p->type.p);
  free(p->id.p);
  memset(p, 0, sizeof *p);
}

/* Enters the sticky error state, blaming the byte at stream offset `off`. */
static int fail(lg_sse *p, int code, uint64_t off) {
  p->err = code;
  p->err_off = off;
  return code;
}

/* ---- fields ----------------------------------------------------------- */

/* Blank line: hands the event to `cb` if it has data, then starts a new one.
 * The state is reset before the callback (the buffers' bytes stay intact
 * until the next line), so a callback that stops or unwinds leaves a
 * consistent parser. */
static int dispatch(lg_sse *p, lg_sse_event_fn cb, void *ud) {
  p->in_event = 0;
  if (!p->has_data) {
    p->type.len = 0;
    return 0;
  }
  lg_sse_event ev;
  ev.type = p->type.len ? p->type.p : "message";
  ev.type_len = p->type.len ? p->type.len : 7;
  ev.data = p->data.len ? p->data.p : "";
  ev.data_len = p->data.len;
  ev.id = p->id.len ? p->id.p : "";
  ev.id_len = p->id.len;
  ev.has_id = p->id.len > 0;
  ev.retry = p->retry;
  p->type.len = 0;
  p->data.len = 0;
  p->has_data = 0;
  p->retry = -1;
  return cb ? cb(ud, &ev) : 0;
}

/* A data field: appends "\n" (between lines) and the value to the event's
 * data, within max_event. `voff` is the value's stream offset, `loff` the
 * line's (blamed when the joining "\n" alone overflows). */
static int add_data(lg_sse *p, const char *v, size_t n, uint64_t voff,
                    uint64_t loff) {
  lg_sse_buf *d = &p->data;
  if (p->has_data) {
    if (d->len >= p->max_event) return fail(p, LG_SSE_EEVENT, loff);
    if (buf_append(d, "\n", 1, p->max_event))
      return fail(p, LG_SSE_ENOMEM, loff);
  }
  size_t room = p->max_event - d->len;
  if (n > room) return fail(p, LG_SSE_EEVENT, voff + room);
  if (buf_append(d, v, n, p->max_event)) return fail(p, LG_SSE_ENOMEM, voff);
  p->has_data = 1;
  return 0;
}

/* A retry field: only ASCII digits count (saturating at LLONG_MAX). */
static void set_retry(lg_sse *p, const char *v, size_t n) {
  long long r = 0;
  if (n == 0) return;
  for (size_t i = 0; i < n; i++) {
    unsigned d = (unsigned char)v[i] - '0';
    if (d > 9) return;
    r = r > (LLONG_MAX - (long long)d) / 10 ? LLONG_MAX : r * 10 + (long long)d;
  }
  p->retry = r;
}

/* Interprets one complete line (without its terminator) that starts at
 * stream offset `off`. */
static int do_line(lg_sse *p, const char *s, size_t n, uint64_t off,
                   lg_sse_event_fn cb, void *ud) {
  if (n == 0) return dispatch(p, cb, ud);
  if (s[0] == ':') return 0;
  p->in_event = 1;
  const char *colon = memchr(s, ':', n);
  size_t name_len = colon ? (size_t)(colon - s) : n;
  size_t vpos = colon ? name_len + 1 : n;
  if (vpos < n && s[vpos] == ' ') vpos++;
  const char *v = s + vpos;
  size_t vlen = n - vpos;
  switch (name_len) {
  case 4:
    if (memcmp(s, "data", 4) == 0) return add_data(p, v, vlen, off + vpos, off);
    break;
  case 5:
    if (memcmp(s, "event", 5) == 0) {
      p->type.len = 0;
      if (buf_append(&p->type, v, vlen, p->max_line))
        return fail(p, LG_SSE_ENOMEM, off);
    } else if (memcmp(s, "retry", 5) == 0) {
      set_retry(p, v, vlen);
    }
    break;
  case 2:
    if (memcmp(s, "id", 2) == 0 && !memchr(v, '\0', vlen)) {
      p->id.len = 0;
      if (buf_append(&p->id, v, vlen, p->max_line))
        return fail(p, LG_SSE_ENOMEM, off);
    }
    break;
  }
  return 0;
}

/* ---- lines ------------------------------------------------------------ */

/* Index of the first `c` in buf[from, len), or len when there is none. */
static size_t find(const char *buf, size_t from, size_t len, char c) {
  const char *q = memchr(buf + from, c, len - from);
  return q ? (size_t)(q - buf) : len;
}

/* Splits `buf` (which starts at stream offset p->offset) into lines. The
 * next LF and CR positions are cached so each byte is scanned at most once
 * per character, even for long CR-free or LF-free inputs (cr == nl: no CR
 * before the next LF). */
static int parse(lg_sse *p, const char *buf, size_t len, lg_sse_event_fn cb,
                 void *ud) {
  const uint64_t base = p->offset;
  size_t i = 0;
  size_t nl = SIZE_MAX, cr = SIZE_MAX; /* SIZE_MAX: not searched yet */
  if (p->skip_lf && len > 0) {
    p->skip_lf = 0;
    if (buf[0] == '\n') {
      i = 1;
      p->line_off++;
    }
  }
  while (i < len) {
    if (nl == SIZE_MAX || nl < i) nl = find(buf, i, len, '\n');
    /* a CR matters only before the next LF: look no further (a feed that
     * stops at the first event must not scan the whole rest for one) */
    if (cr == SIZE_MAX || cr < i) cr = find(buf, i, nl, '\r');
    size_t eol = nl < cr ? nl : cr;
    size_t n = eol - i;
    if (p->line.len + n > p->max_line)
      return fail(p, LG_SSE_ELINE, p->line_off + p->max_line);
    if (eol == len) { /* no line end yet: keep the partial line */
      if (buf_append(&p->line, buf + i, n, p->max_line))
        return fail(p, LG_SSE_ENOMEM, base + i);
      break;
    }
    const char *s = buf + i;
    if (p->line.len) { /* the line began in an earlier feed */
      if (buf_append(&p->line, s, n, p->max_line))
        return fail(p, LG_SSE_ENOMEM, base + i);
      s = p->line.p;
      n = p->line.len;
    }
    size_t next = eol + 1;
    if (buf[eol] == '\r') {
      if (next < len) {
        if (buf[next] == '\n') next++;
      } else {
        p->skip_lf = 1;
      }
    }
    uint64_t off = p->line_off;
    p->offset = base + next;
    p->line_off = base + next;
    int rc = do_line(p, s, n, off, cb, ud);
    p->line.len = 0;
    if (rc) return rc;
    i = next;
  }
  p->offset = base + len;
  return 0;
}

/* Skips a UTF-8 BOM at the very start of the stream, even when split across
 * feeds (a matching prefix is held back until it is decided), then parses. */
int lg_sse_feed(lg_sse *p, const char *buf, size_t len, lg_sse_event_fn cb,
                void *ud) {
  if (p->err) return p->err;
  if (len == 0) return 0;
  if (p->bom < 3) {
    size_t i = 0;
    while (p->bom < 3 && i < len && (unsigned char)buf[i] == utf8_bom[p->bom]) {
      p->bom++;
      i++;
    }
    if (p->bom == 3) { /* whole BOM: skip it */
      p->offset = p->line_off = 3;
    } else if (i == len) { /* still a BOM prefix: hold it */
      p->offset += i;
      return 0;
    } else { /* not a BOM: the held prefix is ordinary bytes at offset 0 */
      size_t held = p->bom;
      p->bom = 3;
      p->offset = 0;
      int rc = parse(p, (const char *)utf8_bom, held, cb, ud);
      if (rc) return rc;
    }
    buf += i;
    len -= i;
  }
  return parse(p, buf, len, cb, ud);
}

/* ---- queries ---------------------------------------------------------- */

/* True while a line, an event or a BOM prefix is incomplete. */
int lg_sse_has_partial(const lg_sse *p) {
  return p->line.len > 0 || p->in_event || (p->bom > 0 && p->bom < 3);
}

/* Stream bytes consumed so far (held BOM bytes included). */
uint64_t lg_sse_offset(const lg_sse *p) { return p->offset; }

/* Where the sticky error happened: the bytes fed before the offending one. */
uint64_t lg_sse_error_offset(const lg_sse *p) { return p->err_off; }

/* A static, human-readable text for a code from lg_sse_feed. */
const char *lg_sse_strerror(int code) {
  switch (code) {
  case LG_SSE_OK: return "no error";
  case LG_SSE_ELINE: return "line longer than max_line";
  case LG_SSE_EEVENT: return "event data larger than max_event";
  case LG_SSE_ENOMEM: return "out of memory";
  default: return code > 0 ? "stopped by the callback" : "unknown error";
  }
}
