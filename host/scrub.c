/* The key scrubber; see scrub.h. Replacement follows secrets.lua's rules:
 * forms longest first, each replacing all its occurrences, left to right,
 * by "***", in the text the forms before it left. */
#include "scrub.h"

#include <lauxlib.h>
#include <lua.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"

#define SCRUB_MT "luagent.Scrubber"
#define MASK "***"

typedef struct {
  char *p;
  size_t n;
} form;

/* Made empty (forms NULL, count 0); close frees the forms, idempotent,
 * and a closed scrubber raises: one that let keys through would be worse. */
typedef struct {
  form *forms; /* longest first; each p malloc'd */
  int count, cap;
  int closed;
} scrubber;

static scrubber *usable(lua_State *L, scrubber *s) {
  if (s->closed) luaL_error(L, "scrubber: used after close");
  return s;
}

static scrubber *check(lua_State *L) { return usable(L, luaL_checkudata(L, 1, SCRUB_MT)); }

/* Frees every form; shared by __gc and __close. */
static int l_close(lua_State *L) {
  scrubber *s = luaL_checkudata(L, 1, SCRUB_MT);
  for (int i = 0; i < s->count; i++) free(s->forms[i].p);
  free(s->forms);
  s->forms = NULL;
  s->count = s->cap = 0;
  s->closed = 1;
  return 0;
}

/* scrubber() -> a scrubber with no form. */
static int l_new(lua_State *L) {
  scrubber *s = lua_newuserdatauv(L, sizeof *s, 0);
  memset(s, 0, sizeof *s);
  luaL_setmetatable(L, SCRUB_MT);
  return 1;
}

/* s:add(form): adds a form of 3 bytes or more (a duplicate is ignored),
 * after the forms as long or longer. */
static int l_add(lua_State *L) {
  scrubber *s = check(L);
  size_t n;
  const char *f = luaL_checklstring(L, 2, &n);
  if (n < 3) return luaL_argerror(L, 2, "a form is 3 bytes or more (\"***\" must not grow a text)");
  for (int i = 0; i < s->count; i++)
    if (s->forms[i].n == n && memcmp(s->forms[i].p, f, n) == 0) return 0;
  if (s->count == s->cap) {
    int cap = s->cap ? s->cap * 2 : 8;
    form *forms = realloc(s->forms, (size_t)cap * sizeof *forms);
    if (!forms) return luaL_error(L, "scrubber: out of memory");
    s->forms = forms;
    s->cap = cap;
  }
  char *p = malloc(n);
  if (!p) return luaL_error(L, "scrubber: out of memory");
  memcpy(p, f, n);
  int at = s->count;
  while (at > 0 && s->forms[at - 1].n < n) at--;
  memmove(s->forms + at + 1, s->forms + at, (size_t)(s->count - at) * sizeof *s->forms);
  s->forms[at] = (form){p, n};
  s->count++;
  return 0;
}

/* Whether any form occurs in t[0, n). */
static int any_form(const scrubber *s, const char *t, size_t n) {
  for (int i = 0; i < s->count; i++)
    if (s->forms[i].n <= n && memmem(t, n, s->forms[i].p, s->forms[i].n)) return 1;
  return 0;
}

/* Replaces every form in t[0, n), working in `scratch` (2 * (n + 1) bytes,
 * the caller's); returns where the result is, *out_n its length. No pass
 * makes the text longer: every form has 3 bytes or more, as many as "***". */
static const char *replace_all(const scrubber *s, const char *t, size_t n, char *scratch, size_t *out_n) {
  char *a = scratch, *b = scratch + n + 1;
  memcpy(a, t, n);
  size_t len = n;
  for (int i = 0; i < s->count; i++) {
    const form *f = &s->forms[i];
    const char *hit = f->n <= len ? memmem(a, len, f->p, f->n) : NULL;
    if (!hit) continue;
    size_t w = 0;
    const char *p = a, *end = a + len;
    while (hit) {
      size_t keep = (size_t)(hit - p);
      memcpy(b + w, p, keep);
      w += keep;
      memcpy(b + w, MASK, 3);
      w += 3;
      p = hit + f->n;
      hit = (size_t)(end - p) >= f->n ? memmem(p, (size_t)(end - p), f->p, f->n) : NULL;
    }
    size_t rest = (size_t)(end - p);
    memcpy(b + w, p, rest);
    len = w + rest;
    char *tmp = a;
    a = b;
    b = tmp;
  }
  *out_n = len;
  return a;
}

