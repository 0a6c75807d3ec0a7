/* Child processes on the loop.
 *
 * Ownership: an lg_process is malloc'd by lg_process_spawn and belongs to the
 * caller until lg_process_release; libuv owns its handles until their close
 * callbacks, so the memory is freed only when both have let go (released and
 * no handle open). Callbacks run no Lua: they move bytes into the capture
 * buffers, record the exit and call `done` once.
 *
 * Every child is started detached (setsid), so it leads a new process group
 * whose id is its pid; a kill goes to the whole group (-pid), grandchildren
 * included, and so does the SIGKILL that ends what is left of the group
 * when the child exits. That one is the last signal: once the leader is
 * reaped its pid, and so the group's id, may be reused by a process of
 * someone else's, so no kill is sent after it (the drain then waits only
 * on processes that left the group, which no group kill reaches). While a child runs it counts as busy, and, unless
 * it is a stream child, as real work for the virtual clock until it exited
 * and its output ended
 * (a stream child, a server of ours that may idle for the whole run, is
 * real work only while a task waits on it: process_lua.c).
 *
 * Stream mode keeps stdin open (each write a malloc'd request freed by its
 * callback) and hands stdout out as it comes: the owner peeks and takes;
 * reading pauses (UV_ENOBUFS from on_alloc) while max_output bytes wait. */
#include "process.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "core.h"

typedef struct {
  uv_pipe_t pipe;
  char *data;
  size_t len, cap;
  size_t dropped;
  int eof;
  int full;             /* stream stdout: reading paused, the buffer is full */
  char scratch[4096];   /* receives bytes past the cap, which are only counted */
} capture;

struct lg_process {
  lg_loop *loop;
  uv_process_t proc;
  uv_pipe_t in;
  uv_write_t wreq;
  capture out, err;
  lg_timer grace;
  lg_timer drain;       /* after the exit: how long its pipes may stay open */
  lg_closer closer;     /* released while running: closed with the loop */
  char *input;
  size_t input_len, max_output;
  int open;             /* libuv handles not yet closed */
  int pid, exited, term_signal, killed, finished, released;
  int stream, in_open;  /* stream mode; stdin still takes writes */
  int real;             /* counted as real work until it exits (not stream mode) */
  int discard;          /* stream mode, killed: stdout is read and dropped */
  long long exit_status;
  void (*done)(void *arg);
  void (*data)(void *arg);
  void *arg;
};

/* One queued write to a stream child's stdin; freed by its callback. */
typedef struct {
  uv_write_t req;
  char bytes[];
} write_req;

/* Frees p once its owner released it and libuv closed every handle. */
static void maybe_free(lg_process *p) {
  if (!p->released || p->open > 0) return;
  lg_loop_closer_remove(p->loop, &p->closer);
  free(p->out.data);
  free(p->err.data);
  free(p->input);
  free(p);
}

/* Close callback of every handle of p: the last one may free p. */
static void on_closed(uv_handle_t *h) {
  lg_process *p = h->data;
  p->open--;
  maybe_free(p);
}

/* Starts closing a handle of p (once). */
static void close_handle(uv_handle_t *h) {
  if (!uv_is_closing(h)) uv_close(h, on_closed);
}

/* Sends `sig` to the child's process group (and to the child itself, in
 * case it left the group) while the child runs: after its exit the ids
 * may name someone else's processes (on_exit_cb sent the last kill). */
static void signal_group(lg_process *p, int sig) {
  if (p->pid <= 0 || p->exited) return;
  kill(-p->pid, sig);
  kill(p->pid, sig);
}

/* Marks p finished once the child exited and both pipes ended; calls done. */
static void check_finished(lg_process *p) {
  if (p->finished || !p->exited || !p->out.eof || !p->err.eof) return;
  p->finished = 1;
  lg_loop_timer_stop(p->loop, &p->grace);
  lg_loop_timer_stop(p->loop, &p->drain);
  /* real work until its output ended too: what it left in its group dies
   * of the last kill and closes the pipes in real time, which the virtual
   * clock must not overtake (a jump would fire the drain, or a tool's
   * grace, before the end of output arrives) */
  if (p->real) {
    p->real = 0;
    lg_loop_real(p->loop, -1);
  }
  lg_loop_busy(p->loop, -1);
  lg_loop_activity(p->loop);
  if (p->done && !p->released) p->done(p->arg);
}

