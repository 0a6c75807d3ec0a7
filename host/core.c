/* Opens luagent.core: each area of the core registers its functions into
 * the module table. */
#include "core.h"

#include <lauxlib.h>

#include "backoff.h"
#include "guard.h"
#include "http.h"
#include "loop.h"
#include "sse.h"
#include "tcp.h"
#include "watch.h"

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
  return 1;
}
