/* JSON text for the observers' hot paths (jsonw.h). A log line per model
 * call and a span per attempt must cost little next to the call's stream;
 * built in Lua, each field left a few small strings behind for the
 * collector. Here each result is written into one luaL_Buffer, which owns
 * the stack's top. otlp_span and otlp_traces pop a value before the buffer
 * is written to, and the string it points to stays alive because the
 * span's tables hold it (read raw; nothing here changes them); json_fields
 * keeps every key and value it writes on the stack. */
#include "jsonw.h"

#include <lauxlib.h>
#include <lua.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "utf8.h"
#include "word8.h"

#define MAX_DEPTH 32
#define MAX_ATTRS (1 << 20) /* slots of a span's attribute list */

/* Appends s[0, n) to b. Inline, as luaL_addchar is (and through the same
 * luaL_Buffer fields its macro uses): a span or a line is a few hundred
 * small pieces, and luaL_addlstring's call per piece was a fifth of the
 * writer's time. */
static inline void add(luaL_Buffer *b, const char *s, size_t n) {
  if (b->size - b->n < n) luaL_prepbuffsize(b, n);
  memcpy(b->b + b->n, s, n);
  b->n += n;
}

/* Appends a string literal (its length known at compile time). */
#define ADD_LIT(b, lit) add((b), "" lit, sizeof(lit) - 1)

/* Appends s[0, n) as a JSON string, as json.lua's quote writes it: '"',
 * '\\' and control bytes escaped (the short forms where JSON has them),
 * every byte that does not start a valid UTF-8 sequence as U+FFFD. */
static void put_string(luaL_Buffer *b, const char *s, size_t n) {
  const unsigned char *p = (const unsigned char *)s, *end = p + n, *run = p;
  luaL_addchar(b, '"');
  while (p < end) {
    if (end - p >= 8 && lg_printable8((const char *)p)) {
      p += 8;
      continue;
    }
    unsigned c = *p;
    if (c >= 0x20 && c < 0x7F && c != '"' && c != '\\') {
      p++;
      continue;
    }
    if (c >= 0x80) {
      size_t len = lg_utf8_seq(p, (size_t)(end - p));
      if (len) {
        p += len;
        continue;
      }
    }
    add(b, (const char *)run, (size_t)(p - run));
    switch (c) {
      case '"': ADD_LIT(b, "\\\""); break;
      case '\\': ADD_LIT(b, "\\\\"); break;
      case '\b': ADD_LIT(b, "\\b"); break;
      case '\f': ADD_LIT(b, "\\f"); break;
      case '\n': ADD_LIT(b, "\\n"); break;
      case '\r': ADD_LIT(b, "\\r"); break;
      case '\t': ADD_LIT(b, "\\t"); break;
      default:
        if (c >= 0x80) {
          ADD_LIT(b, "\xEF\xBF\xBD");
        } else {
          char esc[8];
          snprintf(esc, sizeof esc, "\\u%04x", c);
          add(b, esc, strlen(esc));
        }
    }
    run = ++p;
  }
  add(b, (const char *)run, (size_t)(p - run));
  luaL_addchar(b, '"');
}

/* Writes x to text when it is a whole number of millionths in [1e-4, 1e9)
 * (a duration rounded to the microsecond: the commonest float of a log
 * line), as %.15g writes it: fixed notation (the exponent is -4 to 8), the
 * fraction's trailing zeros dropped. Such a decimal has at most 15
 * significant digits, so it reads back as x. Returns its length, 0 when x
 * is no such number. snprintf's exact conversion of a float (multiple
 * precision arithmetic in glibc) costs several times this. */
static size_t micros_text(double x, char *text) {
  if (!(x >= 1e-4 && x < 1e9)) return 0;
  long long k = llround(x * 1e6);
  if ((double)k / 1e6 != x) return 0;
  char digits[24], *end = digits + sizeof digits, *p = end;
  long long whole = k / 1000000, frac = k % 1000000;
  int places = 6;
  while (places > 0 && frac % 10 == 0) frac /= 10, places--;
  for (int i = 0; i < places; i++, frac /= 10) *--p = (char)('0' + frac % 10);
  if (places > 0) *--p = '.';
  do {
    *--p = (char)('0' + whole % 10);
    whole /= 10;
  } while (whole);
  size_t n = (size_t)(end - p);
  memcpy(text, p, n);
  return n;
}

