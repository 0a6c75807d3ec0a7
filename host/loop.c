/* The event loop and its tasks.
 *
 * One lg_loop per Lua state, kept in the registry. Tasks are coroutines that
 * only the scheduler (run_until) resumes. A primitive that waits fills an
 * lg_wait and calls lg_task_suspend(); whatever completes the operation calls
 * lg_task_wake() from a libuv/libcurl callback, which only queues the task.
 * Cancellation ends a wait through its cancel hook and raises `cancelled` at
 * the suspension point, so pcall handlers and <close> variables run.
 *
 * The virtual clock. The clock is monotonic, or virtual (specs, `luagent
 * run --virtual-clock`), so that waits on timers take no real time. What is
 * in flight decides how virtual time moves:
 * - the loop's own work (tasks, timers, and the sockets between this loop
 *   and its own listeners: the mock provider, the specs' servers): time
 *   jumps to the next timer once the loop is idle, that is no task ready,
 *   no timer due, and two passes of the I/O loop in a row that ran no
 *   callback (libuv runs a finished write's callback one pass later; a
 *   segment between two sockets of the process is in the receiving socket
 *   when the sending call returns, as Linux runs loopback in the sender's
 *   context unless its softirq budget is spent). No guess on timing: a
 *   transfer is the loop's own when the address curl connects to is a
 *   listener of this loop (host/tcp.c registers them, lg_loop_serves;
 *   host/addr.c says which addresses reach which);
 * - real work (lg_loop_real: a transfer or connection to any other peer, a
 *   Redis connect or command, a child process that runs or is waited on):
 *   its end comes from outside, in real time, so while some is in flight
 *   time does not jump. The loop waits for real events as on the real
 *   clock, and virtual time moves on by the real time it waited: a reply
 *   that takes 200 ms costs 200 ms, and a timeout that guards real work
 *   fires after as many real seconds as on the real clock;
 * - held work (lg_loop_hold: a name lookup in curl's resolver thread, a
 *   journal transaction in the SQLite writer's): the host's own work off
 *   the loop, which always ends and whose time a simulation should not
 *   see: time stands until it is done.
 *
 * A task may run under a sandbox box (host/sandbox.c: a Lua tool): every
 * resume of it is armed with the box, and the tasks it spawns share it
 * (a daemon does not: it outlives the call that started it). */
#include "loop.h"
#include "addr.h"
#include "core.h"
#include "errors.h"
#include "sandbox.h"

#include <lauxlib.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define LOOP_KEY "luagent.Loop"
#define TASKS_KEY "luagent.Tasks"
#define TASK_MT "luagent.Task"
#define SLEEP_MT "luagent.Sleep"
#define JOIN_MT "luagent.Join"
#define TRAP_MT "luagent.SigintWait"

enum { T_READY, T_RUNNING, T_WAITING, T_DONE };

struct lg_task {
  lg_loop *loop;
  lua_State *co;        /* the coroutine; NULL for a blocking root */
  int co_ref;           /* registry ref to co while the task is alive */
  int self_ref;         /* registry ref to the userdata while alive */
  int state;
  int nargs;            /* arguments waiting for the first resume */
  int daemon;           /* run() does not wait for it */
  int cancel_pending;   /* raise `cancelled` at the next suspension */
  int cancelled;        /* the current wait ended by cancellation */
  int cancel_reason_ref;
  int ok;               /* T_DONE: returned normally */
  int result_ref;       /* T_DONE: {n=, ...} or {err=, traceback=} */
  int observed;         /* a join saw the outcome */
  lg_wait *wait;        /* T_WAITING: what it waits on */
  lua_KFunction k;      /* continuation of the primitive that suspended */
  lua_KContext kctx;
  lg_task *next_ready;
  struct joiner *joiners;      /* tasks waiting in join() for this one */
  int box_ref;          /* registry ref to the sandbox box it runs under */
  int stopped;          /* T_DONE: ended by its box's stop (not reported) */
};

struct joiner {
  lg_wait w;
  lg_task *target;
  struct joiner *next, *prev;
};

struct lg_loop {
  uv_loop_t uv;
  uv_timer_t wake;        /* real mode: armed for the earliest lg_timer */
  uv_async_t sigwake;     /* the stop signal's handler wakes the loop */
  lg_task *sigint_task;   /* kept alive by sigint_ref */
  int sigint_ref;         /* registry ref to sigint_task's userdata */
  volatile sig_atomic_t sigints;   /* stop signals received */
  volatile sig_atomic_t first_sig; /* SIGINT or SIGTERM */
  lua_State *volatile running;     /* the task coroutine being resumed */
  pthread_t signal_thread;         /* on_sigint: the thread that runs the loop (a
                                    * stop signal delivered to a libuv or libcurl
                                    * worker is passed on to it) */
  int sigint_trap;                 /* sigint_trap(true): a SIGINT is counted, no stop */
  volatile sig_atomic_t trapped;   /* SIGINTs trapped, not yet taken by sigint_wait */
  lg_wait *trap_wait;              /* the task waiting in sigint_wait, if any */
  lua_Hook saved_hook;             /* the hook a stop signal displaced (a */
  int saved_mask, saved_count;     /* tool's stuck-code guard): put back */
  lg_timerheap timers;
  size_t background_timers; /* armed timers with `background` set */
  int is_virtual;
  double vnow;
  lg_task *ready_head, *ready_tail;
  int live;               /* tasks not yet done */
  int live_daemons;
  int busy;
  int real;               /* lg_loop_real: virtual time follows real time */
  int held;               /* lg_loop_hold: virtual time stands */
  unsigned long activity;
  lg_closer *closers;     /* lg_loop_closer_add: called when the loop closes */
  lg_listener *listeners; /* this loop's own TCP listeners */
  int closed;
};

/* ------------------------------------------------------------------ clock */

static double real_now(void) { return (double)uv_hrtime() / 1e9; }

double lg_loop_now(lg_loop *loop) {
  return loop->is_virtual ? loop->vnow : real_now();
}

uv_loop_t *lg_loop_uv(lg_loop *loop) { return &loop->uv; }

void lg_loop_busy(lg_loop *loop, int delta) { loop->busy += delta; }

