/* Redis on the loop (hiredis's async API through its libuv adapter): a
 * connection userdata whose connect and commands suspend the calling task,
 * each with a timeout. The endpoint state shared between hosts
 * (lua/luagent/model/endpoint/redis.lua) is its user. */
#ifndef LG_REDIS_H
#define LG_REDIS_H

#include <lua.h>

/* Registers redis_connect into the table on the stack. */
void lg_redis_register(lua_State *L);

#endif
