/* Durations and times as the observers write them (timetext.h): a traced
 * call writes a log line's time and three durations, and string.format
 * (glibc's printf behind Lua's own format parsing) cost as much per text
 * as the rest of a span. The texts are the ones lua/luagent/observe/log.lua's
 * formats gave, digit for digit (spec/log_spec.lua compares them). */
#include "timetext.h"

#include <lauxlib.h>
#include <lua.h>
#include <math.h>
#include <string.h>
#include <time.h>

/* Writes v in decimal, at least `width` digits (zeros in front), ending
 * just before `end`; returns where the digits begin. */
static char *digits_before(char *end, unsigned long long v, int width) {
  char *p = end;
  do {
    *--p = (char)('0' + v % 10);
    v /= 10;
  } while (v);
  while (end - p < width) *--p = '0';
  return p;
}

/* Pushes integer n in decimal, then the unit. */
static void push_count(lua_State *L, long long n, const char *unit) {
  char text[40], *end = text + 24;
  unsigned long long u = n < 0 ? 0ULL - (unsigned long long)n : (unsigned long long)n;
  char *p = digits_before(end, u, 1);
  if (n < 0) *--p = '-';
  size_t un = strlen(unit);
  memcpy(end, unit, un);
  lua_pushlstring(L, p, (size_t)(end - p) + un);
}

/* duration_text(seconds) -> "37.968s" (one second or more, to the
 * millisecond), "1.3ms" (to a tenth of a millisecond), "191µs" (below);
 * "?" for no finite number of seconds under 10^12. */
static int l_duration_text(lua_State *L) {
  double d = luaL_checknumber(L, 1);
  if (!(fabs(d) < 1e12)) {
    lua_pushliteral(L, "?");
    return 1;
  }
  char text[48], *end = text + 32, *p;
  if (d >= 1) {
    long long ms = (long long)floor(d * 1000 + 0.5);
    p = digits_before(end, (unsigned long long)(ms % 1000), 3);
    *--p = '.';
    p = digits_before(p, (unsigned long long)(ms / 1000), 1);
    memcpy(end, "s", 1);
    lua_pushlstring(L, p, (size_t)(end - p) + 1);
  } else if (d >= 0.001) {
    long long tenths = (long long)floor(d * 10000 + 0.5);
    p = digits_before(end, (unsigned long long)(tenths % 10), 1);
    *--p = '.';
    p = digits_before(p, (unsigned long long)(tenths / 10), 1);
    memcpy(end, "ms", 2);
    lua_pushlstring(L, p, (size_t)(end - p) + 2);
  } else {
    push_count(L, (long long)floor(d * 1e6 + 0.5), "\xC2\xB5s");
  }
  return 1;
}

/* The text of the last second iso_time wrote: its upvalue. */
typedef struct {
  int valid; /* 0: no second written yet */
  long long second;
  char text[19]; /* "YYYY-MM-DDTHH:MM:SS" */
} last_second;

/* iso_time(epoch) -> "2026-12-01T01:01:02.752Z": UTC, to the millisecond
 * (cut, not rounded). Raises for a time outside the years 0 to 9999. The
 * text is os.date's and string.format's, but for a fraction so close to
 * the next second that it reads .1000 there: .999 here. */
static int l_iso_time(lua_State *L) {
  double t = luaL_checknumber(L, 1);
  last_second *last = lua_touserdata(L, lua_upvalueindex(1));
  double s = floor(t);
  if (!(fabs(s) < 1e15)) return luaL_argerror(L, 1, "not a time");
  if (!last->valid || (long long)s != last->second) {
    time_t secs = (time_t)s;
    struct tm tm;
    if (!gmtime_r(&secs, &tm) || tm.tm_year < -1900 || tm.tm_year > 9999 - 1900)
      return luaL_argerror(L, 1, "not a time");
    /* by hand: strftime's %Y writes years before 1000 with fewer digits */
    char *p = last->text;
    digits_before(p + 4, (unsigned long long)(tm.tm_year + 1900), 4);
    p[4] = '-';
    digits_before(p + 7, (unsigned long long)(tm.tm_mon + 1), 2);
    p[7] = '-';
    digits_before(p + 10, (unsigned long long)tm.tm_mday, 2);
    p[10] = 'T';
    digits_before(p + 13, (unsigned long long)tm.tm_hour, 2);
    p[13] = ':';
    digits_before(p + 16, (unsigned long long)tm.tm_min, 2);
    p[16] = ':';
    digits_before(p + 19, (unsigned long long)tm.tm_sec, 2);
    last->second = (long long)s;
    last->valid = 1;
  }
  char text[24];
  memcpy(text, last->text, 19);
  int ms = (int)floor((t - s) * 1000);
  if (ms > 999) ms = 999; /* (t - s) * 1000 may round up to 1000 */
  text[19] = '.';
  text[20] = (char)('0' + ms / 100);
  text[21] = (char)('0' + ms / 10 % 10);
  text[22] = (char)('0' + ms % 10);
  text[23] = 'Z';
  lua_pushlstring(L, text, 24);
  return 1;
}

void lg_timetext_register(lua_State *L) {
  lua_pushcfunction(L, l_duration_text);
  lua_setfield(L, -2, "duration_text");
  last_second *last = lua_newuserdatauv(L, sizeof *last, 0);
  last->valid = 0;
  lua_pushcclosure(L, l_iso_time, 1);
  lua_setfield(L, -2, "iso_time");
}
