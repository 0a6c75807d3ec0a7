/* Lua binding of the SSE parser: core.sse_parser([opts]) returns a
 * "luagent.SseParser" whose :feed(str) returns the events the bytes
 * completed, as {event=, data=, id=, retry=} tables, or nil and a "protocol"
 * error record when a limit is exceeded. */
#include "core.h"
#include "errors.h"
#include "sse.h"

#include <lauxlib.h>
#include <lua.h>

#define SSE_MT "luagent.SseParser"

typedef struct {
  lg_sse p;
  int open;   /* 0 until initialized and after close */
  int busy;   /* inside feed: refuse reentrant feed or close */
  int broken; /* a Lua error unwound a feed: bytes were lost */
} sse_ud;

/* What the protected part of a feed needs (passed as a light userdata). */
typedef struct {
  sse_ud *u;
  const char *s;
  size_t n;
  lua_State *L;
  lua_Integer count; /* events stored so far */
  int rc;            /* lg_sse_feed's result */
} feed_ctx;

/* Checks argument 1 is an open parser; `fn` names the method in errors. */
static sse_ud *check_open(lua_State *L, const char *fn) {
  sse_ud *u = luaL_checkudata(L, 1, SSE_MT);
  if (!u->open) luaL_error(L, "sse_parser:%s: parser is closed", fn);
  if (u->busy) luaL_error(L, "sse_parser:%s: called during a feed", fn);
  if (u->broken)
    luaL_error(L, "sse_parser:%s: a previous feed raised; the stream is lost", fn);
  return u;
}

/* Reads a positive integer limit opts[name]; 0 (the default) when absent. */
static size_t opt_limit(lua_State *L, int opts, const char *name) {
  size_t v = 0;
  if (lua_getfield(L, opts, name) != LUA_TNIL) {
    lua_Integer i = lua_isinteger(L, -1) ? lua_tointeger(L, -1) : 0;
    if (i < 1)
      luaL_error(L, "sse_parser: opts.%s must be a positive integer", name);
    v = (size_t)i;
  }
  lua_pop(L, 1);
  return v;
}

/* sse_parser([opts]) -> parser. The userdata is closed until init is done. */
static int l_sse_parser(lua_State *L) {
  size_t max_line = 0, max_event = 0;
  if (!lua_isnoneornil(L, 1)) {
    luaL_checktype(L, 1, LUA_TTABLE);
    max_line = opt_limit(L, 1, "max_line");
    max_event = opt_limit(L, 1, "max_event");
  }
  sse_ud *u = lua_newuserdatauv(L, sizeof *u, 0);
  u->open = u->busy = u->broken = 0;
  luaL_setmetatable(L, SSE_MT);
  lg_sse_init(&u->p, max_line, max_event);
  u->open = 1;
  return 1;
}

/* Sets t[name] = the value on top (popped) without metamethods: the table
 * may be a caller's, and no Lua code may run inside the parser's callback. */
static void raw_setfield(lua_State *L, int t, const char *name) {
  lua_pushstring(L, name);
  lua_insert(L, -2);
  lua_rawset(L, t);
}

/* Sets event, data, id and retry of the table at index t to `ev`'s (id and
 * retry nil when the event has none). */
void lg_sse_fill_event(lua_State *L, int t, const lg_sse_event *ev) {
  t = lua_absindex(L, t);
  lua_pushlstring(L, ev->type, ev->type_len);
  raw_setfield(L, t, "event");
  lua_pushlstring(L, ev->data, ev->data_len);
  raw_setfield(L, t, "data");
  if (ev->has_id) lua_pushlstring(L, ev->id, ev->id_len);
  else lua_pushnil(L);
  raw_setfield(L, t, "id");
  if (ev->retry >= 0) lua_pushinteger(L, (lua_Integer)ev->retry);
  else lua_pushnil(L);
  raw_setfield(L, t, "retry");
}

