/* File operations on the loop: each one a chain of uv_fs_* requests on one
 * uv_fs_t, each step started from the previous step's callback, in libuv's
 * thread pool. Callbacks run no Lua: they move the outcome into the
 * operation and call `done` once.
 *
 * Ownership: an lg_fs is malloc'd by lg_fs_start and belongs to its caller
 * until done ran (the caller reads the result, then lg_fs_free) or until
 * lg_fs_abandon, after which the operation frees itself: a request not yet
 * started in the pool is cancelled (its callback comes with UV_ECANCELED),
 * one that runs ends there, and then the descriptor it opened, if any, is
 * closed and the memory freed. The close is a step in the pool like the
 * others, the last one (on NFS a close flushes and may wait): a write whose
 * close fails failed, step "close". The path and the bytes to write are copies,
 * so nothing of the caller's is touched after it let go. An operation
 * counts as held work (lg_loop_hold) from its start to its end, abandoned
 * or not: the host's own work off the loop, which the virtual clock does
 * not overtake. At lua_close the loop runs the callbacks still due, so an
 * abandoned operation is freed then too.
 *
 * What is read or written: regular files only (links followed). A FIFO
 * would hold a thread of the pool for good (a read with no writer, a write
 * with no reader), and a device may do anything when opened; so both stat
 * the path first and open only a regular file (a write creates a missing
 * one), and both check the open descriptor again (the name may have been swapped meanwhile; the
 * open never waits, O_NONBLOCK, and O_NOCTTY keeps a terminal from
 * becoming ours). A read takes at most max_bytes: the buffer starts at the
 * size stat gave (one byte more, to see a file that grew) and grows to
 * max_bytes + 1 at most, so a file that reports no size (procfs) is read
 * to its end, within the bound. */
#include "fs.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <uv.h>

#define READ_MIN 4096

struct lg_fs {
  lg_loop *loop;
  uv_fs_t req;
  lg_fs_opts o;
  char *path;
  char *wdata;           /* write: our copy of the bytes */
  size_t wdone;          /* write: bytes written so far */
  uv_file fd;            /* -1 when none is open */
  int abandoned;
  int closing;           /* the close step is in the pool: never cancelled */
  int finished;          /* done ran (or the operation failed to start) */
  lg_fs_result r;
  char *rbuf;            /* read: the bytes */
  size_t rlen, rcap;
  uv_buf_t iov;
  lg_fs_entry *entries;  /* list */
  size_t count, next;    /* list: entries; the next one to lstat */
  char *lpath;           /* list: the path of the entry being lstat'ed */
};

static lg_fs_type type_of_mode(uint64_t mode) {
  if (S_ISREG(mode)) return LG_FT_FILE;
  if (S_ISDIR(mode)) return LG_FT_DIR;
  if (S_ISLNK(mode)) return LG_FT_LINK;
  if (S_ISFIFO(mode)) return LG_FT_FIFO;
  if (S_ISSOCK(mode)) return LG_FT_SOCKET;
  if (S_ISCHR(mode)) return LG_FT_CHAR;
  if (S_ISBLK(mode)) return LG_FT_BLOCK;
  return LG_FT_UNKNOWN;
}

static lg_fs_type type_of_dirent(uv_dirent_type_t t) {
  switch (t) {
    case UV_DIRENT_FILE: return LG_FT_FILE;
    case UV_DIRENT_DIR: return LG_FT_DIR;
    case UV_DIRENT_LINK: return LG_FT_LINK;
    case UV_DIRENT_FIFO: return LG_FT_FIFO;
    case UV_DIRENT_SOCKET: return LG_FT_SOCKET;
    case UV_DIRENT_CHAR: return LG_FT_CHAR;
    case UV_DIRENT_BLOCK: return LG_FT_BLOCK;
    default: return LG_FT_UNKNOWN;
  }
}

static void free_op(lg_fs *op) {
  for (size_t i = 0; i < op->count; i++) free(op->entries[i].name);
  free(op->entries);
  free(op->lpath);
  free(op->rbuf);
  free(op->wdata);
  free(op->path);
  free(op);
}

/* The operation ends (well or not), its descriptor closed: the loop
 * told, and done called, or, abandoned, it frees itself. */
static void finish_now(lg_fs *op) {
  op->finished = 1;
  lg_loop_hold(op->loop, -1);
  lg_loop_activity(op->loop);
  if (op->abandoned) {
    free_op(op);
    return;
  }
  op->o.done(op->o.arg);
}

/* The close step ended. A write's close that fails (a full disk or a
 * quota on NFS: close flushes) is a failed write, unless it failed
 * already; other closes' errors change nothing. */