void lg_loop_real(lg_loop *loop, int delta) { loop->real += delta; }

void lg_loop_activity(lg_loop *loop) { loop->activity++; }

void lg_loop_hold(lg_loop *loop, int delta) { loop->held += delta; }

void lg_loop_closer_add(lg_loop *loop, lg_closer *c) {
  if (c->linked) return;
  c->linked = 1;
  c->prev = NULL;
  c->next = loop->closers;
  if (loop->closers) loop->closers->prev = c;
  loop->closers = c;
}

void lg_loop_closer_remove(lg_loop *loop, lg_closer *c) {
  if (!c->linked) return;
  c->linked = 0;
  if (c->prev) c->prev->next = c->next;
  else loop->closers = c->next;
  if (c->next) c->next->prev = c->prev;
  c->prev = c->next = NULL;
}

void lg_loop_listener_add(lg_loop *loop, lg_listener *l) {
  if (l->listed) return;
  l->prev = NULL;
  l->next = loop->listeners;
  if (l->next) l->next->prev = l;
  loop->listeners = l;
  l->listed = 1;
}

void lg_loop_listener_remove(lg_loop *loop, lg_listener *l) {
  if (!l->listed) return;
  if (l->prev) l->prev->next = l->next;
  else loop->listeners = l->next;
  if (l->next) l->next->prev = l->prev;
  l->prev = l->next = NULL;
  l->listed = 0;
}

int lg_loop_serves(lg_loop *loop, const struct sockaddr *peer) {
  for (lg_listener *l = loop->listeners; l; l = l->next)
    if (lg_addr_reaches((const struct sockaddr *)&l->addr, peer)) return 1;
  return 0;
}

/* Disarms `t`, keeping the count of background timers. */
static void disarm(lg_loop *loop, lg_timer *t) {
  if (t->background && lg_timer_armed(t)) loop->background_timers--;
  lg_timerheap_remove(&loop->timers, t);
}

int lg_loop_timer_start(lg_loop *loop, lg_timer *t, double seconds) {
  if (!(seconds > 0)) seconds = 0; /* also maps NaN to 0 */
  if (isinf(seconds)) { /* never due: leave it unarmed */
    disarm(loop, t);
    return 0;
  }
  int was_armed = lg_timer_armed(t);
  if (lg_timerheap_add(&loop->timers, t, lg_loop_now(loop) + seconds) != 0) return -1;
  if (t->background && !was_armed) loop->background_timers++;
  return 0;
}

void lg_loop_timer_stop(lg_loop *loop, lg_timer *t) {
  disarm(loop, t);
}

/* Fires every timer that is due; returns how many fired. */
static int fire_due_timers(lg_loop *loop) {
  double now = lg_loop_now(loop);
  int fired = 0;
  lg_timer *t;
  while ((t = lg_timerheap_peek(&loop->timers)) && t->due <= now) {
    disarm(loop, t);
    t->fire(t);
    fired++;
  }
  return fired;
}

static void wake_cb(uv_timer_t *h) { (void)h; }

/* The longest the virtual clock waits for real events at once when no
 * timer is nearer; it then looks again. This bounds nothing but a wait no
 * handle would end: the next event ends a wait at once. */
#define REAL_WAIT_MAX 1.0

/* Virtual mode, real or held work in flight: waits for the next real
 * event, as the real clock would, at most until the next timer is due
 * counted in real seconds, and moves virtual time on by the real time
 * waited; while work is held, time stands (the wait is then only bounded). */
static void wait_for_real(lg_loop *loop) {
  int stand = loop->held > 0;
  double wait = REAL_WAIT_MAX;
  lg_timer *t = lg_timerheap_peek(&loop->timers);
  if (!stand && t && t->due - loop->vnow < wait) wait = t->due - loop->vnow;
  uint64_t ms = wait > 0 ? (uint64_t)ceil(wait * 1000.0) : 0;
  double start = real_now();
  uv_update_time(&loop->uv);
  uv_timer_start(&loop->wake, wake_cb, ms, 0);
  uv_run(&loop->uv, UV_RUN_ONCE);
  uv_timer_stop(&loop->wake);
  if (!stand) loop->vnow += real_now() - start;
}

/* Real mode: arms the libuv timer for the earliest lg_timer. */
static void arm_wake(lg_loop *loop) {
  lg_timer *t = lg_timerheap_peek(&loop->timers);
  if (!t) {
    uv_timer_stop(&loop->wake);
    return;
  }
  double wait = t->due - real_now();
  uint64_t ms = wait > 0 ? (uint64_t)ceil(wait * 1000.0) : 0;
  uv_update_time(&loop->uv);
  uv_timer_start(&loop->wake, wake_cb, ms, 0);
}

/* ------------------------------------------------------------- the loop */

static int l_loop_gc(lua_State *L);
static void stop_signals_forget(lg_loop *loop);

static void walk_close(uv_handle_t *h, void *arg) {
  (void)arg;
  if (!uv_is_closing(h)) uv_close(h, NULL);
}

lg_loop *lg_loop_get(lua_State *L) {
  lg_loop *loop;
  if (lua_getfield(L, LUA_REGISTRYINDEX, LOOP_KEY) == LUA_TUSERDATA) {
    loop = lua_touserdata(L, -1);
    lua_pop(L, 1);
    return loop;
  }
  lua_pop(L, 1);
  loop = lua_newuserdatauv(L, sizeof *loop, 0);
  memset(loop, 0, sizeof *loop);
  loop->closed = 1; /* safe for __gc until init succeeds */
  loop->sigint_ref = LUA_NOREF;
  lua_createtable(L, 0, 1);
  lua_pushcfunction(L, l_loop_gc);
  lua_setfield(L, -2, "__gc");
  lua_setmetatable(L, -2);
  if (uv_loop_init(&loop->uv) != 0) luaL_error(L, "luagent: cannot start the event loop");
  loop->closed = 0;
  /* Referenced: while armed it is what keeps uv_run() waiting. */
  uv_timer_init(&loop->uv, &loop->wake);
  lg_timerheap_init(&loop->timers);
  lua_setfield(L, LUA_REGISTRYINDEX, LOOP_KEY);
  return loop;
}

