/* The OpenAI chunk fast path; see chunk.h. A strict JSON reader that keeps
 * only the adapter's fields and declines (returns 0) on anything it is not
 * sure lua-cjson plus the adapter would read the same way. */
#include "chunk.h"

#include <lauxlib.h>
#include <lua.h>
#include <stdint.h>
#include <string.h>

#include "utf8.h"
#include "word8.h"

#define MAX_DEPTH 64

typedef struct {
  const char *s, *end; /* cursor, end of input */
  char *scratch;       /* where the next decoded string goes */
  int depth;
} reader;

/* True when s[0, n) is UTF-8 as Lua's strict utf8.len takes it (no
 * overlong forms, no surrogates, nothing past U+10FFFF). */
static int utf8_valid(const unsigned char *s, size_t n) {
  size_t i = 0;
  while (i < n) {
    if (n - i >= 8 && (lg_word8(s + i) & LG_HIGHS) == 0) { /* 8 ASCII bytes */
      i += 8;
      continue;
    }
    size_t len = lg_utf8_seq(s + i, n - i);
    if (len == 0) return 0;
    i += len;
  }
  return 1;
}

/* Skips JSON whitespace (the four characters cjson takes as such). */
static void ws(reader *r) {
  while (r->s < r->end && (*r->s == ' ' || *r->s == '\t' || *r->s == '\n' || *r->s == '\r')) r->s++;
}

