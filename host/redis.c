/* Redis on the loop: an async client through hiredis and its libuv adapter.
 *   core.redis_connect(host, port, timeout) -> "luagent.Redis" | nil, err
 *   r:command(timeout, arg, ...) -> reply | nil, err   (suspends the task)
 *   r:send(timeout, arg, ...) -> true | nil, err   (queued; reply dropped)
 *   r:connected() -> bool      r:close()  (also __close and __gc)
 *
 * Nothing here blocks: a host name is looked up on libuv's thread pool
 * (uv_getaddrinfo), hiredis is handed the numeric address and connects
 * without blocking, reads and writes go through uv_poll, and every wait is a
 * task suspended with lg_task_suspend, ended by a reply, a timeout or the
 * task's cancellation.
 *
 * Timeouts use one real libuv timer per connection (Redis lives in real
 * time, also when the loop's clock is virtual). Replies come in the order
 * the commands went out, so the oldest command in flight is the first to
 * time out: when the connection has been silent (no reply read, no byte
 * written) for `timeout` seconds since it was queued, the connection is
 * torn down and every command in flight fails with kind "timeout": a Redis
 * that is this slow is treated as gone, and the caller falls back
 * (lua/luagent/model/endpoint/redis.lua).
 *
 * Ownership:
 * - the redisAsyncContext is owned by the connection userdata while open
 *   (ac->data points back to it); hiredis frees it itself after a failed
 *   connect or a disconnect, and we clear our pointer in those callbacks;
 * - each command in flight is a malloc'd `cmd`, owned by hiredis (its
 *   privdata) until its reply callback, which frees it; a waiting task only
 *   borrows it and detaches when it goes away;
 * - replies are deep-copied out of hiredis's reply (hiredis frees its own
 *   after the callback) into an `rval` the waiter owns.
 * Callbacks run no Lua: they copy the reply and wake the task. */
#include "redis.h"

#include <hiredis/async.h>
#include <hiredis/hiredis.h>
#include <hiredis/sds.h>
#include <hiredis/adapters/libuv.h>
#include <errno.h>
#include <lauxlib.h>
#include <stdlib.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <string.h>
#include <uv.h>

#include "core.h"
#include "errors.h"
#include "loop.h"

#define REDIS_MT "luagent.Redis"
#define WAITER_MT "luagent.RedisWait"
#define MAX_ARGS 64

typedef struct rval rval;

/* A reply, copied out of hiredis. */
struct rval {
  int type;          /* REDIS_REPLY_* */
  long long integer; /* REDIS_REPLY_INTEGER */
  char *str;         /* STRING, STATUS, ERROR (owned) */
  size_t len;
  size_t n;          /* ARRAY: elements */
  rval *elems;       /* owned */
};

typedef struct cmd cmd;
typedef struct waiter waiter;
typedef struct rconn rconn;

/* A name lookup on libuv's thread pool: malloc'd, freed by its callback;
 * rc is NULL once the connection let go. */
typedef struct resolve_req {
  uv_getaddrinfo_t req; /* first: on_resolved casts back */
  rconn *rc;
} resolve_req;

/* A command in flight: malloc'd, freed by its reply callback. */
struct cmd {
  cmd *next;         /* the connection's FIFO of commands in flight */
  rconn *conn;       /* NULL once the connection let go */
  waiter *w;         /* NULL when nobody waits (send, or the task left) */
  uint64_t queued;   /* uv_now() milliseconds when it was queued */
  uint64_t wait_ms;  /* its timeout */
};

/* The waiting side of one command: a userdata on the task's stack. */
struct waiter {
  lg_wait w;         /* first: waiter_cancel casts back */
  cmd *c;            /* NULL once done or detached */
  rval *reply;       /* owned; NULL when the command failed */
  lg_error_kind kind; /* error kind when reply is NULL */
  char err[160];
};

/* The connection userdata. */
struct rconn {
  lg_loop *loop;
  redisAsyncContext *ac; /* NULL when closed */
  int connected;         /* the connect completed */
  int connecting;        /* a task waits in redis_connect */
  int cstatus;           /* 0: connected; else why not (see cerr) */
  char cerr[160];
  lg_error_kind ckind;    /* the kind of that failure */
  struct resolve_req *resolving; /* the name lookup under way, or NULL */
  int rstatus;           /* the lookup's libuv status */
  char addr[64];         /* the numeric address the name resolved to */
  lg_wait cw;
  uv_timer_t *timer;     /* malloc'd; freed by its close callback */
  cmd *head, *tail;      /* commands in flight, oldest first */
  uint64_t progress;     /* uv_now() of the last reply read or bytes written */
  int failing;            /* the connection is going down: fail_kind says why */
  int closed;             /* closed by its owner: using it raises */
  lg_error_kind fail_kind;
  char fail_msg[160];
};

