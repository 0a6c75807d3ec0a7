# luagent: build, test, run. `make help` lists the targets.
#
# One set of objects, two faces: $(B)/luagent (the executable, Lua embedded)
# and $(B)/lua/luagent/core.so (the same core as a Lua C module).

DEBIAN_PACKAGES := lua5.4 liblua5.4-dev libcurl4-openssl-dev libuv1-dev \
                   lua-cjson lua-busted pkg-config

SAN ?=
ifeq ($(SAN),1)
B        ?= build-san
SANFLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
else
B        ?= build
SANFLAGS :=
endif

CC      ?= cc
PKGS    := lua5.4 libuv libcurl
CFLAGS  ?= -O2 -g
LG_CFLAGS := -std=c11 -Wall -Wextra -fPIC -D_GNU_SOURCE $(SANFLAGS) \
           $(shell pkg-config --cflags $(PKGS) 2>/dev/null) $(CFLAGS)
LIBS    := $(shell pkg-config --libs libuv libcurl 2>/dev/null) -lm
LUALIB  := $(shell pkg-config --libs lua5.4 2>/dev/null)

CORE_SRC := $(filter-out host/main.c,$(wildcard host/*.c))
CORE_OBJ := $(CORE_SRC:host/%.c=$(B)/obj/%.o)
HEADERS  := $(wildcard host/*.h)

PREFIX ?= /usr/local
BUSTED := /usr/bin/busted
SPECS  ?= spec

.PHONY: all deps test run bench fuzz install clean help san

all: deps $(B)/luagent $(B)/lua/luagent/core.so

include mk/peers.mk

help:
	@echo "make            build $(B)/luagent and $(B)/lua/luagent/core.so"
	@echo "make deps       install missing Debian packages (apt-get; sudo if not root)"
	@echo "make test       build and run every spec; ends with 'N passed, N failed'"
	@echo "make test SAN=1 the same under ASan + UBSan (build-san/)"
	@echo "make run        the demo: one streamed call replayed by the embedded mock"
	@echo "                provider, with a 503 injected on the first request"
	@echo "make bench      run the benchmarks in bench/"
	@echo "make fuzz       fuzz the SSE parser (libFuzzer, 1,000,000 inputs)"
	@echo "make install    install into PREFIX (default /usr/local)"
	@echo "make peers      npm-install the test peers (aimock, openai, @anthropic-ai/sdk) into .peers/"

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

$(B)/obj/%.o: host/%.c $(HEADERS) | $(B)/obj
	$(CC) $(LG_CFLAGS) -c $< -o $@

$(B)/obj $(B)/lua/luagent:
	@mkdir -p $@

$(B)/luagent: $(CORE_OBJ) $(B)/obj/main.o
	$(CC) $(SANFLAGS) -Wl,-E -o $@ $^ $(LUALIB) $(LIBS)

$(B)/lua/luagent/core.so: $(CORE_OBJ) | $(B)/lua/luagent
	$(CC) $(SANFLAGS) -shared -o $@ $(CORE_OBJ) $(LIBS)

# Busted runs inside the executable (the binary face), so under SAN=1 the
# sanitizer runtime is the first thing in the process.
test: all
	@LUAGENT_BIN=$(B)/luagent $(B)/luagent run $(BUSTED) --output=spec/support/summary.lua $(SPECS)

run: all
	$(B)/luagent run --faults 503@1 examples/triage.lua

bench: all
	@B=$(B) sh bench/run.sh

fuzz: deps
	@mkdir -p build/fuzz
	clang -fsanitize=fuzzer,address,undefined -g -O1 -Ihost host/sse.c fuzz/sse_fuzz.c -o build/fuzz/sse_fuzz
	@mkdir -p build/fuzz/corpus-sse
	build/fuzz/sse_fuzz -runs=1000000 -max_len=4096 build/fuzz/corpus-sse spec/fixtures/sse

install: all
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/share/luagent
	install -m 755 $(B)/luagent $(DESTDIR)$(PREFIX)/bin/luagent
	cp -R lua policies examples $(DESTDIR)$(PREFIX)/share/luagent/

clean:
	rm -rf build build-san .peers
