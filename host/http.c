/* HTTP client on the loop: libcurl's multi socket API driven by libuv.
 *
 * One multi handle per Lua state (connections are reused across requests to
 * the same host), one easy handle per request. curl's sockets are watched
 * with uv_poll, curl's own timer is a uv_timer. Callbacks only move bytes
 * into the request's C buffer and wake the waiting task; parsing SSE and
 * building Lua values happen when Lua asks for the next event.
 *
 * Timeouts are per request and each has its own error: `connect` (curl's,
 * real time), `first_byte` (until the response headers), `idle` (longest
 * silence between body bytes) and `total` (the whole request). The last three
 * run on the loop's clock, so they follow the virtual clock in simulations.
 * One task at a time may wait on a request (in read or event).
 *
 * For the virtual clock (loop.c's header) a transfer is held while curl
 * resolves the host name, then real work unless the address it connects
 * to is a listener of this loop (the mock provider, the specs' servers). */
#include "http.h"

#include <lauxlib.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <uv.h>

#include "core.h"
#include "curl_api.h"
#include "errors.h"
#include "loop.h"
#include "sse.h"

#define HTTP_KEY "luagent.Http"
#define REQ_MT "luagent.HttpRequest"
/* Body bytes a request buffers by default before it pauses its transfer
 * (the rest waits in the socket, in the kernel's memory, not the process's):
 * HIGH_WATER while the requests of the process hold under BUDGET bytes of
 * buffers in all, LOW_WATER past it. Streams that arrive as they are
 * generated never reach either; an answer sent at once (bench/stream_server
 * .lua: 64 KiB) is read a bound at a time. Each pause costs CPU (PULL_MAX
 * keeps it low), worth it only when many streams would hold their bursts:
 * at 1,000 at once, 64 KiB each held about 64 MB (bench/stream.sh's header
 * has figures). A max_buffer given is a bound of its own. */
#define HIGH_WATER ((size_t)64 << 10)
#define LOW_WATER ((size_t)16 << 10)
#define BUDGET ((size_t)4 << 20)
/* curl's read size per transfer (CURLOPT_BUFFERSIZE, curl's default 16 KiB):
 * curl allocates it per transfer and a paused transfer holds up to one
 * read, so it counts once per stream. Smaller reads cost more syscalls. */
#define READ_SIZE 4096L
/* Bytes a reader may pull from its own socket per wake-up (see drained). */
#define PULL_MAX ((size_t)256 << 10)

typedef struct {
  CURLM *multi;
  uv_timer_t *timer; /* curl's timer; malloc'd, freed in its close callback */
  lg_loop *loop;
  size_t held;       /* bytes allocated for the requests' body buffers */
  int closed;
} http_ctx;

typedef struct {
  uv_poll_t poll;
  curl_socket_t fd;
  http_ctx *ctx;
} http_sock;

enum { R_CLOSED, R_HEADERS, R_BODY, R_DONE };

/* Where a transfer was when it ended: connecting (name, TCP, TLS), waiting
 * for the response headers (the request was sent), or reading the body. */
enum { P_CONNECT, P_HEADERS, P_BODY };
static const char *const phase_names[] = {"connect", "headers", "body"};

typedef struct {
  char *p;
  size_t off, len, cap; /* unread bytes are p[off, len) */
} bytebuf;

typedef struct request {
  http_ctx *ctx;
  CURL *easy;
  struct curl_slist *headers;
  char *body;
  int state;
  int in_multi;
  int paused;
  curl_socket_t fd;     /* the transfer's socket, as curl last watched it */
  size_t pulled;        /* body bytes pulled by the reader since it last waited */
  long status;
  bytebuf head;         /* raw header lines of the final response */
  bytebuf in;           /* body bytes not yet read by Lua */
  lg_sse sse;
  int sse_on;
  int sse_failed;       /* the parser failed (after the events before it) */
  uint64_t received;    /* body bytes received */
  int delivered;        /* some body byte or event reached Lua */
  int phase;            /* P_CONNECT, P_HEADERS, P_BODY */
  /* outcome once R_DONE: a curl code, or our own failure */
  CURLcode result;
  long os_errno;
  int own_fail;            /* we ended it (timeout, protocol, cancel) */
  lg_error_kind fail_kind; /* ... and this is why */
  const char *fail_which;  /* which timeout */
  char fail_msg[160];
  char errbuf[CURL_ERROR_SIZE];
  double idle_timeout;
  double body_at;       /* the loop's clock at the last body bytes (or resume) */
  size_t max_buffer;    /* pause the transfer past this many unread bytes */
  int bounded;          /* max_buffer was given; else the default (in_bound) */
  lg_timer first_byte, idle, total;
  lg_wait wait;
  int waiting;          /* a task waits on `wait` */
  int resolving;        /* holds the virtual clock until connected (lg_loop_hold) */
  int outside;          /* the peer is not this loop's own server: real work */
} request;

/* ------------------------------------------------------------- buffers */

