/* Lua binding of the HTTP client (host/http.c): core.http_request{...}
 * suspends the calling task until the response headers arrive and returns a
 * "luagent.HttpRequest" with read, event, status, headers, info and close,
 * or nil and an error record. One client per Lua state, a userdata in the
 * registry; each request is a userdata that embeds the transport's request.
 * One task at a time may wait on a request (in read or event); cancelling
 * it aborts the transfer. Error records carry the transport's facts (curl
 * code, errno, phase, bytes); lua/luagent/base/http.lua names their kind. */
#include "http.h"

#include <lauxlib.h>
#include <lua.h>
#include <stddef.h>
#include <string.h>

#include "core.h"
#include "errors.h"
#include "loop.h"

#define HTTP_KEY "luagent.Http"
#define REQ_MT "luagent.HttpRequest"

/* A request as Lua holds it: the transport's request and the wait of the
 * task reading it. */
typedef struct {
  lg_http_request r;
  lg_wait wait;
  int waiting; /* a task waits on `wait` in read or event */
} req_ud;

/* ------------------------------------------------------------ the client */

/* __gc of the client: closes it (its memory is Lua's). */
static int l_client_gc(lua_State *L) {
  lg_http_client_close(lua_touserdata(L, 1));
  return 0;
}

/* The client of this Lua state, opened on first use; it lives in the
 * registry, owned by the state, and outlives every request's finalizer. */
static lg_http_client *client_get(lua_State *L) {
  if (lua_getfield(L, LUA_REGISTRYINDEX, HTTP_KEY) == LUA_TUSERDATA) {
    lg_http_client *c = lua_touserdata(L, -1);
    lua_pop(L, 1);
    return c;
  }
  lua_pop(L, 1);
  lg_loop *loop = lg_loop_get(L);
  lg_http_client *c = lua_newuserdatauv(L, sizeof *c, 0);
  memset(c, 0, sizeof *c);
  c->closed = 1; /* safe for __gc until opened */
  lua_createtable(L, 0, 1);
  lua_pushcfunction(L, l_client_gc);
  lua_setfield(L, -2, "__gc");
  lua_setmetatable(L, -2);
  const char *err = "out of memory";
  if (lg_http_client_open(c, loop, &err) != 0) luaL_error(L, "http: %s", err);
  lua_setfield(L, LUA_REGISTRYINDEX, HTTP_KEY);
  return c;
}

/* ------------------------------------------------------ error records */

/* Pushes the error record of a failed request: the facts, not a verdict.
 * Our own failures keep their kind (timeout with `which`, protocol from the
 * SSE parser, cancelled); a failure curl reported is kind `transport` with
 * curl's code and message and the socket's errno (by name). Both carry the
 * phase, the body bytes received, whether any reached Lua, and the status
 * once known. lua/luagent/base/http.lua names a curl failure's kind from these
 * facts; lua/luagent/model/classify.lua alone decides whether it is retried. */
static void push_failure(lua_State *L, const lg_http_failure *f) {
  static const lg_error_kind kinds[] = {
      [LG_HTTP_CURL] = LG_ERR_TRANSPORT, [LG_HTTP_TIMEOUT] = LG_ERR_TIMEOUT,
      [LG_HTTP_PROTOCOL] = LG_ERR_PROTOCOL, [LG_HTTP_CANCELLED] = LG_ERR_CANCELLED};
  lg_error_push(L, kinds[f->cause], f->message);
  if (f->which) {
    lua_pushstring(L, f->which);
    lua_setfield(L, -2, "which");
  }
  lua_pushinteger(L, f->curl_code);
  lua_setfield(L, -2, "curl_code");
  lua_pushstring(L, f->curl_message);
  lua_setfield(L, -2, "curl_message");
  if (f->errno_name) {
    lua_pushstring(L, f->errno_name);
    lua_setfield(L, -2, "errno");
  }
  lua_pushstring(L, f->phase);
  lua_setfield(L, -2, "phase");
  lua_pushinteger(L, (lua_Integer)f->bytes);
  lua_setfield(L, -2, "bytes");
  lua_pushboolean(L, f->delivered);
  lua_setfield(L, -2, "delivered");
  if (f->status > 0) {
    lua_pushinteger(L, f->status);
    lua_setfield(L, -2, "status");
  }
}

/* Pushes nil (a clean end) or nil, err (a failure) for a finished body; an
 * SSE parser's failure says at which stream byte (err.offset) when
 * `sse_offset` is set. Returns the number of values pushed. */
