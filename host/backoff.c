/* Retry arithmetic: see backoff.h. Pure C; no allocation, no global state. */
#include "backoff.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

/* ======================================================================== */
/* Random numbers: xoshiro256** seeded by splitmix64 (Vigna's reference     */
/* algorithms, public domain).                                              */
/* ======================================================================== */

/* One splitmix64 step: spreads any seed, even 0, over the whole state. */
static uint64_t splitmix64(uint64_t *x) {
  uint64_t z = (*x += UINT64_C(0x9e3779b97f4a7c15));
  z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
  z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
  return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

/* Fills the four state words from the seed (never all zero). */
void lg_backoff_rng_seed(lg_backoff_rng *r, uint64_t seed) {
  for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&seed);
}

/* The next output, all 64 bits. */
uint64_t lg_backoff_rng_next64(lg_backoff_rng *r) {
  uint64_t *s = r->s;
  uint64_t out = rotl(s[1] * 5, 7) * 9;
  uint64_t t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return out;
}

/* The top 53 bits of the next output, scaled to [0, 1). */
double lg_backoff_rng_next(lg_backoff_rng *r) { return (double)(lg_backoff_rng_next64(r) >> 11) * 0x1.0p-53; }

/* ======================================================================== */
/* Backoff delays                                                           */
/* ======================================================================== */

const char *const lg_backoff_names[] = {
    "exponential", "full_jitter",  "equal_jitter", "decorrelated_jitter",
    "power_of_two", "fixed",       "sdk",          NULL};

/* U clamped to [0, 1]; NaN counts as 0. */
static double unit(double u) {
  if (!(u > 0)) return 0;
  return u < 1 ? u : 1;
}

/* min(base * factor^steps, cap) without overflow trouble: a product that
 * overflows to infinity (or turns NaN) is simply the cap; base <= 0 is 0. */
static double grow(double base, double factor, int steps, double cap) {
  if (!(base > 0)) return 0;
  double v = base * pow(factor, steps);
  return v < cap ? v : cap;
}

/* The delay before retry n; see the table in backoff.h. */
double lg_backoff_delay(const lg_backoff_params *p, int n, double prev, double u) {
  double d, c, hi;
  int k = n > 1 ? n - 1 : 0; /* retries before this one */
  u = unit(u);
  switch (p->strategy) {
  case LG_BACKOFF_EXPONENTIAL:
    c = grow(p->base, p->multiplier, k, p->max);
    d = c * (1 - p->jitter + 2 * p->jitter * u);
    break;
  case LG_BACKOFF_FULL_JITTER:
    d = u * grow(p->base, 2, k, p->max);
    break;
  case LG_BACKOFF_EQUAL_JITTER:
    c = grow(p->base, 2, k, p->max);
    d = c / 2 + u * c / 2;
    break;
  case LG_BACKOFF_DECORRELATED:
    if (!(prev > 0)) prev = p->base;
    hi = 3 * prev;
    d = hi > p->base ? p->base + u * (hi - p->base) : p->base;
    if (d > p->max) d = p->max;
    break;
  case LG_BACKOFF_POWER_OF_TWO:
    d = grow(p->base, 2, k + 1, p->max);
    break;
  case LG_BACKOFF_FIXED:
    d = p->base;
    break;
  case LG_BACKOFF_SDK:
    d = grow(p->base, 2, k, p->max) * (1 - p->jitter * u);
    break;
  default:
    d = 0;
  }
  return d > 0 ? d : 0; /* also turns NaN into 0 */
}

/* ======================================================================== */
/* A server's wait                                                          */
/* ======================================================================== */

/* The Retry-After rule: the server's wait replaces the backoff, plus a small
 * jitter so clients told the same instant do not all return at once. */