/* Closes every handle still open and the loop itself (at lua_close). */
static int l_loop_gc(lua_State *L) {
  lg_loop *loop = lua_touserdata(L, 1);
  if (loop->closed) return 0;
  loop->closed = 1;
  stop_signals_forget(loop);
  while (loop->closers) {
    lg_closer *c = loop->closers;
    lg_loop_closer_remove(loop, c);
    c->close(c);
  }
  uv_walk(&loop->uv, walk_close, NULL);
  uv_run(&loop->uv, UV_RUN_DEFAULT);
  uv_loop_close(&loop->uv);
  lg_timerheap_free(&loop->timers);
  return 0;
}

/* ----------------------------------------------------------------- tasks */

/* The task whose coroutine is L, or NULL (main thread, foreign coroutine).
 * A registry table maps each live task's thread to its task. */
static lg_task *task_of(lua_State *L) {
  lua_getfield(L, LUA_REGISTRYINDEX, TASKS_KEY);
  lua_pushthread(L);
  lg_task *t = lua_istable(L, -2) && lua_rawget(L, -2) == LUA_TLIGHTUSERDATA
                   ? lua_touserdata(L, -1) : NULL;
  lua_pop(L, 2);
  return t;
}

/* Maps co to t in the registry (t NULL: removes the entry). */
static void set_task_of(lua_State *L, lua_State *co, lg_task *t) {
  luaL_getsubtable(L, LUA_REGISTRYINDEX, TASKS_KEY);
  lua_pushthread(co);
  lua_xmove(co, L, 1);
  if (t) lua_pushlightuserdata(L, t);
  else lua_pushnil(L);
  lua_rawset(L, -3);
  lua_pop(L, 1);
}

static void push_ready(lg_task *t) {
  lg_loop *loop = t->loop;
  t->state = T_READY;
  t->next_ready = NULL;
  if (loop->ready_tail) loop->ready_tail->next_ready = t;
  else loop->ready_head = t;
  loop->ready_tail = t;
}

void lg_task_wake(lg_wait *w) {
  lg_task *t = w->task;
  if (!t || t->state != T_WAITING || t->wait != w) return;
  w->task = NULL; /* a late wake of an ended wait is a no-op */
  t->wait = NULL;
  t->loop->activity++;
  if (!t->co) t->state = T_READY; /* a blocking root: its run_until sees it */
  else push_ready(t);
}

/* Ends t's wait by cancellation: stops the operation, queues the task. */
static void cancel_wait(lg_task *t) {
  lg_wait *w = t->wait;
  t->wait = NULL;
  t->cancelled = 1;
  if (w) w->task = NULL;
  if (w && w->cancel) w->cancel(w);
  if (!t->co) t->state = T_READY;
  else push_ready(t);
}

static void push_cancelled(lua_State *L, lg_task *t) {
  lg_error_push(L, LG_ERR_CANCELLED, "task cancelled");
  if (t && t->cancel_reason_ref != LUA_NOREF) {
    lua_rawgeti(L, LUA_REGISTRYINDEX, t->cancel_reason_ref);
    if (lua_type(L, -1) == LUA_TSTRING)
      lua_pushfstring(L, "task cancelled: %s", lua_tostring(L, -1));
    else
      lua_pushliteral(L, "task cancelled");
    lua_setfield(L, -3, "message");
    lua_setfield(L, -2, "reason");
  }
}

static int raise_cancelled(lua_State *L, lg_task *t) {
  if (t) t->cancel_pending = t->cancelled = 0;
  push_cancelled(L, t);
  return lua_error(L);
}

static int root_ready(void *arg) { return ((lg_task *)arg)->state != T_WAITING; }

static int run_until(lg_loop *loop, lua_State *L, int (*done)(void *), void *arg);

/* Continuation of every suspension: raise if cancelled, else go on. */
static int resume_k(lua_State *L, int status, lua_KContext ctx) {
  (void)ctx;
  lg_task *t = task_of(L);
  if (t->cancelled || t->cancel_pending) return raise_cancelled(L, t);
  return t->k(L, status, t->kctx);
}

/* Ends a wait nobody will wake: detaches it and undoes what its primitive
 * began (the cancel hook). */
static void drop_wait(lg_wait *w) {
  w->task = NULL;
  if (w->cancel) w->cancel(w);
}

int lg_task_suspend(lua_State *L, lg_wait *w, lua_KContext ctx, lua_KFunction k) {
  lg_loop *loop = lg_loop_get(L);
  lg_task *t = task_of(L);
  if (t && t->box_ref != LUA_NOREF) {
    /* a task its box stopped may not wait: it is to end at once */
    lua_rawgeti(L, LUA_REGISTRYINDEX, t->box_ref);
    if (lg_sandbox_stopped(L, -1)) {
      drop_wait(w);
      return lg_sandbox_raise(L, -1);
    }
    lua_pop(L, 1);
  }
  if (t && t->cancel_pending) {
    drop_wait(w);
    return raise_cancelled(L, t);
  }
  if (t && lua_isyieldable(L)) {
    w->task = t;
    t->wait = w;
    t->state = T_WAITING;
    t->k = k;
    t->kctx = ctx;
    return lua_yieldk(L, 0, 0, resume_k);
  }
  if (!t && lg_sandbox_running(L)) {
    /* Sandboxed code that is no task (a hook, or a coroutine of a tool's
     * own) runs to completion: a wait would run the scheduler, and other
     * tasks, inside its bounds. */
    drop_wait(w);
    return luaL_error(L, "sandboxed code may not wait (it runs to completion)");
  }
  if (t) {
    /* A task inside a C call that cannot yield (a table.sort comparator, a
     * gsub callback, a metamethod called from C). Running the scheduler on
     * this C stack would nest waits: other tasks' wake-ups would wait for
     * this one. Refuse, as OpenResty does, and undo what the primitive began. */
    drop_wait(w);
    return luaL_error(L, "luagent: cannot wait inside a C call that cannot yield "
                         "(a table.sort comparator, a gsub callback, a metamethod): "
                         "move the wait out of it");
  }
  /* Not a task (a plain script, a foreign coroutine): drive the loop until
   * this wait ends. */
  lg_task root;
  memset(&root, 0, sizeof root);
  root.loop = loop;
  root.state = T_WAITING;
  root.wait = w;
  root.cancel_reason_ref = LUA_NOREF;
  w->task = &root;
  int rc = run_until(loop, L, root_ready, &root);
  if (rc != 0) {
    root.wait = NULL;
    drop_wait(w); /* root dies with this frame */
    return luaL_error(L, "luagent: deadlock: waiting on something that can never happen");
  }
  if (root.cancelled) return raise_cancelled(L, NULL);
  return k(L, LUA_OK, ctx);
}