static int push_end(lua_State *L, lg_http_request *r, int sse_offset) {
  lua_pushnil(L);
  lg_http_failure f;
  if (!lg_http_failure_get(r, &f)) return 1;
  push_failure(L, &f);
  if (sse_offset && f.sse_error) {
    lua_pushinteger(L, (lua_Integer)f.sse_offset);
    lua_setfield(L, -2, "offset");
  }
  return 2;
}

/* ------------------------------------------------------ the request */

/* Argument 1 as a request (raises when it is not one). */
static req_ud *check_req(lua_State *L) { return luaL_checkudata(L, 1, REQ_MT); }

/* The transport's wake: ends the reading task's wait, if one waits. */
static void req_wake(void *arg) {
  req_ud *u = arg;
  u->waiting = 0;
  lg_task_wake(&u->wait);
}

/* Cancel hook of the wait: the waiting task was cancelled. */
static void req_cancel(lg_wait *w) {
  req_ud *u = (req_ud *)((char *)w - offsetof(req_ud, wait));
  u->waiting = 0;
  lg_http_cancel(&u->r);
}

/* Suspends the calling task until the transport wakes it; raises `busy`
 * when another task already waits on u. */
static int req_suspend(lua_State *L, req_ud *u, const char *busy, lua_KContext ctx,
                       lua_KFunction k) {
  if (u->waiting) return luaL_error(L, "%s", busy);
  u->waiting = 1;
  lg_http_wait(&u->r);
  return lg_task_suspend(L, &u->wait, ctx, k);
}

/* Reads timeout.<name> (seconds) from the table at index `t`, or 0 when
 * absent; *given (if not NULL) tells whether it was there. */
static double timeout_field(lua_State *L, int t, const char *name, int *given) {
  double v = 0;
  if (given) *given = 0;
  if (lua_type(L, t) == LUA_TTABLE) {
    lua_getfield(L, t, name);
    if (!lua_isnil(L, -1)) {
      if (!lua_isnumber(L, -1)) luaL_error(L, "http.request: timeout.%s must be a number", name);
      v = lua_tonumber(L, -1);
      if (given) *given = 1;
    }
    lua_pop(L, 1);
  }
  return v;
}

/* Reads the request's http_version: "2" (the default: HTTP/2 over TLS when
 * the server offers it, else HTTP/1.1), "1.1", or "2-prior-knowledge"
 * (HTTP/2 from the first byte, also over plain TCP: h2c); an LG_HTTP_V*. */
static int check_http_version(lua_State *L) {
  static const char *const names[] = {"2", "1.1", "2-prior-knowledge", NULL};
  static const int versions[] = {LG_HTTP_V2, LG_HTTP_V1_1, LG_HTTP_V2_PRIOR};
  lua_getfield(L, 1, "http_version");
  if (lua_isnil(L, -1)) {
    lua_pop(L, 1);
    return versions[0];
  }
  const char *v = lua_tostring(L, -1);
  for (int i = 0; v && names[i]; i++) {
    if (strcmp(v, names[i]) == 0) {
      lua_pop(L, 1);
      return versions[i];
    }
  }
  return luaL_error(L, "http.request: http_version must be \"2\", \"1.1\" or "
                       "\"2-prior-knowledge\" (got %s)", luaL_tolstring(L, -1, NULL));
}

/* Continuation: returns the request once its headers arrived, or nil, err
 * when it ended before them (the request is then closed). `ctx` is the
 * request's stack index. */
static int request_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  req_ud *u = lua_touserdata(L, (int)ctx);
  int got = lg_http_response(&u->r);
  if (got > 0) {
    lua_settop(L, (int)ctx);
    return 1;
  }
  if (got == 0) return lg_task_suspend(L, &u->wait, ctx, request_k);
  int n = push_end(L, &u->r, 0);
  lg_http_close(&u->r);
  return n;
}

/* http_request{method=, url=, headers=, body=, timeout={connect=,
 * first_byte=, idle=, total=}, sse={max_line=, max_event=}, max_buffer=,
 * http_version=, ca_file=} -> request once
 * the response headers arrived, or nil, err. The request owns the transfer;
 * close it (or let it be collected) to abort. An absent timeout means none;
 * connect, first_byte and idle <= 0 mean none too. A given total <= 0 (a
 * deadline already passed) fails at once with kind timeout, which = "total",
 * before any transfer starts. max_buffer: unread body bytes held before the
 * transfer pauses (default: see http.h). */