lg_backoff_verdict lg_backoff_server_wait(const lg_backoff_server_params *p,
                                          double asked, double u, double *wait) {
  if (!(asked >= 0)) return LG_WAIT_BACKOFF; /* negative or NaN: unusable */
  if (asked > p->max_wait) {
    if (p->over_max == LG_OVER_MAX_GIVE_UP) return LG_WAIT_GIVE_UP;
    if (p->over_max == LG_OVER_MAX_BACKOFF) return LG_WAIT_BACKOFF;
  }
  double w = asked + (p->jitter > 0 ? unit(u) * p->jitter : 0);
  *wait = w < p->max_wait ? w : p->max_wait;
  return LG_WAIT_USE;
}

/* ======================================================================== */
/* Retry-After parsing                                                      */
/* ======================================================================== */

static int is_digit(char c) { return c >= '0' && c <= '9'; }

static const char *skip_ows(const char *s) {
  while (*s == ' ' || *s == '\t') s++;
  return s;
}

/* Digits with an optional fraction, as mantissa / 10^k: exact for the short
 * values servers send (so "0.3" parses to the same double as the literal). */
int lg_backoff_parse_seconds(const char *s, double *out) {
  double mantissa = 0;
  int digits = 0, frac = 0;
  if (!s) return 0;
  s = skip_ows(s);
  for (; is_digit(*s); s++, digits++) mantissa = mantissa * 10 + (*s - '0');
  if (*s == '.') {
    for (s++; is_digit(*s); s++, digits++, frac++)
      mantissa = mantissa * 10 + (*s - '0');
  }
  if (digits == 0 || *skip_ows(s) != '\0') return 0;
  double v = frac ? mantissa / pow(10, frac) : mantissa;
  if (!(v <= LG_BACKOFF_RETRY_AFTER_MAX)) return 0; /* overflow, inf, NaN */
  *out = v;
  return 1;
}

static const char *const short_days[] = {"Mon", "Tue", "Wed", "Thu",
                                         "Fri", "Sat", "Sun", NULL};
static const char *const long_days[] = {"Monday", "Tuesday", "Wednesday",
                                        "Thursday", "Friday", "Saturday",
                                        "Sunday", NULL};
static const char *const months[] = {"Jan", "Feb", "Mar", "Apr",
                                     "May", "Jun", "Jul", "Aug",
                                     "Sep", "Oct", "Nov", "Dec", NULL};

/* If *s starts with one of `names`, moves past it and returns its index;
 * otherwise returns -1 and leaves *s alone. Case-sensitive, as RFC 9110. */
static int take_name(const char **s, const char *const *names) {
  for (int i = 0; names[i]; i++) {
    size_t n = strlen(names[i]);
    if (strncmp(*s, names[i], n) == 0) {
      *s += n;
      return i;
    }
  }
  return -1;
}

/* Moves past the literal `lit`; 1, or 0 with *s unchanged. */
static int take(const char **s, const char *lit) {
  size_t n = strlen(lit);
  if (strncmp(*s, lit, n) != 0) return 0;
  *s += n;
  return 1;
}

/* Reads exactly n digits into *out. */
static int take_digits(const char **s, int n, int *out) {
  int v = 0;
  for (int i = 0; i < n; i++) {
    if (!is_digit((*s)[i])) return 0;
    v = v * 10 + ((*s)[i] - '0');
  }
  *s += n;
  *out = v;
  return 1;
}

/* "HH:MM:SS". */
static int take_time(const char **s, int *h, int *m, int *sec) {
  return take_digits(s, 2, h) && take(s, ":") && take_digits(s, 2, m) &&
         take(s, ":") && take_digits(s, 2, sec);
}

static int is_leap(int y) { return (y % 4 == 0 && y % 100 != 0) || y % 400 == 0; }

/* Days since 1970-01-01 of a proleptic Gregorian date (m in 1..12), after
 * Howard Hinnant's days_from_civil. */
static long long days_from_civil(long long y, int m, int d) {
  y -= m <= 2;
  long long era = (y >= 0 ? y : y - 399) / 400;
  long long yoe = y - era * 400;
  long long doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1;
  long long doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + doe - 719468;
}

