/* HTTP client on the loop: libcurl's multi socket API driven by libuv, one
 * easy handle per request, the body held as raw bytes under a bound (the
 * transfer pauses past it) and cut into one SSE event per call. No Lua: the
 * binding (host/http_lua.c) embeds both structs below in its userdata,
 * suspends the task that waits and builds the Lua values and error records
 * from the facts this file reports. */
#ifndef LG_HTTP_H
#define LG_HTTP_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "curl_api.h"
#include "sse.h"
#include "timerheap.h"

typedef struct lg_loop lg_loop;

/* ------------------------------------------------------------ the client */

/* The multi handle of one loop: connections are reused across its requests.
 * Fields are private. The owner keeps its memory valid until every request
 * made on it is closed (http_lua.c: a userdata in the registry, which Lua
 * frees only after every finalizer ran). */
typedef struct {
  CURLM *multi;
  uv_timer_t *timer; /* curl's timer; malloc'd, freed in its close callback */
  lg_loop *loop;
  size_t held;       /* bytes allocated for the requests' body buffers */
  int closed;
} lg_http_client;

/* Opens `c` on `loop` (loading libcurl on the process's first request): 0,
 * or -1 with *err a static message, `c` then closed. */
int lg_http_client_open(lg_http_client *c, lg_loop *loop, const char **err);

/* Cleans up the multi handle (and so its sockets) and curl's timer; the
 * memory stays the owner's. Requests closed after it are only freed.
 * Idempotent. */
void lg_http_client_close(lg_http_client *c);

/* ----------------------------------------------------------- a request */

/* A growable byte buffer; its unread bytes are p[off, len). */
typedef struct {
  char *p;
  size_t off, len, cap;
} lg_http_buf;

/* The HTTP versions a request may ask for. */
enum {
  LG_HTTP_V2,          /* HTTP/2 over TLS when the server offers it, else 1.1 */
  LG_HTTP_V1_1,
  LG_HTTP_V2_PRIOR     /* HTTP/2 from the first byte, plain TCP too (h2c) */
};

/* What a request is made of; strings are copied (or read) by lg_http_init
 * and lg_http_start and may go away after. */
typedef struct {
  const char *url;
  const char *method;      /* NULL: GET, or POST when there is a body */
  const char *body;        /* NULL: none */
  size_t body_len;
  const char *ca_file;     /* NULL: curl's own CA bundle */
  int version;             /* LG_HTTP_V2 (0), LG_HTTP_V1_1 or LG_HTTP_V2_PRIOR */
  /* timeouts in seconds; <= 0 means none, except a given total (below) */
  double connect;          /* curl's, real time */
  double first_byte;       /* until the response headers (the loop's clock) */
  double idle;             /* the longest silence between body bytes */
  double total;            /* the whole request */
  int total_given;         /* a total <= 0 given (a deadline passed) fails at once */
  size_t max_line, max_event; /* SSE limits; 0: lg_sse's default */
  size_t max_buffer;       /* unread body bytes before the transfer pauses;
                            * 0: 64 KiB, 16 KiB once the client's requests
                            * hold 4 MiB in all (http.c's HIGH_WATER) */
  void (*wake)(void *arg); /* news for the reader (headers, body bytes, the
                            * end), from a loop callback or a call on the
                            * request; it must not call into the request */
  void *arg;
} lg_http_opts;

/* Why a request failed: its own failures, or one curl reported. */
enum { LG_HTTP_CURL, LG_HTTP_TIMEOUT, LG_HTTP_PROTOCOL, LG_HTTP_CANCELLED };

/* A request. Fields are private; the owner embeds it (the binding's
 * userdata) and must lg_http_close it. */
typedef struct {
  lg_http_client *client;
  CURL *easy;
  struct curl_slist *headers;
  char *body;
  void (*wake)(void *arg);
  void *arg;
  int state;            /* http.c's R_* */
  int in_multi;
  int paused;
  curl_socket_t fd;     /* the transfer's socket, as curl last watched it */
  size_t pulled;        /* body bytes pulled by the reader since it last waited */
  long status;
  lg_http_buf head;     /* raw header lines of the final response */
  lg_http_buf in;       /* body bytes not yet read */
  lg_sse sse;
  int sse_on;
  int sse_failed;       /* the parser failed (after the events before it) */
  uint64_t received;    /* body bytes received */
  int delivered;        /* some body byte or event reached the reader */
  int phase;            /* http.c's P_*: where the transfer was when it ended */
  /* outcome once done: a curl code, or our own failure */
  CURLcode result;
  long os_errno;
  int own_fail;         /* we ended it (timeout, protocol, cancel) */
  int fail_cause;       /* ... and this is why (LG_HTTP_*) */
  const char *fail_which; /* which timeout */
  char fail_msg[160];
  char errbuf[CURL_ERROR_SIZE];
  double idle_timeout;
  double body_at;       /* the loop's clock at the last body bytes (or resume) */
  size_t max_buffer;    /* pause the transfer past this many unread bytes */
  int bounded;          /* max_buffer was given; else the default bounds */
  lg_timer first_byte, idle, total;
  int resolving;        /* holds the virtual clock until connected (lg_loop_hold) */
  int outside;          /* the peer is not this loop's own server: real work */
} lg_http_request;

