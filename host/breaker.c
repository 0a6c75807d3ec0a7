/* Circuit breaker: see breaker.h. Pure C; no allocation, no global state. */
#include "breaker.h"

#include <math.h>
#include <string.h>

/* ======================================================================== */
/* Configuration                                                            */
/* ======================================================================== */

/* The defaults the Lua binding starts from; see breaker.h. */
void lg_breaker_defaults(lg_breaker_config *c) {
  c->consecutive = 5;
  c->ratio = 0.5;
  c->window = 20;
  c->min_calls = 10;
  c->open_for = 5;
  c->open_max = 60;
  c->growth = 2;
  c->probe_timeout = 30;
}

/* The defaults that follow from the fields given; see breaker.h. The ratio
 * rule's size for a lone `consecutive` is computed in millionths, as the
 * ratio test is: the smallest m with m * ratio >= N. */
void lg_breaker_complete(lg_breaker_config *c, unsigned gave) {
  lg_breaker_config d;
  lg_breaker_defaults(&d);
  if (!(gave & LG_BREAKER_GAVE_OPEN_MAX) && c->open_max < c->open_for) c->open_max = c->open_for;
  if (!(gave & LG_BREAKER_GAVE_MIN_CALLS) && c->window < c->min_calls) c->min_calls = c->window;
  const unsigned sized = LG_BREAKER_GAVE_RATIO | LG_BREAKER_GAVE_WINDOW | LG_BREAKER_GAVE_MIN_CALLS;
  if (!(gave & LG_BREAKER_GAVE_CONSECUTIVE) || (gave & sized) || c->consecutive <= 0) return;
  int64_t ppm = llround(c->ratio * 1e6);
  if (!(ppm > 0)) return; /* an invalid ratio: lg_breaker_check reports it */
  int64_t m = ((int64_t)c->consecutive * 1000000 + ppm - 1) / ppm;
  if (m < d.min_calls) m = d.min_calls;
  if (m > LG_BREAKER_WINDOW_MAX) {
    c->window = 0;
    return;
  }
  c->min_calls = (int)m;
  c->window = m > d.window ? (int)m : d.window;
}

/* True for a finite number > 0 (false for NaN). */
static int positive(double v) { return v > 0 && !isinf(v); }

/* The first rule `c` breaks, field name first; NULL when it breaks none. */
const char *lg_breaker_check(const lg_breaker_config *c) {
  if (c->consecutive < 0) return "consecutive must be an integer >= 0";
  if (!(c->ratio > 0 && c->ratio <= 1)) return "ratio must be a number in (0, 1]";
  if (c->window < 0 || c->window > LG_BREAKER_WINDOW_MAX)
    return "window must be an integer in [0, 1024]";
  if (c->window > 0 && (c->min_calls < 1 || c->min_calls > c->window))
    return "min_calls must be an integer in [1, window]";
  if (!positive(c->open_for)) return "open_for must be a finite number > 0";
  if (!(c->open_max >= c->open_for) || isinf(c->open_max))
    return "open_max must be a finite number >= open_for";
  if (!(c->growth >= 1) || isinf(c->growth))
    return "growth must be a finite number >= 1";
  if (!positive(c->probe_timeout)) return "probe_timeout must be a finite number > 0";
  return NULL;
}

/* Empty window, no failures, no trips: the state after init and after the
 * probe's success. */
static void reset_closed(lg_breaker *b) {
  b->state = LG_BREAKER_CLOSED;
  b->open_until = 0;
  b->trips = 0;
  b->consecutive = 0;
  b->probe_out = 0;
  b->probe_deadline = 0;
  b->calls = 0;
  b->failures = 0;
  b->head = 0;
  memset(b->ring, 0, sizeof b->ring);
}

/* Validates first, so a bad config never leaves `b` half set. The ratio is
 * kept in millionths so "failures / calls >= ratio" is integer arithmetic. */
const char *lg_breaker_init(lg_breaker *b, const lg_breaker_config *c) {
  const char *bad = lg_breaker_check(c);
  if (bad) return bad;
  b->cfg = *c;
  b->ratio_ppm = llround(c->ratio * 1e6);
  reset_closed(b);
  return NULL;
}

/* min(open_for * growth^(trip-1), open_max); an overflow is the cap. */
double lg_breaker_open_time(const lg_breaker_config *c, int trip) {
  double t = c->open_for * pow(c->growth, trip > 1 ? trip - 1 : 0);
  return t < c->open_max ? t : c->open_max;
}

/* ======================================================================== */
/* The sliding window                                                       */
/* ======================================================================== */

