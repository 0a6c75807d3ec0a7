/* File operations on the loop (luagent.fs): read a file whole, write or
 * append one, list a folder, stat a path, each as a chain of uv_fs_*
 * requests run in libuv's thread pool, so the loop goes on meanwhile. No
 * Lua in fs.c: host/fs_lua.c is the binding. */
#ifndef LG_FS_H
#define LG_FS_H

#include <stddef.h>
#include <stdint.h>

#include <lua.h>

#include "loop.h"

typedef struct lg_fs lg_fs;

typedef enum { LG_FS_READ, LG_FS_WRITE, LG_FS_LIST, LG_FS_STAT } lg_fs_kind;

/* The type of a file, as list and stat name it. */
typedef enum {
  LG_FT_UNKNOWN, LG_FT_FILE, LG_FT_DIR, LG_FT_LINK, LG_FT_FIFO, LG_FT_SOCKET, LG_FT_CHAR, LG_FT_BLOCK
} lg_fs_type;

/* Why an operation failed beyond its errno (err is 0 then). */
typedef enum {
  LG_FS_OK,
  LG_FS_IS_DIR,        /* a folder where a file is wanted (read, write) */
  LG_FS_NOT_REGULAR,   /* a FIFO, a device or a socket: never read or written */
  LG_FS_TOO_LARGE,     /* read: more than max_bytes */
  LG_FS_NOT_DIR        /* list: not a folder */
} lg_fs_why;

typedef struct {
  lg_fs_kind kind;
  const char *path;       /* copied */
  const char *data;       /* write: the bytes (copied) */
  size_t len;
  int append;             /* write: append instead of replacing */
  size_t max_bytes;       /* read: at most this many bytes */
  void (*done)(void *arg);/* called once, from a libuv callback, unless abandoned */
  void *arg;
} lg_fs_opts;

typedef struct {
  char *name;
  lg_fs_type type;
} lg_fs_entry;

typedef struct {
  int err;                 /* 0, or the negative libuv error of the failing step */
  const char *step;        /* the failing step: "stat", "open", "read", "write", "close", "scandir" */
  lg_fs_why why;
  lg_fs_type found;        /* LG_FS_NOT_REGULAR: what was there */
  const char *data;        /* read: the bytes */
  size_t len;
  const lg_fs_entry *entries; /* list: sorted by name (bytes) */
  size_t count;
  lg_fs_type type;         /* stat (links followed) */
  uint64_t size;           /* stat; LG_FS_TOO_LARGE: the size found (at least) */
  double mtime;            /* stat: seconds since the epoch */
} lg_fs_result;

/* Starts an operation; *out owns it until done ran (then lg_fs_free) or
 * until lg_fs_abandon. 0, or a negative libuv error (nothing started). */
int lg_fs_start(lg_loop *loop, const lg_fs_opts *o, lg_fs **out);
/* The outcome, valid until lg_fs_free. Only after done. */
void lg_fs_result_get(lg_fs *op, lg_fs_result *r);
/* Frees a finished operation. */
void lg_fs_free(lg_fs *op);
/* Lets go of an operation before its end (its task was cancelled): done is
 * never called; the request is cancelled if it has not started, else its
 * step ends in the pool and the operation then closes what it opened and
 * frees itself. */
void lg_fs_abandon(lg_fs *op);

/* The binding (host/fs_lua.c): sets fs_read, fs_write, fs_list and fs_stat
 * into the table on top of the stack. */
void lg_fs_register(lua_State *L);

#endif