/* Stores the outcome of a finished coroutine and wakes its joiners. */
static void finish_task(lua_State *L, lg_task *t, int status, int nres) {
  lg_loop *loop = t->loop;
  lua_State *co = t->co;
  if (status == LUA_OK) {
    lua_xmove(co, L, nres);
    lua_createtable(L, nres, 1);
    lua_insert(L, -(nres + 1));
    for (int i = nres; i >= 1; i--) lua_rawseti(L, -(i + 1), i);
    lua_pushinteger(L, nres);
    lua_setfield(L, -2, "n");
    t->ok = 1;
  } else {
    lua_createtable(L, 0, 2);
    lua_pushvalue(co, -1);
    lua_xmove(co, L, 1);
    lua_setfield(L, -2, "err");
    luaL_traceback(L, co, NULL, 0);
    lua_setfield(L, -2, "traceback");
    t->ok = 0;
  }
  t->result_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  if (t->box_ref != LUA_NOREF) {
    /* its pending <close> variables run under its box too */
    lua_rawgeti(L, LUA_REGISTRYINDEX, t->box_ref);
    int armed = lg_sandbox_arm(L, -1, co) == 0;
    lua_resetthread(co);
    if (armed) lg_sandbox_disarm(L, -1);
    t->stopped = status != LUA_OK && lg_sandbox_stopped(L, -1);
    lua_pop(L, 1);
    luaL_unref(L, LUA_REGISTRYINDEX, t->box_ref);
    t->box_ref = LUA_NOREF;
  } else {
    lua_resetthread(co); /* runs pending <close> variables */
  }
  set_task_of(L, co, NULL);
  t->state = T_DONE;
  luaL_unref(L, LUA_REGISTRYINDEX, t->co_ref);
  t->co_ref = LUA_NOREF;
  t->co = NULL;
  loop->live--;
  if (t->daemon) loop->live_daemons--;
  while (t->joiners) {
    struct joiner *j = t->joiners;
    t->joiners = j->next;
    j->next = j->prev = NULL;
    j->target = NULL;
    lg_task_wake(&j->w);
  }
  luaL_unref(L, LUA_REGISTRYINDEX, t->self_ref);
  t->self_ref = LUA_NOREF;
}

static void finish_cancelled_unstarted(lua_State *L, lg_task *t) {
  lua_settop(t->co, 0);
  push_cancelled(t->co, t);
  finish_task(L, t, LUA_ERRRUN, 0);
}

/* Sets the coroutine the signal handler interrupts; returns the previous
 * one (a blocking wait resumes tasks from inside another). */
static lua_State *loop_running_swap(lg_loop *loop, lua_State *co) {
  lua_State *prev = loop->running;
  loop->running = co;
  return prev;
}

static void resume_task(lua_State *L, lg_task *t) {
  int nargs = 0, nres = 0;
  if (t->nargs >= 0) { /* first resume */
    nargs = t->nargs;
    t->nargs = -1;
    if (t->cancel_pending) {
      finish_cancelled_unstarted(L, t);
      return;
    }
  }
  int box = 0;
  if (t->box_ref != LUA_NOREF) {
    lua_rawgeti(L, LUA_REGISTRYINDEX, t->box_ref);
    box = lua_gettop(L);
    if (lg_sandbox_arm(L, box, t->co) != 0) {
      /* its box runs already (it cannot: a box's tasks run one at a time) */
      lua_pop(L, 1);
      lua_pushliteral(t->co, "sandbox: the task's box is running already");
      finish_task(L, t, LUA_ERRRUN, 0);
      return;
    }
  }
  t->state = T_RUNNING;
  lua_State *outer = loop_running_swap(t->loop, t->co);
  int status = lua_resume(t->co, L, nargs, &nres);
  loop_running_swap(t->loop, outer);
  if (box) {
    lg_sandbox_disarm(L, box);
    lua_pop(L, 1);
  }
  if (status == LUA_YIELD) {
    lua_pop(t->co, nres);
    if (t->state == T_RUNNING) push_ready(t); /* plain coroutine.yield() */
    return;
  }
  finish_task(L, t, status, nres);
}

/* Resumes the tasks that are ready now; those readied meanwhile wait. */
static void run_ready(lg_loop *loop, lua_State *L) {
  lg_task *tail = loop->ready_tail;
  while (loop->ready_head) {
    lg_task *t = loop->ready_head;
    loop->ready_head = t->next_ready;
    if (!loop->ready_head) loop->ready_tail = NULL;
    t->next_ready = NULL;
    resume_task(L, t);
    if (t == tail) break;
  }
}

/* The scheduler: runs tasks, timers and I/O until done(arg). 0, or -1 when
 * nothing can happen any more (a deadlock). Re-entrant: a blocking wait
 * runs a nested scheduler, which never resumes a running task. */
static int run_until(lg_loop *loop, lua_State *L, int (*done)(void *), void *arg) {
  for (;;) {
    if (done(arg)) return 0;
    if (loop->ready_head) {
      run_ready(loop, L);
      uv_run(&loop->uv, UV_RUN_NOWAIT);
      continue;
    }
    if (fire_due_timers(loop)) continue;
    /* background timers (a heartbeat) cannot end a wait of the others */
    int have_timers = loop->timers.count > loop->background_timers;
    if (!have_timers && !uv_loop_alive(&loop->uv) && loop->busy == 0 && loop->real == 0 &&
        loop->held == 0)
      return -1;
    if (loop->is_virtual) {
      /* the rule is in the header: jump only when idle with nothing real
       * or held in flight */
      unsigned long before = loop->activity;
      uv_run(&loop->uv, UV_RUN_NOWAIT);
      if (loop->ready_head || loop->activity != before) continue;
      if (loop->real > 0 || loop->held > 0) {
        wait_for_real(loop);
        continue;
      }
      uv_run(&loop->uv, UV_RUN_NOWAIT); /* the callbacks libuv deferred */
      if (loop->ready_head || loop->activity != before) continue;
      lg_timer *next = lg_timerheap_peek(&loop->timers);
      if (next) {
        if (next->due > loop->vnow) loop->vnow = next->due;
        continue;
      }
      uv_run(&loop->uv, UV_RUN_ONCE);
    } else {
      arm_wake(loop);
      uv_run(&loop->uv, UV_RUN_ONCE);
    }
  }
}