static void close_cb(uv_fs_t *req) {
  lg_fs *op = req->data;
  int res = (int)req->result;
  uv_fs_req_cleanup(req);
  op->closing = 0;
  if (res < 0 && op->o.kind == LG_FS_WRITE && op->r.err == 0 && op->r.why == LG_FS_OK) {
    op->r.err = res;
    op->r.step = "close";
  }
  finish_now(op);
}

/* The operation ends: the descriptor, if one is open, is closed first as
 * one more step in the pool (on NFS a close flushes, and may wait long),
 * then finish_now. An abandoned operation's close is not cancelled. */
static void finish(lg_fs *op) {
  if (op->fd >= 0) {
    uv_file fd = op->fd;
    op->fd = -1;
    op->closing = 1;
    if (uv_fs_close(lg_loop_uv(op->loop), &op->req, fd, close_cb) == 0) return;
    op->closing = 0; /* not started (it cannot be, short of a bad request): here then */
    uv_fs_t req;
    uv_fs_close(NULL, &req, fd, NULL);
    uv_fs_req_cleanup(&req);
  }
  finish_now(op);
}

static void fail(lg_fs *op, const char *step, int err) {
  op->r.err = err;
  op->r.step = step;
  finish(op);
}

static void refuse(lg_fs *op, lg_fs_why why, lg_fs_type found) {
  op->r.why = why;
  op->r.found = found;
  finish(op);
}

/* The step's outcome (its callback's first lines): the result, or -1
 * when the operation ended (abandoned or failed at `step`). */
static ssize_t step_result(uv_fs_t *req, const char *step) {
  lg_fs *op = req->data;
  ssize_t res = req->result;
  if (op->abandoned) {
    /* an open that ended after all: its descriptor is closed by finish */
    if (req->fs_type == UV_FS_OPEN && res >= 0) op->fd = (uv_file)res;
    uv_fs_req_cleanup(req);
    finish(op);
    return -1;
  }
  if (res < 0) {
    uv_fs_req_cleanup(req);
    fail(op, step, (int)res);
    return -1;
  }
  return res;
}

/* Starts the next step: rc is what uv_fs_* returned. */
static void started(lg_fs *op, const char *step, int rc) {
  if (rc < 0) fail(op, step, rc);
}

/* ------------------------------------------------------------- read */

static void read_cb(uv_fs_t *req);

static void read_more(lg_fs *op) {
  if (op->rlen == op->rcap) {
    if (op->rcap > op->o.max_bytes) { /* one byte past the bound: too large */
      op->r.size = op->rlen;
      refuse(op, LG_FS_TOO_LARGE, LG_FT_FILE);
      return;
    }
    size_t cap = op->rcap * 2;
    if (cap < READ_MIN) cap = READ_MIN;
    if (cap > op->o.max_bytes + 1) cap = op->o.max_bytes + 1;
    char *b = realloc(op->rbuf, cap);
    if (!b) {
      fail(op, "read", UV_ENOMEM);
      return;
    }
    op->rbuf = b;
    op->rcap = cap;
  }
  op->iov = uv_buf_init(op->rbuf + op->rlen, (unsigned)(op->rcap - op->rlen > 0x40000000 ? 0x40000000 : op->rcap - op->rlen));
  started(op, "read", uv_fs_read(lg_loop_uv(op->loop), &op->req, op->fd, &op->iov, 1, -1, read_cb));
}

static void read_cb(uv_fs_t *req) {
  lg_fs *op = req->data;
  ssize_t n = step_result(req, "read");
  if (n < 0) return;
  uv_fs_req_cleanup(req);
  if (n == 0) {
    op->r.data = op->rbuf ? op->rbuf : "";
    op->r.len = op->rlen;
    finish(op);
    return;
  }
  op->rlen += (size_t)n;
  read_more(op);
}

static void read_fstat_cb(uv_fs_t *req) {
  lg_fs *op = req->data;
  if (step_result(req, "stat") < 0) return;
  uint64_t mode = req->statbuf.st_mode, size = req->statbuf.st_size;
  uv_fs_req_cleanup(req);
  if (!S_ISREG(mode)) { /* swapped since the stat */
    refuse(op, S_ISDIR(mode) ? LG_FS_IS_DIR : LG_FS_NOT_REGULAR, type_of_mode(mode));
    return;
  }
  if (size > op->o.max_bytes) {
    op->r.size = size;
    refuse(op, LG_FS_TOO_LARGE, LG_FT_FILE);
    return;
  }
  size_t cap = (size_t)size + 1;
  if (cap < READ_MIN) cap = READ_MIN;
  if (cap > op->o.max_bytes + 1) cap = op->o.max_bytes + 1;
  op->rbuf = malloc(cap);
  if (!op->rbuf) {
    fail(op, "read", UV_ENOMEM);
    return;
  }
  op->rcap = cap;
  read_more(op);
}

