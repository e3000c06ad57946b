# A latency probe for gpuarb's real-GPU check: requests of one matrix
# multiply of about MS milliseconds and a sync, RATE a second, for SECONDS
# seconds (an inference service's shape). The first line is "ready N" once
# calibrated; then a line "MONOTONIC_NS LATENCY_NS" per request, its time
# from launch to the sync's return.
import sys
import time

import torch

ms = float(sys.argv[1]) if len(sys.argv) > 1 else 1.0
rate = float(sys.argv[2]) if len(sys.argv) > 2 else 100.0
secs = float(sys.argv[3]) if len(sys.argv) > 3 else 60.0
torch.backends.cuda.matmul.allow_tf32 = False
n = 1024
a = torch.randn(n, n, device="cuda")
b = torch.randn(n, n, device="cuda")
c = torch.empty(n, n, device="cuda")
for _ in range(3):
    torch.mm(a, b, out=c)
torch.cuda.synchronize()
t = time.perf_counter()
for _ in range(10):
    torch.mm(a, b, out=c)
torch.cuda.synchronize()
one = (time.perf_counter() - t) * 100
# Cost grows as n^3: pick n for one kernel of about ms (calibrated while
# the GPU may be shared: the step pauses the others first).
n = max(256, min(8192, int(n * (ms / max(one, 1e-3)) ** (1 / 3)) // 64 * 64))
a = torch.randn(n, n, device="cuda")
b = torch.randn(n, n, device="cuda")
c = torch.empty(n, n, device="cuda")
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