static lg_task *check_task(lua_State *L, int i) {
  return luaL_checkudata(L, i, TASK_MT);
}

/* spawn(fn, ...) -> task: queues fn(...) as a new task. */
static int l_spawn(lua_State *L) {
  luaL_checktype(L, 1, LUA_TFUNCTION);
  lg_loop *loop = lg_loop_get(L);
  int nargs = lua_gettop(L) - 1;
  lg_task *t = lua_newuserdatauv(L, sizeof *t, 0);
  memset(t, 0, sizeof *t);
  t->loop = loop;
  t->co_ref = t->self_ref = t->result_ref = t->cancel_reason_ref = t->box_ref = LUA_NOREF;
  t->state = T_DONE; /* safe for __gc until it is queued */
  t->ok = 1;
  luaL_setmetatable(L, TASK_MT);
  lua_State *co = lua_newthread(L);
  set_task_of(L, co, t);
  t->co = co;
  t->co_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  lua_pushvalue(L, -1);
  t->self_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  for (int i = 1; i <= nargs + 1; i++) lua_pushvalue(L, i);
  lua_xmove(L, co, nargs + 1);
  t->nargs = nargs;
  t->ok = 0;
  lg_task *parent = task_of(L);
  if (parent && parent->box_ref != LUA_NOREF) { /* a tool's helpers share its bounds */
    lua_rawgeti(L, LUA_REGISTRYINDEX, parent->box_ref);
    t->box_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  }
  lg_sandbox_unhook(co); /* inherited from a boxed parent; a box arms its own */
  loop->live++;
  push_ready(t);
  return 1;
}

/* Pushes a finished task's results, or raises its error. */
static int push_outcome(lua_State *L, lg_task *t) {
  t->observed = 1;
  lua_rawgeti(L, LUA_REGISTRYINDEX, t->result_ref);
  int res = lua_gettop(L);
  if (t->ok) {
    lua_getfield(L, res, "n");
    int n = (int)lua_tointeger(L, -1);
    lua_pop(L, 1);
    luaL_checkstack(L, n, "too many results");
    for (int i = 1; i <= n; i++) lua_rawgeti(L, res, i);
    return n;
  }
  lua_getfield(L, res, "err");
  if (lua_istable(L, -1)) {
    if (lua_getfield(L, -1, "traceback") == LUA_TNIL) {
      lua_getfield(L, res, "traceback");
      lua_setfield(L, -3, "traceback");
    }
    lua_pop(L, 1);
  } else if (lua_type(L, -1) == LUA_TSTRING) {
    lua_getfield(L, res, "traceback");
    lua_pushfstring(L, "%s\n%s", lua_tostring(L, -2), lua_tostring(L, -1));
  }
  return lua_error(L);
}

static void join_cancel(lg_wait *w) {
  struct joiner *j = (struct joiner *)w;
  if (!j->target) return;
  if (j->prev) j->prev->next = j->next;
  else j->target->joiners = j->next;
  if (j->next) j->next->prev = j->prev;
  j->next = j->prev = NULL;
  j->target = NULL;
}

static int join_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  (void)ctx;
  return push_outcome(L, check_task(L, 1));
}

/* task:join() -> results of the task, or raises its error. */
static int l_task_join(lua_State *L) {
  lg_task *t = check_task(L, 1);
  lua_settop(L, 1);
  if (t->state == T_DONE) return push_outcome(L, t);
  if (task_of(L) == t) return luaL_error(L, "join: a task cannot join itself");
  struct joiner *j = lua_newuserdatauv(L, sizeof *j, 0);
  memset(j, 0, sizeof *j);
  luaL_setmetatable(L, JOIN_MT);
  j->w.cancel = join_cancel;
  j->target = t;
  j->next = t->joiners;
  if (t->joiners) t->joiners->prev = j;
  t->joiners = j;
  return lg_task_suspend(L, &j->w, 0, join_k);
}

/* A joiner collected while still linked (lua_close) unlinks itself. */
static int l_join_gc(lua_State *L) {
  struct joiner *j = lua_touserdata(L, 1);
  join_cancel(&j->w);
  return 0;
}

/* task:cancel([reason]) -> true if the task was still running. */
static int l_task_cancel(lua_State *L) {
  lg_task *t = check_task(L, 1);
  if (t->state == T_DONE) {
    lua_pushboolean(L, 0);
    return 1;
  }
  if (t->cancel_reason_ref == LUA_NOREF && !lua_isnoneornil(L, 2)) {
    lua_pushvalue(L, 2);
    t->cancel_reason_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  }
  if (t->state == T_WAITING) {
    cancel_wait(t);
  } else {
    t->cancel_pending = 1;
  }
  lua_pushboolean(L, 1);
  return 1;
}

/* task:status() -> "ready" | "running" | "waiting" | "done" | "failed". */
static int l_task_status(lua_State *L) {
  lg_task *t = check_task(L, 1);
  static const char *names[] = {"ready", "running", "waiting", "done"};
  if (t->state == T_DONE && !t->ok) lua_pushliteral(L, "failed");
  else lua_pushstring(L, names[t->state]);
  return 1;
}

/* task:set_daemon(on): run() and `luagent run` do not wait for daemons. */
static int l_task_set_daemon(lua_State *L) {
  lg_task *t = check_task(L, 1);
  int on = lua_toboolean(L, 2);
  if (t->state != T_DONE && on != t->daemon) t->loop->live_daemons += on ? 1 : -1;
  t->daemon = on;
  if (on && t->state != T_RUNNING) { /* a daemon is not part of the call that started it */
    luaL_unref(L, LUA_REGISTRYINDEX, t->box_ref);
    t->box_ref = LUA_NOREF;
    if (t->co) lg_sandbox_unhook(t->co);
  }
  lua_settop(L, 1);
  return 1;
}