/* Closes a stream child's stdin (once); queued writes end cancelled. */
static void close_stdin(lg_process *p) {
  if (!p->in_open) return;
  p->in_open = 0;
  close_handle((uv_handle_t *)&p->in);
}

/* Tells a stream owner that stdout changed (bytes, pause or end). */
static void notify_data(lg_process *p) {
  if (p->data && !p->released) p->data(p->arg);
}

/* Stops reading a pipe that has not ended and closes it (its end is taken
 * as reached). */
static void end_capture(lg_process *p, capture *c) {
  if (c->eof) return;
  c->eof = 1;
  uv_read_stop((uv_stream_t *)&c->pipe);
  close_handle((uv_handle_t *)&c->pipe);
  if (p->stream && c == &p->out) notify_data(p);
}

/* The drain after the exit ended with a pipe still open: a process that
 * left the group (setsid, a daemon) holds it, and no kill reaches it.
 * What was read so far is the output. */
static void drain_fire(lg_timer *t) {
  lg_process *p = (lg_process *)((char *)t - offsetof(lg_process, drain));
  end_capture(p, &p->out);
  end_capture(p, &p->err);
  check_finished(p);
}

/* The child exited (reaped by libuv): records how, closes the handle, and
 * kills what it left running in its group (a job it put in the
 * background): that would outlive the tool and luagent, and hold the
 * pipes open so their end never came. What is in the pipes stays readable;
 * they get LG_PROCESS_DRAIN seconds more to deliver it (a process that left
 * the group may still hold them). */
static void on_exit_cb(uv_process_t *h, int64_t status, int sig) {
  lg_process *p = h->data;
  lg_loop_activity(p->loop);
  p->exit_status = (long long)status;
  p->term_signal = sig;
  /* the last signal to the group, right after the reap: a group's id is
   * not reused while a member lives, and what the child left is all that
   * can be in it */
  if (p->pid > 0) kill(-p->pid, SIGKILL);
  p->exited = 1;
  close_handle((uv_handle_t *)h);
  close_stdin(p);
  check_finished(p);
  if (!p->finished) lg_loop_timer_start(p->loop, &p->drain, LG_PROCESS_DRAIN);
}

/* Gives libuv room at the end of a capture buffer; past max_output a small
 * scratch area receives bytes that are only counted. */
static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *out) {
  capture *c = (capture *)h;
  lg_process *p = h->data;
  (void)suggested;
  if (p->stream && c == &p->out && p->discard) {
    *out = uv_buf_init(c->scratch, sizeof c->scratch);
    return;
  }
  if (p->stream && c->len >= p->max_output) {
    if (c == &p->out) {
      *out = uv_buf_init(NULL, 0); /* UV_ENOBUFS: on_read pauses reading */
      return;
    }
    /* stderr keeps its latest bytes: the older half goes */
    size_t drop = c->len - c->len / 2;
    memmove(c->data, c->data + drop, c->len - drop);
    c->len -= drop;
    c->dropped += drop;
  }
  if (c->len >= p->max_output) {
    *out = uv_buf_init(c->scratch, sizeof c->scratch);
    return;
  }
  size_t want = c->len + 65536;
  if (want > p->max_output) want = p->max_output;
  if (want > c->cap) {
    char *d = realloc(c->data, want);
    if (!d) {
      *out = uv_buf_init(c->scratch, sizeof c->scratch);
      return;
    }
    c->data = d;
    c->cap = want;
  }
  *out = uv_buf_init(c->data + c->len, (unsigned)(c->cap - c->len));
}

/* Bytes from stdout or stderr: kept below the cap, counted above it; at
 * EOF (or a read error) the pipe closes. */
static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
  capture *c = (capture *)s;
  lg_process *p = s->data;
  if (nread == 0) return;
  lg_loop_activity(p->loop);
  int out = p->stream && c == &p->out;
  if (nread > 0) {
    if (c->data && buf->base >= c->data && buf->base < c->data + c->cap) c->len += (size_t)nread;
    else c->dropped += (size_t)nread;
    if (out) notify_data(p);
    return;
  }
  if (nread == UV_ENOBUFS && out) {
    uv_read_stop(s);
    c->full = 1;
    notify_data(p);
    return;
  }
  c->eof = 1;
  uv_read_stop(s);
  close_handle((uv_handle_t *)s);
  if (out) notify_data(p);
  check_finished(p);
}

