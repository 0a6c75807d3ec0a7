/* Retry budget, after gRPC's retry throttling (gRFC A6): a token count
 * shared by every caller of one endpoint. Pure C: no Lua, no libuv.
 *
 * The count starts at `max`. Each counted failure costs 1 token, each
 * success earns `ratio` tokens; the count stays in [0, max]. A retry (never
 * a first attempt) is allowed only while tokens > max / 2, so when most
 * calls fail, nobody retries. Like gRPC, tokens are kept in thousandths:
 * the arithmetic is exact integer arithmetic, and `max` and `ratio` are
 * rounded to the nearest thousandth. */
#ifndef LG_BUDGET_H
#define LG_BUDGET_H

#include <stdint.h>

/* One token in the unit the counts are kept in (thousandths). */
#define LG_BUDGET_ONE 1000

/* Largest `max` accepted, in tokens. */
#define LG_BUDGET_MAX_TOKENS 1000000

typedef struct {
  double max;   /* token maximum, in (0, LG_BUDGET_MAX_TOKENS]; default 10 */
  double ratio; /* tokens earned per success, in [0.001, max]; default 0.1 */
} lg_budget_config;

/* Plain data, no cleanup. Counts are in thousandths of a token. */
typedef struct {
  int64_t max;    /* maximum */
  int64_t ratio;  /* earned per success */
  int64_t tokens; /* current count, in [0, max] */
} lg_budget;

/* Fills `c` with the defaults: max 10, ratio 0.1. */
void lg_budget_defaults(lg_budget_config *c);

/* NULL when `c` is valid, else a static message that starts with the
 * offending field's name. */
const char *lg_budget_check(const lg_budget_config *c);

/* Checks `c` and, when valid, fills `b` (tokens = max) and returns NULL;
 * otherwise returns the message and leaves `b` untouched. */
const char *lg_budget_init(lg_budget *b, const lg_budget_config *c);

/* 1 when a retry may go now (tokens > max / 2), else 0. Changes nothing. */
int lg_budget_allow_retry(const lg_budget *b);

/* A counted failure: tokens -= 1 (not below 0). Returns 1 when this failure
 * is the one that stopped retries (allowed before, refused after). */
int lg_budget_failure(lg_budget *b);

/* A success: tokens += ratio (not above max). Returns 1 when this success
 * is the one that allowed retries again. */
int lg_budget_success(lg_budget *b);

/* The current count, in tokens. */
double lg_budget_tokens(const lg_budget *b);

#endif
