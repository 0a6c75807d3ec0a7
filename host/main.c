/* The luagent executable: embeds Lua 5.4, preloads luagent.core, points
 * package.path at the Lua library next to the binary, and hands argv to
 * luagent.cli. Everything a user sees of the command line is in cli.lua. */
#include <lauxlib.h>
#include <limits.h>
#include <lualib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "core.h"

/* Finds the installation root: the folder holding lua/luagent/init.lua,
 * looked for beside the binary first (checkout: build/.., installed:
 * PREFIX/share/luagent), then in $LUAGENT_HOME. Fills `root`; 0 or -1. */
static int find_root(char *root, size_t size) {
  static const char *candidates[] = {"/..", "/../share/luagent"};
  char exe[PATH_MAX], probe[PATH_MAX + 64];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n > 0) {
    exe[n] = '\0';
    char *slash = strrchr(exe, '/');
    if (slash) *slash = '\0';
    for (size_t i = 0; i < sizeof candidates / sizeof *candidates; i++) {
      snprintf(probe, sizeof probe, "%s%s/lua/luagent/init.lua", exe, candidates[i]);
      if (access(probe, R_OK) == 0) {
        snprintf(probe, sizeof probe, "%s%s", exe, candidates[i]);
        if (realpath(probe, root)) return 0;
      }
    }
  }
  const char *home = getenv("LUAGENT_HOME");
  if (home && strlen(home) < size) {
    snprintf(root, size, "%s", home);
    return 0;
  }
  return -1;
}

/* Runs luagent.cli.main(args) under a traceback handler; returns its code. */
static int pmain(lua_State *L) {
  int argc = (int)lua_tointeger(L, 1);
  char **argv = lua_touserdata(L, 2);
  const char *root = lua_tostring(L, 3);
  luaL_openlibs(L);
  luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_PRELOAD_TABLE);
  lua_pushcfunction(L, luaopen_luagent_core);
  lua_setfield(L, -2, "luagent.core");
  lua_pop(L, 1);
  lua_getglobal(L, "package");
  lua_getfield(L, -1, "path");
  lua_pushfstring(L, "%s/lua/?.lua;%s/lua/?/init.lua;%s", root, root, lua_tostring(L, -1));
  lua_setfield(L, -3, "path");
  lua_pop(L, 2);
  lua_getglobal(L, "require");
  lua_pushliteral(L, "luagent.cli");
  lua_call(L, 1, 1);
  lua_getfield(L, -1, "main");
  lua_createtable(L, argc, 1);
  for (int i = 0; i < argc; i++) {
    lua_pushstring(L, argv[i]);
    lua_rawseti(L, -2, i);
  }
  lua_pushstring(L, root);
  lua_call(L, 2, 1);
  return 1;
}

/* ---- Lua's allocator ----------------------------------------------------
 * Small blocks (tables, strings, closures: most of what a stream makes per
 * event) come from per-size free lists carved out of 64 KiB slabs; larger
 * ones from malloc. Many streams at once interleave millions of small
 * allocations with their buffers' large ones, and in glibc's heap each large
 * malloc then consolidates the small freed chunks (malloc_consolidate,
 * unlink_chunk: a third of the CPU at 1,000 streams). Slabs are freed when
 * the state closes. Under AddressSanitizer every block is malloc's, so it
 * still sees each one. */
#define POOL_STEP 16                      /* size classes: 16, 32, ... bytes */
#define POOL_MAX 512                      /* larger blocks: malloc */
#define POOL_SLAB ((size_t)64 << 10)

typedef struct pool_slab { struct pool_slab *next; } pool_slab;

typedef struct {
  void *free[POOL_MAX / POOL_STEP + 1]; /* per class: a list linked through the blocks */
  pool_slab *slabs;                     /* every slab, to free at the end */
  char *cur, *end;                      /* the slab being carved */
} pool;

#if defined(__SANITIZE_ADDRESS__)
#define POOL_ON 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define POOL_ON 0
#endif
#endif
#ifndef POOL_ON
#define POOL_ON 1
#endif

/* The class of an n-byte block (n >= 1), 0 when malloc serves it. */
static size_t pool_class(size_t n) {
  return POOL_ON && n <= POOL_MAX ? (n + POOL_STEP - 1) / POOL_STEP : 0;
}

/* A block of class c from its free list, else carved from a slab. */
static void *pool_get(pool *p, size_t c) {
  void *b = p->free[c];
  if (b) {
    memcpy(&p->free[c], b, sizeof b);
    return b;
  }
  size_t size = c * POOL_STEP;
  if ((size_t)(p->end - p->cur) < size) {
    pool_slab *s = malloc(POOL_SLAB);
    if (!s) return NULL;
    s->next = p->slabs;
    p->slabs = s;
    p->cur = (char *)s + POOL_STEP; /* the header's room, blocks stay aligned */
    p->end = (char *)s + POOL_SLAB;
  }
  b = p->cur;
  p->cur += size;
  return b;
}

