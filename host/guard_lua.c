/* Lua binding of the circuit breaker and the retry budget:
 *   core.breaker{consecutive=5, ratio=0.5, window=20, min_calls=10,
 *                open_for=5, open_max=60, growth=2, probe_timeout=30}
 *       -> "luagent.Breaker"
 *     b:allow(now)  -> "allow" | "probe", nil, "half_open" | nil, or when
 *                      refused nil, err (kind circuit_open, err.retry_at)
 *     b:record(now, ok, was_probe) -> "open" | "half_open" | "close" | nil
 *     b:release()   -- the probe ended with nothing learned: free its slot
 *     b:state(now)  -> "closed" | "open" | "half_open", {failures=,
 *                      consecutive=, calls=, trips=, open_until=, probe_out=}
 *     b:config()    -> the whole config in force (the fields above)
 *   core.retry_budget{max=10, ratio=0.1} -> "luagent.RetryBudget"
 *     r:allow_retry() -> bool     r:failure() -> bool (retries just stopped)
 *     r:success() -> bool (retries just resumed)   r:tokens() -> tokens, max
 * A bad config value raises, naming the field; so do wrong argument types.
 * Nothing here fails at run time. The userdata hold no resources (no __gc). */
#include "core.h"
#include "errors.h"
#include "guard.h"

#include "breaker.h"
#include "budget.h"

#include <lauxlib.h>
#include <lua.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>

#define BREAKER_MT "luagent.Breaker"
#define BUDGET_MT "luagent.RetryBudget"

/* ======================================================================== */
/* Config tables                                                            */
/* ======================================================================== */

/* Raises "<fn>: unknown config field 'x'" for any key of the table at `t`
 * not in `names` (a misspelt field would otherwise be silently ignored). */
static void check_fields(lua_State *L, int t, const char *fn,
                         const char *const names[]) {
  lua_pushnil(L);
  while (lua_next(L, t)) {
    int i = 0;
    lua_pop(L, 1);
    if (lua_type(L, -1) == LUA_TSTRING)
      while (names[i] && strcmp(lua_tostring(L, -1), names[i]) != 0) i++;
    if (lua_type(L, -1) != LUA_TSTRING || !names[i])
      luaL_error(L, "%s: unknown config field '%s'", fn, luaL_tolstring(L, -1, NULL));
  }
}

/* t[name] as a number into *v when present; 1 when it was. */
static int opt_number(lua_State *L, int t, const char *fn, const char *name, double *v) {
  int present = 0;
  if (t && lua_getfield(L, t, name) != LUA_TNIL) {
    int isnum;
    *v = lua_tonumberx(L, -1, &isnum);
    if (!isnum) luaL_error(L, "%s: config.%s must be a number", fn, name);
    present = 1;
  }
  if (t) lua_pop(L, 1);
  return present;
}

/* t[name] as an int into *v when present; 1 when it was. */
static int opt_int(lua_State *L, int t, const char *fn, const char *name, int *v) {
  int present = 0;
  if (t && lua_getfield(L, t, name) != LUA_TNIL) {
    int isint;
    lua_Integer i = lua_tointegerx(L, -1, &isint);
    if (!isint || i < INT_MIN || i > INT_MAX)
      luaL_error(L, "%s: config.%s must be an integer", fn, name);
    *v = (int)i;
    present = 1;
  }
  if (t) lua_pop(L, 1);
  return present;
}

/* Index of the optional config table at `arg`, 0 when nil or absent. */
static int opt_config(lua_State *L, int arg, const char *fn,
                      const char *const names[]) {
  if (lua_isnoneornil(L, arg)) return 0;
  luaL_checktype(L, arg, LUA_TTABLE);
  check_fields(L, arg, fn, names);
  return arg;
}

/* `now` at `arg`: any number but NaN. */
static double check_now(lua_State *L, int arg) {
  double now = luaL_checknumber(L, arg);
  luaL_argcheck(L, now == now, arg, "now is NaN");
  return now;
}

/* ======================================================================== */
/* Breaker                                                                  */
/* ======================================================================== */

/* core.breaker([config]): a closed breaker. Unset fields take the defaults
 * of breaker.h, completed by lg_breaker_complete (min_calls min(10,
 * window), open_max max(60, open_for), the ratio rule sized by a lone
 * consecutive), so setting one field alone stays valid. */