/* stdin was written (or could not be): close it so the child sees EOF. */
static void on_write(uv_write_t *req, int status) {
  (void)status;
  lg_process *p = req->data;
  close_handle((uv_handle_t *)&p->in);
}

/* The loop closes while a released child was still to be reaped (it was
 * killed; its zombie goes with us): its handles are closed here with
 * on_closed, so the last one frees p. */
static void closer_close(lg_closer *c) {
  lg_process *p = (lg_process *)((char *)c - offsetof(lg_process, closer));
  lg_loop_timer_stop(p->loop, &p->grace);
  lg_loop_timer_stop(p->loop, &p->drain);
  close_handle((uv_handle_t *)&p->proc);
  close_handle((uv_handle_t *)&p->out.pipe);
  close_handle((uv_handle_t *)&p->err.pipe);
  if (p->in.data) close_handle((uv_handle_t *)&p->in); /* there is a stdin pipe */
}

/* The grace after SIGTERM ended: SIGKILL to the group if the child still
 * runs (signal_group). */
static void grace_fire(lg_timer *t) {
  lg_process *p = (lg_process *)((char *)t - offsetof(lg_process, grace));
  signal_group(p, SIGKILL);
}

int lg_process_spawn(lg_loop *loop, const lg_process_opts *o, lg_process **out) {
  lg_process *p = calloc(1, sizeof *p);
  if (!p) return UV_ENOMEM;
  uv_loop_t *uv = lg_loop_uv(loop);
  p->loop = loop;
  p->max_output = o->max_output;
  p->done = o->done;
  p->data = o->data;
  p->stream = o->stream;
  p->arg = o->arg;
  p->grace.fire = grace_fire;
  p->drain.fire = drain_fire;
  p->closer.close = closer_close;
  if (o->input && !o->stream) { /* stream mode writes it through lg_process_write (a copy of its own) */
    p->input = malloc(o->input_len ? o->input_len : 1);
    if (!p->input) {
      free(p);
      return UV_ENOMEM;
    }
    memcpy(p->input, o->input, o->input_len);
    p->input_len = o->input_len;
  }
  lg_ignore_sigpipe(); /* a child that exits unread must not kill us */
  uv_stdio_container_t stdio[3];
  uv_pipe_init(uv, &p->out.pipe, 0);
  uv_pipe_init(uv, &p->err.pipe, 0);
  p->out.pipe.data = p->err.pipe.data = p;
  p->open = 2;
  if (o->input || o->stream) {
    uv_pipe_init(uv, &p->in, 0);
    p->in.data = p;
    p->open++;
    stdio[0].flags = UV_CREATE_PIPE | UV_READABLE_PIPE;
    stdio[0].data.stream = (uv_stream_t *)&p->in;
  } else {
    stdio[0].flags = UV_IGNORE;
  }
  stdio[1].flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE;
  stdio[1].data.stream = (uv_stream_t *)&p->out.pipe;
  stdio[2].flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE;
  stdio[2].data.stream = (uv_stream_t *)&p->err.pipe;
  uv_process_options_t opts;
  memset(&opts, 0, sizeof opts);
  opts.exit_cb = on_exit_cb;
  opts.file = o->argv[0];
  opts.args = (char **)o->argv;
  opts.cwd = o->cwd;
  opts.env = (char **)o->env;
  opts.flags = UV_PROCESS_DETACHED;
  opts.stdio_count = 3;
  opts.stdio = stdio;
  p->proc.data = p;
  int rc = uv_spawn(uv, &p->proc, &opts);
  p->open++; /* the process handle is initialised even when spawning failed */
  if (rc != 0) {
    p->released = 1;
    close_handle((uv_handle_t *)&p->proc);
    close_handle((uv_handle_t *)&p->out.pipe);
    close_handle((uv_handle_t *)&p->err.pipe);
    if (o->input || o->stream) close_handle((uv_handle_t *)&p->in);
    return rc;
  }
  p->pid = p->proc.pid;
  lg_loop_busy(loop, 1);
  if (!o->stream) {
    p->real = 1;
    lg_loop_real(loop, 1);
  }
  uv_read_start((uv_stream_t *)&p->out.pipe, on_alloc, on_read);
  uv_read_start((uv_stream_t *)&p->err.pipe, on_alloc, on_read);
  if (o->stream) {
    p->in_open = 1;
    if (o->input && o->input_len > 0) lg_process_write(p, o->input, o->input_len);
  } else if (o->input) {
    uv_buf_t b = uv_buf_init(p->input, (unsigned)p->input_len);
    p->wreq.data = p;
    if (p->input_len == 0 || uv_write(&p->wreq, (uv_stream_t *)&p->in, &b, 1, on_write) != 0)
      close_handle((uv_handle_t *)&p->in);
  }
  *out = p;
  return 0;
}

