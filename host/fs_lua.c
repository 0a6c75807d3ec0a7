/* Lua binding of the file operations (host/fs.c), under the suspension
 * contract: core.fs_read(path, max_bytes), core.fs_write(path, data,
 * append), core.fs_list(path), core.fs_stat(path) start the operation and
 * suspend the calling task until it ends (a plain script's call drives the
 * loop meanwhile); its cancel hook lets go of the operation
 * (lg_fs_abandon), so a cancelled task raises `cancelled` at once. The
 * operation's state sits in a userdata on the caller's stack, whose __gc
 * lets go of one whose wait was never resumed. Failures are `nil, err`
 * with err {kind = "fs", message =, path =, op =, reason =, code =}
 * (lua/luagent/base/fs.lua is the face: luagent.fs, its checks and
 * options). */
#include <lauxlib.h>
#include <stddef.h>
#include <string.h>

#include "core.h"
#include "errors.h"
#include "fs.h"
#include "loop.h"

#define FS_MT "luagent.FsOp"
#define UD_INDEX 4 /* where the operation's userdata sits on the caller's stack */

typedef struct {
  lg_fs *op;   /* NULL once freed or let go */
  lg_wait w;
  int waiting;
  int done;
  lg_fs_kind kind;
} fs_ud;

static const char *const OP_NAMES[] = {"read", "write", "list", "stat"};

static const char *type_name(lg_fs_type t) {
  switch (t) {
    case LG_FT_FILE: return "file";
    case LG_FT_DIR: return "directory";
    case LG_FT_LINK: return "link";
    case LG_FT_FIFO: return "fifo";
    case LG_FT_SOCKET: return "socket";
    case LG_FT_CHAR: return "char_device";
    case LG_FT_BLOCK: return "block_device";
    default: return "unknown";
  }
}

/* What a file that is not regular is, for messages. */
static const char *type_text(lg_fs_type t) {
  switch (t) {
    case LG_FT_DIR: return "a folder";
    case LG_FT_FIFO: return "a FIFO";
    case LG_FT_SOCKET: return "a socket";
    case LG_FT_CHAR: return "a character device";
    case LG_FT_BLOCK: return "a block device";
    default: return "not a file";
  }
}

static void on_done(void *arg) {
  fs_ud *u = arg;
  u->done = 1;
  if (!u->waiting) return;
  u->waiting = 0;
  lg_task_wake(&u->w);
}

/* Cancel hook: the task was cancelled; the operation goes on alone. */
static void fs_cancel(lg_wait *w) {
  fs_ud *u = (fs_ud *)((char *)w - offsetof(fs_ud, w));
  u->waiting = 0;
  lg_fs_abandon(u->op);
  u->op = NULL;
}

static int fs_gc(lua_State *L) {
  fs_ud *u = luaL_checkudata(L, 1, FS_MT);
  lg_fs_abandon(u->op);
  u->op = NULL;
  return 0;
}

static void set_str(lua_State *L, const char *k, const char *v) {
  lua_pushstring(L, v);
  lua_setfield(L, -2, k);
}

/* The reason of a libuv error, as luagent.fs names it. */
static const char *reason_of(int err, lg_fs_kind kind) {
  switch (err) {
    case UV_ENOENT: return "missing";
    case UV_ENOTDIR: return kind == LG_FS_LIST ? "not_directory" : "missing";
    case UV_EACCES:
    case UV_EPERM: return "permission_denied";
    case UV_EISDIR: return "directory";
    case UV_ENOSPC: return "no_space";
    case UV_EROFS: return "read_only";
    default: return "failed";
  }
}

/* nil and the record of a failed operation; returns 2. */
static int push_failure(lua_State *L, fs_ud *u, const lg_fs_result *r, const char *path) {
  const char *op = OP_NAMES[u->kind];
  const char *reason, *code = NULL;
  lua_pushnil(L);
  if (r->err) {
    reason = reason_of(r->err, u->kind);
    code = uv_err_name(r->err);
    lua_pushfstring(L, "cannot %s '%s': %s", op, path, uv_strerror(r->err));
  } else {
    switch (r->why) {
      case LG_FS_IS_DIR:
        reason = "directory";
        lua_pushfstring(L, "cannot %s '%s': it is a folder, not a file", op, path);
        break;
      case LG_FS_NOT_REGULAR:
        reason = "not_regular";
        lua_pushfstring(L, "cannot %s '%s': it is not a regular file (%s)", op, path, type_text(r->found));
        break;
      case LG_FS_TOO_LARGE:
        reason = "too_large";
        lua_pushfstring(L, "cannot %s '%s': it holds more than %I bytes (max_bytes; %I or more found)", op, path,
                        (lua_Integer)lua_tointeger(L, 2), (lua_Integer)r->size);
        break;
      default:
        reason = "not_directory";
        lua_pushfstring(L, "cannot %s '%s': it is not a folder", op, path);
        break;
    }
  }
  lg_error_push(L, LG_ERR_FS, lua_tostring(L, -1));
  lua_remove(L, -2);
  set_str(L, "path", path);
  set_str(L, "op", op);
  set_str(L, "reason", reason);
  if (code) set_str(L, "code", code);
  return 2;
}

