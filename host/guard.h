/* Lua binding of the per-endpoint protection state: the circuit breaker
 * (breaker.h) and the retry budget (budget.h), in host/guard_lua.c. */
#ifndef LG_GUARD_H
#define LG_GUARD_H

/* Sets `breaker` and `retry_budget` in the table on top of the stack.
 * Declared with a forward type so this header stays free of Lua's. */
struct lua_State;
void lg_guard_register(struct lua_State *L);

#endif
