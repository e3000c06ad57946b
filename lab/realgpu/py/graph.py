# CUDA graph replay for the probes' census: a captured multiply and
# elementwise kernel replayed with a sync each, for SECONDS seconds.
import sys
import time

import torch

secs = float(sys.argv[1]) if len(sys.argv) > 1 else 5.0
n = 2048
a = torch.randn(n, n, device="cuda")
b = torch.randn(n, n, device="cuda")
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    for _ in range(3):
        c = torch.relu(a @ b)
torch.cuda.current_stream().wait_stream(s)
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    c = torch.relu(a @ b)
end = time.monotonic() + secs
i = 0
while time.monotonic() < end:
    g.replay()
    torch.cuda.synchronize()
    i += 1
print("replays", i, flush=True)