/* Appends float x as json.lua writes a number: the shortest of %.15g,
 * %.16g, %.17g that reads back equal; null when not finite. */
static void put_float(luaL_Buffer *b, double x) {
  char text[40];
  if (!isfinite(x)) {
    ADD_LIT(b, "null");
    return;
  }
  size_t n = micros_text(x, text);
  if (n > 0) {
    add(b, text, n);
    return;
  }
  for (int digits = 15; digits <= 17; digits++) {
    snprintf(text, sizeof text, "%.*g", digits, x);
    if (strtod(text, NULL) == x) break;
  }
  add(b, text, strlen(text));
}

/* Appends integer v in decimal (by hand: snprintf's format parsing is most
 * of the cost of a span's many small numbers). */
static void put_integer(luaL_Buffer *b, long long v) {
  char text[24], *end = text + sizeof text, *p = end;
  unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
  do {
    *--p = (char)('0' + u % 10);
    u /= 10;
  } while (u);
  if (v < 0) *--p = '-';
  add(b, p, (size_t)(end - p));
}

/* ---- json_fields ---------------------------------------------------------- */

/* A field of the table being written: its key's text, and where the key is
 * on the stack, its value just above it. Both stay on the stack until the
 * line is written, so no string can go while the encoder runs. */
typedef struct {
  const char *p;
  size_t n;
  int at;
} field;

#define MAX_HEAD 32         /* names json_fields' head list may hold */
#define FIELDS_ON_C_STACK 48 /* other fields before a userdata holds them */

/* Lua's order of strings (in the C locale): bytes, then length. */
static int field_cmp(const void *a, const void *b) {
  const field *x = a, *y = b;
  int c = memcmp(x->p, y->p, x->n < y->n ? x->n : y->n);
  if (c != 0) return c;
  return (x->n > y->n) - (x->n < y->n);
}

/* Sorts fields by key: insertion sort for the few of a log line, qsort
 * past that. */
static void sort_fields(field *f, size_t n) {
  if (n > 16) {
    qsort(f, n, sizeof *f, field_cmp);
    return;
  }
  for (size_t i = 1; i < n; i++) {
    field x = f[i];
    size_t j = i;
    for (; j > 0 && field_cmp(&f[j - 1], &x) > 0; j--) f[j] = f[j - 1];
    f[j] = x;
  }
}

/* Whether key k[0, n) is the string h[0, hn). Equal short strings are one
 * object in Lua, so their texts are one pointer: most keys match or differ
 * there (or by length) without a byte compared. */
static int same_key(const char *k, size_t n, const char *h, size_t hn) {
  return k == h || (n == hn && memcmp(k, h, n) == 0);
}

/* Appends ',"k":' (no comma first) and the value of field f. A value that
 * is no string, number or boolean is encoded by the function at `encode`. */
static void put_field(lua_State *L, luaL_Buffer *b, int encode, const field *f, int *first) {
  int v = f->at + 1;
  if (!*first) luaL_addchar(b, ',');
  *first = 0;
  put_string(b, f->p, f->n);
  luaL_addchar(b, ':');
  switch (lua_type(L, v)) {
    case LUA_TSTRING: {
      size_t n;
      const char *s = lua_tolstring(L, v, &n);
      put_string(b, s, n);
      break;
    }
    case LUA_TNUMBER:
      if (lua_isinteger(L, v)) put_integer(b, (long long)lua_tointeger(L, v));
      else put_float(b, lua_tonumber(L, v));
      break;
    case LUA_TBOOLEAN:
      if (lua_toboolean(L, v)) ADD_LIT(b, "true");
      else ADD_LIT(b, "false");
      break;
    default:
      lua_pushvalue(L, encode);
      lua_pushvalue(L, v);
      lua_call(L, 1, 1);
      if (lua_type(L, -1) != LUA_TSTRING) luaL_error(L, "json_fields: the encoder returned no string");
      luaL_addvalue(b);
  }
}

