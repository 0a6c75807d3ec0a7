/* HTTP client on the loop: libcurl's multi socket API driven by libuv (the
 * transport; its Lua binding is http_lua.c).
 *
 * One client (multi handle) per loop, connections reused across requests to
 * the same host; one easy handle per request. curl's sockets are watched
 * with uv_poll, curl's own timer is a uv_timer. Callbacks only move bytes
 * into the request's buffers and call its wake; cutting SSE events out of
 * the bytes happens when the reader asks for the next one.
 *
 * Ownership: the caller owns the memory of a client and of its requests
 * (both embedded in Lua userdata by the binding); a request owns its easy
 * handle, header list, body copy and buffers until lg_http_close. libuv owns
 * each socket watcher (malloc'd here) until its close callback frees it.
 *
 * Timeouts are per request and each has its own failure: `connect` (curl's,
 * real time), `first_byte` (until the response headers), `idle` (longest
 * silence between body bytes) and `total` (the whole request). The last three
 * run on the loop's clock, so they follow the virtual clock in simulations.
 *
 * For the virtual clock (loop.c's header) a transfer is held while curl
 * resolves the host name, then real work unless the address it connects
 * to is a listener of this loop (the mock provider, the specs' servers). */
#include "http.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "loop.h"

/* Body bytes a request buffers by default before it pauses its transfer
 * (the rest waits in the socket, in the kernel's memory, not the process's):
 * HIGH_WATER while the requests of the client hold under BUDGET bytes of
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

/* One socket curl asked us to watch; freed by its close callback. */
typedef struct {
  uv_poll_t poll;
  curl_socket_t fd;
  lg_http_client *client;
} http_sock;

/* A request's state (lg_http_request.state). */
enum { R_CLOSED, R_HEADERS, R_BODY, R_DONE };

/* Where a transfer was when it ended: connecting (name, TCP, TLS), waiting
 * for the response headers (the request was sent), or reading the body. */
enum { P_CONNECT, P_HEADERS, P_BODY };
static const char *const phase_names[] = {"connect", "headers", "body"};

/* ------------------------------------------------------------- buffers */