static int l_breaker(lua_State *L) {
  static const char fn[] = "breaker";
  static const char *const names[] = {"consecutive", "ratio",    "window",
                                      "min_calls",   "open_for", "open_max",
                                      "growth",      "probe_timeout", NULL};
  lg_breaker_config c;
  lg_breaker_defaults(&c);
  int t = opt_config(L, 1, fn, names);
  unsigned gave = 0;
  if (opt_int(L, t, fn, "consecutive", &c.consecutive)) gave |= LG_BREAKER_GAVE_CONSECUTIVE;
  if (opt_number(L, t, fn, "ratio", &c.ratio)) gave |= LG_BREAKER_GAVE_RATIO;
  if (opt_int(L, t, fn, "window", &c.window)) gave |= LG_BREAKER_GAVE_WINDOW;
  if (opt_int(L, t, fn, "min_calls", &c.min_calls)) gave |= LG_BREAKER_GAVE_MIN_CALLS;
  opt_number(L, t, fn, "open_for", &c.open_for);
  if (opt_number(L, t, fn, "open_max", &c.open_max)) gave |= LG_BREAKER_GAVE_OPEN_MAX;
  opt_number(L, t, fn, "growth", &c.growth);
  opt_number(L, t, fn, "probe_timeout", &c.probe_timeout);
  lg_breaker_complete(&c, gave);
  const char *bad = lg_breaker_check(&c);
  if (bad) return luaL_error(L, "%s: config.%s", fn, bad);
  lg_breaker *b = lua_newuserdatauv(L, sizeof *b, 0);
  lg_breaker_init(b, &c);
  luaL_setmetatable(L, BREAKER_MT);
  return 1;
}

static const char *const transition_names[] = {NULL, "open", "half_open", "close"};

/* Pushes a transition's name, or nil for none. */
static void push_transition(lua_State *L, lg_breaker_transition tr) {
  if (transition_names[tr])
    lua_pushstring(L, transition_names[tr]);
  else
    lua_pushnil(L);
}

/* b:allow(now): "allow"; "probe", nil, "half_open"|nil (the transition this
 * call observed); or false, retry_at (when the next probe is due). */
static int l_breaker_allow(lua_State *L) {
  lg_breaker *b = luaL_checkudata(L, 1, BREAKER_MT);
  double retry_at = 0;
  lg_breaker_transition moved;
  lg_breaker_verdict v = lg_breaker_allow(b, check_now(L, 2), &retry_at, &moved);
  if (v == LG_ALLOW) {
    lua_pushliteral(L, "allow");
    return 1;
  }
  if (v == LG_ALLOW_PROBE) {
    lua_pushliteral(L, "probe");
    lua_pushnil(L);
    push_transition(L, moved);
    return 3;
  }
  /* refused: nil and a record, as every luagent refusal */
  lua_pushnil(L);
  char msg[96];
  snprintf(msg, sizeof msg, "circuit open: next probe due at %.3f", retry_at);
  lg_error_push(L, LG_ERR_CIRCUIT_OPEN, msg);
  lua_pushnumber(L, retry_at);
  lua_setfield(L, -2, "retry_at");
  return 2;
}

/* b:record(now, ok, was_probe): the transition it caused, or nil. */
static int l_breaker_record(lua_State *L) {
  lg_breaker *b = luaL_checkudata(L, 1, BREAKER_MT);
  double now = check_now(L, 2);
  luaL_checkany(L, 3);
  push_transition(L, lg_breaker_record(b, now, lua_toboolean(L, 3), lua_toboolean(L, 4)));
  return 1;
}

/* b:release(): the probe's call ended with nothing learned. */
static int l_breaker_release(lua_State *L) {
  lg_breaker_release(luaL_checkudata(L, 1, BREAKER_MT));
  return 0;
}

/* b:state(now): the state's name and a fresh table of counts (the caller
 * owns it). open_until is nil while closed. */
static int l_breaker_state(lua_State *L) {
  const lg_breaker *b = luaL_checkudata(L, 1, BREAKER_MT);
  lg_breaker_state_t s = lg_breaker_state(b, check_now(L, 2));
  lua_pushstring(L, lg_breaker_state_name(s));
  lua_createtable(L, 0, 6);
  lua_pushinteger(L, b->failures);
  lua_setfield(L, -2, "failures");
  lua_pushinteger(L, b->consecutive);
  lua_setfield(L, -2, "consecutive");
  lua_pushinteger(L, b->calls);
  lua_setfield(L, -2, "calls");
  lua_pushinteger(L, b->trips);
  lua_setfield(L, -2, "trips");
  if (s != LG_BREAKER_CLOSED) {
    lua_pushnumber(L, b->open_until);
    lua_setfield(L, -2, "open_until");
  }
  lua_pushboolean(L, s == LG_BREAKER_HALF_OPEN && b->probe_out);
  lua_setfield(L, -2, "probe_out");
  return 2;
}

