# Sourced by the shell benchmarks (bench/stream.sh, bench/shared.sh):
# - $tmp, a temporary folder removed at exit, with every process whose pid
#   was added to $pids (the server a benchmark started) stopped;
# - bench_wait, to wait for a server to be ready;
# - $on_cpu0 and $on_cpu1, taskset prefixes pinning a command to CPU 0 or
#   CPU 1 when the machine has two CPUs or more (empty otherwise): servers
#   on 0, the measured client on 1, so the two never share a core.
tmp=$(mktemp -d)
pids=
bench_cleanup() {
  for p in $pids; do kill "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap bench_cleanup EXIT
trap 'exit 130' INT TERM

on_cpu0= on_cpu1=
if taskset -c 0 true 2>/dev/null && taskset -c 1 true 2>/dev/null; then
  on_cpu0="taskset -c 0" on_cpu1="taskset -c 1"
fi

# bench_wait WHAT PID LOG CMD...: waits until CMD succeeds (the server PID
# is ready), up to 10 s; exits showing LOG when PID dies first or the time
# runs out.
bench_wait() {
  what=$1 wpid=$2 wlog=$3
  shift 3
  i=0
  until "$@" >/dev/null 2>&1; do
    i=$((i + 1))
    if [ "$i" -gt 100 ] || ! kill -0 "$wpid" 2>/dev/null; then
      echo "$(basename "$0"): $what did not start:" >&2
      cat "$wlog" >&2
      exit 1
    fi
    sleep 0.1
  done
}