/* Appends n bytes to b, compacting or growing it: 0, or -1 out of memory. */
static int buf_append(lg_http_buf *b, const char *data, size_t n) {
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

/* The bytes of b not yet read. */
static size_t buf_unread(const lg_http_buf *b) { return b->len - b->off; }

/* Frees b's memory and empties it. */
static void buf_free(lg_http_buf *b) {
  free(b->p);
  memset(b, 0, sizeof *b);
}

/* Appends to r's body buffer, counting its growth in the client's total. */
static int in_append(lg_http_request *r, const char *data, size_t n) {
  size_t cap = r->in.cap;
  if (buf_append(&r->in, data, n) != 0) return -1;
  r->client->held += r->in.cap - cap;
  return 0;
}

/* Frees r's body buffer, off the client's total. */
static void in_free(lg_http_request *r) {
  if (r->client) r->client->held -= r->in.cap;
  buf_free(&r->in);
}

/* The unread bytes r may hold before its transfer pauses. */
static size_t in_bound(const lg_http_request *r) {
  if (r->bounded) return r->max_buffer;
  return r->client->held > BUDGET ? LOW_WATER : HIGH_WATER;
}

/* ---------------------------------------------------- request lifecycle */

/* Tells the reader there is news; an I/O callback: the loop is not idle. */
static void req_wake(lg_http_request *r) {
  lg_loop_activity(r->client->loop);
  r->wake(r->arg);
}

/* Stops r's three timers. */
static void stop_timers(lg_http_request *r) {
  lg_loop_timer_stop(r->client->loop, &r->first_byte);
  lg_loop_timer_stop(r->client->loop, &r->idle);
  lg_loop_timer_stop(r->client->loop, &r->total);
}

/* Lets the virtual clock move again once the host name is resolved (or the
 * transfer ended first). Idempotent. */
static void resolved(lg_http_request *r) {
  if (!r->resolving) return;
  r->resolving = 0;
  lg_loop_hold(r->client->loop, -1);
}

/* Notes whom the transfer talks to, each time curl picks its peer (a new
 * connection, or a pooled one reused): a peer outside the process is real
 * work for the virtual clock, this loop's own server is not. */
static void peer_is(lg_http_request *r, const struct sockaddr *peer) {
  int outside = !lg_loop_serves(r->client->loop, peer);
  if (outside == r->outside) return;
  r->outside = outside;
  lg_loop_real(r->client->loop, outside ? 1 : -1);
}

/* The transfer no longer waits on its peer. Idempotent. */
static void peer_done(lg_http_request *r) {
  if (!r->outside) return;
  r->outside = 0;
  lg_loop_real(r->client->loop, -1);
}

/* Takes the easy handle out of the multi (aborting it if still running). */
static void detach(lg_http_request *r) {
  resolved(r);
  peer_done(r);
  if (r->in_multi) {
    CURLFN(multi_remove_handle)(r->client->multi, r->easy);
    r->in_multi = 0;
    lg_loop_busy(r->client->loop, -1);
  }
  stop_timers(r);
}

/* Ends the request with our own failure (timeout, protocol error). A
 * protocol error found once curl has finished cleanly (events are parsed
 * as they are asked for) is still the request's failure; one that already
 * failed keeps its first failure. */
static void fail(lg_http_request *r, int cause, const char *which, const char *msg) {
  if (r->state == R_CLOSED || r->own_fail || (r->state == R_DONE && r->result != CURLE_OK)) return;
  detach(r);
  r->own_fail = 1;
  r->fail_cause = cause;
  r->fail_which = which;
  snprintf(r->fail_msg, sizeof r->fail_msg, "%s", msg);
  r->state = R_DONE;
  req_wake(r);
}

/* True when the request ended in failure (not a clean end of body). */
static int failed(const lg_http_request *r) {
  return r->state == R_DONE && (r->own_fail || r->result != CURLE_OK);
}

/* The first-byte timer fired: no response headers in time. */
static void first_byte_fired(lg_timer *t) {
  lg_http_request *r = (lg_http_request *)((char *)t - offsetof(lg_http_request, first_byte));
  fail(r, LG_HTTP_TIMEOUT, "first_byte", "no response headers within the first-byte timeout");
}

/* The idle timer is armed for the whole timeout and body bytes only note
 * their time (a heap update per HTTP chunk costs more than this): when it
 * fires after later bytes, it is armed again for what is left. */
static void idle_fired(lg_timer *t) {
  lg_http_request *r = (lg_http_request *)((char *)t - offsetof(lg_http_request, idle));
  double now = lg_loop_now(r->client->loop), due = r->body_at + r->idle_timeout;
  if (due > now) {
    lg_loop_timer_start(r->client->loop, &r->idle, due - now);
    return;
  }
  fail(r, LG_HTTP_TIMEOUT, "idle", "the stream was silent longer than the idle timeout");
}

/* Starts the idle timeout over from now (headers in, transfer resumed). */
static void idle_restart(lg_http_request *r) {
  if (r->idle_timeout <= 0) return;
  r->body_at = lg_loop_now(r->client->loop);
  lg_loop_timer_start(r->client->loop, &r->idle, r->idle_timeout);
}

/* The total timer fired: the request took too long. */
static void total_fired(lg_timer *t) {
  lg_http_request *r = (lg_http_request *)((char *)t - offsetof(lg_http_request, total));
  fail(r, LG_HTTP_TIMEOUT, "total", "the request took longer than its total timeout");
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
  lg_http_request *r = ud;
  resolved(r);
  struct sockaddr_storage peer;
  if (uv_ip4_addr(ip, port, (struct sockaddr_in *)&peer) == 0 ||
      uv_ip6_addr(ip, port, (struct sockaddr_in6 *)&peer) == 0)
    peer_is(r, (struct sockaddr *)&peer);
  if (r->phase < P_HEADERS) r->phase = P_HEADERS;
  return CURL_PREREQFUNC_OK;
}

/* CURLOPT_HEADERFUNCTION: keeps the final response's status and header
 * lines; its blank line ends the headers and wakes the reader. */
static size_t on_header(char *data, size_t size, size_t n, void *ud) {
  lg_http_request *r = ud;
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
      lg_loop_timer_stop(r->client->loop, &r->first_byte);
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
  lg_http_request *r = ud;
  size_t len = size * n;
  if (r->state == R_HEADERS) { /* body without a header block end; accept */
    r->state = R_BODY;
    r->phase = P_BODY;
    lg_loop_timer_stop(r->client->loop, &r->first_byte);
  }
  size_t unread = buf_unread(&r->in);
  if (unread > 0 && unread + len > in_bound(r)) {
    r->paused = 1;
    lg_loop_timer_stop(r->client->loop, &r->idle);
    return CURL_WRITEFUNC_PAUSE; /* curl keeps these bytes and re-sends them */
  }
  if (in_append(r, data, len) != 0) return 0;
  r->received += len;
  if (r->idle_timeout > 0) {
    r->body_at = lg_loop_now(r->client->loop);
    if (!lg_timer_armed(&r->idle)) lg_loop_timer_start(r->client->loop, &r->idle, r->idle_timeout);
  }
  req_wake(r);
  return len;
}

/* Moves finished transfers to R_DONE and wakes their readers. */
static void check_done(lg_http_client *c) {
  CURLMsg *msg;
  int left;
  while ((msg = CURLFN(multi_info_read)(c->multi, &left))) {
    if (msg->msg != CURLMSG_DONE) continue;
    lg_http_request *r = NULL;
    CURLFN(easy_getinfo)(msg->easy_handle, CURLINFO_PRIVATE, (char **)&r);
    if (!r) continue;
    r->result = msg->data.result;
    CURLFN(easy_getinfo)(r->easy, CURLINFO_OS_ERRNO, &r->os_errno);
    detach(r);
    r->state = R_DONE;
    req_wake(r);
  }
}

/* Lets curl act on r's socket now, from the reader's side of the loop, and
 * moves what finished to R_DONE. */
static void act_now(lg_http_request *r) {
  int running;
  CURLFN(multi_socket_action)(r->client->multi, r->fd, CURL_CSELECT_IN, &running);
  check_done(r->client);
}

/* uv_poll callback: a socket curl watches is ready (or failed). */
static void on_poll(uv_poll_t *h, int status, int events) {
  http_sock *s = h->data;
  int flags = 0, running;
  /* On a socket error let curl read and write: it then meets the real
   * errno (ECONNRESET) instead of a bare "poll error". */
  if (status < 0) flags = CURL_CSELECT_IN | CURL_CSELECT_OUT;
  if (events & UV_READABLE) flags |= CURL_CSELECT_IN;
  if (events & UV_WRITABLE) flags |= CURL_CSELECT_OUT;
  lg_loop_activity(s->client->loop); /* curl moves bytes: the loop is not idle */
  CURLFN(multi_socket_action)(s->client->multi, s->fd, flags, &running);
  check_done(s->client);
}

/* uv_timer callback: curl's own timer is due. */
static void on_curl_timer(uv_timer_t *h) {
  lg_http_client *c = h->data;
  int running;
  lg_loop_activity(c->loop);
  CURLFN(multi_socket_action)(c->multi, CURL_SOCKET_TIMEOUT, 0, &running);
  check_done(c);
}

/* Close callback of curl's timer: frees it. */
static void free_on_close(uv_handle_t *h) { free(h); }

/* Close callback of a socket watcher: frees it. */
static void sock_closed(uv_handle_t *h) { free(h->data); }

/* CURLMOPT_SOCKETFUNCTION: start, change or stop watching a socket. */
static int on_socket(CURL *e, curl_socket_t fd, int what, void *ud, void *sockp) {
  lg_http_client *c = ud;
  http_sock *s = sockp;
  lg_http_request *r = NULL;
  if (CURLFN(easy_getinfo)(e, CURLINFO_PRIVATE, (char **)&r) == CURLE_OK && r)
    r->fd = what == CURL_POLL_REMOVE ? CURL_SOCKET_BAD : fd; /* no stale number to pull from */
  if (what == CURL_POLL_REMOVE) {
    if (s) {
      uv_poll_stop(&s->poll);
      uv_close((uv_handle_t *)&s->poll, sock_closed);
      CURLFN(multi_assign)(c->multi, fd, NULL);
    }
    return 0;
  }
  if (!s) {
    s = calloc(1, sizeof *s);
    if (!s) return -1;
    s->fd = fd;
    s->client = c;
    if (uv_poll_init_socket(lg_loop_uv(c->loop), &s->poll, fd) != 0) {
      free(s);
      return -1;
    }
    s->poll.data = s;
    CURLFN(multi_assign)(c->multi, fd, s);
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
  lg_http_client *c = ud;
  if (ms < 0) uv_timer_stop(c->timer);
  else uv_timer_start(c->timer, on_curl_timer, (uint64_t)ms, 0);
  return 0;
}

/* ------------------------------------------------------------ the client */

/* Opens the client: its multi handle and curl's timer (owned by `c`
 * until lg_http_client_close). */
int lg_http_client_open(lg_http_client *c, lg_loop *loop, const char **err) {
  memset(c, 0, sizeof *c);
  c->closed = 1;
  /* libcurl is loaded and initialized on the first request: a script
   * that makes none never pays for it */
  if (!lg_curl_load(err)) return -1;
  c->loop = loop;
  c->timer = malloc(sizeof *c->timer);
  c->multi = CURLFN(multi_init)();
  if (!c->timer || !c->multi) {
    free(c->timer);
    if (c->multi) CURLFN(multi_cleanup)(c->multi);
    memset(c, 0, sizeof *c);
    c->closed = 1;
    *err = "out of memory";
    return -1;
  }
  uv_timer_init(lg_loop_uv(loop), c->timer);
  c->timer->data = c;
  c->closed = 0;
  CURLFN(multi_setopt)(c->multi, CURLMOPT_SOCKETFUNCTION, on_socket);
  CURLFN(multi_setopt)(c->multi, CURLMOPT_SOCKETDATA, c);
  CURLFN(multi_setopt)(c->multi, CURLMOPT_TIMERFUNCTION, on_timer_change);
  CURLFN(multi_setopt)(c->multi, CURLMOPT_TIMERDATA, c);
  return 0;
}

/* Closes the client's multi handle and timer; `c`'s memory is the caller's. */
void lg_http_client_close(lg_http_client *c) {
  if (c->closed) return;
  c->closed = 1;
  if (c->multi) CURLFN(multi_cleanup)(c->multi); /* removes its sockets */
  if (c->timer) {
    uv_timer_stop(c->timer);
    uv_close((uv_handle_t *)c->timer, free_on_close);
  }
}

/* ------------------------------------------------------------ a request */

/* Sets `r` up and creates its easy handle (owned by `r`). */
int lg_http_init(lg_http_request *r, lg_http_client *c, const lg_http_opts *o) {
  memset(r, 0, sizeof *r);
  r->state = R_CLOSED; /* safe to close until the easy handle exists */
  r->client = c;
  r->wake = o->wake;
  r->arg = o->arg;
  r->first_byte.fire = first_byte_fired;
  r->idle.fire = idle_fired;
  r->total.fire = total_fired;
  r->idle_timeout = o->idle;
  r->bounded = o->max_buffer > 0;
  r->max_buffer = r->bounded ? o->max_buffer : HIGH_WATER;
  r->fd = CURL_SOCKET_BAD;
  lg_sse_init(&r->sse, o->max_line, o->max_event);
  r->sse_on = 1;
  r->easy = CURLFN(easy_init)();
  if (!r->easy) return -1;
  r->state = R_HEADERS;
  if (o->total_given && o->total <= 0)
    fail(r, LG_HTTP_TIMEOUT, "total", "no time left: timeout.total was not positive");
  return 0;
}

/* Appends one request header line to r's list (owned by `r`). */
int lg_http_add_header(lg_http_request *r, const char *line) {
  struct curl_slist *h = CURLFN(slist_append)(r->headers, line);
  if (!h) return -1;
  r->headers = h;
  return 0;
}

/* curl's value for an LG_HTTP_V* version. */
static long curl_version_of(int version) {
  switch (version) {
  case LG_HTTP_V1_1: return CURL_HTTP_VERSION_1_1;
  case LG_HTTP_V2_PRIOR: return CURL_HTTP_VERSION_2_PRIOR_KNOWLEDGE;
  default: return CURL_HTTP_VERSION_2TLS;
  }
}

/* Sets the easy handle's options (the body copied into `r`) and adds it
 * to the multi; returns NULL or a static message. */
const char *lg_http_start(lg_http_request *r, const lg_http_opts *o) {
  lg_http_client *c = r->client;
  /* no "Expect: 100-continue" round trip for request bodies */
  if (lg_http_add_header(r, "Expect:") != 0) return "out of memory";
  long version = curl_version_of(o->version);
  CURL *e = r->easy;
  CURLFN(easy_setopt)(e, CURLOPT_URL, o->url);
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
  CURLFN(easy_setopt)(e, CURLOPT_HTTP_VERSION, version);
  /* libcurl 7.88 fails every reuse of an h2c connection (HTTP/2 on plain
   * TCP) with CURLE_HTTP2, whatever the server: one request each */
  if (version == CURL_HTTP_VERSION_2_PRIOR_KNOWLEDGE) CURLFN(easy_setopt)(e, CURLOPT_FORBID_REUSE, 1L);
  if (o->ca_file) CURLFN(easy_setopt)(e, CURLOPT_CAINFO, o->ca_file);
  if (o->connect > 0) CURLFN(easy_setopt)(e, CURLOPT_CONNECTTIMEOUT_MS, (long)(o->connect * 1000));
  if (o->body) {
    r->body = malloc(o->body_len ? o->body_len : 1);
    if (!r->body) return "out of memory";
    memcpy(r->body, o->body, o->body_len);
    CURLFN(easy_setopt)(e, CURLOPT_POSTFIELDS, r->body);
    CURLFN(easy_setopt)(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)o->body_len);
  }
  if (o->method) CURLFN(easy_setopt)(e, CURLOPT_CUSTOMREQUEST, o->method);
  else if (!o->body) CURLFN(easy_setopt)(e, CURLOPT_HTTPGET, 1L);

  if (CURLFN(multi_add_handle)(c->multi, e) != CURLM_OK) return "cannot start the transfer";
  r->in_multi = 1;
  lg_loop_busy(c->loop, 1);
  /* name resolution runs in curl's resolver thread and says nothing until
   * it is done: the virtual clock must wait for it, not jump past it */
  r->resolving = 1;
  lg_loop_hold(c->loop, 1);
  if (o->first_byte > 0) lg_loop_timer_start(c->loop, &r->first_byte, o->first_byte);
  if (o->total > 0) lg_loop_timer_start(c->loop, &r->total, o->total);
  return NULL;
}

/* Whether the final response's headers are in (1), awaited (0), or will
 * never come (-1). */
int lg_http_response(lg_http_request *r) {
  if (r->phase == P_BODY) return 1; /* the final response's headers are complete */
  if (r->state != R_DONE) return 0;
  if (!failed(r)) r->result = CURLE_GOT_NOTHING; /* ended without a response */
  return -1;
}

/* The final response's status. */
long lg_http_status(const lg_http_request *r) { return r->status; }

/* The final response's raw header lines, in r's buffer. */
const char *lg_http_head(const lg_http_request *r, size_t *len) {
  *len = r->head.p ? r->head.len - r->head.off : 0;
  return r->head.p ? r->head.p + r->head.off : "";
}

/* ------------------------------------------------------------ the body */

/* The unread body bytes, in r's buffer. */
const char *lg_http_peek(const lg_http_request *r, size_t *len) {
  *len = buf_unread(&r->in);
  return *len ? r->in.p + r->in.off : NULL;
}

/* Every buffered body byte is read (by the reader, or by the SSE parser,
 * which holds what it needs): frees the buffer (many streams at once must
 * not each keep the largest burst they saw), or, for a paused transfer,
 * keeps its room, resumes the transfer and pulls. */
static void drained(lg_http_request *r) {
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

/* The reader took every unread byte. */
void lg_http_take(lg_http_request *r) {
  r->delivered = 1;
  drained(r);
}

/* The reader's side of an lg_sse_feed that stops after one event. */
typedef struct {
  lg_http_request *r;
  uint64_t before; /* the parser's offset when the feed began */
  size_t off0;     /* r->in.off then */
  lg_http_event_fn fn;
  void *ud;
} one_feed;

/* SSE callback: marks the event's bytes read, hands it to the reader and
 * stops the feed: the bytes after it stay raw in r->in until asked for,
 * which is far smaller than the events as Lua tables. */
static int feed_one(void *ud, const lg_sse_event *ev) {
  one_feed *f = ud;
  lg_http_request *r = f->r;
  uint64_t off = lg_sse_offset(&r->sse);
  /* the parser is past the event: so are the unread bytes, before the
   * reader's call, which may unwind */
  r->in.off = f->off0 + (size_t)(off - f->before);
  f->fn(f->ud, ev, off);
  return 1;
}

/* Parses the unread bytes up to the end of the next complete event and
 * hands it over; returns 1, or 0 (nothing handed over) when the bytes end
 * before an event does (all consumed) or the parser failed: that ends the
 * request, reported once asked for. Either way an emptied buffer is taken
 * (freed, or the paused transfer resumed). */
static int parse_one(lg_http_request *r, lg_http_event_fn fn, void *ud) {
  size_t n = buf_unread(&r->in);
  one_feed f = {r, lg_sse_offset(&r->sse), r->in.off, fn, ud};
  int rc = lg_sse_feed(&r->sse, r->in.p + r->in.off, n, feed_one, &f);
  if (rc == 1) {
    if (buf_unread(&r->in) == 0) drained(r);
    return 1;
  }
  if (rc < 0) {
    char msg[160];
    snprintf(msg, sizeof msg, "SSE: %s at byte offset %llu", lg_sse_strerror(rc),
             (unsigned long long)lg_sse_error_offset(&r->sse));
    fail(r, LG_HTTP_PROTOCOL, NULL, msg);
    r->sse_failed = 1;
  }
  drained(r);
  return 0;
}

/* Hands the next complete SSE event to `fn`: 1, or 0 when none is buffered. */
int lg_http_next_event(lg_http_request *r, lg_http_event_fn fn, void *ud) {
  /* taking a drained buffer resumes a paused transfer, which can refill it
   * at once (curl hands over the bytes it held): look again before waiting */
  while (buf_unread(&r->in) > 0) {
    if (parse_one(r, fn, ud)) {
      r->delivered = 1;
      return 1;
    }
  }
  return 0;
}

/* The reader waits: its pull allowance starts over. */
void lg_http_wait(lg_http_request *r) { r->pulled = 0; }

/* ------------------------------------------------------------ its end */

/* Ends `r` as cancelled (its task was), without waking it. */
void lg_http_cancel(lg_http_request *r) {
  detach(r);
  if (r->state != R_CLOSED) r->state = R_DONE;
  r->own_fail = 1;
  r->fail_cause = LG_HTTP_CANCELLED;
  snprintf(r->fail_msg, sizeof r->fail_msg, "request cancelled");
}

/* Aborts the transfer and frees everything `r` owns; idempotent. */
void lg_http_close(lg_http_request *r) {
  if (r->state == R_CLOSED) return;
  if (r->client && !r->client->closed) detach(r);
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

/* True once `r` is closed. */
int lg_http_closed(const lg_http_request *r) { return r->state == R_CLOSED; }

/* True once the transfer ended and `r` is not closed. */
int lg_http_done(const lg_http_request *r) { return r->state == R_DONE; }

/* Fills *f with the facts of r's failure (strings in `r`, curl or *f). */
int lg_http_failure_get(const lg_http_request *r, lg_http_failure *f) {
  if (!failed(r)) return 0;
  memset(f, 0, sizeof *f);
  if (r->own_fail) {
    f->cause = r->fail_cause;
    f->message = r->fail_msg;
    f->which = r->fail_which;
    f->curl_message = "";
  } else {
    f->cause = LG_HTTP_CURL;
    f->curl_code = (int)r->result;
    f->curl_message = CURLFN(easy_strerror)(r->result);
    f->message = r->errbuf[0] ? r->errbuf : f->curl_message;
    if (r->os_errno != 0) {
      uv_err_name_r(uv_translate_sys_error((int)r->os_errno), f->errno_buf, sizeof f->errno_buf);
      f->errno_name = f->errno_buf;
    }
  }
  f->phase = phase_names[r->phase];
  f->bytes = r->received;
  f->delivered = r->delivered;
  f->status = r->status;
  f->sse_error = r->sse_failed;
  if (r->sse_failed) f->sse_offset = lg_sse_error_offset(&r->sse);
  return 1;
}

/* Fills *i with what `r` did so far. */
void lg_http_info_get(const lg_http_request *r, lg_http_info *i) {
  i->bytes = r->received;
  i->delivered = r->delivered;
  i->done = r->state == R_DONE || r->state == R_CLOSED;
  i->partial = r->sse_on && lg_sse_has_partial(&r->sse);
  i->paused = r->paused;
}
