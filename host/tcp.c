/* TCP on the loop: core.tcp_listen / core.tcp_connect, a "luagent.TcpServer"
 * (accept, address, close) and a "luagent.TcpConn" (read, write, close,
 * reset, peer).
 *
 * Ownership, so that nothing Lua collects is still used by libuv:
 * - every uv_tcp_t is malloc'd on its own and freed only by its close
 *   callback; handle->data points to the owning userdata while it is open
 *   and is NULL once the owner let go (closed or collected);
 * - connect and write requests are malloc'd and owned by C until libuv's
 *   callback; a waiter that goes away (cancelled, collected) only detaches;
 * - bytes that arrive while nobody reads wait in a C buffer owned by the
 *   connection; past READ_LIMIT the socket is not read until it drains.
 * Callbacks run no Lua: they move bytes, record a status and wake a task.
 * Listeners and idle reads are not "busy" (a server waiting for clients must
 * not hold virtual time); connects and writes in flight are.
 *
 * For the virtual clock (loop.c's header) each listener is registered with
 * the loop while it listens: a connection to it is the loop's own work.
 * A client connection to any other address is real work while its connect,
 * a write, or a read waited on is in flight; the connections a server
 * accepted are the own server's side, never real work. */
#include "tcp.h"

#include <arpa/inet.h>
#include <lauxlib.h>
#include <limits.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <uv.h>

#include "core.h"
#include "errors.h"
#include "loop.h"

#define SERVER_MT "luagent.TcpServer"
#define CONN_MT "luagent.TcpConn"
#define WRITE_MT "luagent.TcpWrite"

#define DEFAULT_BACKLOG 511
#define ACCEPT_QUEUE 64           /* accepted connections not yet handed out */
#define READ_LIMIT (1024 * 1024)  /* buffered bytes beyond which reading stops */

typedef struct {
  lg_loop *loop;
  uv_tcp_t *tcp;                 /* NULL once closed */
  lg_listener listener;          /* the bound address (kept after close), listed with the loop while open */
  lg_wait aw;
  int accepting;                 /* a task waits in accept */
  int accept_err;                /* a failure for the next accept, or 0 */
  int held;                      /* libuv holds a connection the queue had no room for */
  uv_tcp_t *queue[ACCEPT_QUEUE]; /* ring of accepted handles */
  int qhead, qlen;
} server;

typedef struct {
  lg_loop *loop;
  uv_tcp_t *tcp;                 /* NULL once closed */
  struct sockaddr_storage peer;  /* kept after close */
  char *buf;                     /* bytes received and not yet read */
  size_t len, cap;
  int eof;                       /* the peer finished sending */
  int err;                       /* the libuv error that ended reading, or 0 */
  int reading;                   /* uv_read_start is active */
  lg_wait rw;
  int rwaiting;                  /* a task waits in read */
  int outside;                   /* a client of a peer that is not this loop's own server */
  int rreal;                     /* the waiting read counts as real work */
  lg_wait cw;
  int cwaiting;                  /* a task waits in tcp_connect */
  int cstatus;                   /* the connect result */
} conn;

typedef struct writer writer;

/* A write in flight: owned by C from uv_write until on_write. */
typedef struct {
  uv_write_t req;                /* first: on_write casts back */
  lg_loop *loop;
  int real;                      /* to a peer outside: real work */
  writer *waiter;                /* NULL once the waiting task let go */
  char data[];                   /* a copy of the bytes libuv writes */
} write_req;

/* The waiting side of one write: a userdata on the writing task's stack. */
struct writer {
  lg_wait w;                     /* first: write_cancel casts back */
  write_req *req;                /* NULL once detached or done */
  int status;
};

/* A connect in flight: owned by C from uv_tcp_connect until on_connect. */
typedef struct {
  uv_connect_t req;              /* first: on_connect casts back */
  lg_loop *loop;
  int real;                      /* to a peer outside: real work */
} connect_req;

/* ---------------------------------------------------------------- helpers */

