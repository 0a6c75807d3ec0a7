# luagent: build, test, run. `make help` lists the targets.
#
# One set of objects, two faces: $(B)/luagent (the executable, Lua embedded)
# and $(B)/lua/luagent/core.so (the same core as a Lua C module).

DEBIAN_PACKAGES := lua5.4 liblua5.4-dev libcurl4-openssl-dev libuv1-dev \
                   libhiredis-dev lua-cjson lua-busted pkg-config libsqlite3-dev libedit-dev

SAN ?=
ifeq ($(SAN),1)
B        ?= build-san
SANFLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
else
B        ?= build
SANFLAGS :=
endif

CC      ?= cc
PKGS    := lua5.4 libuv libcurl sqlite3 hiredis libedit
CFLAGS  ?= -O2 -g

# pkg-config is asked lazily, once, when the first recipe needs the flags:
# by then `deps` (an order-only prerequisite of every object) has installed
# pkg-config and the -dev packages, so a first `make run` on a bare machine
# builds with the right include paths in the same invocation.
lazy = $(eval $(1) := $(2))$($(1))
LG_CFLAGS = $(call lazy,LG_CFLAGS,-std=c11 -Wall -Wextra -fPIC -D_GNU_SOURCE $(SANFLAGS) \
              $(shell pkg-config --cflags $(PKGS)) $(CFLAGS))
# libcurl is not linked: host/curl_api.c loads it on the first request
LIBS      = $(call lazy,LIBS,$(shell pkg-config --libs libuv sqlite3 hiredis libedit) -ldl -lm)
LUALIB    = $(call lazy,LUALIB,$(shell pkg-config --libs lua5.4))