static int buf_append(bytebuf *b, const char *data, size_t n) {
  if (b->off > 0 && b->off == b->len) b->off = b->len = 0;
  if (b->len + n > b->cap) {
    if (b->off > 0) { /* compact first */
      memmove(b->p, b->p + b->off, b->len - b->off);
      b->len -= b->off;
      b->off = 0;
    }
    if (b->len + n > b->cap) {
      /* small at first: header blocks and streamed events are a few
       * hundred bytes, and many streams at once each hold one */
      size_t cap = b->cap ? b->cap : 1024;
      while (cap < b->len + n) cap *= 2;
      char *p = realloc(b->p, cap);
      if (!p) return -1;
      b->p = p;
      b->cap = cap;
    }
  }
  memcpy(b->p + b->len, data, n);
  b->len += n;
  return 0;
}

static size_t buf_unread(const bytebuf *b) { return b->len - b->off; }

static void buf_free(bytebuf *b) {
  free(b->p);
  memset(b, 0, sizeof *b);
}

/* Appends to r's body buffer, counting its growth in the process's total. */
static int in_append(request *r, const char *data, size_t n) {
  size_t cap = r->in.cap;
  if (buf_append(&r->in, data, n) != 0) return -1;
  r->ctx->held += r->in.cap - cap;
  return 0;
}

/* Frees r's body buffer, off the process's total. */
static void in_free(request *r) {
  if (r->ctx) r->ctx->held -= r->in.cap;
  buf_free(&r->in);
}

/* The unread bytes r may hold before its transfer pauses. */
static size_t in_bound(const request *r) {
  if (r->bounded) return r->max_buffer;
  return r->ctx->held > BUDGET ? LOW_WATER : HIGH_WATER;
}

/* ---------------------------------------------------- request lifecycle */

static void req_wake(request *r) {
  lg_loop_activity(r->ctx->loop);
  r->waiting = 0;
  lg_task_wake(&r->wait);
}

/* Suspends the calling task until req_wake(); raises `busy` when another
 * task already waits on r. */
static int req_suspend(lua_State *L, request *r, const char *busy, lua_KContext ctx,
                       lua_KFunction k) {
  if (r->waiting) return luaL_error(L, "%s", busy);
  r->waiting = 1;
  r->pulled = 0;
  return lg_task_suspend(L, &r->wait, ctx, k);
}

static void stop_timers(request *r) {
  lg_loop_timer_stop(r->ctx->loop, &r->first_byte);
  lg_loop_timer_stop(r->ctx->loop, &r->idle);
  lg_loop_timer_stop(r->ctx->loop, &r->total);
}

/* Lets the virtual clock move again once the host name is resolved (or the
 * transfer ended first). Idempotent. */
static void resolved(request *r) {
  if (!r->resolving) return;
  r->resolving = 0;
  lg_loop_hold(r->ctx->loop, -1);
}

/* Notes whom the transfer talks to, each time curl picks its peer (a new
 * connection, or a pooled one reused): a peer outside the process is real
 * work for the virtual clock, this loop's own server is not. */
static void peer_is(request *r, const struct sockaddr *peer) {
  int outside = !lg_loop_serves(r->ctx->loop, peer);
  if (outside == r->outside) return;
  r->outside = outside;
  lg_loop_real(r->ctx->loop, outside ? 1 : -1);
}

/* The transfer no longer waits on its peer. Idempotent. */
static void peer_done(request *r) {
  if (!r->outside) return;
  r->outside = 0;
  lg_loop_real(r->ctx->loop, -1);
}

/* Takes the easy handle out of the multi (aborting it if still running). */
static void detach(request *r) {
  resolved(r);
  peer_done(r);
  if (r->in_multi) {
    CURLFN(multi_remove_handle)(r->ctx->multi, r->easy);
    r->in_multi = 0;
    lg_loop_busy(r->ctx->loop, -1);
  }
  stop_timers(r);
}

/* Ends the request with our own failure (timeout, protocol error). A
 * protocol error found once curl has finished cleanly (events are parsed
 * as they are asked for) is still the request's failure; one that already
 * failed keeps its first failure. */
static void fail(request *r, lg_error_kind kind, const char *which, const char *msg) {
  if (r->state == R_CLOSED || r->own_fail || (r->state == R_DONE && r->result != CURLE_OK)) return;
  detach(r);
  r->own_fail = 1;
  r->fail_kind = kind;
  r->fail_which = which;
  snprintf(r->fail_msg, sizeof r->fail_msg, "%s", msg);
  r->state = R_DONE;
  req_wake(r);
}

/* Frees everything; idempotent (shared by close, __gc and __close). */
static void req_close(request *r) {
  if (r->state == R_CLOSED) return;
  if (r->ctx && !r->ctx->closed) detach(r);
  if (r->easy) CURLFN(easy_cleanup)(r->easy);
  CURLFN(slist_free_all)(r->headers);
  free(r->body);
  buf_free(&r->head);
  in_free(r);
  if (r->sse_on) lg_sse_free(&r->sse);
  r->easy = NULL;
  r->headers = NULL;
  r->body = NULL;
  r->sse_on = 0;
  r->state = R_CLOSED;
}

static void first_byte_fired(lg_timer *t) {
  request *r = (request *)((char *)t - offsetof(request, first_byte));
  fail(r, LG_ERR_TIMEOUT, "first_byte", "no response headers within the first-byte timeout");
}

