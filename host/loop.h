/* The event loop and its tasks: one libuv loop per Lua state, Lua coroutines
 * as tasks, one clock (monotonic or virtual) for every timer. Only the
 * scheduler resumes tasks; libuv and libcurl callbacks just call
 * lg_task_wake() to mark a task ready. */
#ifndef LG_LOOP_H
#define LG_LOOP_H

#include <lua.h>
#include <sys/socket.h>
#include <uv.h>

#include "timerheap.h"

typedef struct lg_loop lg_loop;
typedef struct lg_task lg_task;
typedef struct lg_wait lg_wait;

/* What a suspended task waits on. A primitive embeds one in its own state,
 * sets `cancel`, and calls lg_task_suspend(). Exactly one of lg_task_wake()
 * (the operation finished) or the cancel hook (the task was cancelled) ends
 * the wait. */
struct lg_wait {
  lg_task *task;               /* set by lg_task_suspend */
  void (*cancel)(lg_wait *w);  /* stop the operation; must not wake */
};

/* The loop of this Lua state, created on first use (lives in the registry). */
lg_loop *lg_loop_get(lua_State *L);
uv_loop_t *lg_loop_uv(lg_loop *loop);
/* Seconds on the loop's clock: monotonic, or virtual when switched. */
double lg_loop_now(lg_loop *loop);

/* Timers on the loop's clock; `fire` runs in the scheduler, not in Lua. */
int lg_loop_timer_start(lg_loop *loop, lg_timer *t, double seconds);
void lg_loop_timer_stop(lg_loop *loop, lg_timer *t);

/* In-flight operations that make progress without any timer (HTTP
 * transfers, connects, writes, child processes, Redis commands, journal
 * writes): while some are in flight, a loop with no timer and no active
 * handle is not deadlocked. */
void lg_loop_busy(lg_loop *loop, int delta);
/* In-flight work whose end comes from outside the loop: a transfer or a
 * connection to a peer that is not a listener of this loop, a Redis
 * connect or command, a child process that runs or is waited on. While
 * some is in flight the virtual clock does not jump: it follows real time
 * (the rule is in loop.c's header). */
void lg_loop_real(lg_loop *loop, int delta);
/* Tells the virtual clock that something happened (called by I/O
 * callbacks): the loop is not idle yet. */
void lg_loop_activity(lg_loop *loop);
/* In-flight work of the host's own on another thread, which always ends
 * and which the virtual clock must never overtake, however long it takes
 * in real time (a name lookup in curl's resolver thread, a journal
 * transaction): while some is held, virtual time stands. */
void lg_loop_hold(lg_loop *loop, int delta);

/* Work whose owner let go while only an event can close its handles (a
 * killed child's exit) registers a closer: when the loop itself closes (at
 * lua_close) it calls close(c) first, so the owner closes its handles with
 * its own callbacks, which free it, before every other handle is closed
 * with none. lg_loop_closer_remove is idempotent. */
typedef struct lg_closer lg_closer;
struct lg_closer {
  void (*close)(lg_closer *c);
  lg_closer *prev, *next;
  int linked;
};
void lg_loop_closer_add(lg_loop *loop, lg_closer *c);
void lg_loop_closer_remove(lg_loop *loop, lg_closer *c);

/* A TCP listener of this loop, registered by host/tcp.c while it listens:
 * a connection to its address is served by this loop's own tasks (the
 * mock provider, the specs' servers), so it is not real work. */
typedef struct lg_listener lg_listener;
struct lg_listener {
  struct sockaddr_storage addr;  /* the bound address */
  lg_listener *prev, *next;
  int listed;
};
void lg_loop_listener_add(lg_loop *loop, lg_listener *l);
/* Harmless when `l` is not listed. */
void lg_loop_listener_remove(lg_loop *loop, lg_listener *l);
/* True when a TCP connection to `peer` reaches a listener of this loop. */
int lg_loop_serves(lg_loop *loop, const struct sockaddr *peer);

/* Suspends the calling Lua code until `w` is woken, then calls `k`. Inside a
 * task this yields to the scheduler; elsewhere (top-level code, a foreign
 * coroutine) it runs the scheduler until `w` is woken. If the task is
 * cancelled, the cancel hook runs and a `cancelled` error is raised here. */
int lg_task_suspend(lua_State *L, lg_wait *w, lua_KContext ctx, lua_KFunction k);
/* Marks the waiting task ready; safe from any callback. */
void lg_task_wake(lg_wait *w);

/* Registers spawn, sleep, now, clock, run, ... into the table on the stack. */
void lg_loop_register(lua_State *L);

#endif