int lg_process_finished(const lg_process *p) { return p->finished; }

void lg_process_info_get(const lg_process *p, lg_process_info *info) {
  info->pid = p->pid;
  info->exited = p->exited;
  info->exit_status = p->exit_status;
  info->term_signal = p->term_signal;
  info->out = p->out.data ? p->out.data : "";
  info->out_len = p->out.len;
  info->err = p->err.data ? p->err.data : "";
  info->err_len = p->err.len;
  info->out_dropped = p->out.dropped;
  info->err_dropped = p->err.dropped;
  info->killed = p->killed;
}

int lg_process_kill(lg_process *p, double grace) {
  if (p->finished) return 0;
  if (p->stream && !p->discard) {
    /* nobody wants a killed peer's output: read it away so its end comes */
    p->discard = 1;
    if (p->out.full && !p->out.eof) {
      p->out.full = 0;
      uv_read_start((uv_stream_t *)&p->out.pipe, on_alloc, on_read);
    }
  }
  if (p->exited) return 0; /* it ended by itself: nothing to kill */
  p->killed = 1;
  if (grace <= 0) {
    signal_group(p, SIGKILL);
    return 1;
  }
  signal_group(p, SIGTERM);
  if (!lg_timer_armed(&p->grace)) lg_loop_timer_start(p->loop, &p->grace, grace);
  return 1;
}

/* A stream write is done (or cancelled because stdin closed): frees it. */
static void on_stream_write(uv_write_t *req, int status) {
  (void)status;
  free(req);
}

int lg_process_write(lg_process *p, const char *data, size_t len) {
  if (!p->stream || !p->in_open) return UV_EPIPE;
  if (len == 0) return 0;
  if (len > (unsigned)-1 / 2) return UV_E2BIG;
  write_req *w = malloc(sizeof *w + len);
  if (!w) return UV_ENOMEM;
  memcpy(w->bytes, data, len);
  uv_buf_t b = uv_buf_init(w->bytes, (unsigned)len);
  int rc = uv_write(&w->req, (uv_stream_t *)&p->in, &b, 1, on_stream_write);
  if (rc != 0) free(w);
  return rc;
}

void lg_process_close_stdin(lg_process *p) { close_stdin(p); }

size_t lg_process_stdin_queued(const lg_process *p) {
  if (!p->stream || !p->in_open) return 0;
  return uv_stream_get_write_queue_size((const uv_stream_t *)&p->in);
}

const char *lg_process_peek(const lg_process *p, size_t *len, int *eof, int *full) {
  *len = p->out.len;
  *eof = p->out.eof;
  *full = p->out.full;
  return p->out.data ? p->out.data : "";
}

void lg_process_take(lg_process *p, size_t n) {
  capture *c = &p->out;
  if (n > c->len) n = c->len;
  memmove(c->data, c->data + n, c->len - n);
  c->len -= n;
  if (c->full && c->len < p->max_output && !c->eof) {
    c->full = 0;
    uv_read_start((uv_stream_t *)&c->pipe, on_alloc, on_read);
  }
}

void lg_process_release(lg_process *p) {
  if (!p || p->released) return;
  p->released = 1;
  p->done = NULL;
  p->data = NULL;
  lg_loop_timer_stop(p->loop, &p->grace);
  lg_loop_timer_stop(p->loop, &p->drain);
  if (!p->exited) {
    p->killed = 1;
    signal_group(p, SIGKILL);
  }
  if (p->open > 0) lg_loop_closer_add(p->loop, &p->closer);
  if (p->stream) {
    /* a paused stdout would never reach its end: nobody reads any more */
    close_stdin(p);
    end_capture(p, &p->out);
    end_capture(p, &p->err);
    check_finished(p);
  } else if (p->exited) {
    /* the drain stopped above would have ended the output: a process that
     * left the group may hold the pipes for good, and until they end the
     * child counts as busy and as real work */
    end_capture(p, &p->out);
    end_capture(p, &p->err);
    check_finished(p);
  }
  maybe_free(p);
}
