# Shared by the real-GPU check's workloads: the operands of one matrix
# multiply of about MS milliseconds (TF32 off: one long kernel).
import time

import torch


def operands(n):
    """Two random n x n matrices and one for their product."""
    return (torch.randn(n, n, device="cuda"), torch.randn(n, n, device="cuda"),
            torch.empty(n, n, device="cuda"))


def matrices(ms, n, lo, hi, warmup, repeats):
    """Times repeats multiplies of n x n after warmup ones and returns
    (n, a, b, c) for one of about ms milliseconds, n within [lo, hi]."""
    torch.backends.cuda.matmul.allow_tf32 = False
    a, b, c = operands(n)
    for _ in range(warmup):
        torch.mm(a, b, out=c)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(repeats):
        torch.mm(a, b, out=c)
    torch.cuda.synchronize()
    one = (time.perf_counter() - t) * 1000 / repeats
    # Cost grows as n^3: pick n for one kernel of about ms.
    n = max(lo, min(hi, int(n * (ms / max(one, 1e-3)) ** (1 / 3)) // 64 * 64))
    a, b, c = operands(n)
    torch.cuda.synchronize()
    return n, a, b, c