/* task:set_sandbox(box | nil) -> task: the task runs under `box` (a
 * core.sandbox) from its next resume on, or under none. Not for the
 * running task. */
static int l_task_set_sandbox(lua_State *L) {
  lg_task *t = check_task(L, 1);
  int none = lua_isnoneornil(L, 2);
  luaL_argexpected(L, none || lg_sandbox_is_box(L, 2), 2, "sandbox or nil");
  if (t->state == T_RUNNING) return luaL_error(L, "set_sandbox: the task is running");
  luaL_unref(L, LUA_REGISTRYINDEX, t->box_ref);
  t->box_ref = LUA_NOREF;
  if (t->co) lg_sandbox_unhook(t->co); /* a box arms its own at each resume */
  if (!none && t->state != T_DONE) {
    lua_pushvalue(L, 2);
    t->box_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  }
  lua_settop(L, 1);
  return 1;
}

/* boxed_tasks(box) -> {task, ...}: the live tasks that run under `box` (a
 * Lua tool's helpers, which sandbox.run ends with it), in no order. */
static int l_boxed_tasks(lua_State *L) {
  luaL_argexpected(L, lg_sandbox_is_box(L, 1), 1, "sandbox");
  lua_settop(L, 1);
  lua_newtable(L);
  lua_Integer n = 0;
  if (lua_getfield(L, LUA_REGISTRYINDEX, TASKS_KEY) != LUA_TTABLE) {
    lua_pop(L, 1);
    return 1;
  }
  lua_pushnil(L);
  while (lua_next(L, 3)) {
    lg_task *t = lua_touserdata(L, -1);
    lua_pop(L, 1);
    if (!t || t->state == T_DONE || t->box_ref == LUA_NOREF) continue;
    lua_rawgeti(L, LUA_REGISTRYINDEX, t->box_ref);
    int same = lua_rawequal(L, -1, 1);
    lua_pop(L, 1);
    if (!same) continue;
    lua_rawgeti(L, LUA_REGISTRYINDEX, t->self_ref);
    lua_rawseti(L, 2, ++n);
  }
  lua_pop(L, 1);
  return 1;
}

/* A failed task nobody joined reports its error when collected. */
static int l_task_gc(lua_State *L) {
  lg_task *t = lua_touserdata(L, 1);
  if (t->state == T_DONE && !t->ok && !t->observed && !t->stopped && t->result_ref != LUA_NOREF) {
    lua_rawgeti(L, LUA_REGISTRYINDEX, t->result_ref);
    lua_getfield(L, -1, "err");
    int cancelled = 0;
    if (lua_istable(L, -1)) {
      lua_getfield(L, -1, "kind");
      cancelled = lua_isstring(L, -1) && strcmp(lua_tostring(L, -1), "cancelled") == 0;
      lua_pop(L, 1);
    }
    if (!cancelled) {
      lua_getfield(L, -2, "traceback");
      const char *msg = luaL_tolstring(L, -2, NULL);
      fprintf(stderr, "luagent: a task failed and was never joined: %s\n%s\n", msg,
              lua_tostring(L, -2));
      lua_pop(L, 2);
    }
    lua_pop(L, 2);
  }
  if (t->result_ref != LUA_NOREF) luaL_unref(L, LUA_REGISTRYINDEX, t->result_ref);
  if (t->cancel_reason_ref != LUA_NOREF) luaL_unref(L, LUA_REGISTRYINDEX, t->cancel_reason_ref);
  t->result_ref = t->cancel_reason_ref = LUA_NOREF;
  return 0;
}

/* ----------------------------------------------------------------- sleep */

typedef struct {
  lg_wait w;
  lg_timer timer;
  lg_loop *loop;
} sleeper;

static void sleep_fire(lg_timer *tm) {
  sleeper *s = (sleeper *)((char *)tm - offsetof(sleeper, timer));
  lg_task_wake(&s->w);
}

static void sleep_cancel(lg_wait *w) {
  sleeper *s = (sleeper *)w;
  lg_loop_timer_stop(s->loop, &s->timer);
}

static int sleep_k(lua_State *L, int status, lua_KContext ctx) {
  (void)L;
  (void)status;
  (void)ctx;
  return 0;
}

static int l_sleep_gc(lua_State *L) {
  sleeper *s = lua_touserdata(L, 1);
  if (s->loop && !s->loop->closed) lg_loop_timer_stop(s->loop, &s->timer);
  return 0;
}

/* sleep(seconds [, "background"]): waits on the loop's clock; cancellable.
 * Negative seconds mean 0; NaN and infinities are refused (a timer due at
 * inf breaks the virtual clock and the real-time wake-up). A background
 * sleep (a daemon's heartbeat) does not keep the loop alive: when every
 * other task waits on what can never happen, the loop still reports the
 * deadlock instead of waking the sleeper for ever. */
static int l_sleep(lua_State *L) {
  double secs = luaL_checknumber(L, 1);
  if (!isfinite(secs)) return luaL_error(L, "sleep: seconds must be a finite number");
  static const char *const kinds[] = {"foreground", "background", NULL};
  int background = luaL_checkoption(L, 2, "foreground", kinds);
  lg_loop *loop = lg_loop_get(L);
  sleeper *s = lua_newuserdatauv(L, sizeof *s, 0);
  memset(s, 0, sizeof *s);
  luaL_setmetatable(L, SLEEP_MT);
  s->loop = loop;
  s->w.cancel = sleep_cancel;
  s->timer.fire = sleep_fire;
  s->timer.background = background;
  if (lg_loop_timer_start(loop, &s->timer, secs) != 0) return luaL_error(L, "sleep: out of memory");
  return lg_task_suspend(L, &s->w, 0, sleep_k);
}

/* ------------------------------------------------------------ run & misc */

static int no_live_tasks(void *arg) {
  lg_loop *loop = arg;
  return loop->live - loop->live_daemons <= 0;
}

