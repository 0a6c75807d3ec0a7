/* TCP on the loop: listeners, accepted and outgoing connections, for the
 * mock provider and for specs' small test servers. Reads, writes, accepts
 * and connects suspend the calling task (lg_task_suspend) and are
 * cancellable; libuv callbacks only move bytes into C buffers and wake. */
#ifndef LG_TCP_H
#define LG_TCP_H

#include <lua.h>

/* Registers tcp_listen and tcp_connect into the table on the stack. */
void lg_tcp_register(lua_State *L);

#endif