/* Returns block b of class c to its free list. */
static void pool_put(pool *p, void *b, size_t c) {
  memcpy(b, &p->free[c], sizeof b);
  p->free[c] = b;
}

/* lua_Alloc over the pool: osize is the block's size when ptr is set. */
static void *pool_alloc(void *ud, void *ptr, size_t osize, size_t nsize) {
  pool *p = ud;
  size_t oc = ptr ? pool_class(osize) : 0, nc = nsize ? pool_class(nsize) : 0;
  if (nsize == 0) {
    if (oc) pool_put(p, ptr, oc);
    else free(ptr);
    return NULL;
  }
  if (ptr && oc == nc && oc) return ptr; /* same class: the block fits */
  if (ptr && !oc && !nc) return realloc(ptr, nsize);
  void *n = nc ? pool_get(p, nc) : malloc(nsize);
  if (!n) return NULL;
  if (ptr) {
    memcpy(n, ptr, osize < nsize ? osize : nsize);
    if (oc) pool_put(p, ptr, oc);
    else free(ptr);
  }
  return n;
}

/* Frees every slab (after lua_close). */
static void pool_free(pool *p) {
  while (p->slabs) {
    pool_slab *s = p->slabs;
    p->slabs = s->next;
    free(s);
  }
}

/* Lua's panic handler (what luaL_newstate installs): reports and aborts. */
static int panic(lua_State *L) {
  const char *msg = lua_tostring(L, -1);
  fprintf(stderr, "luagent: PANIC: unprotected error in call to Lua API (%s)\n",
          msg ? msg : "error object is not a string");
  return 0;
}

static int traceback(lua_State *L) {
  luaL_traceback(L, L, luaL_tolstring(L, 1, NULL), 1);
  return 1;
}

/* scrubbed(message) -> the message scrubbed of every key registered
 * (luagent.base.secrets' text); the message itself when that module was never
 * loaded, since then no key was registered either. */
static int scrubbed(lua_State *L) {
  luaL_checkstring(L, 1);
  lua_getfield(L, LUA_REGISTRYINDEX, LUA_LOADED_TABLE);
  if (lua_getfield(L, -1, "luagent.base.secrets") != LUA_TTABLE) {
    lua_settop(L, 1);
    return 1;
  }
  lua_getfield(L, -1, "text");
  lua_pushvalue(L, 1);
  lua_call(L, 1, 1);
  return 1;
}

/* Prints what escaped cli.lua (the message on top of the stack) scrubbed,
 * as every line luagent prints is; a message that cannot be scrubbed is
 * not printed. */
static void print_internal_error(lua_State *L) {
  lua_pushcfunction(L, scrubbed);
  lua_insert(L, -2);
  if (lua_pcall(L, 1, 1, 0) == LUA_OK && lua_type(L, -1) == LUA_TSTRING)
    fprintf(stderr, "luagent: internal error: %s\n", lua_tostring(L, -1));
  else
    fprintf(stderr, "luagent: internal error (its message could not be scrubbed of keys, so it is not shown)\n");
  lua_pop(L, 1);
}

/* Many agents mean many sockets: lift the soft descriptor limit to the hard
 * one, as servers do; failing to is harmless. */
static void raise_fd_limit(void) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
}

int main(int argc, char **argv) {
  char root[PATH_MAX];
  raise_fd_limit();
  if (find_root(root, sizeof root) != 0) {
    fprintf(stderr, "luagent: cannot find its Lua library (lua/luagent/init.lua) "
                    "beside the executable; set LUAGENT_HOME\n");
    return 1;
  }
  pool heap = {0};
  lua_State *L = lua_newstate(pool_alloc, &heap);
  if (!L) {
    fprintf(stderr, "luagent: out of memory\n");
    return 1;
  }
  lua_atpanic(L, panic);
  /* The collector stays incremental: generational mode measured within
   * 3 % of it on bench/stream.sh (and 7 % more memory at 1,000 streams),
   * and Debian's Lua 5.4.4 lacks upstream's later fixes to its pacing. */
  lua_pushcfunction(L, traceback);
  lua_pushcfunction(L, pmain);
  lua_pushinteger(L, argc);
  lua_pushlightuserdata(L, argv);
  lua_pushstring(L, root);
  int code = 1;
  if (lua_pcall(L, 3, 1, 1) != LUA_OK) {
    print_internal_error(L);
  } else {
    code = (int)luaL_optinteger(L, -1, 0);
  }
  lua_close(L);
  pool_free(&heap);
  return code;
}
