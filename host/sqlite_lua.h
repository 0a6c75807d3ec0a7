/* Lua binding of SQLite: core.sqlite_open and its handles (sqlite_lua.c). */
#ifndef LG_SQLITE_LUA_H
#define LG_SQLITE_LUA_H

#include <lua.h>

/* Registers sqlite_open, sqlite_writer and sqlite_version into the table
 * on the stack. */
void lg_sqlite_register(lua_State *L);
/* The writer off the loop (sqlite_writer.c); called by lg_sqlite_register. */
void lg_sqlite_writer_register(lua_State *L);
/* Pushes nil and a "journal" error record ("<file>: <what>: <msg>" with
 * file, code, code_name, corrupt); returns 2. */
int lg_sqlite_push_fail(lua_State *L, const char *file, const char *what, int code, const char *msg);
/* opts.busy_ms of the options table at index `opts` (may be nil): how long
 * to wait for another connection's lock, default 5000; raises naming fn. */
int lg_sqlite_busy_ms(lua_State *L, int opts, const char *fn);

#endif
