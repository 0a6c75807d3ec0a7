/* Incremental Server-Sent Events parser (WHATWG "event stream" rules). Pure
 * C: no Lua, no libuv. Input may be split anywhere; feeding byte by byte
 * yields exactly the events of one big feed. Memory is bounded by the line
 * and event limits: exceeding one is a sticky error with its byte offset. */
#ifndef LG_SSE_H
#define LG_SSE_H

#include <stddef.h>
#include <stdint.h>

#define LG_SSE_DEFAULT_MAX ((size_t)8 << 20) /* 8 MiB line / event data */

/* Parser error codes (negative; callbacks stop a feed with positive values). */
enum {
  LG_SSE_OK = 0,
  LG_SSE_ELINE = -1,  /* a line is longer than max_line bytes */
  LG_SSE_EEVENT = -2, /* an event's data is longer than max_event bytes */
  LG_SSE_ENOMEM = -3  /* allocation failed */
};

/* One dispatched event. Pointers are valid only during the callback and are
 * never NULL; strings are not NUL-terminated. */
typedef struct {
  const char *type; size_t type_len; /* "message" when no event field */
  const char *data; size_t data_len; /* data lines joined with "\n" */
  const char *id; size_t id_len;     /* last event id (persists) */
  int has_id;                        /* 0 when the last event id is empty */
  long long retry;                   /* retry field since the last event, -1 none */
} lg_sse_event;

/* Called per event; a nonzero (positive) return stops the feed and is
 * returned by lg_sse_feed. It must not feed or free the same parser. */
typedef int (*lg_sse_event_fn)(void *ud, const lg_sse_event *ev);

/* A growable byte buffer, reused across lines and events. */
typedef struct { char *p; size_t len, cap; } lg_sse_buf;

/* The parser. Fields are private; embed it anywhere (no allocation until
 * bytes arrive). */
typedef struct {
  lg_sse_buf line, data, type, id; /* partial line, event data, type, last id */
  size_t max_line, max_event;
  uint64_t offset;   /* stream bytes consumed so far */
  uint64_t line_off; /* stream offset of the current line's first byte */
  uint64_t err_off;  /* offset of the offending byte once in error */
  long long retry;   /* retry field not yet delivered with an event, -1 none */
  int err;           /* sticky error code, 0 while healthy */
  unsigned char bom;      /* BOM bytes matched; 3 once the BOM check is over */
  unsigned char skip_lf;  /* a line ended in CR: skip one LF that follows */
  unsigned char has_data; /* a data field arrived since the last dispatch */
  unsigned char in_event; /* a field line arrived since the last blank line */
} lg_sse;

/* Initializes `p`; a limit of 0 means LG_SSE_DEFAULT_MAX. */
void lg_sse_init(lg_sse *p, size_t max_line, size_t max_event);
/* Parses `len` bytes, calling `cb` (may be NULL) per event. Returns 0 when
 * all bytes were consumed, a negative LG_SSE_E* code (then every later feed
 * returns it too), or the callback's nonzero value: then the bytes after the
 * dispatching blank line were not consumed (see lg_sse_offset) and may be fed
 * again. */
int lg_sse_feed(lg_sse *p, const char *buf, size_t len, lg_sse_event_fn cb,
                void *ud);
/* True when bytes of an undispatched line or event are buffered: a stream
 * that ends now was truncated. */
int lg_sse_has_partial(const lg_sse *p);
/* Stream bytes consumed so far. */
uint64_t lg_sse_offset(const lg_sse *p);
/* Offset of the offending byte (bytes fed before it), once in error. */
uint64_t lg_sse_error_offset(const lg_sse *p);
/* A static message for an LG_SSE_E* code. */
const char *lg_sse_strerror(int code);
/* Frees the buffers; `p` must be initialized again before reuse. */
void lg_sse_free(lg_sse *p);

/* The Lua binding (host/sse_lua.c): sets sse_parser into the table on top of
 * the stack. Declared here with a forward type so this header stays pure. */
struct lua_State;
void lg_sse_register(struct lua_State *L);
/* Pushes `ev` as a Lua table {event=, data=, id=, retry=} (sse_lua.c). */
void lg_sse_push_event(struct lua_State *L, const lg_sse_event *ev);
/* Sets those fields of the table at index t (id, retry nil when absent). */
void lg_sse_fill_event(struct lua_State *L, int t, const lg_sse_event *ev);

#endif