/* The idle timer is armed for the whole timeout and body bytes only note
 * their time (a heap update per HTTP chunk costs more than this): when it
 * fires after later bytes, it is armed again for what is left. */
static void idle_fired(lg_timer *t) {
  request *r = (request *)((char *)t - offsetof(request, idle));
  double now = lg_loop_now(r->ctx->loop), due = r->body_at + r->idle_timeout;
  if (due > now) {
    lg_loop_timer_start(r->ctx->loop, &r->idle, due - now);
    return;
  }
  fail(r, LG_ERR_TIMEOUT, "idle", "the stream was silent longer than the idle timeout");
}

/* Starts the idle timeout over from now (headers in, transfer resumed). */
static void idle_restart(request *r) {
  if (r->idle_timeout <= 0) return;
  r->body_at = lg_loop_now(r->ctx->loop);
  lg_loop_timer_start(r->ctx->loop, &r->idle, r->idle_timeout);
}

static void total_fired(lg_timer *t) {
  request *r = (request *)((char *)t - offsetof(request, total));
  fail(r, LG_ERR_TIMEOUT, "total", "the request took longer than its total timeout");
}

/* ---------------------------------------------------- curl callbacks */

/* CURLOPT_OPENSOCKETFUNCTION: the name resolved, curl opens the connection's
 * socket (as curl itself would, close-on-exec so that child processes, tools
 * and MCP servers, never inherit a provider's connection); returns the
 * socket, which curl owns. */
static curl_socket_t on_open_socket(void *ud, curlsocktype purpose, struct curl_sockaddr *a) {
  (void)purpose;
  resolved(ud);
  peer_is(ud, &a->addr); /* curl's address storage holds any family */
  return socket(a->family, a->socktype | SOCK_CLOEXEC, a->protocol);
}

/* CURLOPT_PREREQFUNCTION: connected (or a pooled connection was reused,
 * which opens no socket): the request is about to be sent. */
static int on_prereq(void *ud, char *ip, char *local_ip, int port, int local_port) {
  (void)local_ip;
  (void)local_port;
  request *r = ud;
  resolved(r);
  struct sockaddr_storage peer;
  if (uv_ip4_addr(ip, port, (struct sockaddr_in *)&peer) == 0 ||
      uv_ip6_addr(ip, port, (struct sockaddr_in6 *)&peer) == 0)
    peer_is(r, (struct sockaddr *)&peer);
  if (r->phase < P_HEADERS) r->phase = P_HEADERS;
  return CURL_PREREQFUNC_OK;
}

static size_t on_header(char *data, size_t size, size_t n, void *ud) {
  request *r = ud;
  size_t len = size * n;
  if (len >= 5 && memcmp(data, "HTTP/", 5) == 0) {
    /* a new status line: a 1xx or a redirect hop starts over */
    r->head.off = r->head.len = 0;
    const char *sp = memchr(data, ' ', len);
    r->status = sp ? strtol(sp + 1, NULL, 10) : 0;
    return len;
  }
  if (len <= 2 && (len == 0 || data[0] == '\r' || data[0] == '\n')) {
    if (r->status >= 200 && r->state == R_HEADERS) {
      r->state = R_BODY;
      r->phase = P_BODY;
      lg_loop_timer_stop(r->ctx->loop, &r->first_byte);
      idle_restart(r);
      req_wake(r);
    }
    return len;
  }
  if (buf_append(&r->head, data, len) != 0) return 0;
  return len;
}

/* CURLOPT_WRITEFUNCTION: appends body bytes to r->in and wakes the reader;
 * pauses the transfer instead when they would take the unread bytes past
 * max_buffer (an empty buffer takes any piece: curl's reads are bounded). */
static size_t on_body(char *data, size_t size, size_t n, void *ud) {
  request *r = ud;
  size_t len = size * n;
  if (r->state == R_HEADERS) { /* body without a header block end; accept */
    r->state = R_BODY;
    r->phase = P_BODY;
    lg_loop_timer_stop(r->ctx->loop, &r->first_byte);
  }
  size_t unread = buf_unread(&r->in);
  if (unread > 0 && unread + len > in_bound(r)) {
    r->paused = 1;
    lg_loop_timer_stop(r->ctx->loop, &r->idle);
    return CURL_WRITEFUNC_PAUSE; /* curl keeps these bytes and re-sends them */
  }
  if (in_append(r, data, len) != 0) return 0;
  r->received += len;
  if (r->idle_timeout > 0) {
    r->body_at = lg_loop_now(r->ctx->loop);
    if (!lg_timer_armed(&r->idle)) lg_loop_timer_start(r->ctx->loop, &r->idle, r->idle_timeout);
  }
  req_wake(r);
  return len;
}

static void check_done(http_ctx *ctx);

/* Lets curl act on r's socket now, from Lua's side of the loop, and moves
 * what finished to R_DONE. */
static void act_now(request *r) {
  int running;
  CURLFN(multi_socket_action)(r->ctx->multi, r->fd, CURL_CSELECT_IN, &running);
  check_done(r->ctx);
}