/* A connect or a command starts (+1) or ends (-1): busy for the loop, and
 * real work for the virtual clock, the reply coming from Redis in real
 * time (loop.c's header). */
static void in_flight(lg_loop *loop, int delta) {
  lg_loop_busy(loop, delta);
  lg_loop_real(loop, delta);
}

/* ------------------------------------------------------------- replies */

/* Frees the contents of a copied reply (not `v` itself). */
static void rval_clear(rval *v) {
  free(v->str);
  for (size_t i = 0; i < v->n; i++) rval_clear(&v->elems[i]);
  free(v->elems);
  memset(v, 0, sizeof *v);
}

/* Copies hiredis's reply `r` into `v`; -1 when out of memory (v cleared). */
static int rval_copy(rval *v, const redisReply *r) {
  memset(v, 0, sizeof *v);
  v->type = r->type;
  v->integer = r->integer;
  if (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS ||
      r->type == REDIS_REPLY_ERROR) {
    v->str = malloc(r->len + 1);
    if (!v->str) return -1;
    memcpy(v->str, r->str, r->len);
    v->str[r->len] = '\0';
    v->len = r->len;
  } else if (r->type == REDIS_REPLY_ARRAY && r->elements > 0) {
    v->elems = calloc(r->elements, sizeof *v->elems);
    if (!v->elems) return -1;
    v->n = r->elements;
    for (size_t i = 0; i < r->elements; i++)
      if (rval_copy(&v->elems[i], r->element[i]) != 0) {
        rval_clear(v);
        return -1;
      }
  }
  return 0;
}

/* Pushes a copied reply: integer, string (bulk and status), false (nil),
 * table (array). An error reply inside an array becomes its message. */
static void push_rval(lua_State *L, const rval *v) {
  switch (v->type) {
  case REDIS_REPLY_INTEGER:
    lua_pushinteger(L, (lua_Integer)v->integer);
    break;
  case REDIS_REPLY_STRING:
  case REDIS_REPLY_STATUS:
  case REDIS_REPLY_ERROR:
    lua_pushlstring(L, v->str, v->len);
    break;
  case REDIS_REPLY_ARRAY:
    lua_createtable(L, (int)v->n, 0);
    for (size_t i = 0; i < v->n; i++) {
      push_rval(L, &v->elems[i]);
      lua_rawseti(L, -2, (lua_Integer)i + 1);
    }
    break;
  default:
    lua_pushboolean(L, 0);
  }
}

/* ------------------------------------------------------------ commands */

/* Ends a command's wait with a reply or an error and wakes its task. */
static void waiter_finish(waiter *w, const redisReply *r, lg_error_kind kind, const char *msg) {
  w->c = NULL;
  if (r) {
    w->reply = malloc(sizeof *w->reply);
    if (!w->reply || rval_copy(w->reply, r) != 0) {
      free(w->reply);
      w->reply = NULL;
      kind = LG_ERR_TRANSPORT;
      msg = "redis: out of memory copying a reply";
    }
  }
  if (!w->reply) {
    w->kind = kind;
    snprintf(w->err, sizeof w->err, "%s", msg);
  }
  lg_task_wake(&w->w);
}

/* Removes `c` from its connection's FIFO (it is almost always the head). */
static void fifo_remove(rconn *rc, cmd *c) {
  cmd **p = &rc->head, *prev = NULL;
  while (*p && *p != c) {
    prev = *p;
    p = &(*p)->next;
  }
  if (!*p) return;
  *p = c->next;
  if (rc->tail == c) rc->tail = prev;
  c->next = NULL;
}

static void arm_timer(rconn *rc);

/* hiredis's reply callback: reply is NULL when the connection went down
 * before the reply came. Frees the command. */
