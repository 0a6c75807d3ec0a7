/* Opens luagent.core: each area of the core registers its functions into
 * the module table. */
#include "core.h"

#include <lauxlib.h>
#include <uv.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backoff.h"
#include "chunk.h"
#include "curl_api.h"
#include "errors.h"
#include "fs.h"
#include "guard.h"
#include "http.h"
#include "ids.h"
#include "jsonw.h"
#include "line_lua.h"
#include "loop.h"
#include "process.h"
#include "readfile.h"
#include "sandbox.h"
#include "scrub.h"
#include "sqlite_lua.h"
#include "redis.h"
#include "sse.h"
#include "tcp.h"
#include "termtext.h"
#include "timetext.h"
#include "watch.h"

void lg_class_new(lua_State *L, const char *name, const luaL_Reg *methods,
                  lua_CFunction close, lua_CFunction gc) {
  if (luaL_newmetatable(L, name)) {
    if (methods) {
      lua_newtable(L);
      luaL_setfuncs(L, methods, 0);
      lua_setfield(L, -2, "__index");
    }
    if (close) {
      lua_pushcfunction(L, close);
      lua_setfield(L, -2, "__close");
    }
    if (gc) {
      lua_pushcfunction(L, gc);
      lua_setfield(L, -2, "__gc");
    }
  }
  lua_pop(L, 1);
}

/* SIGPIPE: a write to a socket or a child's pipe whose reader left must fail
 * with EPIPE (libuv writes with plain write(), and the default action kills
 * the process), but a write to stdout or stderr whose reader left must end
 * the process, as it ends any Unix tool (`luagent run x.lua | head -c 10`).
 * The handler tells them apart: a pipe whose reader is gone polls POLLERR.
 * Only poll, signal and raise are called here, all async-signal-safe. */
static void on_sigpipe(int sig) {
  struct pollfd fds[2] = {{.fd = 1, .events = POLLOUT}, {.fd = 2, .events = POLLOUT}};
  if (poll(fds, 2, 0) > 0 && ((fds[0].revents | fds[1].revents) & POLLERR)) {
    signal(sig, SIG_DFL);
    raise(sig); /* pending until this handler returns, then fatal */
  }
}

/* Installs on_sigpipe when nobody chose a disposition for SIGPIPE. Used by
 * tcp.c and process.c. */
void lg_ignore_sigpipe(void) {
  struct sigaction sa;
  if (sigaction(SIGPIPE, NULL, &sa) != 0 || sa.sa_handler != SIG_DFL) return;
  sa.sa_handler = on_sigpipe;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGPIPE, &sa, NULL);
}

/* __index of the core table: core.curl_version, the version of the
 * libcurl this process loads (loading it on first use). Other missing
 * fields are nil. */
static int lazy_field(lua_State *L) {
  const char *k = lua_tostring(L, 2);
  if (!k || strcmp(k, "curl_version") != 0) return 0;
  const char *err;
  const lg_curl_api *api = lg_curl_load(&err);
  if (!api) return luaL_error(L, "core.curl_version: %s", err);
  lua_pushstring(L, api->version_info(CURLVERSION_NOW)->version);
  return 1;
}

/* wall() -> seconds since the Unix epoch (real time, with fractions): for
 * timestamps that leave the process (log lines, trace spans), never for
 * measuring; durations come from now(), the loop's clock. */
static int l_wall(lua_State *L) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  lua_pushnumber(L, (lua_Number)ts.tv_sec + (lua_Number)ts.tv_nsec / 1e9);
  return 1;
}

/* isatty(fd) -> whether the descriptor is a terminal (log format, colour). */
static int l_isatty(lua_State *L) {
  lua_pushboolean(L, isatty((int)luaL_checkinteger(L, 1)) == 1);
  return 1;
}

int luaopen_luagent_core(lua_State *L) {
  lua_newtable(L);
  lua_pushliteral(L, LG_VERSION);
  lua_setfield(L, -2, "version");
  /* the versions of the libraries this build runs with (not was built
   * with); curl_version loads libcurl, so only when asked (lazy_field) */
  lua_createtable(L, 0, 1);
  lua_pushcfunction(L, lazy_field);
  lua_setfield(L, -2, "__index");
  lua_setmetatable(L, -2);
  lua_pushstring(L, uv_version_string());
  lua_setfield(L, -2, "uv_version");
  lua_pushliteral(L, LUA_RELEASE);
  lua_setfield(L, -2, "lua_release");
  lua_pushcfunction(L, l_wall);
  lua_setfield(L, -2, "wall");
  lua_pushcfunction(L, l_isatty);
  lua_setfield(L, -2, "isatty");
  /* register area bindings */
  lg_errors_register(L);
  lg_backoff_register(L);
  lg_sse_register(L);
  lg_chunk_register(L);
  lg_jsonw_register(L);
  lg_ids_register(L);
  lg_timetext_register(L);
  lg_termtext_register(L);
  lg_scrub_register(L);
  lg_loop_register(L);
  lg_tcp_register(L);
  lg_http_register(L);
  lg_watch_register(L);
  lg_readfile_register(L);
  lg_fs_register(L);
  lg_process_register(L);
  lg_guard_register(L);
  lg_sandbox_register(L);
  lg_sqlite_register(L);
  lg_redis_register(L);
  lg_line_register(L);
  return 1;
}