static int l_http_request(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  lg_http_client *c = client_get(L);
  lg_http_opts o;
  memset(&o, 0, sizeof o);
  lua_getfield(L, 1, "url");
  o.url = luaL_optstring(L, -1, NULL);
  if (!o.url) return luaL_error(L, "http.request: url is required");
  lua_getfield(L, 1, "method");
  o.method = luaL_optstring(L, -1, NULL);
  lua_getfield(L, 1, "body");
  o.body = luaL_optlstring(L, -1, NULL, &o.body_len);
  lua_getfield(L, 1, "ca_file");
  o.ca_file = luaL_optstring(L, -1, NULL);
  o.version = check_http_version(L);
  lua_getfield(L, 1, "timeout");
  int tmo = lua_gettop(L);
  o.connect = timeout_field(L, tmo, "connect", NULL);
  o.first_byte = timeout_field(L, tmo, "first_byte", NULL);
  o.idle = timeout_field(L, tmo, "idle", NULL);
  o.total = timeout_field(L, tmo, "total", &o.total_given);
  if (lua_getfield(L, 1, "sse") == LUA_TTABLE) {
    lua_getfield(L, -1, "max_line");
    o.max_line = (size_t)luaL_optinteger(L, -1, 0);
    lua_getfield(L, -2, "max_event");
    o.max_event = (size_t)luaL_optinteger(L, -1, 0);
    lua_pop(L, 2);
  }
  lua_pop(L, 1);
  if (lua_getfield(L, 1, "max_buffer") != LUA_TNIL) {
    int is_int;
    lua_Integer max_buffer = lua_tointegerx(L, -1, &is_int);
    if (!is_int || max_buffer < 1)
      return luaL_error(L, "http.request: max_buffer must be a positive integer (bytes)");
    o.max_buffer = (size_t)max_buffer;
  }
  lua_pop(L, 1);

  req_ud *u = lua_newuserdatauv(L, sizeof *u, 0);
  memset(u, 0, sizeof *u); /* the request reads as closed: safe for __gc */
  luaL_setmetatable(L, REQ_MT);
  u->wait.cancel = req_cancel;
  o.wake = req_wake;
  o.arg = u;
  if (lg_http_init(&u->r, c, &o) != 0) return luaL_error(L, "http.request: out of memory");
  if (lg_http_response(&u->r) < 0) return request_k(L, LUA_OK, lua_absindex(L, -1));

  /* headers: a map {name = value} or a list {"Name: value", ...} */
  if (lua_getfield(L, 1, "headers") == LUA_TTABLE) {
    lua_pushnil(L);
    while (lua_next(L, -2)) {
      const char *line;
      if (lua_type(L, -2) == LUA_TNUMBER) {
        line = luaL_checkstring(L, -1);
      } else {
        lua_pushfstring(L, "%s: %s", luaL_checkstring(L, -2), luaL_checkstring(L, -1));
        line = lua_tostring(L, -1);
        lua_replace(L, -2);
      }
      if (lg_http_add_header(&u->r, line) != 0) return luaL_error(L, "http.request: out of memory");
      lua_pop(L, 1);
    }
  }
  lua_pop(L, 1);
  const char *err = lg_http_start(&u->r, &o);
  if (err) return luaL_error(L, "http.request: %s", err);
  return lg_task_suspend(L, &u->wait, lua_absindex(L, -1), request_k);
}

static int read_k(lua_State *L, int status, lua_KContext ctx);

/* req:read() -> the next chunk of body bytes, nil at the end, nil, err. */
static int l_req_read(lua_State *L) {
  check_req(L);
  lua_settop(L, 1);
  return read_k(L, LUA_OK, 0);
}

/* read's body and continuation. */
static int read_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  (void)ctx;
  req_ud *u = check_req(L);
  if (lg_http_closed(&u->r)) return luaL_error(L, "read: request is closed");
  size_t n;
  const char *p = lg_http_peek(&u->r, &n);
  if (n > 0) {
    lua_pushlstring(L, p, n);
    lg_http_take(&u->r);
    return 1;
  }
  if (lg_http_done(&u->r)) return push_end(L, &u->r, 0);
  return req_suspend(L, u, "read: another task is already reading", 0, read_k);
}

/* Where an event goes: a new table, or the caller's table at `into`. */
typedef struct {
  lua_State *L;
  int into; /* stack index of the caller's table to fill, or 0 */
} event_out;

/* lg_http_next_event's callback: pushes the event with its offset. */
static void push_event(void *ud, const lg_sse_event *ev, uint64_t offset) {
  event_out *o = ud;
  if (o->into) {
    lua_pushvalue(o->L, o->into);
    lg_sse_fill_event(o->L, -1, ev);
  } else {
    lg_sse_push_event(o->L, ev);
  }
  lua_pushliteral(o->L, "offset");
  lua_pushinteger(o->L, (lua_Integer)offset);
  lua_rawset(o->L, -3);
}

static int event_k(lua_State *L, int status, lua_KContext ctx);

/* The next event of u (argument 1) into the table at argument 2, if any:
 * pushes it, or the end, or waits (the continuation comes back here). */