static void on_reply(redisAsyncContext *ac, void *reply, void *privdata) {
  cmd *c = privdata;
  rconn *rc = c->conn;
  const redisReply *r = reply;
  if (rc) {
    fifo_remove(rc, c);
    rc->progress = uv_now(lg_loop_uv(rc->loop));
    in_flight(rc->loop, -1);
    lg_loop_activity(rc->loop);
  }
  if (c->w) {
    lg_error_kind kind = LG_ERR_TRANSPORT;
    const char *msg = "redis: connection closed";
    if (rc && rc->failing) {
      kind = rc->fail_kind;
      msg = rc->fail_msg;
    } else if (ac && ac->err) {
      msg = ac->errstr;
    }
    waiter_finish(c->w, r, kind, msg);
  }
  free(c);
  if (rc) arm_timer(rc);
}

/* Detaches a waiter from its command: the reply, when it comes, is dropped. */
static void waiter_cancel(lg_wait *lw) {
  waiter *w = (waiter *)lw;
  if (w->c) w->c->w = NULL;
  w->c = NULL;
}

/* A waiter collected mid-command (lua_close) detaches; frees its reply. */
static int l_waiter_gc(lua_State *L) {
  waiter *w = lua_touserdata(L, 1);
  waiter_cancel(&w->w);
  if (w->reply) rval_clear(w->reply);
  free(w->reply);
  w->reply = NULL;
  return 0;
}

/* ---------------------------------------------------------- connection */

/* Close callback of the timer: its memory is ours. */
static void timer_closed(uv_handle_t *h) { free(h); }

/* Detaches every command in flight from the connection (and, if `quiet`,
 * from its waiter: used by __gc, which must wake nobody). */
static void detach_all(rconn *rc, int quiet) {
  for (cmd *c = rc->head; c; c = c->next) {
    c->conn = NULL;
    in_flight(rc->loop, -1);
    if (quiet && c->w) {
      c->w->c = NULL;
      c->w = NULL;
    }
  }
  rc->head = rc->tail = NULL;
}

/* The one teardown of a connection: frees the hiredis context (its pending
 * callbacks then report `kind`/`msg` to their waiters, or nothing when
 * `quiet`), stops the timer. Idempotent. Never called from inside a hiredis
 * callback. */
static void conn_down(rconn *rc, lg_error_kind kind, const char *msg, int quiet) {
  if (rc->ac) {
    redisAsyncContext *ac = rc->ac;
    rc->ac = NULL;
    rc->connected = 0;
    rc->failing = 1;
    rc->fail_kind = kind;
    snprintf(rc->fail_msg, sizeof rc->fail_msg, "%s", msg);
    ac->data = NULL; /* on_connect and on_disconnect: not ours any more */
    if (quiet) detach_all(rc, 1);
    redisAsyncFree(ac); /* runs on_reply(NULL) for each command still queued */
    detach_all(rc, 0);
  }
  if (rc->resolving) { /* its callback frees it; uv_cancel may be too late */
    rc->resolving->rc = NULL;
    uv_cancel((uv_req_t *)&rc->resolving->req);
    rc->resolving = NULL;
  }
  if (rc->connecting) {
    rc->connecting = 0;
    if (!rc->cstatus) rc->cstatus = -1;
    snprintf(rc->cerr, sizeof rc->cerr, "%s", msg);
    rc->ckind = kind;
    in_flight(rc->loop, -1);
    if (!quiet) lg_task_wake(&rc->cw);
  }
  if (rc->timer) {
    uv_close((uv_handle_t *)rc->timer, timer_closed);
    rc->timer = NULL;
  }
}

/* When the oldest command in flight times out: `timeout` after it was
 * queued or after the connection last made progress, whichever is later.
 * So a loop too busy to read for a while, or a long pipeline that Redis
 * answers steadily, is not taken for a dead server; silence is. */
static uint64_t head_deadline(const rconn *rc) {
  uint64_t from = rc->head->queued > rc->progress ? rc->head->queued : rc->progress;
  return from + rc->head->wait_ms;
}

/* The timer fired: the connect, or the oldest command, may be late. The
 * loop may have been busy (a loaded machine, a long task) and libuv runs
 * due timers before it polls: a connect may have completed and a
 * command's replies may wait in the socket. So a finished connect is
 * completed, pending bytes are written and read first; only a connection
 * that is still silent is torn down, failing every command in flight as a
 * timeout. */