/* run(): runs the loop until every non-daemon task is done. Returns true, or
 * false and the number of tasks stuck when nothing more can happen. */
static int l_run(lua_State *L) {
  lg_loop *loop = lg_loop_get(L);
  if (task_of(L)) return luaL_error(L, "run: called from inside a task");
  if (lg_sandbox_running(L)) return luaL_error(L, "run: called from sandboxed code");
  if (run_until(loop, L, no_live_tasks, loop) != 0) {
    lua_pushboolean(L, 0);
    lua_pushinteger(L, loop->live - loop->live_daemons);
    return 2;
  }
  lua_pushboolean(L, 1);
  return 1;
}

static int l_now(lua_State *L) {
  lua_pushnumber(L, lg_loop_now(lg_loop_get(L)));
  return 1;
}

/* current() -> the running task, or nil outside tasks. */
static int l_current(lua_State *L) {
  lg_task *t = task_of(L);
  if (!t) return 0;
  lua_rawgeti(L, LUA_REGISTRYINDEX, t->self_ref);
  return 1;
}

/* clock_virtual([start]) / clock_real(): switch clocks; only while no timer
 * is armed, so no timer mixes two clocks. */
static int switch_clock(lua_State *L, int to_virtual) {
  lg_loop *loop = lg_loop_get(L);
  if (lg_timerheap_peek(&loop->timers))
    return luaL_error(L, "clock: cannot switch while timers are armed");
  loop->is_virtual = to_virtual;
  if (to_virtual) loop->vnow = luaL_optnumber(L, 1, 0);
  return 0;
}
static int l_clock_virtual(lua_State *L) { return switch_clock(L, 1); }
static int l_clock_real(lua_State *L) { return switch_clock(L, 0); }
static int l_clock_is_virtual(lua_State *L) {
  lua_pushboolean(L, lg_loop_get(L)->is_virtual);
  return 1;
}

/* stats() -> {tasks=, daemons=, timers=, busy=, real=, held=}: for specs
 * and diagnostics (busy: operations in flight; real, held: the work the
 * virtual clock waits for, see the header). */
static int l_stats(lua_State *L) {
  lg_loop *loop = lg_loop_get(L);
  lua_createtable(L, 0, 6);
  lua_pushinteger(L, loop->live);
  lua_setfield(L, -2, "tasks");
  lua_pushinteger(L, loop->live_daemons);
  lua_setfield(L, -2, "daemons");
  lua_pushinteger(L, (lua_Integer)loop->timers.count);
  lua_setfield(L, -2, "timers");
  lua_pushinteger(L, loop->busy);
  lua_setfield(L, -2, "busy");
  lua_pushinteger(L, loop->real);
  lua_setfield(L, -2, "real");
  lua_pushinteger(L, loop->held);
  lua_setfield(L, -2, "held");
  return 1;
}

/* ---------------------------------------------------- SIGINT, SIGTERM
 *
 * A stop signal must reach Lua that is busy (a loop in a script never lets
 * the loop turn), so, as lua.c does, the handler sets a hook on the running
 * task's coroutine, which raises `cancelled` there at its next instruction,
 * and wakes the loop, which cancels the on_sigint task if it waits. A
 * second signal exits at once.
 *
 * A REPL (`luagent chat`) traps SIGINT instead (sigint_trap): each Ctrl-C
 * is counted and wakes the task waiting in sigint_wait(), which decides
 * (stop the answer, drop the line typed); no hook, no cancel, no exit,
 * unless three come that nobody takes. SIGTERM stays a stop signal.
 *
 * signal_loop is a process-wide variable, one of the C core's four (the
 * other three hold the process's libcurl: curl_api.c), and it has to be: a
 * signal handler gets no argument, so the loop the signals go to can be
 * found from nowhere else.
 * One loop at a time receives them: set by on_sigint, cleared when that
 * loop closes; everything else the handler needs hangs off the loop. */

static lg_loop *volatile signal_loop;

/* The hook the handler sets: once, in the running task, raises `cancelled`
 * while the on_sigint task lives (a run being stopped stops its busy
 * tasks too); after that task ended, it does nothing. */
static void interrupt_hook(lua_State *L, lua_Debug *ar) {
  (void)ar;
  lg_loop *loop = lg_loop_get(L);
  lua_sethook(L, loop->saved_hook, loop->saved_mask, loop->saved_count);
  lg_task *t = task_of(L);
  if (!t || !loop->sigint_task || loop->sigint_task->state == T_DONE) return;
  lg_error_push(L, LG_ERR_CANCELLED, loop->first_sig == SIGTERM ? "task cancelled: terminated (SIGTERM)"
                                                           : "task cancelled: interrupted (SIGINT)");
  lua_error(L);
}

/* The handler of SIGINT and SIGTERM; async-signal-safe calls only
 * (lua_sethook is meant to be called from one, as lua.c does). */
static void on_stop_signal(int sig) {
  lg_loop *loop = signal_loop;
  if (!loop) {
    signal(sig, SIG_DFL);
    raise(sig);
    return;
  }
  if (!pthread_equal(pthread_self(), loop->signal_thread)) {
    pthread_kill(loop->signal_thread, sig);
    return;
  }
  if (sig == SIGINT && loop->sigint_trap) {
    /* a REPL's Ctrl-C: told to its sigint_wait; three it never took (its
     * Lua is stuck) end the process, as a second stop signal does */
    if (++loop->trapped >= 3) _exit(128 + SIGINT);
    uv_async_send(&loop->sigwake);
    return;
  }
  if (loop->sigints++ > 0) _exit(128 + loop->first_sig);
  loop->first_sig = sig;
  lua_State *co = loop->running;
  if (co) {
    /* reading a state's hook fields is as safe here as setting them */
    loop->saved_hook = lua_gethook(co);
    loop->saved_mask = lua_gethookmask(co);
    loop->saved_count = lua_gethookcount(co);
    lua_sethook(co, interrupt_hook, LUA_MASKCALL | LUA_MASKRET | LUA_MASKCOUNT, 1);
  }
  uv_async_send(&loop->sigwake);
}

