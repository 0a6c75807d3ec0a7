/* Child processes on the loop (libuv): argv without a shell, stdin from a
 * buffer, stdout and stderr captured up to a cap, each child the leader of
 * its own process group so that a kill reaches everything it started; the
 * group does not outlive its leader (what is left in it when the child
 * exits is killed).
 * In stream mode (a long-lived server) stdin stays open for writes and
 * stdout is consumed as it arrives, with at most max_output bytes held. */
#ifndef LG_PROCESS_H
#define LG_PROCESS_H

#include <stddef.h>

#include "loop.h"

typedef struct lg_process lg_process;

/* Seconds a child's pipes may stay open after it exited. A process that
 * left its group (setsid, a daemon) can hold them for ever, and no group
 * kill reaches it; past this the output read so far is the output. */
#define LG_PROCESS_DRAIN 1.0

typedef struct {
  const char *const *argv;   /* argv[0] is looked up in PATH; NULL-terminated */
  const char *cwd;           /* or NULL */
  const char *input;         /* written to stdin, then stdin closes; NULL: /dev/null */
  size_t input_len;
  size_t max_output;         /* bytes kept per stream; the rest is counted, dropped */
  void (*done)(void *arg);   /* called once, from a libuv callback, when finished */
  void *arg;
  const char *const *env;    /* NAME=value list, NULL-terminated; NULL: inherit ours */
  int stream;                /* stdin stays open (lg_process_write); stdout is read with
                              * lg_process_peek/take, reading pauses while max_output
                              * bytes wait; stderr keeps its latest max_output bytes */
  void (*data)(void *arg);   /* stream: stdout bytes arrived, paused full, or ended */
} lg_process_opts;

/* What a finished (or still running) process gave. */
typedef struct {
  int pid;
  int exited;                /* the child exited (or was killed) */
  long long exit_status;     /* when exited and term_signal == 0 */
  int term_signal;           /* the signal that ended it, or 0 */
  const char *out, *err;     /* captured bytes (not NUL-terminated) */
  size_t out_len, err_len;
  size_t out_dropped, err_dropped;
  int killed;                /* lg_process_kill (or a release) was called while it ran */
} lg_process_info;

/* Starts a child. Returns 0 and the process in *out (owned by the caller
 * until lg_process_release), or a libuv error code (nothing to release). */
int lg_process_spawn(lg_loop *loop, const lg_process_opts *o, lg_process **out);

/* True once the child exited and both output pipes reached end of file. */
int lg_process_finished(const lg_process *p);

/* Fills *info; the byte pointers stay valid until the next loop turn or
 * lg_process_release. */
void lg_process_info_get(const lg_process *p, lg_process_info *info);

/* Sends SIGTERM to the child's whole process group, then SIGKILL after
 * `grace` seconds on the loop's clock if it still runs (grace <= 0:
 * SIGKILL at once). In stream mode stdout is read and dropped from then on
 * (so a paused stdout reaches its end). 1, or 0 when the child had exited
 * already: nothing is sent (its group got its last SIGKILL at the exit)
 * and it does not count as killed. */
int lg_process_kill(lg_process *p, double grace);

/* Stream mode: queues `len` bytes (copied) for the child's stdin. 0, or
 * UV_EPIPE once stdin is closed (or the child exited), or a libuv code. */
int lg_process_write(lg_process *p, const char *data, size_t len);

/* Stream mode: the bytes written that wait for the child to read them
 * (queued here, past what the pipe itself holds); 0 once stdin is closed.
 * A peer that never reads makes this grow: the owner bounds it. */
size_t lg_process_stdin_queued(const lg_process *p);

/* Stream mode: closes the child's stdin (it reads end of file). Idempotent. */
void lg_process_close_stdin(lg_process *p);

/* Stream mode: the stdout bytes not yet taken (valid until the next take,
 * loop turn or release); *eof once stdout ended, *full while reading is
 * paused because max_output bytes wait. */
const char *lg_process_peek(const lg_process *p, size_t *len, int *eof, int *full);

/* Stream mode: drops the first n bytes of stdout (n <= what peek gave) and
 * resumes reading if it was paused. */
void lg_process_take(lg_process *p, size_t n);

/* The owner lets go: no more `done` call; a child still running has its
 * group killed (SIGKILL). Memory is freed once libuv closed every handle. */
void lg_process_release(lg_process *p);

/* Sets process_spawn, environment and arg_max into the table on top of
 * the stack (process_lua.c). */
void lg_process_register(lua_State *L);

#endif
