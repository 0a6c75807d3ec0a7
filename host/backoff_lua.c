/* Lua binding of the retry arithmetic (backoff.h):
 *   core.backoff_delay(strategy, n, [params], u_or_rng, [prev]) -> seconds
 *   core.backoff_rng(seed) -> "luagent.Rng" with :next() -> [0, 1)
 *   core.backoff_server_wait(asked, [params], u_or_rng)
 *       -> seconds | nil, "backoff" | nil, "give_up"
 *   core.parse_retry_after(headers, [now]) -> seconds | nil
 * Wrong argument types raise; nothing here fails at run time. */
#include "backoff.h"
#include "core.h"

#include <lauxlib.h>
#include <lua.h>
#include <limits.h>
#include <math.h>
#include <string.h>
#include <time.h>

#define RNG_MT "luagent.Rng"

/* ---- Arguments ----------------------------------------------------------- */

/* U from argument `arg`: a number in [0, 1], or the next draw of an Rng. */
static double check_u(lua_State *L, int arg) {
  lg_backoff_rng *r = luaL_testudata(L, arg, RNG_MT);
  if (r) return lg_backoff_rng_next(r);
  if (lua_type(L, arg) == LUA_TNUMBER) {
    double u = lua_tonumber(L, arg);
    if (u >= 0 && u <= 1) return u;
  }
  return luaL_argerror(L, arg, "expected a number in [0, 1] or a luagent.Rng");
}

/* params[name] as a finite number >= 0, or `dflt` when params or the field is
 * absent. `fn` names the Lua function in errors. */
static double opt_field(lua_State *L, int params, const char *fn,
                        const char *name, double dflt) {
  double v = dflt;
  if (params && lua_getfield(L, params, name) != LUA_TNIL) {
    int isnum;
    v = lua_tonumberx(L, -1, &isnum);
    if (!isnum || !(v >= 0) || isinf(v))
      luaL_error(L, "%s: params.%s must be a finite number >= 0", fn, name);
  }
  if (params) lua_pop(L, 1);
  return v;
}

/* params.max_wait: nil or false mean no limit (INFINITY); else a number >= 0
 * (math.huge allowed). */
static double opt_max_wait(lua_State *L, int params, const char *fn) {
  double v = INFINITY;
  int t = lua_getfield(L, params, "max_wait");
  if (t != LUA_TNIL && !(t == LUA_TBOOLEAN && !lua_toboolean(L, -1))) {
    int isnum;
    v = lua_tonumberx(L, -1, &isnum);
    if (!isnum || !(v >= 0))
      luaL_error(L, "%s: params.max_wait must be a number >= 0 or false", fn);
  }
  lua_pop(L, 1);
  return v;
}

/* Index in `names` of the string params[name]; 0 (the first) when absent. */
static int opt_option(lua_State *L, int params, const char *fn,
                      const char *name, const char *const names[]) {
  int i = 0;
  if (lua_getfield(L, params, name) != LUA_TNIL) {
    const char *v = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : "";
    while (names[i] && strcmp(v, names[i]) != 0) i++;
    if (!names[i]) luaL_error(L, "%s: params.%s: invalid value '%s'", fn, name, v);
  }
  lua_pop(L, 1);
  return i;
}

/* Index of the optional params table at `arg`, or 0 when it is nil/absent. */
static int opt_params(lua_State *L, int arg) {
  if (lua_isnoneornil(L, arg)) return 0;
  luaL_checktype(L, arg, LUA_TTABLE);
  return arg;
}

/* ---- backoff_delay ------------------------------------------------------- */

/* backoff_delay(strategy, n, [params], u_or_rng, [prev]): the delay before
 * retry n. params: base (1), max (30), multiplier (2), jitter (0). prev: the
 * previous delay, for "decorrelated_jitter". */
static int l_backoff_delay(lua_State *L) {
  static const char fn[] = "backoff_delay";
  lg_backoff_params p;
  p.strategy = (lg_backoff_strategy)luaL_checkoption(L, 1, NULL, lg_backoff_names);
  lua_Integer n = luaL_checkinteger(L, 2);
  luaL_argcheck(L, n >= 1, 2, "retry number must be >= 1");
  int params = opt_params(L, 3);
  p.base = opt_field(L, params, fn, "base", 1);
  p.max = opt_field(L, params, fn, "max", 30);
  p.multiplier = opt_field(L, params, fn, "multiplier", 2);
  p.jitter = opt_field(L, params, fn, "jitter", 0);
  double u = check_u(L, 4);
  double prev = luaL_optnumber(L, 5, 0);
  lua_pushnumber(L, lg_backoff_delay(&p, n > INT_MAX ? INT_MAX : (int)n, prev, u));
  return 1;
}

