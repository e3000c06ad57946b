# A saturating CUDA process for gpuarb's real-GPU check: one matrix
# multiply of about MS milliseconds per iteration (TF32 off: one long
# kernel), a sync after each, and a line "MONOTONIC_NS COUNT" on stdout per
# completed iteration. The first line is "ready N" once calibrated.
import sys
import time

import torch

import calibrate

ms = float(sys.argv[1]) if len(sys.argv) > 1 else 40.0
n, a, b, c = calibrate.matrices(ms, 4096, 512, 16384, warmup=1, repeats=1)
print("ready", n, flush=True)
i = 0
while True:
    torch.mm(a, b, out=c)
    torch.cuda.synchronize()
    i += 1
    print(time.monotonic_ns(), i, flush=True)