/* Pushes an error record for libuv error `code` during `what`: refused,
 * reset, or transport for anything else. */
static void push_uv_error(lua_State *L, const char *what, int code) {
  lg_error_kind kind = LG_ERR_TRANSPORT;
  if (code == UV_ECONNREFUSED) kind = LG_ERR_REFUSED;
  else if (code == UV_ECONNRESET || code == UV_EPIPE) kind = LG_ERR_RESET;
  const char *why = code == UV_ECANCELED ? "connection closed" : uv_strerror(code);
  lua_pushfstring(L, "%s: %s", what, why);
  lg_error_push(L, kind, lua_tostring(L, -1));
  lua_remove(L, -2);
}

/* Returns nil, err for libuv error `code` during `what`. */
static int fail(lua_State *L, const char *what, int code) {
  lua_pushnil(L);
  push_uv_error(L, what, code);
  return 2;
}

/* Returns nil, err for a failure of `fn` on host:port ("fn [v6]:port: why"). */
static int fail_addr(lua_State *L, const char *fn, const char *host, lua_Integer port,
                     int code) {
  lua_pushfstring(L, strchr(host, ':') ? "%s [%s]:%I" : "%s %s:%I", fn, host, port);
  fail(L, lua_tostring(L, -1), code);
  lua_remove(L, -3);
  return 2;
}

/* Raises for an address tcp_listen/tcp_connect cannot use (a misuse: the
 * caller passes numeric addresses). */
static int bad_address(lua_State *L, const char *fn, const char *host, lua_Integer port) {
  return luaL_error(L,
                    "%s: bad address '%s' port %I (wants a numeric IPv4 or IPv6 address "
                    "or localhost, and a port from 0 to 65535)",
                    fn, host, port);
}

/* Returns nil, err (kind transport) to a wait that a close ended. Calls on
 * an object already closed raise instead (use after close is a misuse). */
static int closed_error(lua_State *L, const char *message) {
  lua_pushnil(L);
  lg_error_push(L, LG_ERR_TRANSPORT, message);
  return 2;
}

/* Fills `sa` from a numeric address (or "localhost") and a port; 0 or -1. */
static int parse_addr(const char *host, lua_Integer port, struct sockaddr_storage *sa) {
  memset(sa, 0, sizeof *sa);
  if (port < 0 || port > 65535) return -1;
  if (strcmp(host, "localhost") == 0) host = "127.0.0.1";
  if (uv_ip4_addr(host, (int)port, (struct sockaddr_in *)sa) == 0) return 0;
  if (uv_ip6_addr(host, (int)port, (struct sockaddr_in6 *)sa) == 0) return 0;
  return -1;
}

/* Pushes host, port of `sa` (nil, nil when it holds no address). */
static int push_addr(lua_State *L, const struct sockaddr_storage *sa) {
  char host[INET6_ADDRSTRLEN] = "";
  int port;
  if (sa->ss_family == AF_INET) {
    const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
    uv_ip4_name(in, host, sizeof host);
    port = ntohs(in->sin_port);
  } else if (sa->ss_family == AF_INET6) {
    const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
    uv_ip6_name(in6, host, sizeof host);
    port = ntohs(in6->sin6_port);
  } else {
    lua_pushnil(L);
    lua_pushnil(L);
    return 2;
  }
  lua_pushstring(L, host);
  lua_pushinteger(L, port);
  return 2;
}

/* Close callback of every handle here: the handle's memory is ours. */
static void free_handle(uv_handle_t *h) { free(h); }

/* Starts closing a handle this file owns (abortively if `reset`); its memory
 * is freed by the close callback. */
static void close_tcp(uv_tcp_t *tcp, int reset) {
  tcp->data = NULL;
  if (!reset || uv_tcp_close_reset(tcp, free_handle) != 0)
    uv_close((uv_handle_t *)tcp, free_handle);
}

/* --------------------------------------------------------- connections */

static void read_cancel(lg_wait *w);
static void connect_cancel(lg_wait *w);

