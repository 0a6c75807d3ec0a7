/* Lua binding of child processes: core.process_spawn(argv, opts) -> a
 * "luagent.Process" with wait, kill, pid, close. wait() suspends the task
 * until the child exited and its output ended; cancelling the waiting task
 * kills the child's whole process group (SIGTERM, then SIGKILL after the
 * grace period). Collecting or closing a running process kills its group,
 * and what the child leaves in its group when it exits is killed then.
 * With opts.stream the process is a long-lived peer: write() and
 * close_stdin() feed its stdin (queued() says how much waits unread), read_line() suspends for the next line of
 * its stdout (cancelling a read only stops the read), stderr() shows the
 * latest bytes of its stderr. core.environment() lists this process's
 * environment (children get what lua/luagent/base/child_env.lua allows);
 * core.arg_max() says how many bytes a child's argv and environment may
 * take together (sysconf ARG_MAX: past it the spawn fails, E2BIG). */
#include <lauxlib.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core.h"
#include "errors.h"
#include "loop.h"
#include "process.h"

#define PROC_MT "luagent.Process"
#define DEFAULT_MAX_OUTPUT (1024 * 1024)
#define DEFAULT_GRACE 2.0
#define MAX_ARGS 4096
#define MAX_ENV 4096

extern char **environ;

typedef struct {
  lg_process *p;  /* NULL once closed */
  lg_loop *loop;
  lg_wait w;
  int waiting;    /* a task waits in wait() */
  lg_wait rw;
  int reading;    /* a task waits in read_line() */
  int stream;     /* opts.stream */
  int real;       /* counted as real work for the virtual clock */
  double grace;   /* seconds between SIGTERM and SIGKILL */
} proc_ud;

/* Call after `waiting` or `reading` changed: a stream child is real work
 * for the virtual clock while a task waits on it (a one-shot child is,
 * while it runs: process.c). */
static void note_waits(proc_ud *u) {
  int real = u->stream && (u->waiting || u->reading);
  if (real == u->real) return;
  u->real = real;
  lg_loop_real(u->loop, real ? 1 : -1);
}

/* `done` of the process: wakes the task waiting in wait(), if any. */
static void proc_done(void *arg) {
  proc_ud *u = arg;
  if (!u->waiting) return;
  u->waiting = 0;
  note_waits(u);
  lg_task_wake(&u->w);
}

/* `data` of a stream process: wakes the task waiting in read_line(). */
static void proc_data(void *arg) {
  proc_ud *u = arg;
  if (!u->reading) return;
  u->reading = 0;
  note_waits(u);
  lg_task_wake(&u->rw);
}

/* Cancel hook of read_line(): only the read stops; the child runs on. */
static void read_cancel(lg_wait *w) {
  proc_ud *u = (proc_ud *)((char *)w - offsetof(proc_ud, rw));
  u->reading = 0;
  note_waits(u);
}

/* Cancel hook of wait(): the waiting task was cancelled (or timed out), so
 * the child's group is killed; the process stays owned by the userdata. */
static void wait_cancel(lg_wait *w) {
  proc_ud *u = (proc_ud *)((char *)w - offsetof(proc_ud, w));
  u->waiting = 0;
  note_waits(u);
  if (u->p) lg_process_kill(u->p, u->grace);
}

/* The one close (close, __close, __gc): releases the process (a running
 * child's group is killed). Idempotent. */
static int l_proc_close(lua_State *L) {
  proc_ud *u = luaL_checkudata(L, 1, PROC_MT);
  if (u->p) {
    lg_process_release(u->p);
    u->p = NULL;
  }
  int waiting = u->waiting, reading = u->reading;
  u->waiting = u->reading = 0;
  note_waits(u);
  if (waiting) lg_task_wake(&u->w);
  if (reading) lg_task_wake(&u->rw);
  return 0;
}