/* Moves finished transfers to R_DONE and wakes their tasks. */
static void check_done(http_ctx *ctx) {
  CURLMsg *msg;
  int left;
  while ((msg = CURLFN(multi_info_read)(ctx->multi, &left))) {
    if (msg->msg != CURLMSG_DONE) continue;
    request *r = NULL;
    CURLFN(easy_getinfo)(msg->easy_handle, CURLINFO_PRIVATE, (char **)&r);
    if (!r) continue;
    r->result = msg->data.result;
    CURLFN(easy_getinfo)(r->easy, CURLINFO_OS_ERRNO, &r->os_errno);
    detach(r);
    r->state = R_DONE;
    req_wake(r);
  }
}

static void on_poll(uv_poll_t *h, int status, int events) {
  http_sock *s = h->data;
  int flags = 0, running;
  /* On a socket error let curl read and write: it then meets the real
   * errno (ECONNRESET) instead of a bare "poll error". */
  if (status < 0) flags = CURL_CSELECT_IN | CURL_CSELECT_OUT;
  if (events & UV_READABLE) flags |= CURL_CSELECT_IN;
  if (events & UV_WRITABLE) flags |= CURL_CSELECT_OUT;
  lg_loop_activity(s->ctx->loop); /* curl moves bytes: the loop is not idle */
  CURLFN(multi_socket_action)(s->ctx->multi, s->fd, flags, &running);
  check_done(s->ctx);
}

static void on_curl_timer(uv_timer_t *h) {
  http_ctx *ctx = h->data;
  int running;
  lg_loop_activity(ctx->loop);
  CURLFN(multi_socket_action)(ctx->multi, CURL_SOCKET_TIMEOUT, 0, &running);
  check_done(ctx);
}

static void free_on_close(uv_handle_t *h) { free(h); }

static void sock_closed(uv_handle_t *h) { free(h->data); }

/* CURLMOPT_SOCKETFUNCTION: start, change or stop watching a socket. */
static int on_socket(CURL *e, curl_socket_t fd, int what, void *ud, void *sockp) {
  http_ctx *ctx = ud;
  http_sock *s = sockp;
  request *r = NULL;
  if (CURLFN(easy_getinfo)(e, CURLINFO_PRIVATE, (char **)&r) == CURLE_OK && r)
    r->fd = what == CURL_POLL_REMOVE ? CURL_SOCKET_BAD : fd; /* no stale number to pull from */
  if (what == CURL_POLL_REMOVE) {
    if (s) {
      uv_poll_stop(&s->poll);
      uv_close((uv_handle_t *)&s->poll, sock_closed);
      CURLFN(multi_assign)(ctx->multi, fd, NULL);
    }
    return 0;
  }
  if (!s) {
    s = calloc(1, sizeof *s);
    if (!s) return -1;
    s->fd = fd;
    s->ctx = ctx;
    if (uv_poll_init_socket(lg_loop_uv(ctx->loop), &s->poll, fd) != 0) {
      free(s);
      return -1;
    }
    s->poll.data = s;
    CURLFN(multi_assign)(ctx->multi, fd, s);
  }
  int events = 0;
  if (what == CURL_POLL_IN || what == CURL_POLL_INOUT) events |= UV_READABLE;
  if (what == CURL_POLL_OUT || what == CURL_POLL_INOUT) events |= UV_WRITABLE;
  uv_poll_start(&s->poll, events, on_poll);
  return 0;
}

/* CURLMOPT_TIMERFUNCTION: curl asks to be called back in `ms` (-1: never). */
static int on_timer_change(CURLM *m, long ms, void *ud) {
  (void)m;
  http_ctx *ctx = ud;
  if (ms < 0) uv_timer_stop(ctx->timer);
  else uv_timer_start(ctx->timer, on_curl_timer, (uint64_t)ms, 0);
  return 0;
}

/* ------------------------------------------------------ the multi handle */

static int l_http_gc(lua_State *L) {
  http_ctx *ctx = lua_touserdata(L, 1);
  if (ctx->closed) return 0;
  ctx->closed = 1;
  if (ctx->multi) CURLFN(multi_cleanup)(ctx->multi); /* removes its sockets */
  if (ctx->timer) {
    uv_timer_stop(ctx->timer);
    uv_close((uv_handle_t *)ctx->timer, free_on_close);
  }
  return 0;
}