/* Pushes a new connection userdata, closed until a handle is attached. */
static conn *conn_new(lua_State *L, lg_loop *loop) {
  conn *c = lua_newuserdatauv(L, sizeof *c, 0);
  memset(c, 0, sizeof *c);
  c->loop = loop;
  c->rw.cancel = read_cancel;
  c->cw.cancel = connect_cancel;
  luaL_setmetatable(L, CONN_MT);
  return c;
}

/* The connection at argument 1 (raises for anything else). */
static conn *check_conn(lua_State *L) { return luaL_checkudata(L, 1, CONN_MT); }

/* The read wait ended (woken, cancelled, closed). */
static void reader_gone(conn *c) {
  c->rwaiting = 0;
  if (c->rreal) {
    c->rreal = 0;
    lg_loop_real(c->loop, -1);
  }
}

/* Wakes the task waiting in read, if any. */
static void conn_wake_reader(conn *c) {
  if (!c->rwaiting) return;
  reader_gone(c);
  lg_task_wake(&c->rw);
}

/* Gives libuv room for the next read at the end of the connection's buffer
 * (a zero-length buffer when out of memory: libuv then reports ENOBUFS). */
static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *out) {
  conn *c = h->data;
  *out = uv_buf_init(NULL, 0);
  if (!c) return;
  if (c->cap - c->len < suggested) {
    size_t cap = c->cap ? c->cap : suggested;
    while (cap - c->len < suggested) cap *= 2;
    char *p = realloc(c->buf, cap);
    if (!p) return;
    c->buf = p;
    c->cap = cap;
  }
  out->base = c->buf + c->len;
  out->len = c->cap - c->len;
}

/* Stops reading the socket; bytes then wait in the kernel. */
static void conn_read_stop(conn *c) {
  if (!c->reading) return;
  uv_read_stop((uv_stream_t *)c->tcp);
  c->reading = 0;
}

/* Records what a read brought (bytes, EOF or an error) and wakes the reader.
 * Stops reading when the buffer is over READ_LIMIT. */
static void on_read(uv_stream_t *h, ssize_t nread, const uv_buf_t *buf) {
  (void)buf;
  conn *c = h->data;
  if (!c || nread == 0) return;
  lg_loop_activity(c->loop);
  if (nread > 0) {
    c->len += (size_t)nread;
    if (c->len >= READ_LIMIT) conn_read_stop(c);
  } else {
    if (nread == UV_EOF) c->eof = 1;
    else c->err = (int)nread;
    conn_read_stop(c);
  }
  conn_wake_reader(c);
}

/* (Re)starts reading the socket unless it is closed, finished or full. */
static void conn_read_start(conn *c) {
  if (!c->tcp || c->reading || c->eof || c->err || c->len >= READ_LIMIT) return;
  int rc = uv_read_start((uv_stream_t *)c->tcp, on_alloc, on_read);
  if (rc != 0) c->err = rc;
  else c->reading = 1;
}

/* Makes a connected handle (now owned by c) ready for use: records the peer,
 * disables Nagle (small writes of a streamed reply go out at once) and
 * starts buffering what arrives. */
static void conn_start(conn *c, uv_tcp_t *tcp) {
  c->tcp = tcp;
  tcp->data = c;
  int len = (int)sizeof c->peer;
  uv_tcp_getpeername(tcp, (struct sockaddr *)&c->peer, &len);
  uv_tcp_nodelay(tcp, 1);
  conn_read_start(c);
}

/* The one close of a connection (close, reset, __close, __gc): idempotent.
 * Drops unread bytes; `wake` wakes a task blocked in read (not from __gc). */
static void conn_close(conn *c, int reset, int wake) {
  if (!c->tcp) return;
  close_tcp(c->tcp, reset);
  c->tcp = NULL;
  c->reading = 0;
  free(c->buf);
  c->buf = NULL;
  c->len = c->cap = 0;
  if (wake) conn_wake_reader(c);
  else reader_gone(c);
}

/* ------------------------------------------------------------------ read */