static void read_open_cb(uv_fs_t *req) {
  lg_fs *op = req->data;
  ssize_t fd = step_result(req, "open");
  if (fd < 0) return;
  op->fd = (uv_file)fd;
  uv_fs_req_cleanup(req);
  started(op, "stat", uv_fs_fstat(lg_loop_uv(op->loop), &op->req, op->fd, read_fstat_cb));
}

static void read_stat_cb(uv_fs_t *req) {
  lg_fs *op = req->data;
  if (step_result(req, "stat") < 0) return;
  uint64_t mode = req->statbuf.st_mode, size = req->statbuf.st_size;
  uv_fs_req_cleanup(req);
  if (!S_ISREG(mode)) {
    refuse(op, S_ISDIR(mode) ? LG_FS_IS_DIR : LG_FS_NOT_REGULAR, type_of_mode(mode));
    return;
  }
  if (size > op->o.max_bytes) {
    op->r.size = size;
    refuse(op, LG_FS_TOO_LARGE, LG_FT_FILE);
    return;
  }
  started(op, "open", uv_fs_open(lg_loop_uv(op->loop), &op->req, op->path,
                                 O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC, 0, read_open_cb));
}

/* ------------------------------------------------------------ write */

static void write_cb(uv_fs_t *req);

static void write_more(lg_fs *op) {
  if (op->wdone == op->o.len) {
    finish(op); /* the close is the last step: if it fails, so does the write */
    return;
  }
  size_t left = op->o.len - op->wdone;
  op->iov = uv_buf_init(op->wdata + op->wdone, (unsigned)(left > 0x40000000 ? 0x40000000 : left));
  started(op, "write", uv_fs_write(lg_loop_uv(op->loop), &op->req, op->fd, &op->iov, 1, -1, write_cb));
}

static void write_cb(uv_fs_t *req) {
  lg_fs *op = req->data;
  ssize_t n = step_result(req, "write");
  if (n < 0) return;
  uv_fs_req_cleanup(req);
  op->wdone += (size_t)n;
  write_more(op);
}

static void write_fstat_cb(uv_fs_t *req) {
  lg_fs *op = req->data;
  if (step_result(req, "stat") < 0) return;
  uint64_t mode = req->statbuf.st_mode;
  uv_fs_req_cleanup(req);
  if (!S_ISREG(mode)) {
    refuse(op, S_ISDIR(mode) ? LG_FS_IS_DIR : LG_FS_NOT_REGULAR, type_of_mode(mode));
    return;
  }
  write_more(op);
}

static void write_open_cb(uv_fs_t *req);

/* What is there before it is opened: a device or a FIFO is not opened at
 * all (opening some has effects); nothing there: it is created. */
static void write_stat_cb(uv_fs_t *req) {
  lg_fs *op = req->data;
  ssize_t res = req->result;
  if (op->abandoned) {
    uv_fs_req_cleanup(req);
    finish(op);
    return;
  }
  uint64_t mode = res >= 0 ? req->statbuf.st_mode : 0;
  uv_fs_req_cleanup(req);
  if (res < 0 && res != UV_ENOENT) {
    fail(op, "stat", (int)res);
    return;
  }
  if (res >= 0 && !S_ISREG(mode)) {
    refuse(op, S_ISDIR(mode) ? LG_FS_IS_DIR : LG_FS_NOT_REGULAR, type_of_mode(mode));
    return;
  }
  started(op, "open", uv_fs_open(lg_loop_uv(op->loop), &op->req, op->path,
                                 O_WRONLY | O_CREAT | O_NONBLOCK | O_NOCTTY | O_CLOEXEC |
                                     (op->o.append ? O_APPEND : O_TRUNC),
                                 0666, write_open_cb));
}

static void write_open_cb(uv_fs_t *req) {
  lg_fs *op = req->data;
  ssize_t fd = step_result(req, "open");
  if (fd < 0) return;
  op->fd = (uv_file)fd;
  uv_fs_req_cleanup(req);
  started(op, "stat", uv_fs_fstat(lg_loop_uv(op->loop), &op->req, op->fd, write_fstat_cb));
}

/* ------------------------------------------------------------- list */

static int by_name(const void *a, const void *b) {
  return strcmp(((const lg_fs_entry *)a)->name, ((const lg_fs_entry *)b)->name);
}

static void list_lstat_cb(uv_fs_t *req);

