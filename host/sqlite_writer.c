/* A SQLite writer off the loop: a thread with a connection of its own runs
 * transactions for tasks, one after the other, so a commit (and the WAL
 * checkpoints and fsyncs SQLite does inside commits) never stops the loop:
 * the task that asked waits, every other task runs on.
 *
 *   core.sqlite_writer(path, [opts]) -> writer | nil, err
 *   writer:tx({sql, param...}, ...) -> true, changes | nil, err
 *       one transaction (BEGIN IMMEDIATE ... COMMIT) of the statements;
 *       suspends the calling task until it is committed or rolled back
 *   writer:close()   (idempotent; also __gc/__close): finishes queued work
 *
 * Errors are records of kind "journal", as in sqlite_lua.c. Ownership: a
 * job belongs to the queue, then to the thread, then to the done list, then
 * to the task that waits (which frees it), or to the loop callback when
 * that task was cancelled meanwhile. */
#include <lauxlib.h>
#include <sqlite3.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "core.h"
#include "errors.h"
#include "loop.h"
#include "sqlite_lua.h"

#define WRITER_MT "luagent.SqliteWriter"
#define JOB_MT "luagent.SqliteJob"
#define MAX_CACHED 32

typedef struct {
  int type;       /* LUA_TNIL, LUA_TBOOLEAN, LUA_TNUMBER (integer or not), LUA_TSTRING */
  int is_int;
  lua_Integer i;
  double d;
  char *s;
  size_t len;
} wparam;

typedef struct {
  char *sql;
  wparam *params;
  int n;
} wstmt;

typedef struct wjob {
  struct wjob *next;
  wstmt *stmts;
  int nstmts;
  int rc;           /* result: SQLITE_OK or the extended error code */
  char *errmsg;     /* malloc'd, on failure */
  int changes;
  int abandoned;    /* the waiting task was cancelled: the callback frees it */
  int delivered;    /* back on the loop thread, its task woken */
  struct job_ud *holder; /* loop thread only; NULL once the holder let go */
  lg_wait w;
} wjob;

/* Holds a job on the waiting task's stack: if the task never runs tx_k (a
 * cancel that came after the wake-up raises at the resume), its __gc frees
 * the delivered job; an undelivered one is abandoned to deliver(). */
typedef struct job_ud {
  wjob *j; /* NULL once tx_k or the cancel hook took it */
} job_ud;

typedef struct {
  uv_thread_t thread;
  uv_mutex_t mu;
  uv_cond_t cv;
  uv_async_t async;   /* wakes the loop when jobs are done */
  lg_loop *loop;
  char *path;
  int busy_ms;
  wjob *queue, *queue_tail, *done, *done_tail; /* under mu */
  int quit;           /* under mu */
  int inflight;       /* loop thread only */
  int open_rc;        /* the thread's connection: SQLITE_OK or why not */
  char open_err[256];
  struct { char *sql; sqlite3_stmt *st; } cache[MAX_CACHED]; /* thread only */
  int ncache;
} writer;

typedef struct {
  writer *w; /* NULL until started and once closed */
} writer_ud;

/* ------------------------------------------------------------------ jobs */

static void free_job(wjob *j) {
  for (int s = 0; s < j->nstmts; s++) {
    for (int p = 0; p < j->stmts[s].n; p++) free(j->stmts[s].params[p].s);
    free(j->stmts[s].params);
    free(j->stmts[s].sql);
  }
  free(j->stmts);
  free(j->errmsg);
  free(j);
}

/* The thread's prepared statement for sql (cached), or NULL with rc set. */
static sqlite3_stmt *prepared(writer *w, sqlite3 *db, const char *sql, int *rc) {
  for (int i = 0; i < w->ncache; i++)
    if (strcmp(w->cache[i].sql, sql) == 0) return w->cache[i].st;
  sqlite3_stmt *st = NULL;
  *rc = sqlite3_prepare_v3(db, sql, -1, SQLITE_PREPARE_PERSISTENT, &st, NULL);
  if (*rc != SQLITE_OK) return NULL;
  if (w->ncache < MAX_CACHED) {
    char *copy = strdup(sql);
    if (copy) {
      w->cache[w->ncache].sql = copy;
      w->cache[w->ncache++].st = st;
    }
  }
  return st;
}

/* Whether st is one of the cached statements (kept, not finalized). */
static int cached(writer *w, sqlite3_stmt *st) {
  for (int i = 0; i < w->ncache; i++)
    if (w->cache[i].st == st) return 1;
  return 0;
}