/* Cancel hook of read: nothing is in flight, only the wait ends. */
static void read_cancel(lg_wait *w) {
  conn *c = (conn *)((char *)w - offsetof(conn, rw));
  reader_gone(c);
}

static int read_try(lua_State *L, conn *c);

/* Continuation of read: looks again at what arrived. */
static int read_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  (void)ctx;
  return read_try(L, lua_touserdata(L, 1));
}

/* Returns everything buffered, or nil at EOF, or nil, err; else suspends
 * until one of those is there. */
static int read_try(lua_State *L, conn *c) {
  if (c->len > 0) {
    lua_pushlstring(L, c->buf, c->len);
    c->len = 0;
    conn_read_start(c);
    return 1;
  }
  if (!c->tcp) return closed_error(L, "read: connection closed");
  if (c->err) return fail(L, "read", c->err);
  if (c->eof) {
    lua_pushnil(L);
    return 1;
  }
  if (c->rwaiting) return luaL_error(L, "read: another task is already reading");
  c->rwaiting = 1;
  if (c->outside) { /* the reply comes from outside the loop */
    c->rreal = 1;
    lg_loop_real(c->loop, 1);
  }
  return lg_task_suspend(L, &c->rw, 0, read_k);
}

/* conn:read() -> data | nil (EOF) | nil, err. Raises once closed here; a
 * read blocked when another task closes the connection gets nil, err.
 * Cancellable; bytes that
 * arrived stay buffered for the next read. Returns a new Lua string. */
static int l_conn_read(lua_State *L) {
  conn *c = check_conn(L);
  if (!c->tcp) return luaL_error(L, "read: connection is closed");
  lua_settop(L, 1);
  return read_try(L, c);
}

/* ----------------------------------------------------------------- write */

/* Reports a finished write to its waiter, if one is still attached. */
static void on_write(uv_write_t *r, int status) {
  write_req *req = (write_req *)r;
  lg_loop_busy(req->loop, -1);
  if (req->real) lg_loop_real(req->loop, -1);
  lg_loop_activity(req->loop);
  writer *wr = req->waiter;
  if (wr) {
    wr->req = NULL;
    wr->status = status;
    lg_task_wake(&wr->w);
  }
  free(req);
}

/* Lets go of the request: libuv finishes (or cancels) it on its own. */
static void write_cancel(lg_wait *w) {
  writer *wr = (writer *)w;
  if (!wr->req) return;
  wr->req->waiter = NULL;
  wr->req = NULL;
}

/* A writer collected mid-write (lua_close) detaches from its request. */
static int l_writer_gc(lua_State *L) {
  write_cancel(lua_touserdata(L, 1));
  return 0;
}

/* Continuation of write: true, or nil, err with libuv's status. */
static int write_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  (void)ctx;
  writer *wr = lua_touserdata(L, 3);
  if (wr->status != 0) return fail(L, "write", wr->status);
  lua_pushboolean(L, 1);
  return 1;
}

/* conn:write(s) -> true | nil, err, once libuv has written all of s.
 * Cancellable: the bytes are copied, and a cancelled write still goes out. */
static int l_conn_write(lua_State *L) {
  conn *c = check_conn(L);
  size_t len;
  const char *s = luaL_checklstring(L, 2, &len);
  lua_settop(L, 2);
  if (!c->tcp) return luaL_error(L, "write: connection is closed");
  if (len == 0) {
    lua_pushboolean(L, 1);
    return 1;
  }
  writer *wr = lua_newuserdatauv(L, sizeof *wr, 0);
  memset(wr, 0, sizeof *wr);
  wr->w.cancel = write_cancel;
  luaL_setmetatable(L, WRITE_MT);
  write_req *req = malloc(sizeof *req + len);
  if (!req) return luaL_error(L, "write: out of memory");
  memcpy(req->data, s, len);
  req->loop = c->loop;
  req->real = c->outside;
  req->waiter = wr;
  uv_buf_t b;
  b.base = req->data;
  b.len = len;
  int rc = uv_write(&req->req, (uv_stream_t *)c->tcp, &b, 1, on_write);
  if (rc != 0) {
    free(req);
    return fail(L, "write", rc);
  }
  wr->req = req;
  lg_loop_busy(c->loop, 1);
  if (req->real) lg_loop_real(c->loop, 1);
  return lg_task_suspend(L, &wr->w, 0, write_k);
}