/* Appends one call's result, evicting the oldest once the window is full. */
static void window_push(lg_breaker *b, int failed) {
  int i = b->head, w = b->cfg.window;
  uint64_t bit = UINT64_C(1) << (i % 64);
  if (b->calls == w) {
    if (b->ring[i / 64] & bit) b->failures--;
  } else {
    b->calls++;
  }
  if (failed) {
    b->ring[i / 64] |= bit;
    b->failures++;
  } else {
    b->ring[i / 64] &= ~bit;
  }
  b->head = (i + 1) % w;
}

/* The ratio rule, in integers: failures / calls >= ratio. */
static int ratio_reached(const lg_breaker *b) {
  return b->cfg.window > 0 && b->calls >= b->cfg.min_calls &&
         (int64_t)b->failures * 1000000 >= b->ratio_ppm * b->calls;
}

/* ======================================================================== */
/* Transitions                                                              */
/* ======================================================================== */

/* Opens for the next, longer open time; any probe slot is dropped. */
static void trip(lg_breaker *b, double now) {
  if (b->trips < 1000000) b->trips++;
  b->state = LG_BREAKER_OPEN;
  b->open_until = now + lg_breaker_open_time(&b->cfg, b->trips);
  b->probe_out = 0;
}

/* Moves a stored OPEN whose time is over to HALF_OPEN; 1 when it did. */
static int settle(lg_breaker *b, double now) {
  if (b->state != LG_BREAKER_OPEN || !(now >= b->open_until)) return 0;
  b->state = LG_BREAKER_HALF_OPEN;
  b->probe_out = 0;
  return 1;
}

/* Fail fast while open; hand out the single probe once the open time is
 * over (again after probe_timeout if the probe never reports). */
lg_breaker_verdict lg_breaker_allow(lg_breaker *b, double now, double *retry_at,
                                    lg_breaker_transition *moved) {
  lg_breaker_transition tr = settle(b, now) ? LG_BREAKER_TO_HALF_OPEN : LG_BREAKER_STAY;
  if (moved) *moved = tr;
  if (b->state == LG_BREAKER_CLOSED) return LG_ALLOW;
  if (b->state == LG_BREAKER_OPEN) {
    if (retry_at) *retry_at = b->open_until;
    return LG_REFUSE;
  }
  if (b->probe_out && now < b->probe_deadline) { /* half-open, probe out */
    if (retry_at) *retry_at = b->probe_deadline;
    return LG_REFUSE;
  }
  b->probe_out = 1;
  b->probe_deadline = now + b->cfg.probe_timeout;
  return LG_ALLOW_PROBE;
}

/* Closed: window and consecutive count, maybe a trip. Open: ignored.
 * Half-open: only the probe's verdict matters. See breaker.h. */
lg_breaker_transition lg_breaker_record(lg_breaker *b, double now, int success,
                                        int was_probe) {
  lg_breaker_transition tr = settle(b, now) ? LG_BREAKER_TO_HALF_OPEN : LG_BREAKER_STAY;
  switch (b->state) {
  case LG_BREAKER_CLOSED:
    if (b->cfg.window > 0) window_push(b, !success);
    if (success) {
      b->consecutive = 0;
      return LG_BREAKER_STAY;
    }
    if (b->consecutive < 1000000) b->consecutive++;
    if ((b->cfg.consecutive > 0 && b->consecutive >= b->cfg.consecutive) ||
        ratio_reached(b)) {
      trip(b, now);
      return LG_BREAKER_TO_OPEN;
    }
    return LG_BREAKER_STAY;
  case LG_BREAKER_OPEN:
    return tr; /* a straggler admitted before the trip: nothing new */
  default:     /* half-open */
    if (!was_probe) return tr;
    if (success) {
      reset_closed(b);
      return LG_BREAKER_TO_CLOSED;
    }
    trip(b, now);
    return LG_BREAKER_TO_OPEN;
  }
}

/* The probe's caller learned nothing: let the next caller probe. */
void lg_breaker_release(lg_breaker *b) { b->probe_out = 0; }

/* A pure read: the end of the open time shows without a caller. */
lg_breaker_state_t lg_breaker_state(const lg_breaker *b, double now) {
  if (b->state == LG_BREAKER_OPEN && now >= b->open_until) return LG_BREAKER_HALF_OPEN;
  return b->state;
}

/* Names as Lua and events spell them. */
const char *lg_breaker_state_name(lg_breaker_state_t s) {
  switch (s) {
  case LG_BREAKER_OPEN:
    return "open";
  case LG_BREAKER_HALF_OPEN:
    return "half_open";
  default:
    return "closed";
  }
}