/* The process at argument 1, raising "fn: process is closed" once closed. */
static proc_ud *check_open(lua_State *L, const char *fn) {
  proc_ud *u = luaL_checkudata(L, 1, PROC_MT);
  if (!u->p) luaL_error(L, "%s: process is closed", fn);
  return u;
}

/* Sets t[k] = v for the table on top of the stack. */
static void set_int(lua_State *L, const char *k, lua_Integer v) {
  lua_pushinteger(L, v);
  lua_setfield(L, -2, k);
}

/* Pushes {pid=, code=|signal=, stdout=, stderr=, stdout_dropped=,
 * stderr_dropped=, killed=} of a finished process. */
static void push_result(lua_State *L, lg_process *p) {
  lg_process_info in;
  lg_process_info_get(p, &in);
  lua_createtable(L, 0, 8);
  set_int(L, "pid", in.pid);
  if (in.term_signal) set_int(L, "signal", in.term_signal);
  else set_int(L, "code", (lua_Integer)in.exit_status);
  lua_pushlstring(L, in.out, in.out_len);
  lua_setfield(L, -2, "stdout");
  lua_pushlstring(L, in.err, in.err_len);
  lua_setfield(L, -2, "stderr");
  set_int(L, "stdout_dropped", (lua_Integer)in.out_dropped);
  set_int(L, "stderr_dropped", (lua_Integer)in.err_dropped);
  lua_pushboolean(L, in.killed);
  lua_setfield(L, -2, "killed");
}

/* A wait that another task's close ended: nil and an eof record. */
static int closed_while_waiting(lua_State *L, const char *fn) {
  return lg_error_fail(L, LG_ERR_EOF, "%s: the process was closed while this task waited", fn);
}

/* Continuation of wait(): the result once finished, else suspends again. */
static int wait_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  (void)ctx;
  proc_ud *u = luaL_checkudata(L, 1, PROC_MT);
  if (!u->p) return closed_while_waiting(L, "wait");
  if (lg_process_finished(u->p)) {
    push_result(L, u->p);
    return 1;
  }
  if (u->waiting) return luaL_error(L, "wait: another task is already waiting");
  u->waiting = 1;
  note_waits(u);
  return lg_task_suspend(L, &u->w, 0, wait_k);
}

/* proc:wait() -> result table, once the child exited and its stdout and
 * stderr ended. Cancellable: cancellation kills the process group. */
static int l_proc_wait(lua_State *L) {
  check_open(L, "wait");
  lua_settop(L, 1);
  return wait_k(L, LUA_OK, 0);
}

/* proc:kill([grace]) -> whether the child still ran: SIGTERM to the
 * group, SIGKILL after grace seconds (0: SIGKILL at once); false once it
 * exited (nothing is sent: its group's id may be someone else's now). */
static int l_proc_kill(lua_State *L) {
  proc_ud *u = check_open(L, "kill");
  lua_pushboolean(L, lg_process_kill(u->p, luaL_optnumber(L, 2, u->grace)));
  return 1;
}

/* proc:pid() -> the child's pid (also its process group id). */
static int l_proc_pid(lua_State *L) {
  proc_ud *u = check_open(L, "pid");
  lg_process_info in;
  lg_process_info_get(u->p, &in);
  lua_pushinteger(L, in.pid);
  return 1;
}

/* proc:finished() -> whether wait() would return at once. */
static int l_proc_finished(lua_State *L) {
  proc_ud *u = luaL_checkudata(L, 1, PROC_MT);
  lua_pushboolean(L, u->p && lg_process_finished(u->p));
  return 1;
}

/* proc:write(bytes) -> true | nil, err (kind "eof" once stdin is closed).
 * Stream mode; the bytes are queued, never waited for. */
static int l_proc_write(lua_State *L) {
  proc_ud *u = check_open(L, "write");
  size_t len;
  const char *s = luaL_checklstring(L, 2, &len);
  int rc = lg_process_write(u->p, s, len);
  if (rc == 0) {
    lua_pushboolean(L, 1);
    return 1;
  }
  lg_process_info in;
  lg_process_info_get(u->p, &in);
  return lg_error_fail(L, rc == UV_EPIPE ? LG_ERR_EOF : LG_ERR_PROCESS, "write to process %d: %s",
                       in.pid, rc == UV_EPIPE ? "its stdin is closed" : uv_strerror(rc));
}