/* json_fields(t, head, encode [, clear]) -> the JSON object of table t's
 * string keys: those named in the list `head` (up to MAX_HEAD names)
 * first, in its order, then the others sorted. Strings, numbers and
 * booleans are written here; any other value through encode(value) ->
 * JSON text. With clear, every string key of t is set to nil as it is
 * read (a record the caller fills again for its next line: emptied here
 * for a lookup each, where a pairs loop costs a traversal more).
 * One pass over t: each key and value is left on the stack as lua_next
 * gives it, a head key found by its string's identity. */
static int l_json_fields(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  luaL_checktype(L, 2, LUA_TTABLE);
  luaL_checktype(L, 3, LUA_TFUNCTION);
  int clear = lua_toboolean(L, 4);
  lua_settop(L, 3);
  lua_Integer nhead = (lua_Integer)lua_rawlen(L, 2);
  if (nhead > MAX_HEAD) luaL_error(L, "json_fields: head holds more than %d names", MAX_HEAD);
  luaL_checkstack(L, (int)nhead + 8, "json_fields: no stack");
  const char *head[MAX_HEAD];
  size_t head_n[MAX_HEAD];
  int head_at[MAX_HEAD]; /* 0: not in t */
  for (lua_Integer i = 0; i < nhead; i++) {
    /* a string already: a number would never be the same key as a string */
    if (lua_rawgeti(L, 2, i + 1) != LUA_TSTRING) luaL_error(L, "json_fields: head[%d] is not a string", (int)i + 1);
    head[i] = lua_tolstring(L, -1, &head_n[i]);
    head_at[i] = 0;
  }
  /* the other fields: on the C stack, or (past FIELDS_ON_C_STACK) in a
   * userdata placed below everything pushed since, which the collector
   * frees even when the encoder raises */
  field on_c_stack[FIELDS_ON_C_STACK], *rest = on_c_stack;
  size_t nrest = 0, cap = FIELDS_ON_C_STACK;
  int box = 0; /* the userdata's stack index, once there is one */
  lua_pushnil(L);
  while (lua_next(L, 1)) {
    int at = lua_gettop(L) - 1;
    if (lua_type(L, at) != LUA_TSTRING) {
      lua_pop(L, 1); /* the key stays, for lua_next */
      continue;
    }
    size_t n;
    const char *k = lua_tolstring(L, at, &n);
    lua_Integer h = 0;
    while (h < nhead && !same_key(k, n, head[h], head_n[h])) h++;
    if (h < nhead) {
      head_at[h] = at;
    } else {
      if (nrest == cap) {
        field *grown = lua_newuserdatauv(L, 2 * cap * sizeof *grown, 0);
        memcpy(grown, rest, nrest * sizeof *grown);
        if (box) {
          lua_replace(L, box);
        } else {
          /* below the fields: each one's index moves up by one */
          box = 4 + (int)nhead;
          lua_insert(L, box);
          at++;
          for (size_t i = 0; i < nrest; i++) grown[i].at++;
          for (lua_Integer i = 0; i < nhead; i++)
            if (head_at[i]) head_at[i]++;
        }
        rest = grown;
        cap *= 2;
      }
      rest[nrest++] = (field){k, n, at};
    }
    luaL_checkstack(L, 4, "json_fields: too many fields");
    if (clear) {
      /* an existing field set to nil: allowed while lua_next traverses */
      lua_pushvalue(L, at);
      lua_pushnil(L);
      lua_rawset(L, 1);
    }
    lua_pushvalue(L, at); /* the key again, for lua_next */
  }
  sort_fields(rest, nrest);
  luaL_checkstack(L, 8, "json_fields: no stack"); /* the buffer, the encoder's call */
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  luaL_addchar(&b, '{');
  int first = 1;
  for (lua_Integer i = 0; i < nhead; i++) {
    if (head_at[i]) put_field(L, &b, 3, &(field){head[i], head_n[i], head_at[i]}, &first);
  }
  for (size_t i = 0; i < nrest; i++) put_field(L, &b, 3, &rest[i], &first);
  luaL_addchar(&b, '}');
  luaL_pushresult(&b);
  return 1;
}

