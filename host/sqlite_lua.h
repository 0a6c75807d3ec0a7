/* Lua binding of SQLite: core.sqlite_open and its handles (sqlite_lua.c). */
#ifndef LG_SQLITE_LUA_H
#define LG_SQLITE_LUA_H

#include <lua.h>

/* Registers sqlite_open and sqlite_version into the table on the stack. */
void lg_sqlite_register(lua_State *L);

#endif
