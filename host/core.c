/* Opens luagent.core: each area of the core registers its functions into
 * the module table. */
#include "core.h"

#include <curl/curl.h>
#include <lauxlib.h>
#include <uv.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include "backoff.h"
#include "guard.h"
#include "http.h"
#include "loop.h"
#include "process.h"
#include "sse.h"
#include "tcp.h"
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

/* Writing to a socket or pipe whose reader is gone raises SIGPIPE, whose
 * default action kills the process; libuv writes with plain write(), so the
 * signal is ignored (when nobody chose a disposition) and the write reports
 * EPIPE. Used by tcp.c and process.c. */
void lg_ignore_sigpipe(void) {
  struct sigaction sa;
  if (sigaction(SIGPIPE, NULL, &sa) != 0 || sa.sa_handler != SIG_DFL) return;
  sa.sa_handler = SIG_IGN;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;
  sigaction(SIGPIPE, &sa, NULL);
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
  /* the versions of the libraries this build runs with (not was built with) */
  lua_pushstring(L, curl_version_info(CURLVERSION_NOW)->version);
  lua_setfield(L, -2, "curl_version");
  lua_pushstring(L, uv_version_string());
  lua_setfield(L, -2, "uv_version");
  lua_pushliteral(L, LUA_RELEASE);
  lua_setfield(L, -2, "lua_release");
  lua_pushcfunction(L, l_wall);
  lua_setfield(L, -2, "wall");
  lua_pushcfunction(L, l_isatty);
  lua_setfield(L, -2, "isatty");
  /* register area bindings */
  lg_backoff_register(L);
  lg_sse_register(L);
  lg_loop_register(L);
  lg_tcp_register(L);
  lg_http_register(L);
  lg_watch_register(L);
  lg_process_register(L);
  lg_guard_register(L);
  return 1;
}
