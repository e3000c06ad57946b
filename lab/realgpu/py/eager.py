# PyTorch eager mode for the probes' census and the meter's loops: matrix
# multiplies of N x N and an elementwise kernel, a sync every 10
# iterations, for SECONDS seconds. After each sync a line
# "MONOTONIC_NS COUNT" (the iterations done); last "iterations COUNT".
import sys
import time

import torch

secs = float(sys.argv[1]) if len(sys.argv) > 1 else 5.0
n = int(sys.argv[2]) if len(sys.argv) > 2 else 2048
a = torch.randn(n, n, device="cuda")
b = torch.randn(n, n, device="cuda")
end = time.monotonic() + secs
i = 0
while time.monotonic() < end:
    c = torch.relu(a @ b)
    i += 1
    if i % 10 == 0:
        torch.cuda.synchronize()
        print(time.monotonic_ns(), i, flush=True)
torch.cuda.synchronize()
print("iterations", i, flush=True)