/* lstat's the next entry whose type the folder did not give, or ends. */
static void list_next(lg_fs *op) {
  while (op->next < op->count && op->entries[op->next].type != LG_FT_UNKNOWN) op->next++;
  if (op->next == op->count) {
    qsort(op->entries, op->count, sizeof *op->entries, by_name);
    op->r.entries = op->entries;
    op->r.count = op->count;
    finish(op);
    return;
  }
  free(op->lpath);
  size_t a = strlen(op->path), b = strlen(op->entries[op->next].name);
  op->lpath = malloc(a + b + 2);
  if (!op->lpath) {
    fail(op, "scandir", UV_ENOMEM);
    return;
  }
  memcpy(op->lpath, op->path, a);
  op->lpath[a] = '/';
  memcpy(op->lpath + a + 1, op->entries[op->next].name, b + 1);
  started(op, "stat", uv_fs_lstat(lg_loop_uv(op->loop), &op->req, op->lpath, list_lstat_cb));
}

static void list_lstat_cb(uv_fs_t *req) {
  lg_fs *op = req->data;
  ssize_t res = req->result;
  if (op->abandoned) {
    uv_fs_req_cleanup(req);
    finish(op);
    return;
  }
  /* gone since the listing: it stays, its type unknown */
  if (res >= 0) op->entries[op->next].type = type_of_mode(req->statbuf.st_mode);
  uv_fs_req_cleanup(req);
  op->next++;
  list_next(op);
}

static void scandir_cb(uv_fs_t *req) {
  lg_fs *op = req->data;
  ssize_t n = step_result(req, "scandir");
  if (n < 0) return;
  op->entries = calloc((size_t)n + 1, sizeof *op->entries);
  if (!op->entries) {
    uv_fs_req_cleanup(req);
    fail(op, "scandir", UV_ENOMEM);
    return;
  }
  uv_dirent_t ent;
  /* to the end: libuv frees the last entry on the call that says UV_EOF */
  while (uv_fs_scandir_next(req, &ent) != UV_EOF) {
    if (op->count == (size_t)n) continue;
    char *name = strdup(ent.name);
    if (!name) {
      uv_fs_req_cleanup(req);
      fail(op, "scandir", UV_ENOMEM);
      return;
    }
    op->entries[op->count].name = name;
    op->entries[op->count].type = type_of_dirent(ent.type);
    op->count++;
  }
  uv_fs_req_cleanup(req);
  list_next(op);
}

/* ------------------------------------------------------------- stat */

static void stat_cb(uv_fs_t *req) {
  lg_fs *op = req->data;
  if (step_result(req, "stat") < 0) return;
  op->r.type = type_of_mode(req->statbuf.st_mode);
  op->r.size = req->statbuf.st_size;
  op->r.mtime = (double)req->statbuf.st_mtim.tv_sec + (double)req->statbuf.st_mtim.tv_nsec / 1e9;
  uv_fs_req_cleanup(req);
  finish(op);
}

/* ----------------------------------------------------------- public */

int lg_fs_start(lg_loop *loop, const lg_fs_opts *o, lg_fs **out) {
  *out = NULL;
  lg_fs *op = calloc(1, sizeof *op);
  if (!op) return UV_ENOMEM;
  op->loop = loop;
  op->o = *o;
  op->fd = -1;
  op->req.data = op;
  op->path = strdup(o->path);
  if (!op->path) {
    free_op(op);
    return UV_ENOMEM;
  }
  if (o->kind == LG_FS_WRITE) {
    op->wdata = malloc(o->len ? o->len : 1);
    if (!op->wdata) {
      free_op(op);
      return UV_ENOMEM;
    }
    memcpy(op->wdata, o->data, o->len);
  }
  uv_loop_t *uv = lg_loop_uv(loop);
  int rc;
  switch (o->kind) {
    case LG_FS_READ: rc = uv_fs_stat(uv, &op->req, op->path, read_stat_cb); break;
    case LG_FS_WRITE: rc = uv_fs_stat(uv, &op->req, op->path, write_stat_cb); break;
    case LG_FS_LIST: rc = uv_fs_scandir(uv, &op->req, op->path, 0, scandir_cb); break;
    default: rc = uv_fs_stat(uv, &op->req, op->path, stat_cb); break;
  }
  if (rc < 0) {
    free_op(op);
    return rc;
  }
  lg_loop_hold(loop, 1);
  *out = op;
  return 0;
}

void lg_fs_result_get(lg_fs *op, lg_fs_result *r) { *r = op->r; }

void lg_fs_free(lg_fs *op) {
  if (op) free_op(op);
}

void lg_fs_abandon(lg_fs *op) {
  if (!op) return;
  if (op->finished) { /* done ran, its result never read */
    free_op(op);
    return;
  }
  op->abandoned = 1;
  /* a step not yet started ends UV_ECANCELED; a close is let run, or the
   * descriptor would stay open */
  if (!op->closing) uv_cancel((uv_req_t *)&op->req);
}