/* On the loop, after a stop signal: cancels the on_sigint task. */
static void sigwake_cb(uv_async_t *h) {
  lg_loop *loop = h->data;
  if (loop->trapped && loop->trap_wait) {
    lg_wait *w = loop->trap_wait;
    loop->trap_wait = NULL;
    lg_task_wake(w);
  }
  if (loop->sigints == 0) return; /* only trapped SIGINTs came */
  lg_task *t = loop->sigint_task;
  if (!t || t->state == T_DONE) return;
  t->cancel_pending = 1;
  if (t->state == T_WAITING) cancel_wait(t);
}

/* The loop is closing: its signals go back to their default action. */
static void stop_signals_forget(lg_loop *loop) {
  if (signal_loop != loop) return;
  signal(SIGINT, SIG_DFL);
  signal(SIGTERM, SIG_DFL);
  signal_loop = NULL;
}

/* on_sigint(task): the first SIGINT or SIGTERM cancels `task` (and raises
 * `cancelled` in whichever task is busy running Lua), a second exits at
 * once with 128 + the first signal's number. Returns nothing;
 * interrupted() tells whether it fired. The loop holds a reference to the
 * task, so the signal never finds it freed. */
static int claim_signals(lua_State *L, lg_loop *loop, const char *fn);

static int l_on_sigint(lua_State *L) {
  lg_task *t = check_task(L, 1);
  lg_loop *loop = lg_loop_get(L);
  claim_signals(L, loop, "on_sigint");
  luaL_unref(L, LUA_REGISTRYINDEX, loop->sigint_ref);
  lua_pushvalue(L, 1);
  loop->sigint_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  loop->sigint_task = t;
  return 0;
}

/* This loop receives SIGINT and SIGTERM from now on (the handler above). */
static int claim_signals(lua_State *L, lg_loop *loop, const char *fn) {
  if (signal_loop != loop) {
    if (signal_loop) return luaL_error(L, "%s: another Lua state receives the signals", fn);
    uv_async_init(&loop->uv, &loop->sigwake, sigwake_cb);
    loop->sigwake.data = loop;
    uv_unref((uv_handle_t *)&loop->sigwake);
    loop->signal_thread = pthread_self();
    signal_loop = loop;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
  }
  return 0;
}

/* sigint_trap(on): while on, SIGINT stops nothing: each one is counted and
 * wakes the task waiting in sigint_wait() (a REPL: Ctrl-C stops an answer,
 * not the REPL). No hook is set in busy Lua and a second one does not exit
 * (three that nobody takes do). SIGTERM stays a stop signal (on_sigint). */
static int l_sigint_trap(lua_State *L) {
  lg_loop *loop = lg_loop_get(L);
  int on = lua_toboolean(L, 1);
  if (on) claim_signals(L, loop, "sigint_trap");
  loop->sigint_trap = on;
  loop->trapped = 0;
  return 0;
}

typedef struct {
  lg_wait w;
  lg_loop *loop;
} trap_waiter;

static void trap_cancel(lg_wait *w) {
  trap_waiter *tw = (trap_waiter *)w;
  if (tw->loop->trap_wait == w) tw->loop->trap_wait = NULL;
}

static int trap_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  (void)ctx;
  lg_loop *loop = lg_loop_get(L);
  int n = loop->trapped;
  loop->trapped = 0;
  lua_pushinteger(L, n);
  return 1;
}

static int l_trap_gc(lua_State *L) {
  trap_waiter *tw = lua_touserdata(L, 1);
  if (tw->loop && tw->loop->trap_wait == &tw->w) tw->loop->trap_wait = NULL;
  return 0;
}

/* sigint_wait() -> the number of SIGINTs since the last call (>= 1): waits
 * for the next one under sigint_trap(true); cancellable. One task waits at
 * a time. */
static int l_sigint_wait(lua_State *L) {
  lg_loop *loop = lg_loop_get(L);
  if (!loop->sigint_trap) return luaL_error(L, "sigint_wait: SIGINT is not trapped (sigint_trap(true))");
  if (loop->trapped > 0) return trap_k(L, LUA_OK, 0);
  if (loop->trap_wait) return luaL_error(L, "sigint_wait: another task waits for SIGINT");
  trap_waiter *tw = lua_newuserdatauv(L, sizeof *tw, 0);
  memset(tw, 0, sizeof *tw);
  luaL_setmetatable(L, TRAP_MT);
  tw->loop = loop;
  tw->w.cancel = trap_cancel;
  loop->trap_wait = &tw->w;
  return lg_task_suspend(L, &tw->w, 0, trap_k);
}

/* interrupted() -> whether a stop signal came, and its number (2 or 15). */
static int l_interrupted(lua_State *L) {
  lg_loop *loop = lg_loop_get(L);
  lua_pushboolean(L, loop->sigints > 0);
  if (loop->sigints == 0) return 1;
  lua_pushinteger(L, loop->first_sig);
  return 2;
}

void lg_loop_register(lua_State *L) {
  static const luaL_Reg task_methods[] = {
      {"join", l_task_join},     {"cancel", l_task_cancel},
      {"status", l_task_status}, {"set_daemon", l_task_set_daemon},
      {"set_sandbox", l_task_set_sandbox}, {NULL, NULL}};
  lg_class_new(L, TASK_MT, task_methods, NULL, l_task_gc);
  lg_class_new(L, SLEEP_MT, NULL, NULL, l_sleep_gc);
  lg_class_new(L, JOIN_MT, NULL, NULL, l_join_gc);
  lg_class_new(L, TRAP_MT, NULL, NULL, l_trap_gc);

  static const luaL_Reg funcs[] = {
      {"spawn", l_spawn},
      {"sleep", l_sleep},
      {"now", l_now},
      {"run", l_run},
      {"current", l_current},
      {"clock_virtual", l_clock_virtual},
      {"clock_real", l_clock_real},
      {"clock_is_virtual", l_clock_is_virtual},
      {"stats", l_stats},
      {"on_sigint", l_on_sigint},
      {"interrupted", l_interrupted},
      {"sigint_trap", l_sigint_trap},
      {"sigint_wait", l_sigint_wait},
      {"boxed_tasks", l_boxed_tasks},
      {NULL, NULL}};
  luaL_setfuncs(L, funcs, 0);
  lg_loop_get(L);
}