/* json_quote(s) -> the JSON string literal of s, as json.lua writes it. */
static int l_json_quote(lua_State *L) {
  size_t n;
  const char *s = luaL_checklstring(L, 1, &n);
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  put_string(&b, s, n);
  luaL_pushresult(&b);
  return 1;
}

/* ---- otlp_span ------------------------------------------------------------ */

/* Appends the OTLP AnyValue JSON of the value on top of the stack and pops
 * it: integers (and whole floats within 2^53) as "intValue" strings,
 * other finite floats as "doubleValue", the rest as OTLP has them. */
static void put_any(lua_State *L, luaL_Buffer *b, int depth) {
  int type = lua_type(L, -1);
  if (type == LUA_TSTRING) {
    size_t n;
    const char *s = lua_tolstring(L, -1, &n); /* kept by its table */
    lua_pop(L, 1);
    ADD_LIT(b, "{\"stringValue\":");
    put_string(b, s, n);
    luaL_addchar(b, '}');
  } else if (type == LUA_TNUMBER) {
    int is_int = lua_isinteger(L, -1);
    lua_Integer i = lua_tointeger(L, -1);
    lua_Number x = lua_tonumber(L, -1);
    lua_pop(L, 1);
    if (is_int || (x == floor(x) && x > -9007199254740992.0 && x < 9007199254740992.0)) {
      ADD_LIT(b, "{\"intValue\":\"");
      put_integer(b, is_int ? (long long)i : (long long)x);
      ADD_LIT(b, "\"}");
    } else if (isfinite(x)) {
      char text[40];
      snprintf(text, sizeof text, "{\"doubleValue\":%.17g}", x);
      add(b, text, strlen(text));
    } else {
      char text[48];
      snprintf(text, sizeof text, "{\"stringValue\":\"%.14g\"}", x); /* inf, -inf, nan */
      add(b, text, strlen(text));
    }
  } else if (type == LUA_TBOOLEAN) {
    int yes = lua_toboolean(L, -1);
    lua_pop(L, 1);
    if (yes) ADD_LIT(b, "{\"boolValue\":true}");
    else ADD_LIT(b, "{\"boolValue\":false}");
  } else if (type == LUA_TTABLE) {
    if (depth >= MAX_DEPTH) luaL_error(L, "otlp_span: an attribute nests deeper than %d", MAX_DEPTH);
    /* each level keeps its table and its buffer on the stack */
    luaL_checkstack(L, 4, "otlp_span: an attribute nests too deep");
    /* the elements go into a buffer of their own, above the table; its
     * text then replaces the table and joins b */
    int t = lua_gettop(L);
    lua_Integer n = 0;
    while (lua_rawgeti(L, t, n + 1) != LUA_TNIL) {
      lua_pop(L, 1);
      n++;
    }
    lua_pop(L, 1);
    luaL_Buffer inner;
    luaL_buffinit(L, &inner);
    ADD_LIT(&inner, "{\"arrayValue\":{\"values\":[");
    for (lua_Integer i = 1; i <= n; i++) {
      if (i > 1) luaL_addchar(&inner, ',');
      lua_rawgeti(L, t, i);
      put_any(L, &inner, depth + 1);
    }
    ADD_LIT(&inner, "]}}");
    luaL_pushresult(&inner);
    lua_remove(L, t);
    luaL_addvalue(b);
  } else { /* a function or userdata: its type, never its address */
    const char *name = luaL_typename(L, -1);
    lua_pop(L, 1);
    ADD_LIT(b, "{\"stringValue\":");
    put_string(b, name, strlen(name));
    luaL_addchar(b, '}');
  }
}

/* Unix nanoseconds of loop-clock time t, given offset = epoch - loop clock
 * (trace.lua's unix_nano). */
static long long unix_nano(double t, double offset) {
  double e = t + offset, s = floor(e);
  if (!(fabs(e) < 9.2e9)) return 0; /* not a time (nan, inf): the cast would be undefined */
  return (long long)s * 1000000000LL + (long long)floor((e - s) * 1e9);
}