static void on_timeout(uv_timer_t *t) {
  rconn *rc = t->data;
  uv_loop_t *uv = lg_loop_uv(rc->loop);
  lg_loop_activity(rc->loop);
  uv_update_time(uv);
  int soerr = 0;
  socklen_t len = sizeof soerr;
  /* the adapter ignores a poll error, so a refused connect shows only here */
  if (rc->connecting && rc->ac &&
      getsockopt(rc->ac->c.fd, SOL_SOCKET, SO_ERROR, &soerr, &len) == 0 && soerr) {
    char msg[160];
    snprintf(msg, sizeof msg, "redis: connect: %s", strerror(soerr));
    conn_down(rc, soerr == ECONNREFUSED ? LG_ERR_REFUSED : LG_ERR_TRANSPORT, msg, 0);
    return;
  }
  if (rc->connecting && rc->ac) {
    struct pollfd pfd = {.fd = rc->ac->c.fd, .events = POLLOUT};
    if (poll(&pfd, 1, 0) == 1 && (pfd.revents & POLLOUT)) {
      redisAsyncHandleWrite(rc->ac); /* hiredis finishes the connect: on_connect */
      if (!rc->connecting) return;
    }
  }
  if (!rc->connecting && rc->ac) {
    size_t before = sdslen(rc->ac->c.obuf);
    if (before > 0) {
      redisAsyncHandleWrite(rc->ac);
      if (rc->ac && sdslen(rc->ac->c.obuf) < before) rc->progress = uv_now(uv);
    }
    cmd *h;
    do { /* each read takes what one buffer holds */
      h = rc->head;
      if (rc->ac) redisAsyncHandleRead(rc->ac);
    } while (rc->ac && rc->head && rc->head != h);
    if (!rc->ac || !rc->head) return;
    if (head_deadline(rc) > uv_now(uv)) {
      arm_timer(rc);
      return;
    }
  }
  conn_down(rc, LG_ERR_TIMEOUT, rc->connecting ? "redis: connect timed out" : "redis: command timed out", 0);
}

/* Arms the timer for the oldest command in flight; stops it when none. */
static void arm_timer(rconn *rc) {
  if (!rc->timer || rc->connecting) return;
  if (!rc->head) {
    uv_timer_stop(rc->timer);
    return;
  }
  uint64_t now = uv_now(lg_loop_uv(rc->loop));
  uint64_t due = head_deadline(rc);
  uv_timer_start(rc->timer, on_timeout, due > now ? due - now : 0, 0);
}

/* hiredis's connect callback. On failure hiredis frees the context after
 * this returns, so the connection forgets it here. */
static void on_connect(const redisAsyncContext *ac, int status) {
  rconn *rc = ac->data;
  if (!rc) return;
  lg_loop_activity(rc->loop);
  if (status != REDIS_OK) {
    rc->ac = NULL;
    rc->cstatus = -1;
    snprintf(rc->cerr, sizeof rc->cerr, "redis: connect: %s", ac->errstr);
    /* hiredis's own text (never the user's host name) */
    rc->ckind = strstr(ac->errstr, "refused") ? LG_ERR_REFUSED : LG_ERR_TRANSPORT;
  } else {
    rc->connected = 1;
  }
  if (rc->connecting) {
    rc->connecting = 0;
    in_flight(rc->loop, -1);
    if (rc->timer) uv_timer_stop(rc->timer);
    lg_task_wake(&rc->cw);
  }
}

/* hiredis's disconnect callback (the server closed, or a read failed).
 * Commands still queued have had their callbacks; hiredis frees the
 * context after this returns. */
static void on_disconnect(const redisAsyncContext *ac, int status) {
  (void)status;
  rconn *rc = ac->data;
  if (!rc) return;
  rc->ac = NULL;
  rc->connected = 0;
  detach_all(rc, 0);
  if (rc->timer) uv_timer_stop(rc->timer);
}

/* Cancel hook of redis_connect: the half-made connection goes. */
static void connect_cancel(lg_wait *w) {
  rconn *rc = (rconn *)((char *)w - offsetof(rconn, cw));
  if (!rc->connecting) return;
  rc->connecting = 0;
  in_flight(rc->loop, -1);
  conn_down(rc, LG_ERR_CANCELLED, "redis: connect cancelled", 1);
}

/* The connection at argument 1. */
static rconn *check_conn(lua_State *L) { return luaL_checkudata(L, 1, REDIS_MT); }