/* proc:queued() -> the bytes written to stdin that the child has not read
 * yet, beyond what the pipe holds (0 once stdin is closed). Stream mode:
 * write() never waits, so its caller bounds what a child that does not
 * read may make it hold. */
static int l_proc_queued(lua_State *L) {
  proc_ud *u = check_open(L, "queued");
  lua_pushinteger(L, (lua_Integer)lg_process_stdin_queued(u->p));
  return 1;
}

/* proc:close_stdin(): the child reads end of file. Stream mode. */
static int l_proc_close_stdin(lua_State *L) {
  proc_ud *u = check_open(L, "close_stdin");
  lg_process_close_stdin(u->p);
  return 0;
}

/* Continuation of read_line(): a whole line once there, else suspends. */
static int read_line_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  (void)ctx;
  proc_ud *u = luaL_checkudata(L, 1, PROC_MT);
  if (!u->p) return closed_while_waiting(L, "read_line");
  size_t len;
  int eof, full;
  const char *b = lg_process_peek(u->p, &len, &eof, &full);
  const char *nl = len ? memchr(b, '\n', len) : NULL;
  if (nl || (eof && len > 0)) {
    size_t n = nl ? (size_t)(nl - b) : len;
    size_t keep = n > 0 && b[n - 1] == '\r' ? n - 1 : n;
    lua_pushlstring(L, b, keep);
    lg_process_take(u->p, nl ? n + 1 : n);
    return 1;
  }
  if (eof) {
    lua_pushnil(L);
    return 1;
  }
  if (full) {
    return lg_error_fail(L, LG_ERR_PROTOCOL,
                         "read_line: a line of stdout is longer than %d bytes (max_output)", (int)len);
  }
  if (u->reading) return luaL_error(L, "read_line: another task is already reading");
  u->reading = 1;
  note_waits(u);
  return lg_task_suspend(L, &u->rw, 0, read_line_k);
}

/* proc:read_line() -> the next line of stdout without its line end; at the
 * end of stdout a last unterminated line, then nil; nil and a `protocol`
 * error when a line does not fit in max_output bytes. Stream mode. */
static int l_proc_read_line(lua_State *L) {
  proc_ud *u = check_open(L, "read_line");
  (void)u;
  lua_settop(L, 1);
  return read_line_k(L, LUA_OK, 0);
}

/* proc:stderr() -> what the child wrote to stderr so far (in stream mode
 * its latest bytes). */
static int l_proc_stderr(lua_State *L) {
  proc_ud *u = check_open(L, "stderr");
  lg_process_info in;
  lg_process_info_get(u->p, &in);
  lua_pushlstring(L, in.err, in.err_len);
  return 1;
}

/* Builds the child's environment from the table opts.env (NAME = value, or
 * false to leave NAME out) laid over ours, or alone with opts.inherit_env
 * = false: a NULL-terminated list in a userdata left on the stack, its
 * strings anchored in a table pushed below it. NULL (nothing pushed) when
 * opts.env is absent (the child inherits ours). */