/* The multi handle of this Lua state, created on first use. */
static http_ctx *http_get(lua_State *L) {
  if (lua_getfield(L, LUA_REGISTRYINDEX, HTTP_KEY) == LUA_TUSERDATA) {
    http_ctx *ctx = lua_touserdata(L, -1);
    lua_pop(L, 1);
    return ctx;
  }
  lua_pop(L, 1);
  lg_loop *loop = lg_loop_get(L);
  /* libcurl is loaded and initialized on the first request: a script
   * that makes none never pays for it */
  const char *err;
  if (!lg_curl_load(&err)) luaL_error(L, "http: %s", err);
  http_ctx *ctx = lua_newuserdatauv(L, sizeof *ctx, 0);
  memset(ctx, 0, sizeof *ctx);
  ctx->closed = 1;
  lua_createtable(L, 0, 1);
  lua_pushcfunction(L, l_http_gc);
  lua_setfield(L, -2, "__gc");
  lua_setmetatable(L, -2);
  ctx->loop = loop;
  ctx->timer = malloc(sizeof *ctx->timer);
  ctx->multi = CURLFN(multi_init)();
  if (!ctx->timer || !ctx->multi) luaL_error(L, "http: out of memory");
  uv_timer_init(lg_loop_uv(loop), ctx->timer);
  ctx->timer->data = ctx;
  ctx->closed = 0;
  CURLFN(multi_setopt)(ctx->multi, CURLMOPT_SOCKETFUNCTION, on_socket);
  CURLFN(multi_setopt)(ctx->multi, CURLMOPT_SOCKETDATA, ctx);
  CURLFN(multi_setopt)(ctx->multi, CURLMOPT_TIMERFUNCTION, on_timer_change);
  CURLFN(multi_setopt)(ctx->multi, CURLMOPT_TIMERDATA, ctx);
  lua_setfield(L, LUA_REGISTRYINDEX, HTTP_KEY);
  return ctx;
}

/* ------------------------------------------------------ error records */

/* Pushes the error record of a failed request: the facts, not a verdict.
 * Our own failures keep their kind (timeout with `which`, protocol from the
 * SSE parser, cancelled); a failure curl reported is kind `transport` with
 * curl's code and message and the socket's errno (by name). Both carry the
 * phase, the body bytes received, whether any reached Lua, and the status
 * once known. lua/luagent/base/http.lua names a curl failure's kind from these
 * facts; lua/luagent/model/classify.lua alone decides whether it is retried. */
static void push_failure(lua_State *L, request *r) {
  if (r->own_fail) {
    lg_error_push(L, r->fail_kind, r->fail_msg);
    if (r->fail_which) {
      lua_pushstring(L, r->fail_which);
      lua_setfield(L, -2, "which");
    }
    lua_pushinteger(L, 0);
    lua_setfield(L, -2, "curl_code");
    lua_pushliteral(L, "");
    lua_setfield(L, -2, "curl_message");
  } else {
    lg_error_push(L, LG_ERR_TRANSPORT,
                  r->errbuf[0] ? r->errbuf : CURLFN(easy_strerror)(r->result));
    lua_pushinteger(L, r->result);
    lua_setfield(L, -2, "curl_code");
    lua_pushstring(L, CURLFN(easy_strerror)(r->result));
    lua_setfield(L, -2, "curl_message");
    if (r->os_errno != 0) {
      char name[64];
      uv_err_name_r(uv_translate_sys_error((int)r->os_errno), name, sizeof name);
      lua_pushstring(L, name);
      lua_setfield(L, -2, "errno");
    }
  }
  lua_pushstring(L, phase_names[r->phase]);
  lua_setfield(L, -2, "phase");
  lua_pushinteger(L, (lua_Integer)r->received);
  lua_setfield(L, -2, "bytes");
  lua_pushboolean(L, r->delivered);
  lua_setfield(L, -2, "delivered");
  if (r->status > 0) {
    lua_pushinteger(L, r->status);
    lua_setfield(L, -2, "status");
  }
}

/* True when the request ended in failure (not a clean end of body). */
static int failed(const request *r) {
  return r->state == R_DONE && (r->own_fail || r->result != CURLE_OK);
}

/* ---------------------------------------------------- Lua: request */

static request *check_req(lua_State *L) {
  request *r = luaL_checkudata(L, 1, REQ_MT);
  return r;
}

