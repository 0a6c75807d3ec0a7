/* Bounds for running user Lua: wall time, memory and instructions per call,
 * and pattern functions that honour them (host/sandbox.c says why). */
#ifndef LG_SANDBOX_H
#define LG_SANDBOX_H

#include <lua.h>

/* Registers core.sandbox(opts), core.bounded_string and
 * core.bounded_table into the table on top of the stack. */
void lg_sandbox_register(lua_State *L);

/* Whether sandboxed code is running in L's state (a box is resumed). */
int lg_sandbox_running(lua_State *L);

#endif