/* Runs one statement of a job to its end. SQLITE_OK or the error code. */
static int run_stmt(writer *w, sqlite3 *db, wstmt *s) {
  int rc = SQLITE_OK;
  sqlite3_stmt *st = prepared(w, db, s->sql, &rc);
  if (!st) return rc ? rc : SQLITE_ERROR;
  for (int p = 0; p < s->n && rc == SQLITE_OK; p++) {
    wparam *v = &s->params[p];
    if (v->type == LUA_TNIL) rc = sqlite3_bind_null(st, p + 1);
    else if (v->type == LUA_TBOOLEAN || v->is_int) rc = sqlite3_bind_int64(st, p + 1, (sqlite3_int64)v->i);
    else if (v->type == LUA_TNUMBER) rc = sqlite3_bind_double(st, p + 1, v->d);
    else rc = sqlite3_bind_text64(st, p + 1, v->s, v->len, SQLITE_STATIC, SQLITE_UTF8);
  }
  if (rc == SQLITE_OK) {
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {}
    if (rc == SQLITE_DONE) rc = SQLITE_OK;
  }
  sqlite3_reset(st);
  sqlite3_clear_bindings(st);
  if (!cached(w, st)) sqlite3_finalize(st);
  return rc;
}

/* Runs a job as one transaction (in the thread); fills rc, errmsg, changes. */
static void run_job(writer *w, sqlite3 *db, wjob *j) {
  if (!db) {
    j->rc = w->open_rc;
    j->errmsg = strdup(w->open_err);
    return;
  }
  int rc = sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL);
  for (int s = 0; s < j->nstmts && rc == SQLITE_OK; s++) rc = run_stmt(w, db, &j->stmts[s]);
  if (rc == SQLITE_OK) {
    j->changes = sqlite3_changes(db);
    rc = sqlite3_exec(db, "COMMIT", NULL, NULL, NULL);
  }
  if (rc != SQLITE_OK) {
    j->rc = sqlite3_extended_errcode(db);
    if (j->rc == SQLITE_OK) j->rc = rc;
    j->errmsg = strdup(sqlite3_errmsg(db));
    if (!sqlite3_get_autocommit(db)) sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
  }
}

/* ---------------------------------------------------------------- thread */

/* The writer thread: opens its connection, then runs queued jobs in order
 * until told to quit with an empty queue. */
static void writer_main(void *arg) {
  writer *w = arg;
  sqlite3 *db = NULL;
  int rc = sqlite3_open_v2(w->path, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, NULL);
  if (rc == SQLITE_OK) {
    sqlite3_extended_result_codes(db, 1);
    sqlite3_busy_timeout(db, w->busy_ms);
    rc = sqlite3_exec(db, "PRAGMA synchronous = NORMAL", NULL, NULL, NULL);
  }
  if (rc != SQLITE_OK) {
    w->open_rc = db ? sqlite3_extended_errcode(db) : rc;
    snprintf(w->open_err, sizeof w->open_err, "%s", db ? sqlite3_errmsg(db) : sqlite3_errstr(rc));
    sqlite3_close_v2(db);
    db = NULL;
  }
  uv_mutex_lock(&w->mu);
  for (;;) {
    while (!w->queue && !w->quit) uv_cond_wait(&w->cv, &w->mu);
    wjob *j = w->queue;
    if (!j) break;
    w->queue = j->next;
    if (!w->queue) w->queue_tail = NULL;
    uv_mutex_unlock(&w->mu);
    run_job(w, db, j);
    uv_mutex_lock(&w->mu);
    j->next = NULL;
    if (w->done_tail) w->done_tail->next = j;
    else w->done = j;
    w->done_tail = j;
    uv_async_send(&w->async);
  }
  uv_mutex_unlock(&w->mu);
  for (int i = 0; i < w->ncache; i++) {
    sqlite3_finalize(w->cache[i].st);
    free(w->cache[i].sql);
  }
  w->ncache = 0;
  sqlite3_close_v2(db);
}

/* ------------------------------------------------------------- the loop */

/* Hands the finished jobs to their tasks (or frees the abandoned ones). On
 * the loop's thread: from the async callback, and from close. */
static void deliver(writer *w) {
  uv_mutex_lock(&w->mu);
  wjob *j = w->done;
  w->done = w->done_tail = NULL;
  uv_mutex_unlock(&w->mu);
  while (j) {
    wjob *next = j->next;
    lg_loop_busy(w->loop, -1);
    lg_loop_hold(w->loop, -1);
    lg_loop_activity(w->loop);
    if (--w->inflight == 0) uv_unref((uv_handle_t *)&w->async);
    if (j->abandoned) {
      free_job(j);
    } else {
      j->delivered = 1;
      lg_task_wake(&j->w);
    }
    j = next;
  }
}

