/* File watching on the loop (libuv fs events), for hot reload. */
#ifndef LG_WATCH_H
#define LG_WATCH_H

#include <lua.h>

/* Sets watch into the table on top of the stack. */
void lg_watch_register(lua_State *L);

#endif
