/* File watching: core.watch(path) -> watcher; watcher:wait() suspends the
 * task until the file changes (a path ending in "/" watches every file of
 * the folder). core.list_dir(path) lists a folder. The watch is on the file's folder, filtered
 * by name, so editors that save by writing a new file and renaming it over
 * the old one are seen too. Changes that arrive while nobody waits are
 * coalesced into one. One task at a time may wait; closing the watcher
 * wakes it with an error. */
#include "watch.h"

#include <lauxlib.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "errors.h"
#include "loop.h"

#define WATCH_MT "luagent.Watcher"

typedef struct {
  lg_wait wait;
  lg_loop *loop;
  uv_fs_event_t *handle; /* malloc'd: libuv owns it until its close callback */
  char *name;            /* the file's base name */
  int changes;           /* changes not yet reported */
  int waiting;           /* a task waits in wait() */
} watcher;

static void on_closed(uv_handle_t *h) { free(h); }

/* Wakes the task waiting in wait(), if any. */
static void wake_waiter(watcher *w) {
  if (!w->waiting) return;
  w->waiting = 0;
  lg_task_wake(&w->wait);
}

/* Cancel hook of wait(): nothing is in flight, only the wait ends. */
static void wait_cancel(lg_wait *lw) {
  watcher *w = (watcher *)((char *)lw - offsetof(watcher, wait));
  w->waiting = 0;
}

static void on_change(uv_fs_event_t *h, const char *filename, int events, int status) {
  (void)events;
  watcher *w = h->data;
  if (!w || status < 0) return;
  if (filename && w->name[0] && strcmp(filename, w->name) != 0) return;
  w->changes++;
  lg_loop_activity(w->loop);
  wake_waiter(w);
}

/* Stops watching and wakes a waiting task (its wait() then raises);
 * idempotent (close, __gc and __close). */
static void watcher_close(watcher *w) {
  if (w->handle) {
    w->handle->data = NULL;
    uv_fs_event_stop(w->handle);
    uv_close((uv_handle_t *)w->handle, on_closed);
    w->handle = NULL;
  }
  free(w->name);
  w->name = NULL;
  wake_waiter(w);
}

static int l_watch_close(lua_State *L) {
  watcher_close(luaL_checkudata(L, 1, WATCH_MT));
  return 0;
}

/* watch(path) -> watcher, or nil, err when the folder cannot be watched. */
static int l_watch(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  lg_loop *loop = lg_loop_get(L);
  watcher *w = lua_newuserdatauv(L, sizeof *w, 0);
  memset(w, 0, sizeof *w);
  luaL_setmetatable(L, WATCH_MT);
  w->loop = loop;
  w->wait.cancel = wait_cancel;
  const char *slash = strrchr(path, '/');
  const char *base = slash ? slash + 1 : path;
  lua_pushlstring(L, path, slash ? (size_t)(slash - path) : 0);
  const char *dir = slash ? (slash == path ? "/" : lua_tostring(L, -1)) : ".";
  w->name = strdup(base);
  w->handle = malloc(sizeof *w->handle);
  if (!w->name || !w->handle) {
    free(w->handle);
    w->handle = NULL;
    return luaL_error(L, "watch: out of memory");
  }
  uv_fs_event_init(lg_loop_uv(loop), w->handle);
  w->handle->data = w;
  int rc = uv_fs_event_start(w->handle, on_change, dir, 0);
  if (rc != 0) {
    watcher_close(w);
    return lg_error_fail(L, LG_ERR_USAGE, "watch: cannot watch '%s': %s", dir, uv_strerror(rc));
  }
  lua_pop(L, 1);
  return 1;
}

static int wait_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  (void)ctx;
  watcher *w = luaL_checkudata(L, 1, WATCH_MT);
  if (w->changes > 0) {
    w->changes = 0;
    lua_pushboolean(L, 1);
    return 1;
  }
  if (!w->handle) return luaL_error(L, "wait: watcher is closed");
  if (w->waiting) return luaL_error(L, "wait: another task is already waiting");
  w->waiting = 1;
  return lg_task_suspend(L, &w->wait, 0, wait_k);
}

/* watcher:wait() -> true once the file changed since the last wait. */
static int l_watch_wait(lua_State *L) {
  luaL_checkudata(L, 1, WATCH_MT);
  lua_settop(L, 1);
  return wait_k(L, LUA_OK, 0);
}

/* watcher:pending() -> number of changes not yet taken by wait(). */
static int l_watch_pending(lua_State *L) {
  watcher *w = luaL_checkudata(L, 1, WATCH_MT);
  lua_pushinteger(L, w->changes);
  return 1;
}

/* list_dir(path) -> {names of regular files and links, unsorted}, or
 * nil, err (kind usage) when the folder cannot be read. Synchronous: for
 * small folders (tool sets, policies). */
static int l_list_dir(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  uv_fs_t req;
  int rc = uv_fs_scandir(NULL, &req, path, 0, NULL);
  if (rc < 0) {
    uv_fs_req_cleanup(&req);
    return lg_error_fail(L, LG_ERR_USAGE, "cannot read folder '%s': %s", path, uv_strerror(rc));
  }
  lua_createtable(L, rc, 0);
  uv_dirent_t ent;
  int i = 0;
  while (uv_fs_scandir_next(&req, &ent) != UV_EOF) {
    if (ent.type == UV_DIRENT_DIR) continue;
    lua_pushstring(L, ent.name);
    lua_rawseti(L, -2, ++i);
  }
  uv_fs_req_cleanup(&req);
  return 1;
}

void lg_watch_register(lua_State *L) {
  static const luaL_Reg methods[] = {
      {"wait", l_watch_wait}, {"pending", l_watch_pending}, {"close", l_watch_close}, {NULL, NULL}};
  lg_class_new(L, WATCH_MT, methods, l_watch_close, l_watch_close);
  lua_pushcfunction(L, l_watch);
  lua_setfield(L, -2, "watch");
  lua_pushcfunction(L, l_list_dir);
  lua_setfield(L, -2, "list_dir");
}
