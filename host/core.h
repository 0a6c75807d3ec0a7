/* The luagent.core module: one C core, opened by the executable (preloaded)
 * and by build/lua/luagent/core.so (for plain lua5.4 and Busted). */
#ifndef LG_CORE_H
#define LG_CORE_H

#include <lua.h>

#define LG_VERSION "0.1.0"

int luaopen_luagent_core(lua_State *L);

#endif