/* The three forms share their fields; each parser fills them in. */
typedef struct {
  int year, mon, day, hour, min, sec; /* mon 0..11 */
} http_date;

/* "06 Nov 1994 08:49:37 GMT", after "Sun, ". */
static int parse_imf(const char *s, http_date *t) {
  return take_digits(&s, 2, &t->day) && take(&s, " ") &&
         (t->mon = take_name(&s, months)) >= 0 && take(&s, " ") &&
         take_digits(&s, 4, &t->year) && take(&s, " ") &&
         take_time(&s, &t->hour, &t->min, &t->sec) && take(&s, " GMT") &&
         *skip_ows(s) == '\0';
}

/* "06-Nov-94 08:49:37 GMT", after "Sunday, ". Two-digit years below 70 are
 * 20xx, the rest 19xx. */
static int parse_rfc850(const char *s, http_date *t) {
  if (!(take_digits(&s, 2, &t->day) && take(&s, "-") &&
        (t->mon = take_name(&s, months)) >= 0 && take(&s, "-") &&
        take_digits(&s, 2, &t->year) && take(&s, " ") &&
        take_time(&s, &t->hour, &t->min, &t->sec) && take(&s, " GMT") &&
        *skip_ows(s) == '\0'))
    return 0;
  t->year += t->year < 70 ? 2000 : 1900;
  return 1;
}

/* "Nov  6 08:49:37 1994", after "Sun ". The day is two digits or a space
 * and one digit. */
static int parse_asctime(const char *s, http_date *t) {
  if ((t->mon = take_name(&s, months)) < 0 || !take(&s, " ")) return 0;
  if (*s == ' ') {
    s++;
    if (!take_digits(&s, 1, &t->day)) return 0;
  } else if (!take_digits(&s, 2, &t->day)) {
    return 0;
  }
  return take(&s, " ") && take_time(&s, &t->hour, &t->min, &t->sec) &&
         take(&s, " ") && take_digits(&s, 4, &t->year) && *skip_ows(s) == '\0';
}

/* Tries the forms by their weekday spelling: "Sunday, " is RFC 850, "Sun, "
 * IMF-fixdate, "Sun " asctime. Then checks the fields' ranges. */
int lg_backoff_parse_http_date(const char *s, double *epoch) {
  static const int mdays[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  http_date t;
  int ok;
  if (!s) return 0;
  s = skip_ows(s);
  const char *rest = s;
  if (take_name(&rest, long_days) >= 0 && take(&rest, ", ")) {
    ok = parse_rfc850(rest, &t);
  } else {
    rest = s;
    if (take_name(&rest, short_days) < 0) return 0;
    if (take(&rest, ", "))
      ok = parse_imf(rest, &t);
    else
      ok = take(&rest, " ") && parse_asctime(rest, &t);
  }
  if (!ok) return 0;
  int dim = mdays[t.mon] + (t.mon == 1 && is_leap(t.year));
  if (t.day < 1 || t.day > dim || t.hour > 23 || t.min > 59 || t.sec > 60)
    return 0;
  *epoch = (double)days_from_civil(t.year, t.mon + 1, t.day) * 86400.0 +
           t.hour * 3600.0 + t.min * 60.0 + t.sec;
  return 1;
}

/* retry-after-ms first (the SDKs' order), then retry-after as seconds, then
 * as a date. A value that does not parse falls through to the next form. */
int lg_backoff_retry_after(const char *ms_value, const char *value, double now,
                           double *out) {
  double v;
  if (lg_backoff_parse_seconds(ms_value, &v)) {
    *out = v / 1000;
    return 1;
  }
  if (lg_backoff_parse_seconds(value, &v)) {
    *out = v;
    return 1;
  }
  if (lg_backoff_parse_http_date(value, &v)) {
    double wait = v - now;
    if (wait >= 0 && wait <= LG_BACKOFF_RETRY_AFTER_MAX) { /* NaN now fails */
      *out = wait;
      return 1;
    }
  }
  return 0;
}
