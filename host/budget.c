/* Retry budget: see budget.h. Pure C; no allocation, no global state. */
#include "budget.h"

#include <math.h>
#include <stddef.h>

/* The defaults the Lua binding starts from: gRPC's usual example values. */
void lg_budget_defaults(lg_budget_config *c) {
  c->max = 10;
  c->ratio = 0.1;
}

/* Rounds tokens to thousandths; callers have checked the range. */
static int64_t milli(double tokens) { return llround(tokens * LG_BUDGET_ONE); }

/* The first rule `c` breaks; checked on the rounded values, the ones used. */
const char *lg_budget_check(const lg_budget_config *c) {
  if (!(c->max > 0 && c->max <= LG_BUDGET_MAX_TOKENS) || milli(c->max) < 1)
    return "max must be a number in (0, 1000000], at least 0.001";
  if (!(c->ratio > 0 && c->ratio <= c->max) || milli(c->ratio) < 1)
    return "ratio must be a number in [0.001, max]";
  return NULL;
}

/* Validates first, so a bad config never leaves `b` half set; starts full,
 * as gRPC does. */
const char *lg_budget_init(lg_budget *b, const lg_budget_config *c) {
  const char *bad = lg_budget_check(c);
  if (bad) return bad;
  b->max = milli(c->max);
  b->ratio = milli(c->ratio);
  b->tokens = b->max;
  return NULL;
}

/* tokens > max / 2, as 2 * tokens > max so an odd max needs no rounding. */
int lg_budget_allow_retry(const lg_budget *b) { return 2 * b->tokens > b->max; }

/* Spends one token; reports the crossing into "retries refused". */
int lg_budget_failure(lg_budget *b) {
  int before = lg_budget_allow_retry(b);
  b->tokens = b->tokens > LG_BUDGET_ONE ? b->tokens - LG_BUDGET_ONE : 0;
  return before && !lg_budget_allow_retry(b);
}

/* Earns `ratio`; reports the crossing back into "retries allowed". */
int lg_budget_success(lg_budget *b) {
  int before = lg_budget_allow_retry(b);
  b->tokens = b->max - b->tokens > b->ratio ? b->tokens + b->ratio : b->max;
  return !before && lg_budget_allow_retry(b);
}

/* Thousandths back to tokens: n / 1000 is the double nearest the decimal. */
double lg_budget_tokens(const lg_budget *b) { return (double)b->tokens / LG_BUDGET_ONE; }