/* Initializes `r` (the caller's memory) on client `c` and creates its easy
 * handle: 0, or -1 when out of memory (`r` is then closed). A total timeout
 * given <= 0 ends `r` at once (timeout "total") before any transfer: the
 * caller sees lg_http_response() < 0 and need not start it. */
int lg_http_init(lg_http_request *r, lg_http_client *c, const lg_http_opts *o);

/* Adds a request header line "Name: value" before lg_http_start: 0, or -1
 * when out of memory. */
int lg_http_add_header(lg_http_request *r, const char *line);

/* Starts the transfer on the loop (the same `o` as lg_http_init): NULL, or
 * a static message when it could not start (`r` stays to be closed). */
const char *lg_http_start(lg_http_request *r, const lg_http_opts *o);

/* The response: 1 once the final response's headers are in, 0 while they
 * are awaited, -1 when `r` ended before them (lg_http_failure_get says why;
 * a clean end without a response is curl's "got nothing"). */
int lg_http_response(lg_http_request *r);

/* The final response's HTTP status (0 before it). */
long lg_http_status(const lg_http_request *r);

/* The raw header lines of the final response ("Name: value\r\n" each), in
 * `r`'s memory until it is closed; *len their length. */
const char *lg_http_head(const lg_http_request *r, size_t *len);

/* The body bytes not yet read, in `r`'s memory until the next call on it
 * (NULL when none); *len their count. */
const char *lg_http_peek(const lg_http_request *r, size_t *len);

/* The reader took every unread byte: frees the buffer (many streams at
 * once must not each keep the largest burst they saw) or, for a paused
 * transfer, resumes it and pulls what its socket holds. */
void lg_http_take(lg_http_request *r);

/* Called with each event lg_http_next_event cuts; `offset` is the stream
 * byte just past it. The event's pointers live during the call only. The
 * call may unwind (a Lua error): the event's bytes are read before it. */
typedef void (*lg_http_event_fn)(void *ud, const lg_sse_event *ev, uint64_t offset);

/* Cuts the next complete SSE event out of the unread bytes and hands it to
 * `fn`: 1, or 0 when no complete event is buffered (every byte consumed;
 * the reader waits unless `r` is done). A parser error ends `r` with a
 * protocol failure, reported once asked for. */
int lg_http_next_event(lg_http_request *r, lg_http_event_fn fn, void *ud);

/* The reader is about to wait on `r`: a new wake-up, whose pull allowance
 * starts over. */
void lg_http_wait(lg_http_request *r);

/* The waiting task was cancelled: ends `r` (the transfer aborted) with a
 * `cancelled` failure, without calling wake. */
void lg_http_cancel(lg_http_request *r);

/* Aborts the transfer if it runs and frees what `r` holds; idempotent. */
void lg_http_close(lg_http_request *r);

/* True once closed. */
int lg_http_closed(const lg_http_request *r);

/* True once the transfer ended (body complete or failed) and `r` is not
 * closed: what is still buffered can be read, then the end or the failure. */
int lg_http_done(const lg_http_request *r);

/* The facts of a failure (the binding makes the error record of them). */
typedef struct {
  int cause;                 /* LG_HTTP_CURL, or ours: TIMEOUT, PROTOCOL, CANCELLED */
  const char *message;       /* ours, or curl's error buffer or its code's text */
  const char *which;         /* the timeout ("first_byte", "idle", "total"), or NULL */
  int curl_code;             /* 0 for ours */
  const char *curl_message;  /* curl's text of its code; "" for ours */
  const char *errno_name;    /* the socket's errno by name ("ECONNRESET"), or NULL */
  const char *phase;         /* "connect", "headers" or "body" */
  uint64_t bytes;            /* body bytes received */
  int delivered;             /* some body byte or event reached the reader */
  long status;               /* the HTTP status once known, else 0 */
  int sse_error;             /* the SSE parser failed ... */
  uint64_t sse_offset;       /* ... at this byte of the stream */
  char errno_buf[64];
} lg_http_failure;

/* 1 and *f filled (its strings in `r` or in *f, valid while both are) when
 * `r` ended in failure, else 0. */
int lg_http_failure_get(const lg_http_request *r, lg_http_failure *f);

/* What a request did so far. */
typedef struct {
  uint64_t bytes;   /* body bytes received */
  int delivered;    /* some body byte or event reached the reader */
  int done;         /* the transfer ended (or `r` is closed) */
  int partial;      /* the SSE parser holds an undispatched line or event */
  int paused;       /* the transfer waits for the reader (max_buffer) */
} lg_http_info;

void lg_http_info_get(const lg_http_request *r, lg_http_info *i);

/* The Lua binding (host/http_lua.c): sets http_request into the table on
 * top of the stack. Declared with a forward type so this header stays pure. */
struct lua_State;
void lg_http_register(struct lua_State *L);

#endif
