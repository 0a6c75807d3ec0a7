/* Bounds for running user Lua: wall time, memory and instructions, and
 * pattern functions that honour them (host/sandbox.c says why). */
#ifndef LG_SANDBOX_H
#define LG_SANDBOX_H

#include <lua.h>

/* Registers core.sandbox(opts), core.sandbox_running(), core.bounded_string
 * and core.bounded_table into the table on top of the stack. */
void lg_sandbox_register(lua_State *L);

/* Whether sandboxed code is running in L's state (a box is armed). */
int lg_sandbox_running(lua_State *L);

/* Removes a box's count hook from co, which inherited it (lua_newthread)
 * or keeps it, and runs under no box from now on (a daemon, a task taken
 * out of its box). Not for a coroutine a box runs. */
void lg_sandbox_unhook(lua_State *co);

/* Whether the value at idx is a box (core.sandbox). */
int lg_sandbox_is_box(lua_State *L, int idx);

/* Arms the box at idx for one resume of co (host/loop.c resumes a task
 * under its box so): its allocator, hook and bounded functions hold until
 * lg_sandbox_disarm, which the caller must call before anything else runs.
 * 0, or -1 when that box is armed already. */
int lg_sandbox_arm(lua_State *L, int idx, lua_State *co);
void lg_sandbox_disarm(lua_State *L, int idx);

/* Whether the box at idx was stopped (for good); lg_sandbox_raise raises
 * its stop message in L. */
int lg_sandbox_stopped(lua_State *L, int idx);
int lg_sandbox_raise(lua_State *L, int idx);

#endif
