/* Opens luagent.core: each area of the core registers its functions into
 * the module table. */
#include "core.h"

#include <lauxlib.h>

#include "backoff.h"
#include "guard.h"
#include "http.h"
#include "loop.h"
#include "sandbox.h"
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

int luaopen_luagent_core(lua_State *L) {
  lua_newtable(L);
  lua_pushliteral(L, LG_VERSION);
  lua_setfield(L, -2, "version");
  /* register area bindings */
  lg_backoff_register(L);
  lg_sse_register(L);
  lg_loop_register(L);
  lg_tcp_register(L);
  lg_http_register(L);
  lg_watch_register(L);
  lg_guard_register(L);
  lg_sandbox_register(L);
  return 1;
}
