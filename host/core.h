/* The luagent.core module: one C core, opened by the executable (preloaded)
 * and by build/lua/luagent/core.so (for plain lua5.4 and Busted). */
#ifndef LG_CORE_H
#define LG_CORE_H

#include <lauxlib.h>
#include <lua.h>

#define LG_VERSION "0.1.0"

int luaopen_luagent_core(lua_State *L);

/* Creates the metatable `name` once: `methods` (may be NULL) as __index,
 * `close` (may be NULL) as __close, `gc` (may be NULL) as __gc. Bindings
 * pass one idempotent close function for both where they have one. */
void lg_class_new(lua_State *L, const char *name, const luaL_Reg *methods,
                  lua_CFunction close, lua_CFunction gc);

/* Ignores SIGPIPE unless the program chose a disposition for it. */
void lg_ignore_sigpipe(void);

#endif