/* ---- backoff_server_wait ------------------------------------------------- */

/* backoff_server_wait(asked, [params], u_or_rng): the wait when a server asks
 * for `asked` seconds. params: max_wait (nil or false: no limit), jitter (0),
 * over_max ("give_up" | "cap" | "backoff"). */
static int l_backoff_server_wait(lua_State *L) {
  static const char fn[] = "backoff_server_wait";
  static const char *const over_max[] = {"give_up", "cap", "backoff", NULL};
  lg_backoff_server_params p = {INFINITY, 0, LG_OVER_MAX_GIVE_UP};
  double asked = luaL_checknumber(L, 1);
  int params = opt_params(L, 2);
  if (params) {
    p.max_wait = opt_max_wait(L, params, fn);
    p.jitter = opt_field(L, params, fn, "jitter", 0);
    p.over_max = (lg_backoff_over_max)opt_option(L, params, fn, "over_max", over_max);
  }
  double wait = 0;
  switch (lg_backoff_server_wait(&p, asked, check_u(L, 3), &wait)) {
  case LG_WAIT_USE:
    lua_pushnumber(L, wait);
    return 1;
  case LG_WAIT_BACKOFF:
    lua_pushnil(L);
    lua_pushliteral(L, "backoff");
    return 2;
  default:
    lua_pushnil(L);
    lua_pushliteral(L, "give_up");
    return 2;
  }
}

/* ---- parse_retry_after --------------------------------------------------- */

/* headers[name] when it is a string, else NULL. Leaves the stack as it was;
 * the string stays valid because the headers table holds it. */
static const char *header(lua_State *L, int headers, const char *name) {
  const char *v = NULL;
  if (lua_getfield(L, headers, name) == LUA_TSTRING) v = lua_tostring(L, -1);
  lua_pop(L, 1);
  return v;
}

/* parse_retry_after(headers, [now]): the server's requested wait in seconds
 * from headers["retry-after-ms"] / headers["retry-after"] (lowercase names),
 * or nil. `now` (epoch seconds, default the wall clock) anchors HTTP-dates. */
static int l_parse_retry_after(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  double now = luaL_optnumber(L, 2, (double)time(NULL));
  double wait;
  if (lg_backoff_retry_after(header(L, 1, "retry-after-ms"),
                             header(L, 1, "retry-after"), now, &wait))
    lua_pushnumber(L, wait);
  else
    lua_pushnil(L);
  return 1;
}

/* ---- Rng ----------------------------------------------------------------- */

/* backoff_rng(seed): a generator; the same integer seed, the same sequence. */
static int l_backoff_rng(lua_State *L) {
  lua_Integer seed = luaL_checkinteger(L, 1);
  lg_backoff_rng *r = lua_newuserdatauv(L, sizeof *r, 0);
  lg_backoff_rng_seed(r, (uint64_t)seed);
  luaL_setmetatable(L, RNG_MT);
  return 1;
}

/* rng:next() -> a number in [0, 1). */
static int l_rng_next(lua_State *L) {
  lg_backoff_rng *r = luaL_checkudata(L, 1, RNG_MT);
  lua_pushnumber(L, lg_backoff_rng_next(r));
  return 1;
}

static const luaL_Reg rng_methods[] = {
    {"next", l_rng_next},
    {NULL, NULL},
};

static const luaL_Reg backoff_funcs[] = {
    {"backoff_delay", l_backoff_delay},
    {"backoff_rng", l_backoff_rng},
    {"backoff_server_wait", l_backoff_server_wait},
    {"parse_retry_after", l_parse_retry_after},
    {NULL, NULL},
};

/* Creates the Rng metatable and sets the functions in the table on top. */
void lg_backoff_register(lua_State *L) {
  lg_class_new(L, RNG_MT, rng_methods, NULL, NULL);
  luaL_setfuncs(L, backoff_funcs, 0);
}