/* Pushes t[0, n) scrubbed; `self` (a stack index, 0 for none) is the
 * string t came from, pushed again when nothing changes. */
static void push_scrubbed(lua_State *L, const scrubber *s, const char *t, size_t n, int self) {
  if (!any_form(s, t, n)) {
    if (self) lua_pushvalue(L, self);
    else lua_pushlstring(L, t, n);
    return;
  }
  /* the work space is a userdata: collected even when a push raises */
  char *scratch = lua_newuserdatauv(L, 2 * (n + 1), 0);
  size_t len = 0;
  const char *out = replace_all(s, t, n, scratch, &len);
  lua_pushlstring(L, out, len);
  lua_remove(L, -2);
}

/* The length of the longest end of t[0, n) that is the start of a form
 * but not a whole one. */
static size_t tail_len(const scrubber *s, const char *t, size_t n) {
  size_t best = 0;
  for (int i = 0; i < s->count; i++) {
    const form *f = &s->forms[i];
    /* candidates start in the last f->n - 1 bytes, earliest (longest) first */
    size_t from = n >= f->n ? n - f->n + 1 : 0;
    while (from < n && n - from > best) {
      const char *c = memchr(t + from, f->p[0], n - from);
      if (!c) break;
      size_t at = (size_t)(c - t);
      if (n - at <= best) break;
      if (memcmp(c, f->p, n - at) == 0) {
        best = n - at;
        break;
      }
      from = at + 1;
    }
  }
  return best;
}

/* s:text(str) -> str with every form replaced by "***" (str itself when
 * there was none). */
static int l_text(lua_State *L) {
  scrubber *s = check(L);
  size_t n;
  const char *t = luaL_checklstring(L, 2, &n);
  push_scrubbed(L, s, t, n, 2);
  return 1;
}

/* s:tail(str) -> the length of the longest end of str that is the start
 * of a form (but not a whole one). */
static int l_tail(lua_State *L) {
  scrubber *s = check(L);
  size_t n;
  const char *t = luaL_checklstring(L, 2, &n);
  lua_pushinteger(L, (lua_Integer)tail_len(s, t, n));
  return 1;
}

/* s:delta(held, str) -> text, tail: the next piece of a stream of deltas.
 * held (nil or a string) is what the stream kept back last time. Scrubs
 * held .. str; text is it without its end that may start a form, tail is
 * that end (nil when none) to hold back until the next piece. `at` is
 * held's stack index. */
static int delta(lua_State *L, scrubber *s, int at) {
  size_t hn = 0, n;
  const char *held = luaL_optlstring(L, at, NULL, &hn);
  const char *t = luaL_checklstring(L, at + 1, &n);
  if (held && hn > 0) {
    lua_pushvalue(L, at);
    lua_pushvalue(L, at + 1);
    lua_concat(L, 2);
    t = lua_tolstring(L, -1, &n);
    push_scrubbed(L, s, t, n, lua_gettop(L));
  } else {
    push_scrubbed(L, s, t, n, at + 1);
  }
  t = lua_tolstring(L, -1, &n);
  size_t k = tail_len(s, t, n);
  if (k == 0) {
    lua_pushnil(L);
    return 2;
  }
  lua_pushlstring(L, t, n - k);
  lua_pushlstring(L, t + n - k, k);
  return 2;
}

static int l_delta(lua_State *L) { return delta(L, check(L), 2); }

/* The function s:delta_function() returns: s:delta bound to s. */
static int l_bound_delta(lua_State *L) {
  return delta(L, usable(L, lua_touserdata(L, lua_upvalueindex(1))), 1);
}

/* s:delta_function() -> function(held, str): s:delta without the method
 * call, for the per-delta path (the function keeps s alive). */
static int l_delta_function(lua_State *L) {
  check(L);
  lua_settop(L, 1);
  lua_pushcclosure(L, l_bound_delta, 1);
  return 1;
}

void lg_scrub_register(lua_State *L) {
  static const luaL_Reg methods[] = {
      {"add", l_add},     {"text", l_text}, {"tail", l_tail}, {"delta", l_delta},
      {"delta_function", l_delta_function}, {NULL, NULL}};
  lg_class_new(L, SCRUB_MT, methods, l_close, l_close);
  lua_pushcfunction(L, l_new);
  lua_setfield(L, -2, "scrubber");
}
