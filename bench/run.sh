#!/bin/sh
# Runs every benchmark in bench/ with the binary in $B (default build).
# Never part of `make test`: these machines are shared and noisy, so read
# ratios measured side by side, not absolute times.
set -e
B=${B:-build}
echo "== bench/tasks.lua (10,000 sleeping tasks, real clock)"
if [ -x /usr/bin/time ]; then
  /usr/bin/time -f "peak RSS: %M KiB, CPU: %U s user %S s sys" "$B/luagent" run bench/tasks.lua 10000
else
  "$B/luagent" run bench/tasks.lua 10000   # apt-get install time: for peak RSS
fi
echo "== bench/agents.lua (1,000 agents x 5 turns, one Lua tool per turn, mock on loopback)"
"$B/luagent" run bench/agents.lua 1000
echo "== bench/agents.lua journal (the same, then again as durable agents: journal off vs on)"
"$B/luagent" run bench/agents.lua 1000 openai journal
if [ -f bench/sse_parse.c ]; then
  echo "== bench/sse_parse.c (SSE parser vs memchr line scan)"
  mkdir -p "$B/bench"
  ${CC:-cc} -std=c11 -O2 -Ihost host/sse.c bench/sse_parse.c -o "$B/bench/sse_parse"
  "$B/bench/sse_parse"
fi
B="$B" sh bench/stream.sh
B="$B" sh bench/shared.sh