static int event_next(lua_State *L, req_ud *u) {
  if (lg_http_closed(&u->r)) return luaL_error(L, "event: request is closed");
  event_out o = {L, lua_istable(L, 2) ? 2 : 0};
  if (lg_http_next_event(&u->r, push_event, &o)) return 1;
  if (lg_http_done(&u->r)) return push_end(L, &u->r, 1);
  return req_suspend(L, u, "event: another task is already reading", 0, event_k);
}

/* req:event([into]) -> the next SSE event {event=, data=, id=, retry=,
 * offset=} (offset: the stream byte just past the event; `into`, a table
 * given by a reader that keeps no event past the next call, is filled and
 * returned instead of a new one), nil at the
 * end of the stream, or nil, err (transport failure, or a protocol error for
 * an oversized line or event: err.offset is its byte). Bytes after the last
 * complete event at the end of the stream are reported by req:info().partial. */
static int l_req_event(lua_State *L) {
  req_ud *u = check_req(L);
  lua_settop(L, 2);
  if (!lua_isnil(L, 2)) luaL_checktype(L, 2, LUA_TTABLE);
  return event_next(L, u); /* per event: the request is checked once */
}

/* event's continuation, once the transport woke the task. */
static int event_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  (void)ctx;
  return event_next(L, check_req(L));
}

/* req:status() -> the HTTP status code. */
static int l_req_status(lua_State *L) {
  lua_pushinteger(L, lg_http_status(&check_req(L)->r));
  return 1;
}

/* req:headers() -> {lowercased name = value}; repeated names joined by ", ". */
static int l_req_headers(lua_State *L) {
  req_ud *u = check_req(L);
  lua_newtable(L);
  size_t len;
  const char *p = lg_http_head(&u->r, &len);
  const char *end = p + len;
  while (p < end) {
    const char *eol = memchr(p, '\n', (size_t)(end - p));
    if (!eol) eol = end;
    const char *colon = memchr(p, ':', (size_t)(eol - p));
    if (colon) {
      luaL_Buffer b;
      luaL_buffinit(L, &b);
      for (const char *c = p; c < colon; c++) luaL_addchar(&b, (char)(*c >= 'A' && *c <= 'Z' ? *c + 32 : *c));
      luaL_pushresult(&b);
      const char *v = colon + 1, *ve = eol;
      while (v < ve && (*v == ' ' || *v == '\t')) v++;
      while (ve > v && (ve[-1] == '\r' || ve[-1] == ' ' || ve[-1] == '\t')) ve--;
      lua_pushvalue(L, -1);
      if (lua_rawget(L, -3) == LUA_TSTRING) {
        lua_pushliteral(L, ", ");
        lua_pushlstring(L, v, (size_t)(ve - v));
        lua_concat(L, 3);
      } else {
        lua_pop(L, 1);
        lua_pushlstring(L, v, (size_t)(ve - v));
      }
      lua_rawset(L, -3);
    }
    p = eol + 1;
  }
  return 1;
}

/* req:info() -> {bytes=, delivered=, done=, partial=, paused=}. */
static int l_req_info(lua_State *L) {
  lg_http_info i;
  lg_http_info_get(&check_req(L)->r, &i);
  lua_createtable(L, 0, 5);
  lua_pushinteger(L, (lua_Integer)i.bytes);
  lua_setfield(L, -2, "bytes");
  lua_pushboolean(L, i.delivered);
  lua_setfield(L, -2, "delivered");
  lua_pushboolean(L, i.done);
  lua_setfield(L, -2, "done");
  lua_pushboolean(L, i.partial);
  lua_setfield(L, -2, "partial");
  lua_pushboolean(L, i.paused);
  lua_setfield(L, -2, "paused");
  return 1;
}

/* req:close(), __close and __gc: aborts the transfer if running and frees
 * it; a task waiting on it wakes and sees it closed. Idempotent. */
static int l_req_close(lua_State *L) {
  req_ud *u = check_req(L);
  if (u->waiting && !lg_http_closed(&u->r)) req_wake(u);
  lg_http_close(&u->r);
  return 0;
}

/* Creates the request metatable and sets http_request in the table on top. */
void lg_http_register(lua_State *L) {
  static const luaL_Reg methods[] = {
      {"read", l_req_read},       {"event", l_req_event}, {"status", l_req_status},
      {"headers", l_req_headers}, {"info", l_req_info},   {"close", l_req_close},
      {NULL, NULL}};
  lg_class_new(L, REQ_MT, methods, l_req_close, l_req_close);
  lua_pushcfunction(L, l_http_request);
  lua_setfield(L, -2, "http_request");
}