CORE_SRC := $(filter-out host/main.c,$(wildcard host/*.c))
CORE_OBJ := $(CORE_SRC:host/%.c=$(B)/obj/%.o)
HEADERS  := $(wildcard host/*.h)

# What every object waits for: `deps` installs missing packages first.
# luarocks sets DEPS= (it brings its own checks and must not call apt-get).
DEPS ?= deps

PREFIX ?= /usr/local
BUSTED := /usr/bin/busted
SPECS  ?= spec

.PHONY: all deps test run bench fuzz install rock rock-install clean help san settings api

all: deps $(B)/luagent $(B)/lua/luagent/core.so

include mk/peers.mk

help:
	@echo "make            build $(B)/luagent and $(B)/lua/luagent/core.so"
	@echo "make deps       install missing Debian packages (apt-get; sudo if not root)"
	@echo "make test       build and run every spec; ends with 'N passed, N failed'"
	@echo "make test SAN=1 the same under ASan + UBSan (build-san/)"
	@echo "make run        the demo: the triage agent (examples/triage.lua) and its tools,"
	@echo "                its model replayed by the embedded mock provider, with a 503"
	@echo "                injected on the first request; ARGS=\"--trace --cost\" adds the span"
	@echo "                tree and the cost table"
	@echo "make bench      run the benchmarks in bench/"
	@echo "make fuzz       fuzz the SSE parser and the OpenAI chunk fast path (libFuzzer)"
	@echo "make install    install into PREFIX (default /usr/local)"
	@echo "                (luarocks make: the Lua library and luagent.core, see the rockspec)"
	@echo "make peers      npm-install the test peers (aimock, openai, @anthropic-ai/sdk, MCP servers) into .peers/"
	@echo "make settings   rewrite README.md's table of settings from lua/luagent/config.lua"
	@echo "make api        rewrite docs/api.md, the API reference, from the LuaLS annotations"

# Installs only what is missing; a no-op (one dpkg-query) when all is there.
deps:
	@missing=""; \
	for p in $(DEBIAN_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'ok installed' || missing="$$missing $$p"; \
	done; \
	command -v cc >/dev/null 2>&1 || missing="$$missing gcc"; \
	command -v make >/dev/null 2>&1 || missing="$$missing make"; \
	if [ -n "$$missing" ]; then \
	  echo "make deps: installing$$missing"; \
	  if [ "$$(id -u)" = 0 ]; then sudo=""; else sudo="sudo"; fi; \
	  $$sudo apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq $$missing >/dev/null || exit 1; \
	fi

$(B)/obj/%.o: host/%.c $(HEADERS) | $(DEPS) $(B)/obj
	$(CC) $(LG_CFLAGS) -c $< -o $@

$(B)/obj $(B)/lua/luagent:
	@mkdir -p $@

$(B)/luagent: $(CORE_OBJ) $(B)/obj/main.o
	$(CC) $(SANFLAGS) -Wl,-E -o $@ $^ $(LUALIB) $(LIBS)

$(B)/lua/luagent/core.so: $(CORE_OBJ) | $(B)/lua/luagent
	$(CC) $(SANFLAGS) -shared -o $@ $(CORE_OBJ) $(LIBS)

# The specs also package luagent with luarocks (spec/install_spec.lua). A
# target-specific value reaches the prerequisites too, so `make test`'s deps
# installs luarocks while `make run`'s does not; redis-server is what the
# specs of the shared endpoint state start (spec/shared_spec.lua); tmux is
# the terminal spec/chat_spec.lua drives `luagent chat` in.
test: DEBIAN_PACKAGES += luarocks redis-server tmux

# Busted runs inside the executable (the binary face), so under SAN=1 the
# sanitizer runtime is the first thing in the process; `--log off` keeps the
# log lines of the failures specs cause on purpose out of the report.
test: all
	@LUAGENT_BIN=$(B)/luagent $(B)/luagent run --log off $(BUSTED) --output=spec/support/summary.lua $(SPECS)

# README.md's table of settings, from the table in lua/luagent/config.lua
# (spec/settings_spec.lua fails until this has been run after a change).
settings: deps
	@lua5.4 mk/settings.lua README.md

# docs/api.md, the API reference, from the LuaLS annotations (---@class,
# ---@param, ---@return) of the public modules (spec/docs_spec.lua fails
# until this has been run after a change).
api: deps
	@lua5.4 mk/apidoc.lua docs/api.md

# ARGS adds options: make run ARGS="--trace --cost"
run: all
	$(B)/luagent run --faults 503@1 $(ARGS) examples/triage.lua

bench: all
	@B=$(B) sh bench/run.sh

fuzz: deps
	@mkdir -p build/fuzz
	clang -fsanitize=fuzzer,address,undefined -g -O1 -Ihost host/sse.c fuzz/sse_fuzz.c -o build/fuzz/sse_fuzz
	@mkdir -p build/fuzz/corpus-sse
	build/fuzz/sse_fuzz -runs=1000000 -max_len=4096 build/fuzz/corpus-sse spec/fixtures/sse
	clang -fsanitize=fuzzer,address,undefined -g -O1 -std=c11 -D_GNU_SOURCE -Ihost \
	  $(shell pkg-config --cflags $(PKGS)) $(CORE_SRC) fuzz/chunk_fuzz.c \
	  $(shell pkg-config --libs lua5.4) $(LIBS) -o build/fuzz/chunk_fuzz
	@mkdir -p build/fuzz/corpus-chunk
	build/fuzz/chunk_fuzz -dict=fuzz/chunk.dict -runs=200000 -max_len=2048 build/fuzz/corpus-chunk spec/fixtures/providers

# The executable, the Lua library, the bundled policies, the examples and
# the docs (`luagent help TOPIC` prints docs/guide/TOPIC.md):
# PREFIX/bin/luagent finds PREFIX/share/luagent beside it (host/main.c).
install: all
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/share/luagent
	install -m 755 $(B)/luagent $(DESTDIR)$(PREFIX)/bin/luagent
	cp -R lua policies examples docs $(DESTDIR)$(PREFIX)/share/luagent/

# For luagent-scm-1.rockspec (build type make): the module face only. The
# Lua files go to INST_LUADIR, the bundled policies to
# INST_LUADIR/luagent/policies (lua/luagent/model/policy.lua looks there), the
# docs to INST_LUADIR/luagent/docs (beside the annotated sources that
# lua-language-server reads), the core to INST_LIBDIR/luagent/core.so.
rock: $(B)/lua/luagent/core.so

rock-install: rock
	@test -n "$(INST_LUADIR)" -a -n "$(INST_LIBDIR)" || { echo "rock-install: set INST_LUADIR and INST_LIBDIR (luarocks does)"; exit 2; }
	install -d $(INST_LIBDIR)/luagent $(INST_LUADIR)/luagent/policies
	install -m 755 $(B)/lua/luagent/core.so $(INST_LIBDIR)/luagent/core.so
	cd lua && find luagent -type d -exec install -d $(INST_LUADIR)/{} \; && \
	  find luagent -type f -exec install -m 644 {} $(INST_LUADIR)/{} \;
	install -m 644 policies/*.lua $(INST_LUADIR)/luagent/policies/
	find docs -type d -exec install -d $(INST_LUADIR)/luagent/{} \; && \
	  find docs -type f -exec install -m 644 {} $(INST_LUADIR)/luagent/{} \;

clean:
	rm -rf build build-san .peers