/* ------------------------------------------------------ conn: the rest */

/* conn:close(), conn:__close(): graceful close; a blocked read gets nil, err. */
static int l_conn_close(lua_State *L) {
  conn_close(check_conn(L), 0, 1);
  return 0;
}

/* conn:reset(): abortive close, the peer sees a RST. */
static int l_conn_reset(lua_State *L) {
  conn_close(check_conn(L), 1, 1);
  return 0;
}

/* __gc: closes without waking anyone (the state may be closing). */
static int l_conn_gc(lua_State *L) {
  conn_close(lua_touserdata(L, 1), 0, 0);
  return 0;
}

/* conn:peer() -> host, port of the other end (also after close). */
static int l_conn_peer(lua_State *L) { return push_addr(L, &check_conn(L)->peer); }

/* --------------------------------------------------------------- connect */

/* Reports the connect result to the task that waits for it, if any. */
static void on_connect(uv_connect_t *r, int status) {
  connect_req *req = (connect_req *)r;
  lg_loop_busy(req->loop, -1);
  if (req->real) lg_loop_real(req->loop, -1);
  lg_loop_activity(req->loop);
  conn *c = r->handle->data;
  if (c && c->cwaiting) {
    c->cwaiting = 0;
    c->cstatus = status;
    lg_task_wake(&c->cw);
  }
  free(req);
}

/* Aborts the connect by closing the handle (libuv then cancels the request). */
static void connect_cancel(lg_wait *w) {
  conn *c = (conn *)((char *)w - offsetof(conn, cw));
  c->cwaiting = 0;
  conn_close(c, 0, 0);
}

/* Continuation of tcp_connect: the connection (index 3), or nil, err. */
static int connect_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  (void)ctx;
  conn *c = lua_touserdata(L, 3);
  if (!c->tcp) return closed_error(L, "tcp_connect: connection closed");
  if (c->cstatus != 0) {
    int rc = c->cstatus;
    conn_close(c, 0, 0);
    return fail_addr(L, "tcp_connect", lua_tostring(L, 1), lua_tointeger(L, 2), rc);
  }
  conn_start(c, c->tcp);
  lua_settop(L, 3);
  return 1;
}

/* tcp_connect(host, port) -> conn | nil, err, once connected. Cancellable.
 * Returns a new "luagent.TcpConn" userdata owned by Lua. */
static int l_tcp_connect(lua_State *L) {
  const char *host = luaL_checkstring(L, 1);
  lua_Integer port = luaL_checkinteger(L, 2);
  lua_settop(L, 2);
  lg_loop *loop = lg_loop_get(L);
  struct sockaddr_storage sa;
  if (parse_addr(host, port, &sa) != 0) return bad_address(L, "tcp_connect", host, port);
  lg_ignore_sigpipe();
  conn *c = conn_new(L, loop);
  uv_tcp_t *tcp = malloc(sizeof *tcp);
  connect_req *req = malloc(sizeof *req);
  if (!tcp || !req) {
    free(tcp);
    free(req);
    return luaL_error(L, "tcp_connect: out of memory");
  }
  int rc = uv_tcp_init(lg_loop_uv(loop), tcp);
  if (rc != 0) {
    free(tcp);
    free(req);
    return fail_addr(L, "tcp_connect", host, port, rc);
  }
  c->tcp = tcp;
  tcp->data = c;
  c->outside = !lg_loop_serves(loop, (struct sockaddr *)&sa);
  req->loop = loop;
  req->real = c->outside;
  rc = uv_tcp_connect(&req->req, tcp, (struct sockaddr *)&sa, on_connect);
  if (rc != 0) {
    free(req);
    conn_close(c, 0, 0);
    return fail_addr(L, "tcp_connect", host, port, rc);
  }
  lg_loop_busy(loop, 1);
  if (req->real) lg_loop_real(loop, 1);
  c->cwaiting = 1;
  return lg_task_suspend(L, &c->cw, 0, connect_k);
}