/* Pushes the outcome of the finished operation of u. */
static int push_outcome(lua_State *L, fs_ud *u) {
  lg_fs_result r;
  lg_fs_result_get(u->op, &r);
  const char *path = lua_tostring(L, 1);
  int n;
  if (r.err || r.why != LG_FS_OK) {
    n = push_failure(L, u, &r, path);
  } else if (u->kind == LG_FS_READ) {
    lua_pushlstring(L, r.data, r.len);
    n = 1;
  } else if (u->kind == LG_FS_WRITE) {
    lua_pushboolean(L, 1);
    n = 1;
  } else if (u->kind == LG_FS_LIST) {
    lua_createtable(L, (int)r.count, 0);
    for (size_t i = 0; i < r.count; i++) {
      lua_createtable(L, 0, 2);
      set_str(L, "name", r.entries[i].name);
      set_str(L, "type", type_name(r.entries[i].type));
      lua_rawseti(L, -2, (lua_Integer)i + 1);
    }
    n = 1;
  } else {
    lua_createtable(L, 0, 3);
    set_str(L, "type", type_name(r.type));
    lua_pushinteger(L, (lua_Integer)r.size);
    lua_setfield(L, -2, "size");
    lua_pushnumber(L, r.mtime);
    lua_setfield(L, -2, "mtime");
    n = 1;
  }
  lg_fs_free(u->op);
  u->op = NULL;
  return n;
}

static int fs_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  (void)ctx;
  fs_ud *u = luaL_checkudata(L, UD_INDEX, FS_MT);
  if (!u->op) return luaL_error(L, "fs: the operation was let go");
  if (u->done) return push_outcome(L, u);
  u->waiting = 1;
  return lg_task_suspend(L, &u->w, 0, fs_k);
}

/* Starts an operation of `kind` with the arguments at 1..3 (normalized by
 * the caller) and waits for its end. */
static int start(lua_State *L, lg_fs_kind kind, const char *data, size_t len, int append, size_t max_bytes) {
  size_t plen;
  const char *path = lua_tolstring(L, 1, &plen);
  if (strlen(path) != plen) return luaL_error(L, "fs.%s: path must not hold a NUL byte", OP_NAMES[kind]);
  lg_loop *loop = lg_loop_get(L); /* before the userdata: finalized after it */
  fs_ud *u = lua_newuserdatauv(L, sizeof *u, 0);
  memset(u, 0, sizeof *u);
  u->kind = kind;
  u->w.cancel = fs_cancel;
  luaL_setmetatable(L, FS_MT);
  lg_fs_opts o = {.kind = kind, .path = path, .data = data, .len = len, .append = append,
                  .max_bytes = max_bytes, .done = on_done, .arg = u};
  int rc = lg_fs_start(loop, &o, &u->op);
  if (rc != 0) {
    lg_fs_result r;
    memset(&r, 0, sizeof r);
    r.err = rc;
    r.step = "open";
    return push_failure(L, u, &r, path);
  }
  return fs_k(L, LUA_OK, 0);
}

/* fs_read(path, max_bytes) -> bytes | nil, err */
static int l_fs_read(lua_State *L) {
  luaL_checkstring(L, 1);
  lua_Integer max = luaL_checkinteger(L, 2);
  luaL_argcheck(L, max >= 0, 2, "max_bytes must be >= 0");
  lua_settop(L, 3);
  return start(L, LG_FS_READ, NULL, 0, 0, (size_t)max);
}

/* fs_write(path, data, append) -> true | nil, err */
static int l_fs_write(lua_State *L) {
  luaL_checkstring(L, 1);
  size_t len;
  const char *data = luaL_checklstring(L, 2, &len);
  int append = lua_toboolean(L, 3);
  lua_settop(L, 3);
  return start(L, LG_FS_WRITE, data, len, append, 0);
}

/* fs_list(path) -> {{name=, type=}...} sorted by name | nil, err */
static int l_fs_list(lua_State *L) {
  luaL_checkstring(L, 1);
  lua_settop(L, 3);
  return start(L, LG_FS_LIST, NULL, 0, 0, 0);
}

/* fs_stat(path) -> {type=, size=, mtime=} | nil, err (links followed) */
static int l_fs_stat(lua_State *L) {
  luaL_checkstring(L, 1);
  lua_settop(L, 3);
  return start(L, LG_FS_STAT, NULL, 0, 0, 0);
}

void lg_fs_register(lua_State *L) {
  lg_class_new(L, FS_MT, NULL, NULL, fs_gc);
  static const luaL_Reg fns[] = {{"fs_read", l_fs_read}, {"fs_write", l_fs_write},
                                 {"fs_list", l_fs_list}, {"fs_stat", l_fs_stat}, {NULL, NULL}};
  luaL_setfuncs(L, fns, 0);
}
