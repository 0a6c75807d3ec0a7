/* Retry arithmetic: backoff delays, a seeded random generator, Retry-After
 * parsing and the server-wait rule. Pure C: no Lua, no libuv. Every duration
 * is in seconds, as a double. Functions take the random number U in [0, 1]
 * as an argument, so a caller can pass a fixed U (exact tests) or draw it
 * from an lg_backoff_rng (deterministic under a seed). */
#ifndef LG_BACKOFF_H
#define LG_BACKOFF_H

#include <stdint.h>

/* ---- Random numbers ------------------------------------------------------ */

/* xoshiro256** state, seeded through splitmix64. Plain data: copy or embed. */
typedef struct {
  uint64_t s[4];
} lg_backoff_rng;

/* Seeds `r`; the same seed always gives the same sequence. */
void lg_backoff_rng_seed(lg_backoff_rng *r, uint64_t seed);
/* The next number in [0, 1), with 53 random bits. */
double lg_backoff_rng_next(lg_backoff_rng *r);
/* The next output as it is: 64 random bits (trace ids, host/ids.c). */
uint64_t lg_backoff_rng_next64(lg_backoff_rng *r);

/* ---- Backoff delays ------------------------------------------------------ */

/* Delay before retry n (n counts from 1), with c = a capped growth:
 *   EXPONENTIAL   c = min(base * multiplier^(n-1), max);
 *                 c * (1 - jitter + 2 * jitter * U)     (yoagent: +-20 %)
 *   FULL_JITTER   c = min(base * 2^(n-1), max); U * c   (the book, AWS)
 *   EQUAL_JITTER  c = min(base * 2^(n-1), max); c/2 + U * c/2
 *   DECORRELATED  min(max, base + U * (3 * prev - base)); prev is the
 *                 previous delay, base before the first retry (AWS)
 *   POWER_OF_TWO  min(base * 2^n, max), no jitter       (axon: 2, 4, 8 s...)
 *   FIXED         base
 *   SDK           min(base * 2^(n-1), max) * (1 - jitter * U)
 *                 (OpenAI/Anthropic SDKs: base 0.5, max 8, jitter 0.25) */
typedef enum {
  LG_BACKOFF_EXPONENTIAL,
  LG_BACKOFF_FULL_JITTER,
  LG_BACKOFF_EQUAL_JITTER,
  LG_BACKOFF_DECORRELATED,
  LG_BACKOFF_POWER_OF_TWO,
  LG_BACKOFF_FIXED,
  LG_BACKOFF_SDK
} lg_backoff_strategy;

/* The strategy's name as policies spell it ("full_jitter"...), NULL-ended in
 * enum order, so that lg_backoff_names[s] names strategy s. */
extern const char *const lg_backoff_names[];

typedef struct {
  lg_backoff_strategy strategy;
  double base;       /* first delay or first ceiling, seconds (>= 0) */
  double max;        /* cap, seconds (>= 0) */
  double multiplier; /* growth per retry: EXPONENTIAL only */
  double jitter;     /* fraction: EXPONENTIAL (+-) and SDK (-) only */
} lg_backoff_params;

/* The delay before retry `n` (n < 1 counts as 1). `prev` is the previous
 * delay (DECORRELATED only; <= 0 means none yet). `u` is clamped to [0, 1].
 * Never negative, never NaN for finite non-negative parameters. */
double lg_backoff_delay(const lg_backoff_params *p, int n, double prev, double u);

/* ---- A server's wait ----------------------------------------------------- */

/* What to do when the server asks for longer than max_wait. */
typedef enum {
  LG_OVER_MAX_GIVE_UP, /* stop retrying: the book's rule */
  LG_OVER_MAX_CAP,     /* wait max_wait instead: yoagent */
  LG_OVER_MAX_BACKOFF  /* ignore the server, use the backoff: the SDKs */
} lg_backoff_over_max;

typedef struct {
  double max_wait; /* longest server wait obeyed, seconds; INFINITY: any */
  double jitter;   /* up to this many seconds are added, seconds (>= 0) */
  lg_backoff_over_max over_max;
} lg_backoff_server_params;

typedef enum {
  LG_WAIT_USE,     /* *wait is set: sleep that long */
  LG_WAIT_BACKOFF, /* ignore the server's value, use the backoff delay */
  LG_WAIT_GIVE_UP  /* the server asks for too long: fail now */
} lg_backoff_verdict;

/* Applies the server's requested wait `asked` (seconds, >= 0): wait = asked +
 * U * jitter, never above max_wait. When asked > max_wait, over_max decides. */
lg_backoff_verdict lg_backoff_server_wait(const lg_backoff_server_params *p,
                                          double asked, double u, double *wait);

/* ---- Retry-After --------------------------------------------------------- */

/* Values above this many seconds (about 31 years) are treated as garbage. */
#define LG_BACKOFF_RETRY_AFTER_MAX 1e9

/* Parses a non-negative decimal number ("5", "1.5", " 2 "; no sign, no
 * exponent, no hex) into *out. Returns 1, or 0 for anything else, NaN or a
 * value above LG_BACKOFF_RETRY_AFTER_MAX. */
int lg_backoff_parse_seconds(const char *s, double *out);

/* Parses an HTTP-date (IMF-fixdate "Sun, 06 Nov 1994 08:49:37 GMT", or the
 * obsolete RFC 850 "Sunday, 06-Nov-94 08:49:37 GMT" and asctime
 * "Sun Nov  6 08:49:37 1994") into seconds since the Unix epoch. 1 or 0. */
int lg_backoff_parse_http_date(const char *s, double *epoch);

/* The server's requested wait from the header values (either may be NULL):
 * `retry-after-ms` (milliseconds, fractional allowed) first, then
 * `retry-after` as seconds or as an HTTP-date relative to `now` (epoch
 * seconds). Returns 1 with *out in seconds, or 0 when neither gives a usable
 * value: absent, garbage, negative, overflowing, or a date in the past. */
int lg_backoff_retry_after(const char *ms_value, const char *value, double now,
                           double *out);

/* The Lua binding (host/backoff_lua.c): sets backoff_delay, backoff_rng,
 * backoff_server_wait and parse_retry_after in the table on top of the
 * stack. Declared with a forward type so this header stays pure. */
struct lua_State;
void lg_backoff_register(struct lua_State *L);

#endif