/* Continuation of redis_connect: the connection (index 4), or nil, err. */
static int connect_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  (void)ctx;
  rconn *rc = lua_touserdata(L, 4);
  if (rc->cstatus != 0 || !rc->connected) {
    lg_error_kind kind = rc->cerr[0] ? rc->ckind : LG_ERR_TRANSPORT;
    lua_pushnil(L);
    lg_error_push(L, kind, rc->cerr[0] ? rc->cerr : "redis: connect failed");
    conn_down(rc, kind, rc->cerr, 1);
    return 2;
  }
  lua_settop(L, 4);
  return 1;
}

/* Starts hiredis's non-blocking connect of rc to the numeric address
 * `addr`: 0, or -1 with rc->cstatus and rc->cerr set. */
static int start_connect(rconn *rc, const char *addr, int port) {
  redisAsyncContext *ac = redisAsyncConnect(addr, port);
  const char *why = !ac ? "out of memory" : ac->err ? ac->errstr : NULL;
  if (!why && redisLibuvAttach(ac, lg_loop_uv(rc->loop)) != REDIS_OK) why = "cannot attach to the loop";
  if (why) {
    rc->cstatus = -1;
    snprintf(rc->cerr, sizeof rc->cerr, "redis: connect %s:%d: %s", addr, port, why);
    rc->ckind = LG_ERR_TRANSPORT;
    if (ac) redisAsyncFree(ac);
    return -1;
  }
  /* an idle connection does not keep the loop alive (nor hide a deadlock) */
  uv_unref((uv_handle_t *)&((redisLibuvEvents *)ac->ev.data)->handle);
  ac->data = rc;
  rc->ac = ac;
  redisAsyncSetConnectCallback(ac, on_connect);
  redisAsyncSetDisconnectCallback(ac, on_disconnect);
  return 0;
}

/* The lookup ended (or was cancelled): keeps the first address, wakes the
 * task in redis_connect. Frees the request. */
static void on_resolved(uv_getaddrinfo_t *req, int status, struct addrinfo *res) {
  resolve_req *r = (resolve_req *)req;
  rconn *rc = r->rc;
  if (rc) {
    lg_loop_activity(rc->loop);
    rc->resolving = NULL;
    rc->rstatus = status ? status : UV_EAI_NONAME;
    for (struct addrinfo *a = res; status == 0 && a; a = a->ai_next) {
      int ok = a->ai_family == AF_INET
                   ? uv_ip4_name((struct sockaddr_in *)a->ai_addr, rc->addr, sizeof rc->addr) == 0
               : a->ai_family == AF_INET6
                   ? uv_ip6_name((struct sockaddr_in6 *)a->ai_addr, rc->addr, sizeof rc->addr) == 0
                   : 0;
      if (ok) {
        rc->rstatus = 0;
        break;
      }
    }
    lg_task_wake(&rc->cw);
  }
  uv_freeaddrinfo(res);
  free(r);
}

/* Continuation of redis_connect after the name lookup: connects to the
 * address found, or fails (kind dns, or the timeout's). */
static int resolve_k(lua_State *L, int status, lua_KContext ctx) {
  rconn *rc = lua_touserdata(L, 4);
  if (!rc->connecting) return connect_k(L, status, ctx); /* timed out */
  if (rc->rstatus != 0) {
    rc->cstatus = -1;
    snprintf(rc->cerr, sizeof rc->cerr, "redis: cannot resolve '%s': %s", lua_tostring(L, 1),
             uv_strerror(rc->rstatus));
    rc->ckind = LG_ERR_DNS;
    return connect_k(L, status, ctx);
  }
  if (start_connect(rc, rc->addr, (int)lua_tointeger(L, 2)) != 0) return connect_k(L, status, ctx);
  return lg_task_suspend(L, &rc->cw, 0, connect_k);
}

/* redis_connect(host, port, timeout) -> conn | nil, err, once connected
 * (or failed, or `timeout` seconds passed). host is a numeric IPv4 or IPv6
 * address, "localhost", or a name, looked up on libuv's thread pool so the
 * loop never blocks on DNS. Cancellable. Returns a new "luagent.Redis". */
