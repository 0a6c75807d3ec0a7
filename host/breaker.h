/* Circuit breaker: the per-endpoint state that stops calls to a provider
 * that keeps failing. Pure C: no Lua, no libuv, no clock. Time is passed in
 * as `now` (seconds, as a double, from any monotonic or virtual clock), so a
 * spec drives every transition.
 *
 *   CLOSED --(N consecutive counted failures, or failures/calls >= R over the
 *             last W calls with calls >= M; both checked when a failure is
 *             recorded, so a success never trips it)--> OPEN
 *   OPEN   --(now >= open_until)--> HALF_OPEN
 *   HALF_OPEN: exactly one caller gets the probe, every other one is refused;
 *             the probe's success --> CLOSED (trips, counts and window reset),
 *             its failure --> OPEN again, for longer.
 *
 * Open time of trip k (k = 1, 2, ... since the last close):
 *   min(open_for * growth^(k-1), open_max).
 * A probe that never reports (its caller was cancelled) frees its slot after
 * probe_timeout seconds, and the next caller becomes the probe. */
#ifndef LG_BREAKER_H
#define LG_BREAKER_H

#include <stdint.h>

/* The largest sliding window, in calls. */
#define LG_BREAKER_WINDOW_MAX 1024

typedef struct {
  int consecutive;      /* N: consecutive counted failures that trip; 0: rule off */
  double ratio;         /* R in (0, 1]: failure ratio over the window that trips */
  int window;           /* W: calls in the sliding window; 0: ratio rule off */
  int min_calls;        /* M in [1, W]: calls in the window before R applies */
  double open_for;      /* open time of the first trip, seconds (> 0) */
  double open_max;      /* cap of the open time, seconds (>= open_for) */
  double growth;        /* factor per repeated trip (>= 1) */
  double probe_timeout; /* seconds before an unreported probe's slot frees (> 0) */
} lg_breaker_config;

typedef enum { LG_BREAKER_CLOSED, LG_BREAKER_OPEN, LG_BREAKER_HALF_OPEN } lg_breaker_state_t;

/* The answer to "may I call?". */
typedef enum {
  LG_REFUSE = 0,     /* fail fast; *retry_at says when the next probe is due */
  LG_ALLOW = 1,      /* an ordinary call (closed) */
  LG_ALLOW_PROBE = 2 /* the one half-open probe: report it with was_probe = 1 */
} lg_breaker_verdict;

/* What a call to lg_breaker_allow or lg_breaker_record changed. */
typedef enum {
  LG_BREAKER_STAY,
  LG_BREAKER_TO_OPEN,
  LG_BREAKER_TO_HALF_OPEN,
  LG_BREAKER_TO_CLOSED
} lg_breaker_transition;

/* Plain data: embed it anywhere (a Lua userdata), no allocation, no cleanup.
 * Read the fields freely; change them only through the functions. */
typedef struct {
  lg_breaker_config cfg;
  int64_t ratio_ppm;        /* cfg.ratio in millionths: the ratio test is exact */
  lg_breaker_state_t state; /* as last stored: OPEN may already be over */
  double open_until;        /* end of the current open time (OPEN, HALF_OPEN) */
  int trips;                /* trips since the last close */
  int consecutive;          /* consecutive counted failures (closed) */
  int probe_out;            /* 1 while the half-open probe has not reported */
  double probe_deadline;    /* when the outstanding probe's slot frees */
  int calls;                /* calls in the window (<= cfg.window) */
  int failures;             /* failures among them */
  int head;                 /* ring index of the next slot to write */
  uint64_t ring[LG_BREAKER_WINDOW_MAX / 64]; /* bit set: that call failed */
} lg_breaker;

/* Fills `c` with the defaults: consecutive 5, ratio 0.5, window 20,
 * min_calls 10, open_for 5, open_max 60, growth 2, probe_timeout 30. */
void lg_breaker_defaults(lg_breaker_config *c);

/* The fields a caller gave, for lg_breaker_complete (a bit set). */
enum {
  LG_BREAKER_GAVE_CONSECUTIVE = 1 << 0,
  LG_BREAKER_GAVE_RATIO = 1 << 1,
  LG_BREAKER_GAVE_WINDOW = 1 << 2,
  LG_BREAKER_GAVE_MIN_CALLS = 1 << 3,
  LG_BREAKER_GAVE_OPEN_MAX = 1 << 4
};

/* Completes `c`, the defaults with the fields in `gave` laid over them,
 * with the defaults that follow from the given fields, so that a config
 * naming one field alone is valid and means what it says:
 *   - open_max not given: max(60, open_for);
 *   - min_calls not given: min(10, window);
 *   - consecutive given (N > 0) with none of ratio, window, min_calls: the
 *     ratio rule is sized so that it cannot open before N counted failures
 *     are in its window: min_calls = max(10, ceil(N / ratio)) and window =
 *     max(20, min_calls); when that is more than LG_BREAKER_WINDOW_MAX
 *     calls, the ratio rule is off (window 0).
 * Checks nothing: lg_breaker_check says whether the result is valid. */
void lg_breaker_complete(lg_breaker_config *c, unsigned gave);

/* NULL when `c` is valid, else a static message that starts with the
 * offending field's name ("ratio must be a number in (0, 1]"). */
const char *lg_breaker_check(const lg_breaker_config *c);

/* Checks `c` (see lg_breaker_check) and, when valid, sets `b` to closed with
 * empty counts and returns NULL; otherwise returns the message and leaves
 * `b` untouched. */
const char *lg_breaker_init(lg_breaker *b, const lg_breaker_config *c);

/* May a caller call now? Closed: LG_ALLOW. Open: LG_REFUSE with *retry_at =
 * open_until. Half-open: LG_ALLOW_PROBE to the first caller (and to the next
 * one once an unreported probe is older than probe_timeout); LG_REFUSE with
 * *retry_at = the probe's deadline to the others. *retry_at is written only
 * on LG_REFUSE; *moved (both may be NULL) is LG_BREAKER_TO_HALF_OPEN when
 * this call observed the end of the open time, else LG_BREAKER_STAY. */
lg_breaker_verdict lg_breaker_allow(lg_breaker *b, double now, double *retry_at,
                                    lg_breaker_transition *moved);

/* Records a counted result (the caller decides what counts: only failures
 * that say something about the provider). Closed: the result enters the
 * window and may trip the breaker (LG_BREAKER_TO_OPEN). Half-open: the
 * probe's result (was_probe != 0) closes or reopens it; results of calls
 * admitted before the trip are ignored, as they are while open. A result
 * recorded after the open time is over moves OPEN to HALF_OPEN first, which
 * is returned when nothing else changed. */
lg_breaker_transition lg_breaker_record(lg_breaker *b, double now, int success,
                                        int was_probe);

/* Frees the probe slot without a verdict: the probe's call ended with a
 * result that says nothing about the provider (cancelled, auth error), so
 * the next caller may probe at once. No effect when no probe is out. */
void lg_breaker_release(lg_breaker *b);

/* The state at `now` without changing anything: OPEN reads as HALF_OPEN
 * once now >= open_until, before anyone asks. */
lg_breaker_state_t lg_breaker_state(const lg_breaker *b, double now);

/* The state's name: "closed", "open" or "half_open". */
const char *lg_breaker_state_name(lg_breaker_state_t s);

/* The open time of trip number `trip` (1 = the first since the last close). */
double lg_breaker_open_time(const lg_breaker_config *c, int trip);

#endif
