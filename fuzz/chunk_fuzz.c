/* libFuzzer target: the OpenAI chunk fast path (host/chunk.c) against the
 * ordinary path (lua-cjson + the adapter in lua/luagent/model/providers/openai.lua).
 * The input's lines are one stream's chunk payloads (a leading "data: " is
 * dropped, so SSE fixtures are seeds); an openai decoder reads them with the
 * fast path off, another with it on, and every feed's events or error must
 * be the same. Invariant broken: abort. Run from the checkout's root (the
 * Lua library is loaded from lua/).
 * Build: clang -fsanitize=fuzzer,address,undefined -g -O1 -Ihost
 *        -I/usr/include/lua5.4 host/<core files>.c fuzz/chunk_fuzz.c
 *        -llua5.4 -luv -lcurl -lm -o build/fuzz/chunk_fuzz (make fuzz) */
#include <lauxlib.h>
#include <lualib.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"

/* Compares both paths over a list of payloads; returns true when they agree,
 * else false and a description. */
static const char compare_lua[] =
    "local openai = require 'luagent.model.providers.openai'\n"
    "local function same(a, b, seen)\n"
    "  if a == b then return true end\n"
    "  if type(a) ~= 'table' or type(b) ~= 'table' then return false end\n"
    "  for k, v in pairs(a) do if not same(v, b[k]) then return false end end\n"
    "  for k in pairs(b) do if a[k] == nil then return false end end\n"
    "  return true\n"
    "end\n"
    "local function run(payloads, fast)\n"
    "  openai.fast = fast\n"
    "  local dec = openai.decoder({ model = 'requested-model' })\n"
    "  openai.fast = true\n"
    "  local out = {}\n"
    "  for i, p in ipairs(payloads) do\n"
    "    out[i] = { dec:feed({ event = 'message', data = p }) }\n"
    "  end\n"
    "  out[#out + 1] = { dec:finish() }\n"
    "  return out\n"
    "end\n"
    "return function(payloads)\n"
    "  local a, b = run(payloads, false), run(payloads, true)\n"
    "  if same(a, b) then return true end\n"
    "  return false, table.concat(payloads, '\\n')\n"
    "end\n";

static lua_State *L;

/* Makes the Lua state once: standard libraries, luagent.core preloaded,
 * the Lua library from lua/, and the comparer in the registry. */
static void setup(void) {
  L = luaL_newstate();
  luaL_openlibs(L);
  luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_PRELOAD_TABLE);
  lua_pushcfunction(L, luaopen_luagent_core);
  lua_setfield(L, -2, "luagent.core");
  lua_pop(L, 1);
  if (luaL_dostring(L, "package.path = 'lua/?.lua;lua/?/init.lua;' .. package.path") ||
      luaL_loadstring(L, compare_lua) || lua_pcall(L, 0, 1, 0)) {
    fprintf(stderr, "chunk_fuzz: setup: %s (run from the checkout's root)\n", lua_tostring(L, -1));
    abort();
  }
  lua_setfield(L, LUA_REGISTRYINDEX, "chunk_fuzz.compare");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!L) setup();
  lua_getfield(L, LUA_REGISTRYINDEX, "chunk_fuzz.compare");
  lua_newtable(L);
  const char *s = (const char *)data, *end = s + size;
  int n = 0;
  while (s < end) {
    const char *nl = memchr(s, '\n', (size_t)(end - s));
    const char *e = nl ? nl : end;
    if (e - s >= 6 && memcmp(s, "data: ", 6) == 0) s += 6;
    if (e > s) {
      lua_pushlstring(L, s, (size_t)(e - s));
      lua_rawseti(L, -2, ++n);
    }
    s = e + 1;
  }
  if (lua_pcall(L, 1, 2, 0) != LUA_OK) {
    fprintf(stderr, "chunk_fuzz: raised: %s\n", lua_tostring(L, -1));
    abort();
  }
  if (!lua_toboolean(L, -2)) {
    fprintf(stderr, "chunk_fuzz: the paths differ on:\n%s\n", lua_tostring(L, -1));
    abort();
  }
  lua_pop(L, 2);
  lua_gc(L, LUA_GCSTEP, 0);
  return 0;
}
