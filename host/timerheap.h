/* A binary min-heap of timers ordered by due time (then by arming order, so
 * timers due at the same instant fire first-armed first). Pure C: the loop
 * owns one heap and drives it from either the real or the virtual clock. */
#ifndef LG_TIMERHEAP_H
#define LG_TIMERHEAP_H

#include <stddef.h>
#include <stdint.h>

typedef struct lg_timer lg_timer;

/* A timer is embedded in its owner's struct; the heap never allocates one. */
struct lg_timer {
  double due;                    /* clock seconds at which it fires */
  uint64_t seq;                  /* arming order, breaks ties */
  size_t slot;                   /* 1-based heap position; 0 when not armed */
  void (*fire)(lg_timer *t);     /* called once when due, after removal */
  int background;                /* the loop's: does not keep it alive */
};

typedef struct {
  lg_timer **items;
  size_t count, cap;
  uint64_t next_seq;
} lg_timerheap;

void lg_timerheap_init(lg_timerheap *h);
void lg_timerheap_free(lg_timerheap *h);
/* Arms `t` to fire at `due`; re-arms it if already armed. 0 or -1 (no memory). */
int lg_timerheap_add(lg_timerheap *h, lg_timer *t, double due);
/* Disarms `t`; harmless when it is not armed. */
void lg_timerheap_remove(lg_timerheap *h, lg_timer *t);
/* Whether `t` is armed. */
static inline int lg_timer_armed(const lg_timer *t) { return t->slot != 0; }
/* The earliest timer, or NULL. */
lg_timer *lg_timerheap_peek(const lg_timerheap *h);

#endif
