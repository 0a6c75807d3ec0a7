/* Random ids for traces and spans (ids.h): W3C Trace Context's 32 and 16
 * hex digits, never all zeros. The generator (backoff.h's xoshiro256**) is
 * the module's own, its state drawn from getrandom when the module opens,
 * not math.random: a script may seed that with a constant for its own
 * reasons, and every run's ids must still differ. The digits are written
 * by hand: string.format's "%016x" cost as much as the rest of a span. */
#include "ids.h"

#include <lauxlib.h>
#include <lua.h>
#include <stdint.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "backoff.h"

/* The whole state from getrandom; else seeded from the time and the pid. */
static void seed(lg_backoff_rng *r) {
  if (getrandom(r->s, sizeof r->s, GRND_NONBLOCK) == (ssize_t)sizeof r->s &&
      (r->s[0] | r->s[1] | r->s[2] | r->s[3]) != 0)
    return;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  lg_backoff_rng_seed(r, ((uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec) ^ ((uint64_t)getpid() << 32));
}

/* random_id(digits) -> `digits` (16 or 32) random lowercase hex digits,
 * not all zeros. The generator is the closure's upvalue (a userdata). */
static int l_random_id(lua_State *L) {
  static const char HEX[] = "0123456789abcdef";
  lua_Integer digits = luaL_checkinteger(L, 1);
  if (digits != 16 && digits != 32) return luaL_argerror(L, 1, "16 or 32 digits");
  lg_backoff_rng *r = lua_touserdata(L, lua_upvalueindex(1));
  uint64_t words[2];
  int n = (int)digits / 16;
  do {
    for (int i = 0; i < n; i++) words[i] = lg_backoff_rng_next64(r);
  } while (words[0] == 0 && (n == 1 || words[1] == 0));
  char text[32];
  for (int i = 0; i < n; i++)
    for (int j = 0; j < 16; j++) text[16 * i + j] = HEX[(words[i] >> (60 - 4 * j)) & 15];
  lua_pushlstring(L, text, (size_t)digits);
  return 1;
}

void lg_ids_register(lua_State *L) {
  lg_backoff_rng *r = lua_newuserdatauv(L, sizeof *r, 0);
  seed(r);
  lua_pushcclosure(L, l_random_id, 1);
  lua_setfield(L, -2, "random_id");
}
