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

static int traceback(lua_State *L) {
  luaL_traceback(L, L, luaL_tolstring(L, 1, NULL), 1);
  return 1;
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
  lua_State *L = luaL_newstate();
  if (!L) {
    fprintf(stderr, "luagent: out of memory\n");
    return 1;
  }
  lua_pushcfunction(L, traceback);
  lua_pushcfunction(L, pmain);
  lua_pushinteger(L, argc);
  lua_pushlightuserdata(L, argv);
  lua_pushstring(L, root);
  int code = 1;
  if (lua_pcall(L, 3, 1, 1) != LUA_OK) {
    fprintf(stderr, "luagent: internal error: %s\n", lua_tostring(L, -1));
  } else {
    code = (int)luaL_optinteger(L, -1, 0);
  }
  lua_close(L);
  return code;
}
