# PyTorch eager mode for the probes' census: matrix multiplies and an
# elementwise kernel, a sync every 10 iterations, for SECONDS seconds.
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
torch.cuda.synchronize()
print("iterations", i, flush=True)