static const char **build_env(lua_State *L) {
  if (lua_type(L, 2) != LUA_TTABLE) return NULL;
  lua_getfield(L, 2, "inherit_env");
  int inherit = lua_isnil(L, -1) || lua_toboolean(L, -1);
  lua_pop(L, 1);
  lua_getfield(L, 2, "env");
  if (lua_isnil(L, -1)) {
    if (!inherit) luaL_error(L, "process_spawn: opts.inherit_env = false needs opts.env");
    lua_pop(L, 1);
    return NULL;
  }
  if (lua_type(L, -1) != LUA_TTABLE) luaL_error(L, "process_spawn: opts.env must be a table");
  int env = lua_gettop(L);
  lua_newtable(L); /* NAME -> "NAME=value", ours first (if inherited), then the overrides */
  int merged = env + 1;
  for (char **e = environ; inherit && *e; e++) {
    const char *eq = strchr(*e, '=');
    if (!eq) continue;
    lua_pushlstring(L, *e, (size_t)(eq - *e));
    lua_pushstring(L, *e);
    lua_rawset(L, merged);
  }
  lua_pushnil(L);
  while (lua_next(L, env)) {
    if (lua_type(L, -2) != LUA_TSTRING || (lua_type(L, -1) != LUA_TSTRING && !(lua_isboolean(L, -1) && !lua_toboolean(L, -1))))
      luaL_error(L, "process_spawn: opts.env must map names to strings (or false)");
    const char *k = lua_tostring(L, -2);
    if (!*k || strchr(k, '=')) luaL_error(L, "process_spawn: opts.env: bad variable name '%s'", k);
    lua_pushvalue(L, -2);
    if (lua_isstring(L, -2)) lua_pushfstring(L, "%s=%s", k, lua_tostring(L, -2));
    else lua_pushnil(L);
    lua_rawset(L, merged);
    lua_pop(L, 1);
  }
  int n = 0;
  lua_pushnil(L);
  while (lua_next(L, merged)) {
    n++;
    lua_pop(L, 1);
  }
  if (n > MAX_ENV) luaL_error(L, "process_spawn: opts.env: more than %d variables", MAX_ENV);
  const char **list = lua_newuserdatauv(L, sizeof(char *) * (size_t)(n + 1), 0);
  int i = 0;
  lua_pushnil(L);
  while (lua_next(L, merged)) {
    list[i++] = lua_tostring(L, -1);
    lua_pop(L, 1);
  }
  list[i] = NULL;
  return list;
}

/* Reads an optional number field of the options table at index 2. */
static double opt_number(lua_State *L, const char *k, double def) {
  if (lua_type(L, 2) != LUA_TTABLE) return def;
  lua_getfield(L, 2, k);
  double v = lua_isnil(L, -1) ? def : luaL_checknumber(L, -1);
  lua_pop(L, 1);
  return v;
}

/* Reads an optional string field of the options table at index 2 (left on
 * the stack so the pointer stays valid), or NULL. */
static const char *opt_string(lua_State *L, const char *k, size_t *len) {
  if (lua_type(L, 2) != LUA_TTABLE) {
    lua_pushnil(L);
    return NULL;
  }
  lua_getfield(L, 2, k);
  if (lua_isnil(L, -1)) return NULL;
  if (lua_type(L, -1) != LUA_TSTRING)
    luaL_error(L, "process_spawn: opts.%s must be a string", k);
  return lua_tolstring(L, -1, len);
}

/* process_spawn(argv, [opts]) -> process | nil, err. argv is a list of
 * strings (no shell; argv[1] is looked up in PATH); opts: stdin (string),
 * cwd, env (NAME = value or false, over ours; with inherit_env = false the
 * whole environment), max_output (bytes kept per
 * stream, default 1 MiB; in stream mode the longest stdout line), grace
 * (seconds between SIGTERM and SIGKILL, default 2), stream (keep stdin
 * open; read stdout by lines). Returns a new "luagent.Process". */
