/* HTTP client on the loop (libcurl multi socket API driven by libuv). */
#ifndef LG_HTTP_H
#define LG_HTTP_H

#include <lua.h>

/* Sets http_request into the table on top of the stack. */
void lg_http_register(lua_State *L);

#endif
