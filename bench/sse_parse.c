/* Benchmark (not a test): the SSE parser against a plain memchr line scan
 * over the same bytes, side by side in one run. The input is 200k
 * OpenAI-style chat.completion.chunk events. The parser is measured fed in
 * 16 KiB pieces (like network reads) and in one piece; each measurement is
 * the best of several repetitions of CPU time.
 * Build: gcc -std=c11 -O2 -Ihost host/sse.c bench/sse_parse.c -o build/bench/sse_parse */
#define _POSIX_C_SOURCE 200809L
#include "sse.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define EVENTS 200000
#define PIECE 16384
#define REPEAT 7

/* CPU seconds used by this process. */
static double cpu_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Builds the stream; the caller frees it. */
static char *make_stream(size_t *len) {
  static const char *words[] = {"the ", "model ", "streams ", "tokens ", "quickly, ",
                                "one ", "delta ", "at ", "a ", "time.\\n"};
  size_t cap = (size_t)EVENTS * 160, n = 0;
  char *s = malloc(cap);
  if (!s) abort();
  for (int i = 0; i < EVENTS; i++) {
    n += (size_t)snprintf(s + n, cap - n,
                          "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\","
                          "\"choices\":[{\"index\":0,\"delta\":{\"content\":\"%s\"}}]}\n\n",
                          words[i % 10]);
  }
  *len = n;
  return s;
}

typedef struct { size_t events, bytes; } tally;

/* Event callback: counts, so the work cannot be optimized away. */
static int count_event(void *ud, const lg_sse_event *ev) {
  tally *t = ud;
  t->events++;
  t->bytes += ev->data_len;
  return 0;
}

/* One parse of the whole stream in pieces of `piece` bytes. */
static size_t run_parser(const char *s, size_t len, size_t piece) {
  tally t = {0, 0};
  lg_sse p;
  lg_sse_init(&p, 0, 0);
  for (size_t i = 0; i < len; i += piece) {
    size_t n = len - i < piece ? len - i : piece;
    if (lg_sse_feed(&p, s + i, n, count_event, &t) != 0) abort();
  }
  lg_sse_free(&p);
  return t.events + t.bytes;
}

/* The baseline: find every line end with memchr and do nothing else. */
static size_t run_memchr(const char *s, size_t len, size_t piece) {
  (void)piece;
  size_t lines = 0;
  const char *q = s, *end = s + len;
  while ((q = memchr(q, '\n', (size_t)(end - q))) != NULL) {
    lines++;
    q++;
  }
  return lines;
}

/* Best MB/s of REPEAT runs of `fn`; `check` receives its result. */
static double best_mbps(size_t (*fn)(const char *, size_t, size_t), const char *s,
                        size_t len, size_t piece, size_t *check) {
  double best = 0;
  for (int r = 0; r < REPEAT; r++) {
    double t0 = cpu_now();
    *check = fn(s, len, piece);
    double dt = cpu_now() - t0;
    double mbps = (double)len / 1e6 / dt;
    if (mbps > best) best = mbps;
  }
  return best;
}

int main(void) {
  size_t len, a, b, c;
  char *s = make_stream(&len);
  double scan = best_mbps(run_memchr, s, len, 0, &a);
  double pieces = best_mbps(run_parser, s, len, PIECE, &b);
  double whole = best_mbps(run_parser, s, len, len, &c);
  if (b != c) abort();
  printf("input: %d events, %.1f MB\n", EVENTS, (double)len / 1e6);
  printf("memchr line scan        %8.0f MB/s  (%zu lines)\n", scan, a);
  printf("lg_sse, %5d B feeds    %8.0f MB/s  ratio scan/parser %.2f\n", PIECE, pieces,
         scan / pieces);
  printf("lg_sse, one feed        %8.0f MB/s  ratio scan/parser %.2f\n", whole,
         scan / whole);
  free(s);
  return 0;
}