/* b:config(): the whole config in force, defaults included, as a fresh
 * table (the Redis backend runs its scripts with the same numbers). */
static int l_breaker_config(lua_State *L) {
  const lg_breaker *b = luaL_checkudata(L, 1, BREAKER_MT);
  const lg_breaker_config *c = &b->cfg;
  lua_createtable(L, 0, 8);
  lua_pushinteger(L, c->consecutive);
  lua_setfield(L, -2, "consecutive");
  lua_pushnumber(L, c->ratio);
  lua_setfield(L, -2, "ratio");
  lua_pushinteger(L, c->window);
  lua_setfield(L, -2, "window");
  lua_pushinteger(L, c->min_calls);
  lua_setfield(L, -2, "min_calls");
  lua_pushnumber(L, c->open_for);
  lua_setfield(L, -2, "open_for");
  lua_pushnumber(L, c->open_max);
  lua_setfield(L, -2, "open_max");
  lua_pushnumber(L, c->growth);
  lua_setfield(L, -2, "growth");
  lua_pushnumber(L, c->probe_timeout);
  lua_setfield(L, -2, "probe_timeout");
  return 1;
}

static const luaL_Reg breaker_methods[] = {
    {"allow", l_breaker_allow},
    {"config", l_breaker_config},
    {"record", l_breaker_record},
    {"release", l_breaker_release},
    {"state", l_breaker_state},
    {NULL, NULL},
};

/* ======================================================================== */
/* Retry budget                                                             */
/* ======================================================================== */

/* core.retry_budget([config]): a full budget (tokens = max). */
static int l_retry_budget(lua_State *L) {
  static const char fn[] = "retry_budget";
  static const char *const names[] = {"max", "ratio", NULL};
  lg_budget_config c;
  lg_budget_defaults(&c);
  int t = opt_config(L, 1, fn, names);
  opt_number(L, t, fn, "max", &c.max);
  opt_number(L, t, fn, "ratio", &c.ratio);
  const char *bad = lg_budget_check(&c);
  if (bad) return luaL_error(L, "%s: config.%s", fn, bad);
  lg_budget *r = lua_newuserdatauv(L, sizeof *r, 0);
  lg_budget_init(r, &c);
  luaL_setmetatable(L, BUDGET_MT);
  return 1;
}

/* r:allow_retry(): may a retry (not a first attempt) go now? */
static int l_budget_allow_retry(lua_State *L) {
  lua_pushboolean(L, lg_budget_allow_retry(luaL_checkudata(L, 1, BUDGET_MT)));
  return 1;
}

/* r:failure(): a counted failure; true when it stopped retries. */
static int l_budget_failure(lua_State *L) {
  lua_pushboolean(L, lg_budget_failure(luaL_checkudata(L, 1, BUDGET_MT)));
  return 1;
}

/* r:success(): a success; true when it allowed retries again. */
static int l_budget_success(lua_State *L) {
  lua_pushboolean(L, lg_budget_success(luaL_checkudata(L, 1, BUDGET_MT)));
  return 1;
}

/* r:tokens(): the count and the maximum, in tokens. */
static int l_budget_tokens(lua_State *L) {
  const lg_budget *r = luaL_checkudata(L, 1, BUDGET_MT);
  lua_pushnumber(L, lg_budget_tokens(r));
  lua_pushnumber(L, (double)r->max / LG_BUDGET_ONE);
  return 2;
}

static const luaL_Reg budget_methods[] = {
    {"allow_retry", l_budget_allow_retry},
    {"failure", l_budget_failure},
    {"success", l_budget_success},
    {"tokens", l_budget_tokens},
    {NULL, NULL},
};

/* ======================================================================== */
/* Registration                                                             */
/* ======================================================================== */

static const luaL_Reg guard_funcs[] = {
    {"breaker", l_breaker},
    {"retry_budget", l_retry_budget},
    {NULL, NULL},
};

/* Creates both metatables and sets the constructors in the table on top. */
void lg_guard_register(lua_State *L) {
  lg_class_new(L, BREAKER_MT, breaker_methods, NULL, NULL);
  lg_class_new(L, BUDGET_MT, budget_methods, NULL, NULL);
  luaL_setfuncs(L, guard_funcs, 0);
}