/* The string field k of the table at t (kept by the table), or NULL. */
static const char *string_field(lua_State *L, int t, const char *k, size_t *n) {
  lua_getfield(L, t, k);
  const char *s = lua_type(L, -1) == LUA_TSTRING ? lua_tolstring(L, -1, n) : NULL;
  lua_pop(L, 1);
  return s;
}

/* The integer field k of the table at t (a float with an exact integer
 * value too), or dflt when it is nil; raises for any other value. */
static lua_Integer integer_field(lua_State *L, int t, const char *k, lua_Integer dflt) {
  int ok, absent = lua_getfield(L, t, k) == LUA_TNIL;
  lua_Integer v = lua_tointegerx(L, -1, &ok);
  lua_pop(L, 1);
  if (absent) return dflt;
  if (!ok) luaL_error(L, "otlp_span: a span's %s must be an integer", k);
  return v;
}

static double number_field(lua_State *L, int t, const char *k, double dflt) {
  lua_getfield(L, t, k);
  double x = lua_type(L, -1) == LUA_TNUMBER ? lua_tonumber(L, -1) : dflt;
  lua_pop(L, 1);
  return x;
}

/* Pushes the attrs list of the span at stack index s (put_span reads it),
 * after checking there is one. A span is lua/luagent/observe/trace.lua's:
 * trace_id, span_id, parent (a span), name, kind, start, stop, attrs (the
 * attributes as a list of names and values: {k1, v1, k2, v2, ...}), nattrs
 * (the slots of attrs in use), status, status_message. */
static void push_attributes(lua_State *L, int s) {
  luaL_checkstack(L, 2, "otlp_traces: too many spans");
  if (lua_getfield(L, s, "attrs") != LUA_TTABLE) luaL_error(L, "otlp_span: not a span (trace_id, span_id, name, attrs)");
}

/* Appends the OTLP JSON (opentelemetry.proto.trace.v1.Span) of the span
 * at stack index s, whose attrs list is at `attrs` (push_attributes).
 * Every value is popped before b is written to; its string stays alive in
 * the span's tables. A pair whose value is nil is left out. */
static void put_span(lua_State *L, luaL_Buffer *b, int s, int attrs, double offset) {
  size_t ntrace = 0, nspan = 0, nname = 0, nparent = 0, nmsg = 0;
  const char *trace_id = string_field(L, s, "trace_id", &ntrace);
  const char *span_id = string_field(L, s, "span_id", &nspan);
  const char *name = string_field(L, s, "name", &nname);
  const char *msg = string_field(L, s, "status_message", &nmsg);
  const char *parent = NULL;
  if (lua_getfield(L, s, "parent") == LUA_TTABLE) parent = string_field(L, -1, "span_id", &nparent);
  lua_pop(L, 1); /* the parent table is kept by the span */
  if (!trace_id || !span_id || !name) luaL_error(L, "otlp_span: not a span (trace_id, span_id, name, attrs)");
  double start = number_field(L, s, "start", 0), stop = number_field(L, s, "stop", start);
  lua_Integer kind = integer_field(L, s, "kind", 0);
  lua_Integer status = integer_field(L, s, "status", 0);
  lua_Integer nattrs = integer_field(L, s, "nattrs", 0);
  if (nattrs < 0 || nattrs > MAX_ATTRS) luaL_error(L, "otlp_span: nattrs must be a count up to %d", MAX_ATTRS);

  ADD_LIT(b, "{\"traceId\":\"");
  add(b, trace_id, ntrace);
  ADD_LIT(b, "\",\"spanId\":\"");
  add(b, span_id, nspan);
  if (parent) {
    ADD_LIT(b, "\",\"parentSpanId\":\"");
    add(b, parent, nparent);
  }
  ADD_LIT(b, "\",\"name\":");
  put_string(b, name, nname);
  ADD_LIT(b, ",\"kind\":");
  put_integer(b, (long long)kind);
  ADD_LIT(b, ",\"startTimeUnixNano\":\"");
  put_integer(b, unix_nano(start, offset));
  ADD_LIT(b, "\",\"endTimeUnixNano\":\"");
  put_integer(b, unix_nano(stop, offset));
  ADD_LIT(b, "\",\"attributes\":[");
  int first = 1;
  for (lua_Integer i = 1; i < nattrs; i += 2) {
    size_t nk;
    int absent = lua_rawgeti(L, attrs, i + 1) == LUA_TNIL;
    lua_pop(L, 1);
    if (absent) continue; /* a pair with no value is no attribute */
    if (lua_rawgeti(L, attrs, i) != LUA_TSTRING) luaL_error(L, "otlp_span: attribute name %d is not a string", (int)i);
    const char *k = lua_tolstring(L, -1, &nk); /* kept by attrs */
    lua_pop(L, 1);
    if (!first) luaL_addchar(b, ',');
    first = 0;
    ADD_LIT(b, "{\"key\":");
    put_string(b, k, nk);
    ADD_LIT(b, ",\"value\":");
    lua_rawgeti(L, attrs, i + 1);
    put_any(L, b, 0);
    luaL_addchar(b, '}');
  }
  ADD_LIT(b, "],\"status\":{\"code\":");
  put_integer(b, (long long)status);
  if (msg) {
    ADD_LIT(b, ",\"message\":");
    put_string(b, msg, nmsg);
  }
  ADD_LIT(b, "}}");
}

