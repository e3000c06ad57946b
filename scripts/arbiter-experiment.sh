#!/usr/bin/env bash
# arbiter-experiment.sh LIMIT WORKLOAD [ARGS...] (as root, after make build):
# one tenant under `limit: LIMIT` on the simulated GPU; prints each second
# the true GPU share (fakegpud stats) beside the daemon's estimate, duty and
# reason. SECS sets the number of seconds. See BENCHMARKS.md §4.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=$PWD/bin
LIMIT=$1; shift
RUN=$(mktemp -d /tmp/gpuarb-exp.XXXXXX)
export FAKEGPU_SOCKET=$RUN/fakegpu.sock
CG_ROOT=$(awk '$9 == "cgroup2" {print $5; exit}' /proc/self/mountinfo)
CG=$CG_ROOT/gpuarb-exp
pids=()
cleanup() {
	for ((i = ${#pids[@]} - 1; i >= 0; i--)); do kill "${pids[i]}" 2>/dev/null || true; wait "${pids[i]}" 2>/dev/null || true; done
	rmdir "$CG/t" "$CG" 2>/dev/null || true
	[ -n "${KEEP:-}" ] && cp "$RUN/daemon.log" /tmp/exp-daemon.log; rm -rf "$RUN"
}
trap cleanup EXIT INT TERM
mkdir -p $CG/t
cat > $RUN/policy.yaml <<P
tenants:
  - {name: t, cgroup: /gpuarb-exp/t, limit: $LIMIT}
P
"$BIN/fakegpud" serve --socket "$FAKEGPU_SOCKET" & pids+=($!)
for _ in $(seq 50); do [ -S "$FAKEGPU_SOCKET" ] && break; sleep 0.1; done
API=$RUN/gpuarb.sock
"$BIN/gpuarb" daemon --socket "$API" --pin-path /sys/fs/bpf/gpuarb-exp --no-host-devices --policy $RUN/policy.yaml \
	--device 1:7=nvidia --libcuda "$BIN/libcuda.so.1" 2> "$RUN/daemon.log" & pids+=($!)
for _ in $(seq 100); do "$BIN/gpuarb" status --socket "$API" >/dev/null 2>&1 && break; sleep 0.1; done
sh -c 'echo $$ > "$1/cgroup.procs"; shift; exec "$@"' sh "$CG/t" "$BIN/gpuwork" "$@" > "${WORKLOAD_OUT:-/dev/null}" & pids+=($!)
WPID=$!
sleep 2
"$BIN/fakegpud" stats --socket "$FAKEGPU_SOCKET" --reset >/dev/null
for i in $(seq ${SECS:-8}); do
	sleep 1
	"$BIN/fakegpud" stats --json --socket "$FAKEGPU_SOCKET" --reset | python3 -c 'import json,sys; s=json.load(sys.stdin); g=s["gpus"][0]; print("true %.1f%%" % (100*g["busy_ns"]/s["elapsed_ns"]))' | tr '\n' ' '
	"$BIN/gpuarb" status --json --socket "$API" | python3 -c 'import json,sys; s=json.load(sys.stdin); print(" ".join("%s est %.1f%% duty %.3f %s" % (t["name"], 100*t["share"], t["duty"], t["reason"]) for t in s["tenants"]))'
	ps -o pid,stat,comm --ppid $WPID -p $WPID | tail -n +2 | tr "\n" " "; echo
done