static void req_cancel(lg_wait *w) {
  request *r = (request *)((char *)w - offsetof(request, wait));
  r->waiting = 0;
  detach(r);
  if (r->state != R_CLOSED) r->state = R_DONE;
  r->own_fail = 1;
  r->fail_kind = LG_ERR_CANCELLED;
  snprintf(r->fail_msg, sizeof r->fail_msg, "request cancelled");
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
 * (HTTP/2 from the first byte, also over plain TCP: h2c). */
static long check_http_version(lua_State *L) {
  static const char *const names[] = {"2", "1.1", "2-prior-knowledge", NULL};
  static const long versions[] = {CURL_HTTP_VERSION_2TLS, CURL_HTTP_VERSION_1_1,
                                  CURL_HTTP_VERSION_2_PRIOR_KNOWLEDGE};
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
 * when it ended before them. `ctx` is the request's stack index. */
static int request_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  request *r = lua_touserdata(L, (int)ctx);
  if (r->phase == P_BODY) { /* the final response's headers are complete */
    lua_settop(L, (int)ctx);
    return 1;
  }
  if (r->state != R_DONE) return lg_task_suspend(L, &r->wait, ctx, request_k);
  if (!failed(r)) r->result = CURLE_GOT_NOTHING; /* ended without a response */
  lua_pushnil(L);
  push_failure(L, r);
  req_close(r);
  return 2;
}

/* http_request{method=, url=, headers=, body=, timeout={connect=,
 * first_byte=, idle=, total=}, sse={max_line=, max_event=}, max_buffer=,
 * http_version=, ca_file=} -> request once
 * the response headers arrived, or nil, err. The request owns the transfer;
 * close it (or let it be collected) to abort. An absent timeout means none;
 * connect, first_byte and idle <= 0 mean none too. A given total <= 0 (a
 * deadline already passed) fails at once with kind timeout, which = "total",
 * before any transfer starts. max_buffer: unread body bytes held before the
 * transfer pauses (default: see HIGH_WATER). */
static int l_http_request(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  http_ctx *ctx = http_get(L);
  lua_getfield(L, 1, "url");
  const char *url = luaL_optstring(L, -1, NULL);
  if (!url) return luaL_error(L, "http.request: url is required");
  lua_getfield(L, 1, "method");
  const char *method = luaL_optstring(L, -1, NULL);
  lua_getfield(L, 1, "body");
  size_t body_len = 0;
  const char *body = luaL_optlstring(L, -1, NULL, &body_len);
  lua_getfield(L, 1, "ca_file");
  const char *ca_file = luaL_optstring(L, -1, NULL);
  long http_version = check_http_version(L);
  lua_getfield(L, 1, "timeout");
  int tmo = lua_gettop(L);
  int total_given;
  double t_connect = timeout_field(L, tmo, "connect", NULL);
  double t_first = timeout_field(L, tmo, "first_byte", NULL);
  double t_idle = timeout_field(L, tmo, "idle", NULL);
  double t_total = timeout_field(L, tmo, "total", &total_given);
  size_t max_line = 0, max_event = 0;
  if (lua_getfield(L, 1, "sse") == LUA_TTABLE) {
    lua_getfield(L, -1, "max_line");
    max_line = (size_t)luaL_optinteger(L, -1, 0);
    lua_getfield(L, -2, "max_event");
    max_event = (size_t)luaL_optinteger(L, -1, 0);
    lua_pop(L, 2);
  }
  lua_pop(L, 1);
  lua_Integer max_buffer = (lua_Integer)HIGH_WATER;
  int bounded = lua_getfield(L, 1, "max_buffer") != LUA_TNIL;
  if (bounded) {
    int is_int;
    max_buffer = lua_tointegerx(L, -1, &is_int);
    if (!is_int) max_buffer = 0;
  }
  if (max_buffer < 1) return luaL_error(L, "http.request: max_buffer must be a positive integer (bytes)");
  lua_pop(L, 1);

  request *r = lua_newuserdatauv(L, sizeof *r, 0);
  memset(r, 0, sizeof *r);
  r->state = R_CLOSED; /* safe for __gc until the transfer starts */
  luaL_setmetatable(L, REQ_MT);
  r->ctx = ctx;
  r->wait.cancel = req_cancel;
  r->first_byte.fire = first_byte_fired;
  r->idle.fire = idle_fired;
  r->total.fire = total_fired;
  r->idle_timeout = t_idle;
  r->max_buffer = (size_t)max_buffer;
  r->bounded = bounded;
  r->fd = CURL_SOCKET_BAD;
  lg_sse_init(&r->sse, max_line, max_event);
  r->sse_on = 1;
  r->easy = CURLFN(easy_init)();
  if (!r->easy) return luaL_error(L, "http.request: out of memory");
  r->state = R_HEADERS;
  if (total_given && t_total <= 0) {
    fail(r, LG_ERR_TIMEOUT, "total", "no time left: timeout.total was not positive");
    return request_k(L, LUA_OK, lua_absindex(L, -1));
  }

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
      struct curl_slist *h = CURLFN(slist_append)(r->headers, line);
      if (!h) return luaL_error(L, "http.request: out of memory");
      r->headers = h;
      lua_pop(L, 1);
    }
  }
  lua_pop(L, 1);
  /* no "Expect: 100-continue" round trip for request bodies */
  struct curl_slist *h = CURLFN(slist_append)(r->headers, "Expect:");
  if (!h) return luaL_error(L, "http.request: out of memory");
  r->headers = h;

  CURL *e = r->easy;
  CURLFN(easy_setopt)(e, CURLOPT_URL, url);
  CURLFN(easy_setopt)(e, CURLOPT_PRIVATE, (char *)r);
  CURLFN(easy_setopt)(e, CURLOPT_HTTPHEADER, r->headers);
  CURLFN(easy_setopt)(e, CURLOPT_HEADERFUNCTION, on_header);
  CURLFN(easy_setopt)(e, CURLOPT_HEADERDATA, r);
  CURLFN(easy_setopt)(e, CURLOPT_WRITEFUNCTION, on_body);
  CURLFN(easy_setopt)(e, CURLOPT_WRITEDATA, r);
  CURLFN(easy_setopt)(e, CURLOPT_ERRORBUFFER, r->errbuf);
  CURLFN(easy_setopt)(e, CURLOPT_OPENSOCKETFUNCTION, on_open_socket);
  CURLFN(easy_setopt)(e, CURLOPT_OPENSOCKETDATA, r);
  CURLFN(easy_setopt)(e, CURLOPT_PREREQFUNCTION, on_prereq);
  CURLFN(easy_setopt)(e, CURLOPT_PREREQDATA, r);
  CURLFN(easy_setopt)(e, CURLOPT_NOSIGNAL, 1L);
  CURLFN(easy_setopt)(e, CURLOPT_BUFFERSIZE, READ_SIZE);
  CURLFN(easy_setopt)(e, CURLOPT_HTTP_VERSION, http_version);
  /* libcurl 7.88 fails every reuse of an h2c connection (HTTP/2 on plain
   * TCP) with CURLE_HTTP2, whatever the server: one request each */
  if (http_version == CURL_HTTP_VERSION_2_PRIOR_KNOWLEDGE) CURLFN(easy_setopt)(e, CURLOPT_FORBID_REUSE, 1L);
  if (ca_file) CURLFN(easy_setopt)(e, CURLOPT_CAINFO, ca_file);
  if (t_connect > 0) CURLFN(easy_setopt)(e, CURLOPT_CONNECTTIMEOUT_MS, (long)(t_connect * 1000));
  if (body) {
    r->body = malloc(body_len ? body_len : 1);
    if (!r->body) return luaL_error(L, "http.request: out of memory");
    memcpy(r->body, body, body_len);
    CURLFN(easy_setopt)(e, CURLOPT_POSTFIELDS, r->body);
    CURLFN(easy_setopt)(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)body_len);
  }
  if (method) CURLFN(easy_setopt)(e, CURLOPT_CUSTOMREQUEST, method);
  else if (!body) CURLFN(easy_setopt)(e, CURLOPT_HTTPGET, 1L);

  if (CURLFN(multi_add_handle)(ctx->multi, e) != CURLM_OK)
    return luaL_error(L, "http.request: cannot start the transfer");
  r->in_multi = 1;
  lg_loop_busy(ctx->loop, 1);
  /* name resolution runs in curl's resolver thread and says nothing until
   * it is done: the virtual clock must wait for it, not jump past it */
  r->resolving = 1;
  lg_loop_hold(ctx->loop, 1);
  if (t_first > 0) lg_loop_timer_start(ctx->loop, &r->first_byte, t_first);
  if (t_total > 0) lg_loop_timer_start(ctx->loop, &r->total, t_total);
  return lg_task_suspend(L, &r->wait, lua_absindex(L, -1), request_k);
}

