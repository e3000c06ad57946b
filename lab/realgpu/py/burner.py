# A saturating CUDA process for gpuarb's real-GPU check: one matrix
# multiply of about MS milliseconds per iteration (TF32 off: one long
# kernel), a sync after each, and a line "MONOTONIC_NS COUNT" on stdout per
# completed iteration. The first line is "ready N" once calibrated.
import sys
import time

import torch

ms = float(sys.argv[1]) if len(sys.argv) > 1 else 40.0
torch.backends.cuda.matmul.allow_tf32 = False
n = 4096
a = torch.randn(n, n, device="cuda")
b = torch.randn(n, n, device="cuda")
c = torch.empty(n, n, device="cuda")
torch.mm(a, b, out=c)
torch.cuda.synchronize()
t = time.perf_counter()
torch.mm(a, b, out=c)
torch.cuda.synchronize()
one = (time.perf_counter() - t) * 1000
# Cost grows as n^3: pick n for one kernel of about ms.
n = max(512, min(16384, int(n * (ms / max(one, 1e-3)) ** (1 / 3)) // 64 * 64))
a = torch.randn(n, n, device="cuda")
b = torch.randn(n, n, device="cuda")
c = torch.empty(n, n, device="cuda")
torch.cuda.synchronize()
print("ready", n, flush=True)
i = 0
while True:
    torch.mm(a, b, out=c)
    torch.cuda.synchronize()
    i += 1
    print(time.monotonic_ns(), i, flush=True)