/* Value of one hex digit, or -1. */
static int hex(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* Reads the string at the cursor (on its '"'). Escapes are decoded into the
 * scratch; `out` (may be NULL: the string is only checked) gets the bytes,
 * and then keeps its scratch. Declines (-1) control characters, unknown
 * escapes, \u0000 and every surrogate escape. 0 or -1. */
static int string(reader *r, lg_chunk_str *out) {
  const char *p = r->s + 1, *start = p;
  int escaped = 0;
  for (;;) {
    while (r->end - p >= 8 && lg_plain8(p)) p += 8;
    unsigned char c;
    for (;;) { /* to the next byte that ends the run */
      if (p >= r->end) return -1;
      c = (unsigned char)*p;
      if (c == '"' || c == '\\' || c < 0x20) break;
      p++;
    }
    if (c == '"') break;
    if (c < 0x20) return -1;
    escaped = 1; /* a backslash: its next byte is taken as it is here */
    if (++p >= r->end) return -1;
    p++;
  }
  r->s = p + 1;
  if (!escaped) {
    if (out) *out = (lg_chunk_str){start, (size_t)(p - start), 1};
    return 0;
  }
  char *w = r->scratch;
  for (const char *q = start; q < p;) {
    if (*q != '\\') {
      *w++ = *q++;
      continue;
    }
    q++;
    switch (*q++) {
    case '"': *w++ = '"'; break;
    case '\\': *w++ = '\\'; break;
    case '/': *w++ = '/'; break;
    case 'b': *w++ = '\b'; break;
    case 'f': *w++ = '\f'; break;
    case 'n': *w++ = '\n'; break;
    case 'r': *w++ = '\r'; break;
    case 't': *w++ = '\t'; break;
    case 'u': {
      if (p - q < 4) return -1;
      unsigned cp = 0;
      for (int k = 0; k < 4; k++) {
        int d = hex(q[k]);
        if (d < 0) return -1;
        cp = cp << 4 | (unsigned)d;
      }
      q += 4;
      if (cp == 0 || (cp >= 0xD800 && cp <= 0xDFFF)) return -1;
      if (cp < 0x80) {
        *w++ = (char)cp;
      } else if (cp < 0x800) {
        *w++ = (char)(0xC0 | cp >> 6);
        *w++ = (char)(0x80 | (cp & 0x3F));
      } else {
        *w++ = (char)(0xE0 | cp >> 12);
        *w++ = (char)(0x80 | (cp >> 6 & 0x3F));
        *w++ = (char)(0x80 | (cp & 0x3F));
      }
      break;
    }
    default: return -1;
    }
  }
  if (out) {
    *out = (lg_chunk_str){r->scratch, (size_t)(w - r->scratch), 1};
    r->scratch = w;
  }
  return 0;
}

/* Skips a strict JSON number without exponent (declined: rare in chunks,
 * and strtod's range is cjson's business). 0 or -1. */
static int number(reader *r) {
  const char *p = r->s;
  if (p < r->end && *p == '-') p++;
  if (p >= r->end) return -1;
  if (*p == '0') {
    p++;
  } else if (*p >= '1' && *p <= '9') {
    while (p < r->end && *p >= '0' && *p <= '9') p++;
  } else {
    return -1;
  }
  if (p < r->end && *p == '.') {
    p++;
    if (p >= r->end || *p < '0' || *p > '9') return -1;
    while (p < r->end && *p >= '0' && *p <= '9') p++;
  }
  if (p < r->end && (*p == 'e' || *p == 'E')) return -1;
  r->s = p;
  return 0;
}

/* Skips `word` (true, false, null) at the cursor. 0 or -1. */
static int literal(reader *r, const char *word, size_t n) {
  if ((size_t)(r->end - r->s) < n || memcmp(r->s, word, n) != 0) return -1;
  r->s += n;
  return 0;
}

/* Receives an array's elements (key NULL) or an object's members (the key's
 * raw bytes, escape-free) with the cursor on the value, which it consumes. */
typedef int (*member_fn)(reader *r, const char *key, size_t klen, void *ud);

static int skip(reader *r, const char *k, size_t n, void *ud);

/* Reads the array or object at the cursor, `close` being its closing
 * bracket; each element or member value goes to `fn`. 0 or -1. */
static int container(reader *r, char close, member_fn fn, void *ud) {
  if (++r->depth > MAX_DEPTH) return -1;
  r->s++;
  ws(r);
  if (r->s < r->end && *r->s == close) {
    r->s++;
    r->depth--;
    return 0;
  }
  for (;;) {
    const char *key = NULL;
    size_t klen = 0;
    ws(r);
    if (close == '}') {
      if (r->s >= r->end || *r->s != '"') return -1;
      key = r->s + 1;
      if (string(r, NULL)) return -1;
      klen = (size_t)(r->s - 1 - key);
      if (memchr(key, '\\', klen)) return -1; /* an escaped key: decline */
      ws(r);
      if (r->s >= r->end || *r->s++ != ':') return -1;
      ws(r);
    }
    if (r->s >= r->end || fn(r, key, klen, ud)) return -1;
    ws(r);
    if (r->s >= r->end) return -1;
    if (*r->s == close) break;
    if (*r->s++ != ',') return -1;
  }
  r->s++;
  r->depth--;
  return 0;
}

static int object(reader *r, member_fn fn, void *ud) { return container(r, '}', fn, ud); }
static int array(reader *r, member_fn fn, void *ud) { return container(r, ']', fn, ud); }

/* Skips any value. */
static int skip(reader *r, const char *k, size_t n, void *ud) {
  (void)k, (void)n, (void)ud;
  if (r->s >= r->end) return -1;
  switch (*r->s) {
  case '"': return string(r, NULL);
  case '{': return object(r, skip, NULL);
  case '[': return array(r, skip, NULL);
  case 't': return literal(r, "true", 4);
  case 'f': return literal(r, "false", 5);
  case 'n': return literal(r, "null", 4);
  default: return number(r);
  }
}

/* Key comparison on raw bytes. */
#define IS(lit) (klen == sizeof lit - 1 && memcmp(key, lit, sizeof lit - 1) == 0)

/* What a chunk's members leave while they are read. */
typedef struct {
  lg_chunk *out;
  unsigned seen;           /* keys met in the current object: a repeat declines */
  int rc_state;            /* reasoning_content: 0 absent or null, 2 a string */
  lg_chunk_str rc, reasoning;
} chunk_ctx;

enum { K_ID = 1, K_MODEL = 2, K_CHOICES = 4, K_DELTA = 8, K_REASON = 16, K_CONTENT = 32,
       K_RC = 64, K_REASONING = 128 };

/* Marks key bit `k` seen; -1 when it was already (cjson keeps the last of
 * repeated keys; declining is simpler than following it). */
static int once(chunk_ctx *c, unsigned k) {
  if (c->seen & k) return -1;
  c->seen |= k;
  return 0;
}

/* A string-or-null field: a string is kept in `dst`, null skipped; any
 * other type declines (the adapter reports it as the payload's fault). */
static int string_field(reader *r, lg_chunk_str *dst) {
  if (*r->s == '"') return string(r, dst);
  if (*r->s == 'n') return literal(r, "null", 4);
  return -1;
}

/* Members of a choice's delta. */
static int delta_member(reader *r, const char *key, size_t klen, void *ud) {
  chunk_ctx *c = ud;
  if (IS("content")) return once(c, K_CONTENT) || string_field(r, &c->out->content);
  if (IS("reasoning_content")) {
    if (once(c, K_RC)) return -1;
    if (*r->s == '"') c->rc_state = 2;
    return string_field(r, &c->rc);
  }
  if (IS("reasoning")) return once(c, K_REASONING) || string_field(r, &c->reasoning);
  if (IS("tool_calls") && *r->s != 'n') return -1; /* calls (or a bad value): the adapter's */
  return skip(r, NULL, 0, NULL);
}

/* Members of the one choice. */
static int choice_member(reader *r, const char *key, size_t klen, void *ud) {
  chunk_ctx *c = ud;
  if (IS("delta")) {
    if (once(c, K_DELTA)) return -1;
    if (*r->s == 'n') return literal(r, "null", 4); /* null: an empty delta */
    if (*r->s != '{') return -1;                    /* another type: the adapter reports it */
    return object(r, delta_member, c);
  }
  if (IS("finish_reason")) {
    if (once(c, K_REASON) || string_field(r, &c->out->reason)) return -1;
    if (c->out->reason.set && c->out->reason.n == 5 && memcmp(c->out->reason.p, "error", 5) == 0)
      return -1;
    return 0;
  }
  return skip(r, NULL, 0, NULL);
}

/* One element of "choices": the first, an object, is read; more decline. */
static int choice(reader *r, const char *key, size_t klen, void *ud) {
  (void)key, (void)klen;
  chunk_ctx *c = ud;
  if (c->out->choices++ > 0 || *r->s != '{') return -1;
  unsigned seen = c->seen;
  c->seen = 0;
  int rc = object(r, choice_member, c);
  c->seen = seen;
  return rc;
}

/* Members of the chunk itself. */
static int chunk_member(reader *r, const char *key, size_t klen, void *ud) {
  chunk_ctx *c = ud;
  if (IS("id")) return once(c, K_ID) || string_field(r, &c->out->id);
  if (IS("model")) return once(c, K_MODEL) || string_field(r, &c->out->model);
  if (IS("choices")) {
    if (once(c, K_CHOICES)) return -1;
    if (*r->s == 'n') return literal(r, "null", 4); /* null: no choices */
    if (*r->s != '[') return -1;                    /* another type: the adapter reports it */
    return array(r, choice, c);
  }
  if (IS("error")) return -1;
  if (IS("usage") && *r->s != 'n') return -1; /* usage (or a bad value): the adapter's */
  return skip(r, NULL, 0, NULL);
}

int lg_chunk_openai(const char *s, size_t n, char *scratch, lg_chunk *out) {
  memset(out, 0, sizeof *out);
  if (!utf8_valid((const unsigned char *)s, n)) return 0;
  reader r = {s, s + n, scratch, 0};
  chunk_ctx c = {out, 0, 0, {0}, {0}};
  ws(&r);
  if (r.s >= r.end || *r.s != '{') return 0;
  if (object(&r, chunk_member, &c)) return 0;
  ws(&r);
  if (r.s != r.end) return 0;
  /* the adapter's `delta.reasoning_content or delta.reasoning` */
  if (c.rc_state == 2) out->thinking = c.rc;
  else out->thinking = c.reasoning;
  return 1;
}

/* ---- Lua ---------------------------------------------------------------- */

/* Pushes a string field, or nil when it was not a string. */
static void push_str(lua_State *L, const lg_chunk_str *f) {
  if (f->set) lua_pushlstring(L, f->p, f->n);
  else lua_pushnil(L);
}

/* openai_chunk(data [, started]) -> true, id, model, choices, content,
 * thinking, finish_reason (nil for each field that is not a string; id and
 * model always nil when `started`: the message has them already) | false
 * when the chunk must be decoded the ordinary way. */
static int l_openai_chunk(lua_State *L) {
  size_t n;
  const char *s = luaL_checklstring(L, 1, &n);
  int started = lua_toboolean(L, 2);
  char small[2048];
  char *scratch = n <= sizeof small ? small : lua_newuserdatauv(L, n, 0);
  lg_chunk c;
  if (!lg_chunk_openai(s, n, scratch, &c)) {
    lua_pushboolean(L, 0);
    return 1;
  }
  lua_pushboolean(L, 1);
  if (started) {
    lua_pushnil(L);
    lua_pushnil(L);
  } else {
    push_str(L, &c.id);
    push_str(L, &c.model);
  }
  lua_pushinteger(L, c.choices);
  push_str(L, &c.content);
  push_str(L, &c.thinking);
  push_str(L, &c.reason);
  return 7;
}

void lg_chunk_register(lua_State *L) {
  lua_pushcfunction(L, l_openai_chunk);
  lua_setfield(L, -2, "openai_chunk");
}