/* Lua has read every buffered body byte: frees the buffer (many streams
 * at once must not each keep the largest burst they saw), or, for a paused
 * transfer, keeps its room, resumes the transfer and pulls. */
static void drained(request *r) {
  if (!r->paused || !r->in_multi) {
    in_free(r);
    return;
  }
  r->in.off = r->in.len = 0;
  r->paused = 0;
  idle_restart(r);
  uint64_t before = r->received;
  CURLFN(easy_pause)(r->easy, CURLPAUSE_CONT); /* hands over what curl held */
  /* Pull: rather than wait for the loop's next turn, let curl read the
   * socket now (the rest of a burst is usually there) and go on in the
   * same wake-up, as with the whole burst buffered. Waiting instead cost
   * more than the bytes saved: at 1,000 streams (bench/stream.sh), the
   * 16 KiB bound took 20-30 % more CPU than 64 KiB, pulling 6-12 % (the
   * rest: curl's pause and resume, smaller reads, and Lua's collector and
   * allocator running slower, not more, between reads). At most PULL_MAX
   * bytes, then the reader waits its turn like any other. */
  if (!r->paused && r->in_multi && r->fd != CURL_SOCKET_BAD && r->pulled < PULL_MAX) act_now(r);
  r->pulled += (size_t)(r->received - before);
}

/* Pushes nil (clean end) or nil, err (failure) for a finished body. */
static int push_end(lua_State *L, request *r) {
  lua_pushnil(L);
  if (!failed(r)) return 1;
  push_failure(L, r);
  return 2;
}

static int read_k(lua_State *L, int status, lua_KContext ctx);

/* req:read() -> the next chunk of body bytes, nil at the end, nil, err. */
static int l_req_read(lua_State *L) {
  check_req(L);
  lua_settop(L, 1);
  return read_k(L, LUA_OK, 0);
}

static int read_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  (void)ctx;
  request *r = check_req(L);
  if (r->state == R_CLOSED) return luaL_error(L, "read: request is closed");
  size_t n = buf_unread(&r->in);
  if (n > 0) {
    lua_pushlstring(L, r->in.p + r->in.off, n);
    r->delivered = 1;
    drained(r);
    return 1;
  }
  if (r->state == R_DONE) return push_end(L, r);
  return req_suspend(L, r, "read: another task is already reading", 0, read_k);
}

/* What the feed's callback needs. */
typedef struct {
  lua_State *L;
  request *r;
  uint64_t before; /* the parser's offset when the feed began */
  size_t off0;     /* r->in.off then */
  int reuse;       /* stack index of the caller's table to fill, or 0 */
} one_feed;

/* SSE callback: pushes the event (with its offset), marks its bytes read
 * and stops the feed: the bytes after it stay raw in r->in until asked
 * for, which is far smaller than the events as Lua tables. */