static int l_process_spawn(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  if (!lua_isnoneornil(L, 2)) luaL_checktype(L, 2, LUA_TTABLE);
  lua_settop(L, 2);
  lua_Integer n = luaL_len(L, 1);
  if (n < 1 || n > MAX_ARGS) return luaL_error(L, "process_spawn: argv must list 1 to %d strings", MAX_ARGS);
  const char **argv = lua_newuserdatauv(L, sizeof(char *) * (size_t)(n + 1), 0);
  for (lua_Integer i = 1; i <= n; i++) {
    if (lua_rawgeti(L, 1, i) != LUA_TSTRING)
      return luaL_error(L, "process_spawn: argv[%d] must be a string", (int)i);
    argv[i - 1] = lua_tostring(L, -1);
    lua_pop(L, 1); /* still referenced by the argv table */
  }
  argv[n] = NULL;
  lg_process_opts o;
  memset(&o, 0, sizeof o);
  o.argv = argv;
  o.input = opt_string(L, "stdin", &o.input_len);
  o.cwd = opt_string(L, "cwd", NULL);
  o.env = build_env(L);
  if (lua_type(L, 2) == LUA_TTABLE) {
    lua_getfield(L, 2, "stream");
    o.stream = lua_toboolean(L, -1);
    lua_pop(L, 1);
  }
  if (o.stream) o.data = proc_data;
  double max_output = opt_number(L, "max_output", DEFAULT_MAX_OUTPUT);
  double grace = opt_number(L, "grace", DEFAULT_GRACE);
  if (!(max_output >= 0) || max_output > 1e12) return luaL_error(L, "process_spawn: opts.max_output must be >= 0");
  if (!(grace >= 0) || grace > 1e9) return luaL_error(L, "process_spawn: opts.grace must be >= 0");
  o.max_output = (size_t)max_output;
  o.done = proc_done;
  /* the loop exists before the userdata, so it is finalized after it */
  lg_loop *loop = lg_loop_get(L);
  proc_ud *u = lua_newuserdatauv(L, sizeof *u, 0);
  memset(u, 0, sizeof *u);
  u->loop = loop;
  u->stream = o.stream;
  u->w.cancel = wait_cancel;
  u->rw.cancel = read_cancel;
  u->grace = grace;
  luaL_setmetatable(L, PROC_MT);
  o.arg = u;
  int rc = lg_process_spawn(loop, &o, &u->p);
  if (rc != 0) {
    u->p = NULL;
    return lg_error_fail(L, LG_ERR_PROCESS, "cannot start '%s': %s", argv[0], uv_strerror(rc));
  }
  return 1;
}

/* environment() -> {NAME = value}: this process's environment as it is
 * now (for the rule of what children inherit, and the keys the scrubber
 * takes from it: lua/luagent/base/secrets.lua). */
static int l_environment(lua_State *L) {
  lua_newtable(L);
  for (char **e = environ; *e; e++) {
    const char *eq = strchr(*e, '=');
    if (!eq) continue;
    lua_pushlstring(L, *e, (size_t)(eq - *e));
    lua_pushstring(L, eq + 1);
    lua_rawset(L, -3);
  }
  return 1;
}

/* arg_max() -> the bytes a child's argv and environment may take
 * together (sysconf(_SC_ARG_MAX), which follows the stack limit on Linux),
 * or nil when the system does not say. */
static int l_arg_max(lua_State *L) {
  long n = sysconf(_SC_ARG_MAX);
  if (n <= 0) lua_pushnil(L);
  else lua_pushinteger(L, (lua_Integer)n);
  return 1;
}

/* Creates the "luagent.Process" metatable and sets process_spawn,
 * environment and arg_max into the table on the stack. */
void lg_process_register(lua_State *L) {
  static const luaL_Reg methods[] = {{"wait", l_proc_wait},         {"kill", l_proc_kill},
                                     {"pid", l_proc_pid},           {"finished", l_proc_finished},
                                     {"close", l_proc_close},       {"write", l_proc_write},
                                     {"close_stdin", l_proc_close_stdin}, {"queued", l_proc_queued},
                                     {"read_line", l_proc_read_line}, {"stderr", l_proc_stderr},
                                     {NULL, NULL}};
  lg_class_new(L, PROC_MT, methods, l_proc_close, l_proc_close);
  lua_pushcfunction(L, l_process_spawn);
  lua_setfield(L, -2, "process_spawn");
  lua_pushcfunction(L, l_environment);
  lua_setfield(L, -2, "environment");
  lua_pushcfunction(L, l_arg_max);
  lua_setfield(L, -2, "arg_max");
}