/* Pushes one event as a table {event=, data=, id=, retry=}. */
void lg_sse_push_event(lua_State *L, const lg_sse_event *ev) {
  lua_createtable(L, 0, 4);
  lg_sse_fill_event(L, -1, ev);
}

/* Event callback: appends one event table to the results table on top. */
static int push_event(void *ud, const lg_sse_event *ev) {
  feed_ctx *c = ud;
  lg_sse_push_event(c->L, ev);
  lua_rawseti(c->L, -2, ++c->count);
  return 0;
}

/* Runs the parser under lua_pcall, so a memory error raised while building
 * tables cannot skip the bookkeeping in l_feed. Returns the results table. */
static int feed_protected(lua_State *L) {
  feed_ctx *c = lua_touserdata(L, 1);
  lua_newtable(L);
  c->L = L;
  c->rc = lg_sse_feed(&c->u->p, c->s, c->n, push_event, c);
  return 1;
}

/* Pushes a "protocol" error record for parser code `rc`, with the events
 * completed before the error (table at index `events`) as its `events`. */
static void push_error(lua_State *L, const lg_sse *p, int rc, int events) {
  lua_Integer limit = (lua_Integer)(rc == LG_SSE_ELINE ? p->max_line : p->max_event);
  lua_Integer off = (lua_Integer)lg_sse_error_offset(p);
  lua_pushfstring(L, "sse: %s (%I bytes) at byte offset %I", lg_sse_strerror(rc),
                  limit, off);
  lg_error_push(L, LG_ERR_PROTOCOL, lua_tostring(L, -1));
  lua_remove(L, -2);
  lua_pushinteger(L, off);
  lua_setfield(L, -2, "offset");
  lua_pushvalue(L, events);
  lua_setfield(L, -2, "events");
}

/* parser:feed(str) -> {events} | nil, err. err.events holds the events this
 * feed completed before the error; later feeds return the same error. */
static int l_feed(lua_State *L) {
  sse_ud *u = check_open(L, "feed");
  feed_ctx c = {u, NULL, 0, L, 0, 0};
  c.s = luaL_checklstring(L, 2, &c.n);
  lua_settop(L, 2);
  lua_pushcfunction(L, feed_protected);
  lua_pushlightuserdata(L, &c);
  u->busy = 1;
  int status = lua_pcall(L, 1, 1, 0);
  u->busy = 0;
  if (status != LUA_OK) {
    u->broken = 1;
    return lua_error(L);
  }
  if (c.rc == LG_SSE_OK) return 1;
  if (c.rc == LG_SSE_ENOMEM) return luaL_error(L, "sse_parser:feed: out of memory");
  lua_pushnil(L);
  push_error(L, &u->p, c.rc, 3);
  return 2;
}

/* parser:has_partial() -> true when the stream so far ends inside a line or
 * an event (so ending it now means it was truncated). */
static int l_has_partial(lua_State *L) {
  sse_ud *u = check_open(L, "has_partial");
  lua_pushboolean(L, lg_sse_has_partial(&u->p));
  return 1;
}

/* parser:close(), __close and __gc: frees the buffers; idempotent. */
static int l_close(lua_State *L) {
  sse_ud *u = luaL_checkudata(L, 1, SSE_MT);
  if (u->busy) return luaL_error(L, "sse_parser:close: called during a feed");
  if (u->open) {
    u->open = 0;
    lg_sse_free(&u->p);
  }
  return 0;
}

static const luaL_Reg sse_methods[] = {
  {"feed", l_feed},
  {"has_partial", l_has_partial},
  {"close", l_close},
  {NULL, NULL},
};


/* Creates the parser metatable and sets sse_parser in the table on top. */
void lg_sse_register(lua_State *L) {
  lg_class_new(L, SSE_MT, sse_methods, l_close, l_close);
  lua_pushcfunction(L, l_sse_parser);
  lua_setfield(L, -2, "sse_parser");
}