static int push_one(void *ud, const lg_sse_event *ev) {
  one_feed *f = ud;
  request *r = f->r;
  uint64_t off = lg_sse_offset(&r->sse);
  /* the parser is past the event: so are the unread bytes, before anything
   * that may raise (out of memory) */
  r->in.off = f->off0 + (size_t)(off - f->before);
  if (f->reuse) {
    lua_pushvalue(f->L, f->reuse);
    lg_sse_fill_event(f->L, -1, ev);
  } else {
    lg_sse_push_event(f->L, ev);
  }
  lua_pushliteral(f->L, "offset");
  lua_pushinteger(f->L, (lua_Integer)off);
  lua_rawset(f->L, -3);
  return 1;
}

/* Parses the unread bytes up to the end of the next complete event and
 * pushes it; returns 1, or 0 (nothing pushed) when the bytes end before an
 * event does (all consumed) or the parser failed: that ends the request,
 * reported once asked for. */
static int parse_one(lua_State *L, request *r, int reuse) {
  size_t n = buf_unread(&r->in);
  one_feed f = {L, r, lg_sse_offset(&r->sse), r->in.off, reuse};
  int rc = lg_sse_feed(&r->sse, r->in.p + r->in.off, n, push_one, &f);
  if (rc == 1) {
    if (buf_unread(&r->in) == 0) drained(r);
    return 1;
  }
  if (rc < 0) {
    char msg[160];
    snprintf(msg, sizeof msg, "SSE: %s at byte offset %llu", lg_sse_strerror(rc),
             (unsigned long long)lg_sse_error_offset(&r->sse));
    fail(r, LG_ERR_PROTOCOL, NULL, msg);
    r->sse_failed = 1;
  }
  drained(r);
  return 0;
}

static int event_k(lua_State *L, int status, lua_KContext ctx);

/* req:event([into]) -> the next SSE event {event=, data=, id=, retry=,
 * offset=} (offset: the stream byte just past the event; `into`, a table
 * given by a reader that keeps no event past the next call, is filled and
 * returned instead of a new one), nil at the
 * end of the stream, or nil, err (transport failure, or a protocol error for
 * an oversized line or event). Bytes after the last complete event at the
 * end of the stream are reported by req:info().partial. */
static int l_req_event(lua_State *L) {
  check_req(L);
  lua_settop(L, 2);
  if (!lua_isnil(L, 2)) luaL_checktype(L, 2, LUA_TTABLE);
  return event_k(L, LUA_OK, 0);
}

static int event_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  (void)ctx;
  request *r = check_req(L);
  if (r->state == R_CLOSED) return luaL_error(L, "event: request is closed");
  /* a drained buffer resumes a paused transfer, which can refill it at
   * once (curl hands over the bytes it held): look again before waiting */
  while (buf_unread(&r->in) > 0) {
    if (parse_one(L, r, lua_istable(L, 2) ? 2 : 0)) {
      r->delivered = 1;
      return 1;
    }
  }
  if (r->state == R_DONE && r->sse_failed) {
    lua_pushnil(L);
    push_failure(L, r);
    lua_pushinteger(L, (lua_Integer)lg_sse_error_offset(&r->sse));
    lua_setfield(L, -2, "offset");
    return 2;
  }
  if (r->state == R_DONE) return push_end(L, r);
  return req_suspend(L, r, "event: another task is already reading", 0, event_k);
}

/* req:status() -> the HTTP status code. */
static int l_req_status(lua_State *L) {
  lua_pushinteger(L, check_req(L)->status);
  return 1;
}

/* req:headers() -> {lowercased name = value}; repeated names joined by ", ". */
static int l_req_headers(lua_State *L) {
  request *r = check_req(L);
  lua_newtable(L);
  const char *p = r->head.p ? r->head.p + r->head.off : "";
  const char *end = r->head.p ? r->head.p + r->head.len : p;
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
  request *r = check_req(L);
  lua_createtable(L, 0, 5);
  lua_pushinteger(L, (lua_Integer)r->received);
  lua_setfield(L, -2, "bytes");
  lua_pushboolean(L, r->delivered);
  lua_setfield(L, -2, "delivered");
  lua_pushboolean(L, r->state == R_DONE || r->state == R_CLOSED);
  lua_setfield(L, -2, "done");
  lua_pushboolean(L, r->sse_on && lg_sse_has_partial(&r->sse));
  lua_setfield(L, -2, "partial");
  lua_pushboolean(L, r->paused);
  lua_setfield(L, -2, "paused");
  return 1;
}

/* req:close(): aborts the transfer if running and frees it; idempotent. */
static int l_req_close(lua_State *L) {
  request *r = luaL_checkudata(L, 1, REQ_MT);
  if (r->waiting && r->state != R_CLOSED) req_wake(r); /* it then sees "closed" */
  req_close(r);
  return 0;
}

void lg_http_register(lua_State *L) {
  static const luaL_Reg methods[] = {
      {"read", l_req_read},       {"event", l_req_event}, {"status", l_req_status},
      {"headers", l_req_headers}, {"info", l_req_info},   {"close", l_req_close},
      {NULL, NULL}};
  lg_class_new(L, REQ_MT, methods, l_req_close, l_req_close);
  lua_pushcfunction(L, l_http_request);
  lua_setfield(L, -2, "http_request");
}