static void on_async(uv_async_t *a) { deliver(a->data); }

static void on_closed(uv_handle_t *h) {
  writer *w = h->data;
  uv_cond_destroy(&w->cv);
  uv_mutex_destroy(&w->mu);
  free(w->path);
  free(w);
}

/* Cancel hook of tx(): the task is gone; the job still runs (it may be
 * under way), and the loop callback frees it. */
static void tx_cancel(lg_wait *wt) {
  wjob *j = (wjob *)((char *)wt - offsetof(wjob, w));
  j->abandoned = 1;
  if (j->holder) j->holder->j = NULL; /* deliver() frees it now */
  j->holder = NULL;
}

/* The one close (close, __close, __gc): lets the thread finish the queued
 * jobs, joins it, wakes their tasks, and closes the async handle (the
 * writer is freed in its close callback). Idempotent. */
static int l_writer_close(lua_State *L) {
  writer_ud *u = luaL_checkudata(L, 1, WRITER_MT);
  writer *w = u->w;
  if (!w) return 0;
  u->w = NULL;
  uv_mutex_lock(&w->mu);
  w->quit = 1;
  uv_cond_signal(&w->cv);
  uv_mutex_unlock(&w->mu);
  uv_thread_join(&w->thread);
  deliver(w);
  uv_close((uv_handle_t *)&w->async, on_closed);
  return 0;
}

/* Checks argument `arg` is a statement {sql, params...} whose parameters
 * can be bound; raises (misuse) otherwise, before anything is allocated. */
static void check_stmt(lua_State *L, int arg, int index) {
  if (lua_type(L, arg) != LUA_TTABLE) luaL_error(L, "tx: statement %d must be a table {sql, params...}", index);
  if (lua_rawgeti(L, arg, 1) != LUA_TSTRING) luaL_error(L, "tx: statement %d has no SQL text first", index);
  lua_pop(L, 1);
  lua_Integer n = luaL_len(L, arg) - 1;
  if (n > 999) luaL_error(L, "tx: statement %d has too many parameters", index);
  for (lua_Integer p = 0; p < n; p++) {
    int t = lua_rawgeti(L, arg, p + 2);
    lua_pop(L, 1);
    if (t != LUA_TNIL && t != LUA_TBOOLEAN && t != LUA_TNUMBER && t != LUA_TSTRING)
      luaL_error(L, "tx: statement %d, parameter %d is a %s (nil, boolean, number or string expected)", index,
                 (int)p + 1, lua_typename(L, t));
  }
}

/* Copies the checked statement at `arg` into s; 0, or -1 when out of
 * memory (what was copied is freed with the job). */
static int copy_stmt(lua_State *L, int arg, wstmt *s) {
  lua_rawgeti(L, arg, 1);
  s->sql = strdup(lua_tostring(L, -1));
  lua_pop(L, 1);
  lua_Integer n = luaL_len(L, arg) - 1;
  s->params = calloc((size_t)n + 1, sizeof *s->params);
  if (!s->sql || !s->params) return -1;
  for (lua_Integer p = 0; p < n; p++) {
    wparam *v = &s->params[p];
    s->n = (int)p + 1;
    int t = lua_rawgeti(L, arg, p + 2);
    v->type = t;
    if (t == LUA_TBOOLEAN) v->i = lua_toboolean(L, -1);
    else if (t == LUA_TNUMBER) {
      v->is_int = lua_isinteger(L, -1);
      v->i = lua_tointeger(L, -1);
      v->d = lua_tonumber(L, -1);
    } else if (t == LUA_TSTRING) {
      const char *str = lua_tolstring(L, -1, &v->len);
      v->s = malloc(v->len + 1);
      if (v->s) memcpy(v->s, str, v->len + 1);
    }
    lua_pop(L, 1);
    if (t == LUA_TSTRING && !v->s) return -1;
  }
  return 0;
}

/* __gc of a job holder: see job_ud. */
static int l_job_gc(lua_State *L) {
  job_ud *h = luaL_checkudata(L, 1, JOB_MT);
  if (h->j) {
    h->j->holder = NULL;
    if (h->j->delivered) free_job(h->j);
    else h->j->abandoned = 1;
    h->j = NULL;
  }
  return 0;
}

