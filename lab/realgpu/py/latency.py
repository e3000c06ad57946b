# A latency probe for gpuarb's real-GPU check: requests of one matrix
# multiply of about MS milliseconds and a sync, RATE a second, for SECONDS
# seconds (an inference service's shape). The first line is "ready N" once
# calibrated; then a line "MONOTONIC_NS LATENCY_NS" per request, its time
# from launch to the sync's return.
import sys
import time

import torch

import calibrate

ms = float(sys.argv[1]) if len(sys.argv) > 1 else 1.0
rate = float(sys.argv[2]) if len(sys.argv) > 2 else 100.0
secs = float(sys.argv[3]) if len(sys.argv) > 3 else 60.0
# Calibrated while the GPU may be shared: the step pauses the others first.
n, a, b, c = calibrate.matrices(ms, 1024, 256, 8192, warmup=3, repeats=10)
torch.mm(a, b, out=c)
torch.cuda.synchronize()
print("ready", n, flush=True)
period = 1.0 / rate
end = time.monotonic() + secs
due = time.monotonic()
while time.monotonic() < end:
    delay = due - time.monotonic()
    if delay > 0:
        time.sleep(delay)
    t0 = time.perf_counter_ns()
    torch.mm(a, b, out=c)
    torch.cuda.synchronize()
    print(time.monotonic_ns(), time.perf_counter_ns() - t0, flush=True)
    due += period
