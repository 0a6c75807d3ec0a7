/* Binary min-heap of timers; see timerheap.h. */
#include "timerheap.h"

#include <stdlib.h>

static int earlier(const lg_timer *a, const lg_timer *b) {
  if (a->due != b->due) return a->due < b->due;
  return a->seq < b->seq;
}

static void place(lg_timerheap *h, size_t i, lg_timer *t) {
  h->items[i] = t;
  t->slot = i + 1;
}

static void sift_up(lg_timerheap *h, size_t i) {
  lg_timer *t = h->items[i];
  while (i > 0) {
    size_t parent = (i - 1) / 2;
    if (!earlier(t, h->items[parent])) break;
    place(h, i, h->items[parent]);
    i = parent;
  }
  place(h, i, t);
}

static void sift_down(lg_timerheap *h, size_t i) {
  lg_timer *t = h->items[i];
  for (;;) {
    size_t child = 2 * i + 1;
    if (child >= h->count) break;
    if (child + 1 < h->count && earlier(h->items[child + 1], h->items[child]))
      child++;
    if (!earlier(h->items[child], t)) break;
    place(h, i, h->items[child]);
    i = child;
  }
  place(h, i, t);
}

void lg_timerheap_init(lg_timerheap *h) {
  h->items = NULL;
  h->count = h->cap = 0;
  h->next_seq = 0;
}

void lg_timerheap_free(lg_timerheap *h) {
  for (size_t i = 0; i < h->count; i++) h->items[i]->slot = 0;
  free(h->items);
  lg_timerheap_init(h);
}

int lg_timerheap_add(lg_timerheap *h, lg_timer *t, double due) {
  if (t->slot) lg_timerheap_remove(h, t);
  if (h->count == h->cap) {
    size_t cap = h->cap ? h->cap * 2 : 64;
    lg_timer **items = realloc(h->items, cap * sizeof *items);
    if (!items) return -1;
    h->items = items;
    h->cap = cap;
  }
  t->due = due;
  t->seq = h->next_seq++;
  place(h, h->count++, t);
  sift_up(h, h->count - 1);
  return 0;
}

void lg_timerheap_remove(lg_timerheap *h, lg_timer *t) {
  if (!t->slot) return;
  size_t i = t->slot - 1;
  t->slot = 0;
  lg_timer *last = h->items[--h->count];
  if (i == h->count) return;
  place(h, i, last);
  if (i > 0 && earlier(last, h->items[(i - 1) / 2])) sift_up(h, i);
  else sift_down(h, i);
}

lg_timer *lg_timerheap_peek(const lg_timerheap *h) {
  return h->count ? h->items[0] : NULL;
}