/* Continuation of tx(): the job is done; pushes its result, frees it. */
static int tx_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  wjob *j = (wjob *)ctx;
  job_ud *h = luaL_checkudata(L, 2, JOB_MT);
  h->j = NULL;
  int rc = j->rc, changes = j->changes;
  if (rc == SQLITE_OK) {
    free_job(j);
    lua_pushboolean(L, 1);
    lua_pushinteger(L, changes);
    return 2;
  }
  lua_pushstring(L, j->errmsg ? j->errmsg : sqlite3_errstr(rc));
  free_job(j);
  writer_ud *u = lua_touserdata(L, 1);
  lg_sqlite_push_fail(L, u && u->w ? u->w->path : "?", "commit", rc, lua_tostring(L, -1));
  return 2;
}

/* writer:tx({sql, params...}, ...) -> true, changes | nil, err. Suspends
 * the task until the thread committed (or rolled back) the statements. */
static int l_writer_tx(lua_State *L) {
  writer_ud *u = luaL_checkudata(L, 1, WRITER_MT);
  if (!u->w) return luaL_error(L, "tx: writer is closed");
  int n = lua_gettop(L) - 1;
  if (n < 1) return luaL_error(L, "tx: no statements");
  for (int s = 0; s < n; s++) check_stmt(L, s + 2, s + 1);
  /* the holder first (it can raise), empty until the job is whole */
  job_ud *h = lua_newuserdatauv(L, sizeof *h, 0);
  h->j = NULL;
  luaL_setmetatable(L, JOB_MT);
  wjob *j = calloc(1, sizeof *j);
  if (!j || !(j->stmts = calloc((size_t)n, sizeof *j->stmts))) {
    free(j);
    return luaL_error(L, "tx: out of memory");
  }
  j->nstmts = n;
  j->w.cancel = tx_cancel;
  for (int s = 0; s < n; s++) {
    if (copy_stmt(L, s + 2, &j->stmts[s]) != 0) {
      j->nstmts = s + 1;
      free_job(j);
      return luaL_error(L, "tx: out of memory");
    }
  }
  lua_copy(L, -1, 2); /* the holder at index 2 (tx_k finds it there) */
  lua_settop(L, 2);
  h->j = j;
  j->holder = h;
  writer *w = u->w;
  uv_mutex_lock(&w->mu);
  if (w->queue_tail) w->queue_tail->next = j;
  else w->queue = j;
  w->queue_tail = j;
  uv_cond_signal(&w->cv);
  uv_mutex_unlock(&w->mu);
  if (w->inflight++ == 0) uv_ref((uv_handle_t *)&w->async);
  lg_loop_busy(w->loop, 1);
  lg_loop_hold(w->loop, 1);
  return lg_task_suspend(L, &j->w, (lua_KContext)j, tx_k);
}

/* sqlite_writer(path, [opts]) -> writer | nil, err. opts.busy_ms: how long
 * a transaction waits for another process's lock (default 5000). The file
 * should exist (sqlite_open it first: the thread's open does not create). */
static int l_sqlite_writer(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  int busy = lg_sqlite_busy_ms(L, 2, "sqlite_writer");
  /* the loop exists before the userdata, so it is finalized after it */
  lg_loop *loop = lg_loop_get(L);
  writer_ud *u = lua_newuserdatauv(L, sizeof *u, 0);
  u->w = NULL;
  luaL_setmetatable(L, WRITER_MT);
  writer *w = calloc(1, sizeof *w);
  if (!w || !(w->path = strdup(path))) {
    free(w);
    return luaL_error(L, "sqlite_writer: out of memory");
  }
  w->busy_ms = busy;
  w->loop = loop;
  uv_mutex_init(&w->mu);
  uv_cond_init(&w->cv);
  uv_async_init(lg_loop_uv(w->loop), &w->async, on_async);
  w->async.data = w;
  uv_unref((uv_handle_t *)&w->async);
  int rc = uv_thread_create(&w->thread, writer_main, w);
  if (rc != 0) {
    uv_close((uv_handle_t *)&w->async, on_closed);
    return lg_error_fail(L, LG_ERR_JOURNAL, "%s: cannot start the writer thread: %s", path, uv_strerror(rc));
  }
  u->w = w;
  return 1;
}

/* Creates the writer's metatable and sets sqlite_writer into the table on
 * the stack. */
void lg_sqlite_writer_register(lua_State *L) {
  static const luaL_Reg methods[] = {{"tx", l_writer_tx}, {"close", l_writer_close}, {NULL, NULL}};
  lg_class_new(L, WRITER_MT, methods, l_writer_close, l_writer_close);
  lg_class_new(L, JOB_MT, NULL, NULL, l_job_gc);
  lua_pushcfunction(L, l_sqlite_writer);
  lua_setfield(L, -2, "sqlite_writer");
}