static int l_redis_connect(lua_State *L) {
  const char *host = luaL_checkstring(L, 1);
  lua_Integer port = luaL_checkinteger(L, 2);
  double timeout = luaL_checknumber(L, 3);
  luaL_argcheck(L, port > 0 && port <= 65535, 2, "port must be in [1, 65535]");
  luaL_argcheck(L, timeout > 0 && timeout < 1e6, 3, "timeout must be a number of seconds > 0");
  luaL_argcheck(L, host[0] != '\0', 1, "host must not be empty");
  if (strcmp(host, "localhost") == 0) host = "127.0.0.1";
  struct sockaddr_in6 probe6;
  struct sockaddr_in probe4;
  int numeric = uv_ip4_addr(host, (int)port, &probe4) == 0 || uv_ip6_addr(host, (int)port, &probe6) == 0;
  lua_settop(L, 3);
  lg_loop *loop = lg_loop_get(L);
  rconn *rc = lua_newuserdatauv(L, sizeof *rc, 0); /* born closed */
  memset(rc, 0, sizeof *rc);
  rc->loop = loop;
  rc->cw.cancel = connect_cancel;
  luaL_setmetatable(L, REDIS_MT);
  rc->timer = malloc(sizeof *rc->timer);
  if (!rc->timer) return luaL_error(L, "redis_connect: out of memory");
  uv_timer_init(lg_loop_uv(loop), rc->timer);
  rc->timer->data = rc;
  resolve_req *r = NULL;
  if (!numeric) {
    r = malloc(sizeof *r);
    if (!r) return luaL_error(L, "redis_connect: out of memory");
    r->rc = rc;
    struct addrinfo hints;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    int rv = uv_getaddrinfo(lg_loop_uv(loop), &r->req, on_resolved, host, NULL, &hints);
    if (rv != 0) {
      free(r);
      rc->cstatus = -1;
      snprintf(rc->cerr, sizeof rc->cerr, "redis: cannot resolve '%s': %s", host, uv_strerror(rv));
      rc->ckind = LG_ERR_DNS;
      return connect_k(L, 0, 0);
    }
    rc->resolving = r;
  } else if (start_connect(rc, host, (int)port) != 0) {
    return connect_k(L, 0, 0);
  }
  rc->connecting = 1;
  in_flight(loop, 1);
  uv_update_time(lg_loop_uv(loop));
  uv_timer_start(rc->timer, on_timeout, (uint64_t)(timeout * 1000 + 0.5), 0);
  return lg_task_suspend(L, &rc->cw, 0, r ? resolve_k : connect_k);
}

/* Collects the arguments from `first` on into argv/lens (strings or
 * numbers); returns how many. */
static int collect_args(lua_State *L, int first, const char **argv, size_t *lens) {
  int n = lua_gettop(L) - first + 1;
  if (n < 1) luaL_error(L, "redis: a command needs at least its name");
  if (n > MAX_ARGS) luaL_error(L, "redis: at most %d arguments", MAX_ARGS);
  for (int i = 0; i < n; i++) {
    int t = lua_type(L, first + i);
    if (t != LUA_TSTRING && t != LUA_TNUMBER)
      luaL_error(L, "redis: argument %d must be a string or a number", i + 1);
    argv[i] = lua_tolstring(L, first + i, &lens[i]);
  }
  return n;
}

/* Queues argv on the connection with `w` as its waiter (may be NULL);
 * 0, or -1 when the connection cannot take it. */
static int queue_cmd(rconn *rc, waiter *w, double timeout, int argc, const char **argv,
                     const size_t *lens) {
  cmd *c = malloc(sizeof *c);
  if (!c) return -1;
  memset(c, 0, sizeof *c);
  c->conn = rc;
  c->w = w;
  uv_update_time(lg_loop_uv(rc->loop));
  c->queued = uv_now(lg_loop_uv(rc->loop));
  c->wait_ms = (uint64_t)(timeout * 1000 + 0.5);
  if (redisAsyncCommandArgv(rc->ac, on_reply, c, argc, argv, lens) != REDIS_OK) {
    free(c);
    return -1;
  }
  if (rc->tail) rc->tail->next = c;
  else rc->head = c;
  rc->tail = c;
  if (w) w->c = c;
  in_flight(rc->loop, 1);
  if (rc->head == c) arm_timer(rc);
  return 0;
}

/* Continuation of command: the reply, nil, err (an error reply has kind
 * protocol), or nil, err for a connection that failed. */
