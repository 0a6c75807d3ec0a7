-- luagent as a rock: the Lua library (with its LuaLS annotations), the bundled
-- policies, the docs (luagent/docs: what `luagent help TOPIC` prints) and the core as a
-- C module (luagent.core), for a plain `lua5.4`. The executable comes with
-- `make install`; this is the module face only.
--
--   luarocks --lua-version 5.4 make --local
--   eval "$(luarocks --lua-version 5.4 path)"; lua5.4 -e 'require "luagent"'
rockspec_format = "3.0"
package = "luagent"
version = "scm-1"
source = { url = "git+https://github.com/luagent/luagent.git" }
description = {
  summary = "A host for LLM agents: retries, shared protection, tools, on libuv and libcurl",
  detailed = [[
luagent runs model calls and agents written in Lua on a libuv event loop with
libcurl streaming: classified retries with jittered backoff, a circuit breaker,
a retry budget and cooldowns shared per endpoint, and a mock provider with
fault injection for tests.]],
  license = "MIT",
}
-- lua-cjson is needed at run time too. It is not listed here because the
-- Debian package (lua-cjson) is what provides it on the machines luagent is
-- built for, and a rock dependency would make luarocks download its own copy.
dependencies = { "lua >= 5.4, < 5.5" }
-- libcurl, libuv, sqlite3, hiredis and libedit are found by the Makefile through pkg-config (Debian
-- keeps curl's headers in a multiarch folder luarocks does not search).
build = {
  type = "make",
  build_target = "rock",
  install_target = "rock-install",
  build_variables = { LUA_INCDIR = "$(LUA_INCDIR)", DEPS = "" },
  install_variables = { INST_LUADIR = "$(LUADIR)", INST_LIBDIR = "$(LIBDIR)", DEPS = "" },
}