/* --------------------------------------------------------------- servers */

/* The server at argument 1 (raises for anything else). */
static server *check_server(lua_State *L) { return luaL_checkudata(L, 1, SERVER_MT); }

/* Wakes the task waiting in accept, if any. */
static void server_wake(server *s) {
  if (!s->accepting) return;
  s->accepting = 0;
  lg_task_wake(&s->aw);
}

/* Moves the connection libuv holds into the queue, if there is room. While
 * the queue is full libuv holds one and stops accepting, so the kernel's
 * backlog queues the rest. */
static void server_fill(server *s) {
  if (!s->held || s->qlen == ACCEPT_QUEUE) return;
  uv_tcp_t *c = malloc(sizeof *c);
  int rc = c ? uv_tcp_init(lg_loop_uv(s->loop), c) : UV_ENOMEM;
  if (rc != 0) { /* still held: the next accept tries again */
    free(c);
    s->accept_err = rc;
    return;
  }
  c->data = NULL;
  s->held = 0;
  rc = uv_accept((uv_stream_t *)s->tcp, (uv_stream_t *)c);
  if (rc != 0) {
    close_tcp(c, 0);
    s->accept_err = rc;
    return;
  }
  s->queue[(s->qhead + s->qlen) % ACCEPT_QUEUE] = c;
  s->qlen++;
}

/* A client connected (or accepting failed): queue it, wake the acceptor. */
static void on_connection(uv_stream_t *h, int status) {
  server *s = h->data;
  if (!s) return;
  lg_loop_activity(s->loop);
  if (status < 0) {
    s->accept_err = status;
  } else {
    s->held = 1;
    server_fill(s);
  }
  server_wake(s);
}

/* The one close of a server (close, __close, __gc): idempotent. Closes the
 * queued connections; `wake` wakes a task blocked in accept (not from __gc). */
static void server_close(server *s, int wake) {
  if (!s->tcp) return;
  lg_loop_listener_remove(s->loop, &s->listener);
  close_tcp(s->tcp, 0);
  s->tcp = NULL;
  for (; s->qlen > 0; s->qlen--) {
    close_tcp(s->queue[s->qhead], 0);
    s->qhead = (s->qhead + 1) % ACCEPT_QUEUE;
  }
  s->held = 0;
  if (wake) server_wake(s);
  else s->accepting = 0;
}

/* Cancel hook of accept: queued connections stay for the next accept. */
static void accept_cancel(lg_wait *w) {
  server *s = (server *)((char *)w - offsetof(server, aw));
  s->accepting = 0;
}

static int accept_try(lua_State *L, server *s);

/* Continuation of accept: looks again at the queue. */
static int accept_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  (void)ctx;
  return accept_try(L, lua_touserdata(L, 1));
}

/* Hands out the oldest queued connection, or nil, err, or suspends until a
 * client connects or the server closes. */
static int accept_try(lua_State *L, server *s) {
  if (!s->tcp) return closed_error(L, "server closed");
  if (s->qlen == 0 && s->accept_err) {
    int rc = s->accept_err;
    s->accept_err = 0;
    return fail(L, "accept", rc);
  }
  if (s->qlen == 0) {
    if (s->accepting) return luaL_error(L, "accept: another task is already accepting");
    s->accepting = 1;
    return lg_task_suspend(L, &s->aw, 0, accept_k);
  }
  conn *c = conn_new(L, s->loop);
  uv_tcp_t *tcp = s->queue[s->qhead];
  s->qhead = (s->qhead + 1) % ACCEPT_QUEUE;
  s->qlen--;
  server_fill(s);
  conn_start(c, tcp);
  return 1;
}

/* srv:accept() -> conn | nil, err. Connections are handed out in the order
 * they arrived; an accept blocked when the server closes gets nil, err
 * (transport, "server closed"); accept on a closed server raises.
 * Cancellable. Returns a new "luagent.TcpConn" userdata owned by Lua. */
