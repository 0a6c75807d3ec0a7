/* Error records made in C: the one owner of their shape, their metatable
 * ("luagent.Error", printing as "kind: message") and of the kinds C can
 * produce. Every kind here is in lua/luagent/base/errors.lua's closed list (a
 * spec checks it through core.error_kinds). */
#ifndef LG_ERRORS_H
#define LG_ERRORS_H

#include <lua.h>

/* The kinds C produces (their names are in core.error_kinds, in order). */
typedef enum {
  LG_ERR_CANCELLED, /* the task was cancelled */
  LG_ERR_TIMEOUT,   /* a timer of ours fired; the record says `which` */
  LG_ERR_PROTOCOL,  /* bytes our own parser refused (SSE) */
  LG_ERR_TRANSPORT, /* the transport failed; the record carries the facts */
  LG_ERR_REFUSED,   /* a TCP connect was refused */
  LG_ERR_RESET,     /* a TCP connection was reset */
  LG_ERR_DNS,       /* a host name did not resolve (Redis connects) */
  LG_ERR_EOF,       /* the other end is closed (a child's stdin) */
  LG_ERR_CIRCUIT_OPEN, /* a breaker refused a call; the record says `retry_at` */
  LG_ERR_PROCESS,   /* a child process could not be started */
  LG_ERR_USAGE,     /* bad input from a user (a path to watch) */
  LG_ERR_JOURNAL,   /* the run journal's database failed (sqlite) */
  LG_ERR_FS,        /* a file operation failed (luagent.fs); `path`, `op`, `reason`, `code` */
  LG_ERR_NKINDS
} lg_error_kind;

/* Pushes a new record {kind=, message=} with the shared metatable. */
void lg_error_push(lua_State *L, lg_error_kind kind, const char *message);

/* Pushes nil and a new record whose message is formatted as lua_pushfstring
 * does; returns 2, for `return lg_error_fail(L, kind, fmt, ...)` as the
 * `nil, err` of an operational failure. */
int lg_error_fail(lua_State *L, lg_error_kind kind, const char *fmt, ...);

/* Creates the metatable and sets core.error_metatable and core.error_kinds
 * (the list of names above) in the table on the stack. */
void lg_errors_register(lua_State *L);

#endif
