/* Error records made in C: every binding pushes its operational failures
 * through lg_error_push, so they share one shape and one metatable. Lua's
 * records (lua/luagent/base/errors.lua) use the same metatable. */
#include "errors.h"

#include <lauxlib.h>
#include <stdarg.h>

#define ERROR_MT "luagent.Error"

static const char *const kind_names[LG_ERR_NKINDS] = {
    [LG_ERR_CANCELLED] = "cancelled", [LG_ERR_TIMEOUT] = "timeout",
    [LG_ERR_PROTOCOL] = "protocol",   [LG_ERR_TRANSPORT] = "transport",
    [LG_ERR_REFUSED] = "refused",     [LG_ERR_RESET] = "reset",
    [LG_ERR_DNS] = "dns",
    [LG_ERR_EOF] = "eof",
    [LG_ERR_CIRCUIT_OPEN] = "circuit_open",
    [LG_ERR_PROCESS] = "process",     [LG_ERR_USAGE] = "usage",
    [LG_ERR_JOURNAL] = "journal",
    [LG_ERR_FS] = "fs",
};

int lg_error_fail(lua_State *L, lg_error_kind kind, const char *fmt, ...) {
  lua_pushnil(L);
  va_list ap;
  va_start(ap, fmt);
  const char *msg = lua_pushvfstring(L, fmt, ap);
  va_end(ap);
  lg_error_push(L, kind, msg);
  lua_remove(L, -2); /* the message: the record holds it */
  return 2;
}

/* Pushes a new record; the caller owns it (a plain table). */
void lg_error_push(lua_State *L, lg_error_kind kind, const char *message) {
  lua_createtable(L, 0, 4);
  lua_pushstring(L, kind_names[kind]);
  lua_setfield(L, -2, "kind");
  lua_pushstring(L, message);
  lua_setfield(L, -2, "message");
  luaL_setmetatable(L, ERROR_MT);
}

/* __tostring of error records: "kind: message" (either printed as
 * tostring() would: a record is a plain table anyone can fill). */
static int l_error_tostring(lua_State *L) {
  lua_getfield(L, 1, "kind");
  lua_getfield(L, 1, "message");
  luaL_tolstring(L, 2, NULL);
  lua_pushliteral(L, ": ");
  luaL_tolstring(L, 3, NULL);
  lua_concat(L, 3);
  return 1;
}

/* Sets core.error_metatable and core.error_kinds in the table on the stack. */
void lg_errors_register(lua_State *L) {
  if (luaL_newmetatable(L, ERROR_MT)) { /* also sets __name */
    lua_pushcfunction(L, l_error_tostring);
    lua_setfield(L, -2, "__tostring");
  }
  lua_setfield(L, -2, "error_metatable");
  lua_createtable(L, LG_ERR_NKINDS, 0);
  for (int i = 0; i < LG_ERR_NKINDS; i++) {
    lua_pushstring(L, kind_names[i]);
    lua_rawseti(L, -2, i + 1);
  }
  lua_setfield(L, -2, "error_kinds");
}