static int l_server_accept(lua_State *L) {
  server *s = check_server(L);
  if (!s->tcp) return luaL_error(L, "accept: server is closed");
  lua_settop(L, 1);
  return accept_try(L, s);
}

/* srv:address() -> host, port it listens on (also after close). */
static int l_server_address(lua_State *L) { return push_addr(L, &check_server(L)->listener.addr); }

/* srv:close(), srv:__close(): stops listening; a blocked accept gets nil, err. */
static int l_server_close(lua_State *L) {
  server_close(check_server(L), 1);
  return 0;
}

/* __gc: closes without waking anyone (the state may be closing). */
static int l_server_gc(lua_State *L) {
  server_close(lua_touserdata(L, 1), 0);
  return 0;
}

/* tcp_listen(host, port [, backlog]) -> server | nil, err. Port 0 picks a
 * free port. Returns a new "luagent.TcpServer" userdata owned by Lua. */
static int l_tcp_listen(lua_State *L) {
  const char *host = luaL_checkstring(L, 1);
  lua_Integer port = luaL_checkinteger(L, 2);
  lua_Integer backlog = luaL_optinteger(L, 3, DEFAULT_BACKLOG);
  luaL_argcheck(L, backlog > 0 && backlog <= INT_MAX, 3, "backlog must be positive");
  lg_loop *loop = lg_loop_get(L);
  struct sockaddr_storage sa;
  if (parse_addr(host, port, &sa) != 0) return bad_address(L, "tcp_listen", host, port);
  lg_ignore_sigpipe();
  server *s = lua_newuserdatauv(L, sizeof *s, 0);
  memset(s, 0, sizeof *s);
  s->loop = loop;
  s->aw.cancel = accept_cancel;
  luaL_setmetatable(L, SERVER_MT);
  uv_tcp_t *tcp = malloc(sizeof *tcp);
  if (!tcp) return luaL_error(L, "tcp_listen: out of memory");
  int rc = uv_tcp_init(lg_loop_uv(loop), tcp);
  if (rc != 0) {
    free(tcp);
    return fail_addr(L, "tcp_listen", host, port, rc);
  }
  s->tcp = tcp;
  tcp->data = s;
  int len = (int)sizeof s->listener.addr;
  if ((rc = uv_tcp_bind(tcp, (const struct sockaddr *)&sa, 0)) != 0 ||
      (rc = uv_listen((uv_stream_t *)tcp, (int)backlog, on_connection)) != 0 ||
      (rc = uv_tcp_getsockname(tcp, (struct sockaddr *)&s->listener.addr, &len)) != 0) {
    server_close(s, 0);
    return fail_addr(L, "tcp_listen", host, port, rc);
  }
  lg_loop_listener_add(loop, &s->listener);
  return 1;
}

/* ----------------------------------------------------------- registration */

/* Creates the metatables and adds tcp_listen, tcp_connect to the table
 * on the stack. */
void lg_tcp_register(lua_State *L) {
  static const luaL_Reg server_methods[] = {{"accept", l_server_accept},
                                            {"address", l_server_address},
                                            {"close", l_server_close},
                                            {NULL, NULL}};
  static const luaL_Reg conn_methods[] = {
      {"read", l_conn_read},   {"write", l_conn_write}, {"close", l_conn_close},
      {"reset", l_conn_reset}, {"peer", l_conn_peer},   {NULL, NULL}};
  lg_class_new(L, SERVER_MT, server_methods, l_server_close, l_server_gc);
  lg_class_new(L, CONN_MT, conn_methods, l_conn_close, l_conn_gc);
  lg_class_new(L, WRITE_MT, NULL, NULL, l_writer_gc);
  static const luaL_Reg funcs[] = {
      {"tcp_listen", l_tcp_listen}, {"tcp_connect", l_tcp_connect}, {NULL, NULL}};
  luaL_setfuncs(L, funcs, 0);
}