/* otlp_span(span, offset) -> the span's OTLP JSON (put_span). */
static int l_otlp_span(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  double offset = luaL_checknumber(L, 2);
  lua_settop(L, 2);
  push_attributes(L, 1);
  luaL_checkstack(L, 8, "otlp_span: no stack"); /* put_span's own pushes */
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  put_span(L, &b, 1, 3, offset);
  luaL_pushresult(&b);
  return 1;
}

/* otlp_traces(roots, offset) -> text, count: the OTLP JSON of the spans of
 * every tree in the list `roots` (each span and the spans of its
 * `children` list), tree after tree, each tree parents before children,
 * comma-separated, and how many spans there are. One string for a batch
 * of finished traces, not one per span or per trace and a join. */
static int l_otlp_traces(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  double offset = luaL_checknumber(L, 2);
  lua_settop(L, 2);
  /* each tree breadth first, on the stack: a span's children are pushed
   * after every span already there, so the stack from index 3 is the list */
  for (lua_Integer r = 1;; r++) {
    luaL_checkstack(L, 2, "otlp_traces: too many spans");
    int type = lua_rawgeti(L, 1, r);
    if (type == LUA_TNIL) {
      lua_pop(L, 1);
      break;
    }
    if (type != LUA_TTABLE) luaL_error(L, "otlp_traces: roots[%d] is not a span", (int)r);
    for (int at = lua_gettop(L); at <= lua_gettop(L); at++) {
      if (lua_getfield(L, at, "children") != LUA_TTABLE) {
        lua_pop(L, 1);
        continue;
      }
      int kids = lua_gettop(L);
      for (lua_Integer i = 1;; i++) {
        luaL_checkstack(L, 2, "otlp_traces: too many spans");
        if (lua_rawgeti(L, kids, i) != LUA_TTABLE) {
          lua_pop(L, 1);
          break;
        }
      }
      lua_remove(L, kids);
    }
  }
  int last = lua_gettop(L), n = last - 2;
  for (int at = 3; at <= last; at++) push_attributes(L, at);
  luaL_checkstack(L, 8, "otlp_traces: too many spans"); /* put_span's own pushes */
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  for (int i = 0; i < n; i++) {
    if (i > 0) luaL_addchar(&b, ',');
    put_span(L, &b, 3 + i, last + 1 + i, offset);
  }
  luaL_pushresult(&b);
  lua_pushinteger(L, n);
  return 2;
}

void lg_jsonw_register(lua_State *L) {
  static const luaL_Reg fns[] = {
    {"json_quote", l_json_quote},
    {"json_fields", l_json_fields},
    {"otlp_span", l_otlp_span},
    {"otlp_traces", l_otlp_traces},
    {NULL, NULL},
  };
  luaL_setfuncs(L, fns, 0);
}