static int command_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  waiter *w = lua_touserdata(L, (int)ctx);
  if (!w->reply) {
    lua_pushnil(L);
    lg_error_push(L, w->kind, w->err);
    return 2;
  }
  if (w->reply->type == REDIS_REPLY_ERROR) {
    lua_pushnil(L);
    lg_error_push(L, LG_ERR_PROTOCOL, w->reply->str);
    return 2;
  }
  push_rval(L, w->reply);
  return 1;
}

/* The arguments of command and send: a timeout, then the command. */
typedef struct {
  double timeout;
  int argc;
  const char *argv[MAX_ARGS];
  size_t lens[MAX_ARGS];
} cmd_args;

/* Reads the arguments of command and send (the connection at 1, a timeout
 * at 2, the command from 3) into `a`. The connection when the command may
 * go; otherwise pushes nil, err for a connection that went down and returns
 * NULL. Raises for one its owner closed (use after close). */
static rconn *take_args(lua_State *L, cmd_args *a) {
  rconn *rc = check_conn(L);
  if (rc->closed) luaL_error(L, "command: connection is closed");
  a->timeout = luaL_checknumber(L, 2);
  luaL_argcheck(L, a->timeout > 0 && a->timeout < 1e6, 2, "timeout must be a number of seconds > 0");
  a->argc = collect_args(L, 3, a->argv, a->lens);
  if (rc->ac && rc->connected) return rc;
  lua_pushnil(L);
  lg_error_push(L, LG_ERR_TRANSPORT, rc->fail_msg[0] ? rc->fail_msg : "redis: connection closed");
  return NULL;
}

/* r:command(timeout, arg, ...) -> reply | nil, err. Cancellable (the reply
 * is then dropped). Replies: integer, string, false (nil reply), table. */
static int l_command(lua_State *L) {
  cmd_args a;
  rconn *rc = take_args(L, &a);
  if (!rc) return 2;
  int top = lua_gettop(L);
  waiter *w = lua_newuserdatauv(L, sizeof *w, 0);
  memset(w, 0, sizeof *w);
  w->w.cancel = waiter_cancel;
  luaL_setmetatable(L, WAITER_MT);
  if (queue_cmd(rc, w, a.timeout, a.argc, a.argv, a.lens) != 0)
    return luaL_error(L, "redis: cannot queue the command");
  return lg_task_suspend(L, &w->w, top + 1, command_k);
}

/* r:send(timeout, arg, ...) -> true | nil, err: queues the command without
 * waiting; its reply is dropped, but a late reply still takes the
 * connection down like a command's. */
static int l_send(lua_State *L) {
  cmd_args a;
  rconn *rc = take_args(L, &a);
  if (!rc) return 2;
  if (queue_cmd(rc, NULL, a.timeout, a.argc, a.argv, a.lens) != 0)
    return luaL_error(L, "redis: cannot queue the command");
  lua_pushboolean(L, 1);
  return 1;
}

/* r:connected() -> true, or false, why (the last failure's message). */
static int l_connected(lua_State *L) {
  rconn *rc = check_conn(L);
  lua_pushboolean(L, rc->ac && rc->connected);
  if (rc->ac && rc->connected) return 1;
  lua_pushstring(L, rc->fail_msg[0] ? rc->fail_msg : "closed");
  return 2;
}

/* r:close(), __close: commands in flight fail with "connection closed". */
static int l_close(lua_State *L) {
  rconn *rc = check_conn(L);
  rc->closed = 1;
  conn_down(rc, LG_ERR_TRANSPORT, "redis: connection closed", 0);
  return 0;
}

/* __gc: the same close, waking nobody (the state may be closing). */
static int l_gc(lua_State *L) {
  conn_down(lua_touserdata(L, 1), LG_ERR_TRANSPORT, "redis: connection closed", 1);
  return 0;
}

/* Creates the metatables and adds redis_connect to the table on the stack. */
void lg_redis_register(lua_State *L) {
  static const luaL_Reg methods[] = {{"command", l_command},
                                     {"send", l_send},
                                     {"connected", l_connected},
                                     {"close", l_close},
                                     {NULL, NULL}};
  lg_class_new(L, REDIS_MT, methods, l_close, l_gc);
  lg_class_new(L, WAITER_MT, NULL, NULL, l_waiter_gc);
  lua_pushcfunction(L, l_redis_connect);
  lua_setfield(L, -2, "redis_connect");
}
