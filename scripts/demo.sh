#!/usr/bin/env bash
# gpuarb demo on the simulated GPU: starts fakegpud, the gpuarb daemon
# (enforcing the default policy) and two tenants in their own cgroups (a training job of 4
# processes and an inference service), shows `gpuarb top` live, a few traced
# events, and compares the daemon's estimate with the simulator's ground
# truth. Everything it starts is stopped on exit, Ctrl-C included.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "demo: run as root (eBPF, cgroups, device nodes)" >&2; exit 1; }

BIN=$PWD/bin
RUN=$(mktemp -d /tmp/gpuarb-demo.XXXXXX)
export FAKEGPU_SOCKET=$RUN/fakegpu.sock
CG_ROOT=$(awk '$9 == "cgroup2" {print $5; exit}' /proc/self/mountinfo)
DEMO_CG=$CG_ROOT/gpuarb-demo
pids=()

cleanup() {
	# Tenants first, the simulated GPU last: newest first.
	for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
		kill "${pids[i]}" 2>/dev/null || true
		wait "${pids[i]}" 2>/dev/null || true
	done
	for cg in train infer; do rmdir "$DEMO_CG/$cg" 2>/dev/null || true; done
	rmdir "$DEMO_CG" 2>/dev/null || true
	rm -rf "$RUN"
}
trap cleanup EXIT INT TERM

in_cgroup() { # in_cgroup NAME CMD... : run CMD in the demo cgroup NAME
	local cg=$DEMO_CG/$1; shift
	mkdir -p "$cg"
	sh -c 'echo $$ > "$1/cgroup.procs"; shift; exec "$@"' sh "$cg" "$@" &
	pids+=($!)
}

echo "== starting the simulated GPU (fakegpud) on $FAKEGPU_SOCKET"
"$BIN/fakegpud" serve --socket "$FAKEGPU_SOCKET" & pids+=($!)
for _ in $(seq 50); do [ -S "$FAKEGPU_SOCKET" ] && break; sleep 0.1; done

API=$RUN/gpuarb.sock
echo "== starting the gpuarb daemon (probes pinned under /sys/fs/bpf/gpuarb-demo)"
"$BIN/gpuarb" daemon --socket "$API" --pin-path /sys/fs/bpf/gpuarb-demo --no-host-devices \
	--device 1:7=nvidia --libcuda "$BIN/libcuda.so.1" 2> "$RUN/daemon.log" & pids+=($!)
for _ in $(seq 100); do "$BIN/gpuarb" status --socket "$API" >/dev/null 2>&1 && break; sleep 0.1; done

echo "== tenants: train (4 processes of 20 ms kernels) and infer (100 requests/s)"
for _ in 1 2 3 4; do in_cgroup train "$BIN/gpuwork" hog --duration 14 >/dev/null; done
in_cgroup infer "$BIN/gpuwork" infer --rate 100 --duration 14 --interval 2 > "$RUN/infer.log"

echo "== gpuarb trace: a few decoded events (ioctls and libcuda calls)"
"$BIN/gpuarb" trace --no-host-devices --device 1:7=nvidia --libcuda "$BIN/libcuda.so.1" --duration 2s > "$RUN/trace.log" 2> "$RUN/trace.err" || true
grep -v ' launch ' "$RUN/trace.log" | head -6 || true
echo "   ... $(grep -c ' launch ' "$RUN/trace.log" || true) launches traced in 2 s; $(tail -1 "$RUN/trace.err")"

for i in 1 2 3 4; do
	echo
	"$BIN/gpuarb" top --once --socket "$API"
	sleep 2
done
"$BIN/fakegpud" stats --socket "$FAKEGPU_SOCKET" --reset >/dev/null
sleep 1
echo
echo "== the daemon's estimate (eBPF only) against the simulator's ground truth, last second:"
"$BIN/gpuarb" status --socket "$API"
"$BIN/fakegpud" stats --socket "$FAKEGPU_SOCKET"
echo "   Time-slicing is fair per context, so the 4-process tenant takes ~4/5 of the"
echo "   GPU: the unfairness gpuarb's arbiter steers against (BENCHMARKS.md §4 has how far it gets)."
echo
echo "== inference latency beside the training job (gpuwork infer, per 2 s):"
cat "$RUN/infer.log"
