/* libFuzzer target for the SSE parser. Invariant: however the input is split
 * (one feed, byte by byte, at positions derived from the input, or resumed
 * after a callback that stops at every event), the parser yields the same
 * events, the same final result and error offset, and the same partial
 * flag. Runs twice: default limits and small limits taken from the input.
 * Build: clang -fsanitize=fuzzer,address,undefined -g -O1 host/sse.c
 *        fuzz/sse_fuzz.c -o build/fuzz/sse_fuzz */
#include "../host/sse.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A transcript of everything a run observed, compared byte for byte. */
typedef struct { char *p; size_t len, cap; } out_buf;

static void out_put(out_buf *o, const void *s, size_t n) {
  if (o->len + n > o->cap) {
    size_t cap = o->cap ? o->cap : 1024;
    while (cap < o->len + n) cap *= 2;
    o->p = realloc(o->p, cap);
    if (!o->p) abort();
    o->cap = cap;
  }
  memcpy(o->p + o->len, s, n);
  o->len += n;
}

static void out_num(out_buf *o, long long v) { out_put(o, &v, sizeof v); }

static void out_str(out_buf *o, const char *s, size_t n) {
  out_num(o, (long long)n);
  out_put(o, s, n);
}

/* Records one event; returns `stop` so a run can stop at every event. */
typedef struct { out_buf *o; int stop; } sink;

static int on_event(void *ud, const lg_sse_event *ev) {
  sink *k = ud;
  out_str(k->o, ev->type, ev->type_len);
  out_str(k->o, ev->data, ev->data_len);
  out_num(k->o, ev->has_id);
  out_str(k->o, ev->id, ev->id_len);
  out_num(k->o, ev->retry);
  return k->stop;
}

/* Feeds one piece; with a stopping sink, re-feeds the unconsumed rest. */
static int feed_piece(lg_sse *p, const uint8_t *s, size_t n, sink *k) {
  for (;;) {
    uint64_t before = lg_sse_offset(p);
    int rc = lg_sse_feed(p, (const char *)s, n, on_event, k);
    if (rc <= 0) return rc;
    size_t used = (size_t)(lg_sse_offset(p) - before);
    if (used > n) abort();
    s += used;
    n -= used;
  }
}

enum { ONE_SHOT, BYTES, DERIVED, STOPPING };

/* Runs the whole input through a fresh parser in `mode` and returns the
 * transcript. */
static out_buf run(const uint8_t *d, size_t n, size_t max_line,
                   size_t max_event, int mode) {
  out_buf o = {0};
  sink k = {&o, mode == STOPPING};
  lg_sse p;
  lg_sse_init(&p, max_line, max_event);
  int rc = 0;
  if (mode == ONE_SHOT) {
    rc = feed_piece(&p, d, n, &k);
  } else if (mode == BYTES) {
    for (size_t i = 0; i < n; i++) rc = feed_piece(&p, d + i, 1, &k);
  } else { /* piece lengths 0..15 from a hash of the bytes seen so far */
    uint32_t h = 2166136261u;
    size_t i = 0;
    while (i < n) {
      h = (h ^ d[i]) * 16777619u;
      size_t len = (h >> 7) % 16;
      if (len > n - i) len = n - i;
      rc = feed_piece(&p, d + i, len, &k);
      i += len;
    }
    rc = feed_piece(&p, d, 0, &k);
  }
  if (rc < 0 && lg_sse_feed(&p, "x", 1, NULL, NULL) != rc) abort();
  out_num(&o, rc);
  out_num(&o, rc < 0 ? (long long)lg_sse_error_offset(&p) : -1);
  out_num(&o, rc < 0 ? 0 : lg_sse_has_partial(&p));
  lg_sse_free(&p);
  return o;
}

/* Checks that every split mode agrees with the one-shot transcript. */
static void check(const uint8_t *d, size_t n, size_t max_line, size_t max_event) {
  out_buf ref = run(d, n, max_line, max_event, ONE_SHOT);
  for (int mode = BYTES; mode <= STOPPING; mode++) {
    out_buf o = run(d, n, max_line, max_event, mode);
    if (o.len != ref.len || memcmp(o.p, ref.p, o.len) != 0) {
      fprintf(stderr, "sse_fuzz: mode %d differs from one-shot (limits %zu/%zu)\n",
              mode, max_line, max_event);
      abort();
    }
    free(o.p);
  }
  free(ref.p);
}

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) {
  check(d, n, 0, 0);
  if (n >= 2) check(d, n, 1 + d[0] % 64, 1 + d[1] % 128);
  return 0;
}
