# Cost per launch: COUNT launches of an empty kernel (PTX, JIT-compiled by
# the driver: no nvcc needed) straight through libcuda with ctypes, then
# one context sync; prints nanoseconds per launch. ctypes' own cost per
# call is in the figure, the same with and without gpuarb's probes.
import ctypes
import sys
import time

count = int(sys.argv[1]) if len(sys.argv) > 1 else 100000
cuda = ctypes.CDLL("libcuda.so.1")


def check(result, what):
    if result != 0:
        sys.exit("%s: CUresult %d" % (what, result))


check(cuda.cuInit(0), "cuInit")
dev = ctypes.c_int()
check(cuda.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
ctx = ctypes.c_void_p()
check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
check(cuda.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
ptx = b""".version 7.0
.target sm_70
.address_size 64
.visible .entry empty()
{
	ret;
}
"""
mod = ctypes.c_void_p()
check(cuda.cuModuleLoadData(ctypes.byref(mod), ctypes.c_char_p(ptx)), "cuModuleLoadData")
fn = ctypes.c_void_p()
check(cuda.cuModuleGetFunction(ctypes.byref(fn), mod, b"empty"), "cuModuleGetFunction")
launch = cuda.cuLaunchKernel
launch.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
for _ in range(1000):
    launch(fn, 1, 1, 1, 1, 1, 1, 0, None, None, None)
check(cuda.cuCtxSynchronize(), "cuCtxSynchronize")
t = time.perf_counter_ns()
for _ in range(count):
    r = launch(fn, 1, 1, 1, 1, 1, 1, 0, None, None, None)
    if r != 0:
        sys.exit("cuLaunchKernel: CUresult %d" % r)
check(cuda.cuCtxSynchronize(), "cuCtxSynchronize")
print("%.1f" % ((time.perf_counter_ns() - t) / count), flush=True)
