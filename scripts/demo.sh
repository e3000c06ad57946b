#!/usr/bin/env bash
# gpuarb demo on the simulated GPU: starts fakegpud, two tenants in their
# own cgroups (a training job of 4 processes and an inference service),
# traces their GPU work with gpuarb's eBPF probes and compares the GPU time
# the kernel-side counters attribute with the simulator's ground truth.
# Everything it starts is stopped on exit, Ctrl-C included.
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
	for ((i = ${#pids[@]} - 1; i >= 0; i--)); do kill "${pids[i]}" 2>/dev/null || true; done
	wait 2>/dev/null || true
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

echo "== tenants: train (4 processes of 20 ms kernels) and infer (100 requests/s)"
for _ in 1 2 3 4; do in_cgroup train "$BIN/gpuwork" hog --duration 12 >/dev/null; done
in_cgroup infer "$BIN/gpuwork" infer --rate 100 --duration 12 --interval 2 > "$RUN/infer.log"

echo "== gpuarb trace: the first decoded events (ioctls and libcuda calls)"
"$BIN/gpuarb" trace --no-host-devices --device 1:7=nvidia --libcuda "$BIN/libcuda.so.1" --duration 8s > "$RUN/trace.log" 2> "$RUN/trace.err" &
trace=$!; pids+=($trace)
sleep 8.5
grep -v ' launch ' "$RUN/trace.log" | head -12 || true
echo "   ... $(grep -c ' launch ' "$RUN/trace.log" || true) launches traced; $(tail -1 "$RUN/trace.err")"

echo
echo "== ground truth from the simulator (fakegpud stats): time-slicing is fair per"
echo "   context, so the 4-process tenant takes ~4/5 of the GPU - what gpuarb exists to fix"
"$BIN/fakegpud" stats --socket "$FAKEGPU_SOCKET"
echo
echo "== inference latency beside the training job (gpuwork infer, per 2 s):"
cat "$RUN/infer.log"
