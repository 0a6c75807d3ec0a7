#!/bin/sh
# Benchmark (not a test): what sharing the endpoint state through Redis
# costs the 1,000-agent benchmark (bench/agents.lua: N agents x 5 turns, one
# tool call per turn, the mock in the same process). The same benchmark
# runs with the endpoint state local, then shared through a redis-server on
# loopback (LUAGENT_REDIS_URL; the server started here on a free port in a
# temporary folder, stopped after), ROUNDS times each, interleaved (local
# first in odd rounds, Redis first in even ones), side by side in one run.
# The best wall time and the best CPU time of each side count: the machine
# is shared and noisy, so read the ratios. Redis's INFO commandstats gives
# the round trips: EVALSHA commands (and all the commands luagent sent,
# SCRIPT LOAD and SELECT at connect included) per model call.
# Placement: with taskset and two CPUs or more, redis-server runs on CPU 0
# and luagent on CPU 1, as bench/stream.sh places its server and clients.
# Knobs: B (build dir), N (agents, default 1000), ROUNDS (default 5).
#   sh bench/shared.sh
set -e
B=${B:-build}
N=${N:-1000}
ROUNDS=${ROUNDS:-5}
TURNS=5 # bench/agents.lua's

server=$(command -v redis-server || true)
cli=$(command -v redis-cli || true)
if [ -z "$server" ] || [ -z "$cli" ]; then
  echo "shared.sh: redis-server is not installed (apt-get install redis-server): skipped"
  exit 0
fi

. "$(dirname "$0")/common.sh" # $tmp, $pids, $on_cpu0, $on_cpu1
on_redis=$on_cpu0 on_luagent=$on_cpu1

# a free port: the kernel's pick for port 0
echo 'local s = require("luagent.core").tcp_listen("127.0.0.1", 0)
local _, p = s:address() s:close() io.write(p)' >"$tmp/port.lua"
port=$("$B/luagent" run "$tmp/port.lua")
$on_redis "$server" --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$tmp" \
  </dev/null >"$tmp/redis.log" 2>&1 &
pid=$! pids=$!
bench_wait redis-server "$pid" "$tmp/redis.log" "$cli" -p "$port" ping
url="redis://127.0.0.1:$port/0"

# run_one SIDE: one run of bench/agents.lua; appends "SIDE wall cpu evalsha
# commands" to $tmp/results (the Redis figures are this run's: 0 for local).
run_one() {
  side=$1
  "$cli" -p "$port" flushall >/dev/null
  "$cli" -p "$port" config resetstat >/dev/null
  if [ "$side" = redis ]; then
    LUAGENT_REDIS_URL=$url $on_luagent "$B/luagent" run bench/agents.lua "$N" >"$tmp/out" 2>"$tmp/err" ||
      { echo "shared.sh: the $side run failed:" >&2; tail -n 20 "$tmp/err" >&2; exit 1; }
  else
    $on_luagent "$B/luagent" run bench/agents.lua "$N" >"$tmp/out" 2>"$tmp/err" ||
      { echo "shared.sh: the $side run failed:" >&2; tail -n 20 "$tmp/err" >&2; exit 1; }
  fi
  stats=$("$cli" -p "$port" info commandstats)
  evalsha=$(printf '%s\n' "$stats" | sed -n 's/^cmdstat_evalsha:calls=\([0-9]*\).*/\1/p')
  # every command luagent sends (commandstats also counts the commands its
  # scripts run inside Redis: TIME, HGETALL, HSET, EXPIRE are not round trips)
  commands=$(printf '%s\n' "$stats" | grep -E '^cmdstat_(evalsha|script\|load|select|auth|ping|hello):' |
    sed -n 's/^cmdstat_[a-z|]*:calls=\([0-9]*\).*/\1/p' | awk '{ s += $1 } END { print s + 0 }')
  # "agents: wall 7.64 s, CPU 7.51 s; ..."
  awk -v side="$side" -v ev="${evalsha:-0}" -v cmds="$commands" \
    '/^agents: wall/ { printf "%s %s %s %s %s\n", side, $3, $6, ev, cmds }' "$tmp/out" >>"$tmp/results"
}

r=1
while [ "$r" -le "$ROUNDS" ]; do
  if [ $((r % 2)) -eq 1 ]; then run_one local; run_one redis; else run_one redis; run_one local; fi
  r=$((r + 1))
done

echo "== bench/shared.sh ($N agents x $TURNS turns of bench/agents.lua: endpoint state local vs shared" \
  "through Redis on loopback)"
echo "best of $ROUNDS interleaved rounds${on_luagent:+ (redis-server on CPU 0, luagent on CPU 1)}"
awk -v calls=$((N * TURNS)) '
  {
    side = $1; n[side]++
    w[side, n[side]] = $2; c[side, n[side]] = $3
    if (!(side in bw) || $2 < bw[side]) bw[side] = $2
    if (!(side in bc) || $3 < bc[side]) bc[side] = $3
    if (side == "redis") {
      if ($4 == 0) { print "shared.sh: a Redis run sent no EVALSHA: its endpoint state was local"; bad = 1 }
      ev += $4; cmds += $5
    }
  }
  END {
    if (bad) exit 1
    for (i = 1; i <= n["local"]; i++)
      printf "round %d: local wall %.2f s CPU %.2f s; redis wall %.2f s CPU %.2f s\n", i,
        w["local", i], c["local", i], w["redis", i], c["redis", i]
    printf "best: local wall %.2f s CPU %.2f s; redis wall %.2f s CPU %.2f s\n",
      bw["local"], bc["local"], bw["redis"], bc["redis"]
    printf "redis/local: wall x%.3f (%+.1f %%), CPU x%.3f (%+.1f %%)\n", bw["redis"] / bw["local"],
      (bw["redis"] / bw["local"] - 1) * 100, bc["redis"] / bc["local"], (bc["redis"] / bc["local"] - 1) * 100
    printf "Redis round trips per model call: %.3f EVALSHA, %.3f commands in all (%d calls a run)\n",
      ev / n["redis"] / calls, cmds / n["redis"] / calls, calls
  }' "$tmp/results"
