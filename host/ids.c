/* Random ids for traces and spans (ids.h): W3C Trace Context's 32 and 16
 * hex digits, never all zeros. The generator is the module's own
 * (xoshiro256**, seeded from getrandom when the module opens), not
 * math.random: a script may seed that with a constant for its own reasons,
 * and every run's ids must still differ. The digits are written by hand:
 * string.format's "%016x" cost as much as the rest of a span. */
#include "ids.h"

#include <lauxlib.h>
#include <lua.h>
#include <stdint.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

/* The generator's state: a userdata, the upvalue of random_id. */
typedef struct {
  uint64_t s[4];
} rng;

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t next(rng *r) {
  uint64_t *s = r->s, out = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return out;
}

/* splitmix64: spreads a seed over the state. */
static uint64_t splitmix(uint64_t *x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

/* The whole state from getrandom; else spread from the time and the pid. */
static void seed(rng *r) {
  if (getrandom(r->s, sizeof r->s, GRND_NONBLOCK) == (ssize_t)sizeof r->s &&
      (r->s[0] | r->s[1] | r->s[2] | r->s[3]) != 0)
    return;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  uint64_t x = ((uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec) ^ ((uint64_t)getpid() << 32);
  for (int i = 0; i < 4; i++) r->s[i] = splitmix(&x);
}

/* random_id(digits) -> `digits` (16 or 32) random lowercase hex digits,
 * not all zeros. */
static int l_random_id(lua_State *L) {
  static const char HEX[] = "0123456789abcdef";
  lua_Integer digits = luaL_checkinteger(L, 1);
  if (digits != 16 && digits != 32) return luaL_argerror(L, 1, "16 or 32 digits");
  rng *r = lua_touserdata(L, lua_upvalueindex(1));
  uint64_t words[2];
  int n = (int)digits / 16;
  do {
    for (int i = 0; i < n; i++) words[i] = next(r);
  } while (words[0] == 0 && (n == 1 || words[1] == 0));
  char text[32];
  for (int i = 0; i < n; i++)
    for (int j = 0; j < 16; j++) text[16 * i + j] = HEX[(words[i] >> (60 - 4 * j)) & 15];
  lua_pushlstring(L, text, (size_t)digits);
  return 1;
}

void lg_ids_register(lua_State *L) {
  rng *r = lua_newuserdatauv(L, sizeof *r, 0);
  seed(r);
  lua_pushcclosure(L, l_random_id, 1);
  lua_setfield(L, -2, "random_id");
}
