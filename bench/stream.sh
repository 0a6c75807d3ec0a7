#!/bin/sh
# Benchmark (not a test): client CPU per streamed chunk, side by side in one
# run against one local server (bench/stream_server.lua): luagent's whole
# path (bench/stream_client.lua: HTTP, SSE in C, the OpenAI adapter) versus
# the floor (bench/floor_client.c: libcurl and memchr only). The clients run
# interleaved for ROUNDS rounds and the best CPU time of each counts: the
# machine is shared and noisy, so read the ratio. Two more luagent rows split
# the path: "sse" (HTTP and SSE events as Lua tables, no decoding) and
# "json" (sse plus cjson.decode of each payload). Two more compare the
# observers: "stream" goes through the retry loop (every event published on
# the bus), "observed" is the same with logs, traces and cost all on
# (`--log info --trace --cost --otlp FILE`): their cost per chunk is the
# ratio of the two rows.
# Placement: with taskset and two CPUs or more, the server runs on CPU 0 and
# the clients on CPU 1. Unpinned, the floor's figure jumps by 2x between runs:
# reading the body on the core that just wrote it (hot in cache) costs half
# of reading it on the other. Across cores is the stable case and the closer
# one to bytes that come from a network card.
# Knobs: B (build dir), N (text chunks per response), R (requests per client
# run), ROUNDS, MODES (a subset of the rows, floor first: MODES="floor
# stream observed" for the observers alone).
set -e
B=${B:-build}
N=${N:-200}
R=${R:-1500}
ROUNDS=${ROUNDS:-3}
MODES=${MODES:-"floor provider sse json stream observed"}

mkdir -p "$B/bench"
${CC:-cc} -std=c11 -O2 bench/floor_client.c -lcurl -o "$B/bench/floor_client"

on_server= on_client=
if taskset -c 0 true 2>/dev/null && taskset -c 1 true 2>/dev/null; then
  on_server="taskset -c 0" on_client="taskset -c 1"
fi

tmp=$(mktemp -d)
server=
cleanup() {
  if [ -n "$server" ]; then kill "$server" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

$on_server "$B/luagent" run bench/stream_server.lua 0 "$N" >"$tmp/server" 2>&1 &
server=$!
i=0
until grep -q '^listening' "$tmp/server"; do
  i=$((i + 1))
  if [ "$i" -gt 100 ] || ! kill -0 "$server" 2>/dev/null; then
    echo "stream.sh: the server did not start:" >&2
    cat "$tmp/server" >&2
    exit 1
  fi
  sleep 0.1
done
url="http://127.0.0.1:$(awk '{ print $2; exit }' "$tmp/server")"

# One client run; appends "<mode> chunks=... cpu=..." to $tmp/results.
run_one() {
  if [ "$1" = floor ]; then
    $on_client "$B/bench/floor_client" "$url" "$R" >>"$tmp/results"
  elif [ "$1" = observed ]; then
    $on_client "$B/luagent" run --log info --trace --cost --otlp "$tmp/otlp.jsonl" \
      bench/stream_client.lua "$url" "$R" "$N" stream 2>/dev/null | sed 's/^stream /observed /' >>"$tmp/results"
  else
    $on_client "$B/luagent" run bench/stream_client.lua "$url" "$R" "$N" "$1" >>"$tmp/results"
  fi
}

r=1
while [ "$r" -le "$ROUNDS" ]; do
  for m in $MODES; do run_one "$m"; done
  r=$((r + 1))
done

echo "== bench/stream.sh (client CPU per streamed chunk: luagent vs libcurl + memchr)"
echo "$R requests x $((N + 3)) SSE events ($N text chunks) per client run," \
  "best of $ROUNDS interleaved rounds${on_client:+ (server on CPU 0, clients on CPU 1)}"
awk -v want=$((R * (N + 3))) -v order="$MODES" '
  {
    mode = $1
    split($2, c, "="); split($NF, t, "=")
    if (c[2] != want) { printf "stream.sh: %s counted %s chunks, expected %s\n", mode, c[2], want; bad = 1 }
    if (!(mode in best) || t[2] < best[mode]) best[mode] = t[2]
    chunks[mode] = c[2]
  }
  END {
    if (bad) exit 1
    label["floor"] = "floor (libcurl + memchr)"
    label["provider"] = "luagent (provider, whole path)"
    label["sse"] = "  part: HTTP + SSE to Lua"
    label["json"] = "  part: + cjson.decode"
    label["stream"] = "luagent.stream (retry loop, bus)"
    label["observed"] = "  + logs, traces, cost on"
    printf "%-32s %9s %10s %14s %8s\n", "client", "chunks", "CPU s", "chunks/CPU-s", "x floor"
    n = split(order, m, " ")
    floor_rate = chunks["floor"] / best["floor"]
    for (i = 1; i <= n; i++) {
      rate = chunks[m[i]] / best[m[i]]
      printf "%-32s %9d %10.4f %14.0f %8.1f\n", label[m[i]], chunks[m[i]], best[m[i]], rate, floor_rate / rate
    }
    if ("provider" in best)
      printf "ratio: the floor is %.1fx cheaper per chunk than luagent'\''s whole path\n", \
        floor_rate / (chunks["provider"] / best["provider"])
    if (("observed" in best) && ("stream" in best))
      printf "observers: logs, traces and cost on cost %+.1f%% CPU per chunk (observed vs stream)\n", \
        (best["observed"] / best["stream"] - 1) * 100
  }' "$tmp/results"
