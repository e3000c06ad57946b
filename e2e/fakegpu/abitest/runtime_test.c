/* ABI test of what the CUDA runtime, PyTorch and NCCL use of the simulated
 * GPU's libcuda.so.1: entry points found through cuGetProcAddress_v2 (the
 * variant for each version and flag), primary contexts and the context
 * stack, per-thread default streams, cuLaunchKernelEx with attributes,
 * event queries, cross-stream waits, host functions, stream memory
 * operations, stream-ordered allocation, copies and memsets, graphs of
 * many kernels and their update, the per-stream queue limit, and the
 * kernel image's cost lines. Declares the API as a program written against
 * cuda.h sees it and links with -lcuda. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

typedef int CUresult;
enum {
	CUDA_SUCCESS = 0,
	CUDA_ERROR_INVALID_VALUE = 1,
	CUDA_ERROR_INVALID_DEVICE = 101,
	CUDA_ERROR_INVALID_IMAGE = 200,
	CUDA_ERROR_INVALID_CONTEXT = 201,
	CUDA_ERROR_NOT_FOUND = 500,
	CUDA_ERROR_NOT_READY = 600,
	CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE = 910,
};
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long cuuint64_t;
typedef unsigned int cuuint32_t;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphExec_st *CUgraphExec;
typedef struct CUgraphNode_st *CUgraphNode;
typedef void (*CUhostFn)(void *userData);
typedef enum { CU_GET_PROC_ADDRESS_SUCCESS = 0, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND = 1,
	       CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT = 2 } CUdriverProcAddressQueryResult;
#define CU_GET_PROC_ADDRESS_DEFAULT 0
#define CU_GET_PROC_ADDRESS_LEGACY_STREAM 1
#define CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM 2
#define CU_STREAM_PER_THREAD ((CUstream)0x2)
#define CU_STREAM_WAIT_VALUE_EQ 1
typedef struct CUlaunchAttribute_st {
	int id;
	char pad[4];
	union {
		char pad[64];
		int cooperative;
		int priority;
	} value;
} CUlaunchAttribute;
typedef struct CUlaunchConfig_st {
	unsigned int gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
	CUstream hStream;
	CUlaunchAttribute *attrs;
	unsigned int numAttrs;
} CUlaunchConfig;
#define CU_LAUNCH_ATTRIBUTE_COOPERATIVE 2
#define CU_LAUNCH_ATTRIBUTE_PRIORITY 8
typedef struct {
	int result;
	CUgraphNode errorNode, errorFromNode;
} CUgraphExecUpdateResultInfo;
typedef struct {
	char reserved[64];
} CUipcMemHandle;

CUresult cuInit(unsigned int Flags);
CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
			     CUdriverProcAddressQueryResult *symbolStatus);
CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags);

/* The functions this test calls, found as the runtime finds them. */
static struct {
	CUresult (*DriverGetVersion)(int *);
	CUresult (*DevicePrimaryCtxRetain)(CUcontext *, CUdevice);
	CUresult (*DevicePrimaryCtxRelease)(CUdevice);
	CUresult (*DevicePrimaryCtxReset)(CUdevice);
	CUresult (*DevicePrimaryCtxGetState)(CUdevice, unsigned int *, int *);
	CUresult (*CtxCreate3)(CUcontext *, void *, int, unsigned int, CUdevice);
	CUresult (*CtxCreate4)(CUcontext *, void *, unsigned int, CUdevice);
	CUresult (*CtxDestroy)(CUcontext);
	CUresult (*CtxSetCurrent)(CUcontext);
	CUresult (*CtxGetCurrent)(CUcontext *);
	CUresult (*CtxPushCurrent)(CUcontext);
	CUresult (*CtxPopCurrent)(CUcontext *);
	CUresult (*CtxSynchronize2)(CUcontext);
	CUresult (*ModuleLoadData)(CUmodule *, const void *);
	CUresult (*ModuleGetFunction)(CUfunction *, CUmodule, const char *);
	CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
				 CUstream, void **, void **);
	CUresult (*LaunchKernelEx)(const CUlaunchConfig *, CUfunction, void **, void **);
	CUresult (*LaunchHostFunc)(CUstream, CUhostFn, void *);
	CUresult (*StreamCreate)(CUstream *, unsigned int);
	CUresult (*StreamSynchronize)(CUstream);
	CUresult (*StreamQuery)(CUstream);
	CUresult (*StreamWaitEvent)(CUstream, CUevent, unsigned int);
	CUresult (*StreamWriteValue32)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
	CUresult (*StreamWaitValue32)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
	CUresult (*StreamBeginCapture)(CUstream, int);
	CUresult (*StreamEndCapture)(CUstream, CUgraph *);
	CUresult (*StreamBeginCaptureToGraph)(CUstream, CUgraph, const void *, const void *, size_t, int);
	CUresult (*GraphCreate)(CUgraph *, unsigned int);
	CUresult (*EventCreate)(CUevent *, unsigned int);
	CUresult (*EventRecord)(CUevent, CUstream);
	CUresult (*EventRecordWithFlags)(CUevent, CUstream, unsigned int);
	CUresult (*EventQuery)(CUevent);
	CUresult (*EventSynchronize)(CUevent);
	CUresult (*EventElapsedTime)(float *, CUevent, CUevent);
	CUresult (*MemAlloc)(CUdeviceptr *, size_t);
	CUresult (*MemAllocAsync)(CUdeviceptr *, size_t, CUstream);
	CUresult (*MemFreeAsync)(CUdeviceptr, CUstream);
	CUresult (*MemcpyAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
	CUresult (*MemcpyPeerAsync)(CUdeviceptr, CUcontext, CUdeviceptr, CUcontext, size_t, CUstream);
	CUresult (*MemsetD32)(CUdeviceptr, unsigned int, size_t);
	CUresult (*MemsetD32Async)(CUdeviceptr, unsigned int, size_t, CUstream);
	CUresult (*IpcGetMemHandle)(CUipcMemHandle *, CUdeviceptr);
	CUresult (*IpcOpenMemHandle)(CUdeviceptr *, CUipcMemHandle, unsigned int);
	CUresult (*IpcCloseMemHandle)(CUdeviceptr);
	CUresult (*GraphInstantiate)(CUgraphExec *, CUgraph, unsigned long long);
	CUresult (*GraphGetNodes)(CUgraph, CUgraphNode *, size_t *);
	CUresult (*GraphExecUpdate)(CUgraphExec, CUgraph, CUgraphExecUpdateResultInfo *);
	CUresult (*GraphLaunch)(CUgraphExec, CUstream);
} cu;

static int passed, failed;

#define EXPECT(call, want)                                                                         \
	do {                                                                                       \
		CUresult _r = (call);                                                              \
		if (_r == (want)) {                                                                \
			passed++;                                                                  \
		} else {                                                                           \
			failed++;                                                                  \
			printf("FAIL %s:%d: %s = %d, want %d\n", __FILE__, __LINE__, #call, _r, (want)); \
		}                                                                                  \
	} while (0)

#define CHECK(cond)                                                            \
	do {                                                                   \
		if (cond) {                                                    \
			passed++;                                              \
		} else {                                                       \
			failed++;                                              \
			printf("FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond); \
		}                                                              \
	} while (0)

static double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* Resolves base at version with the per-thread flag into *fn; fails the
 * test when it does not resolve. */
static void find(void *fn, const char *base, int version)
{
	CUdriverProcAddressQueryResult st = 99;
	void *p = NULL;

	EXPECT(cuGetProcAddress_v2(base, &p, version, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &st), CUDA_SUCCESS);
	if (!p || st != CU_GET_PROC_ADDRESS_SUCCESS)
		printf("FAIL: %s at %d did not resolve (status %d)\n", base, version, st);
	CHECK(p != NULL);
	memcpy(fn, &p, sizeof(p));
}

/* The variant table of docs/driver.md §1: base, version, flags, the
 * exported symbol the query must return. */
static const struct {
	const char *base;
	int version;
	int flags;
	const char *want;
} variants[] = {
	{ "cuLaunchKernel", 12040, 0, "cuLaunchKernel" },
	{ "cuLaunchKernel", 12040, 1, "cuLaunchKernel" },
	{ "cuLaunchKernel", 12040, 2, "cuLaunchKernel_ptsz" },
	{ "cuLaunchKernelEx", 12040, 2, "cuLaunchKernelEx_ptsz" },
	{ "cuGraphLaunch", 13000, 2, "cuGraphLaunch_ptsz" },
	{ "cuStreamSynchronize", 12040, 2, "cuStreamSynchronize_ptsz" },
	{ "cuStreamQuery", 12040, 2, "cuStreamQuery_ptsz" },
	{ "cuStreamWaitEvent", 12040, 2, "cuStreamWaitEvent_ptsz" },
	{ "cuEventRecord", 12040, 2, "cuEventRecord_ptsz" },
	{ "cuEventRecordWithFlags", 12040, 2, "cuEventRecordWithFlags_ptsz" },
	{ "cuEventSynchronize", 12040, 2, "cuEventSynchronize" },
	{ "cuEventQuery", 12040, 2, "cuEventQuery" },
	{ "cuCtxSynchronize", 12080, 0, "cuCtxSynchronize" },
	{ "cuCtxSynchronize", 13000, 2, "cuCtxSynchronize_v2" },
	{ "cuCtxCreate", 11020, 0, "cuCtxCreate_v2" },
	{ "cuCtxCreate", 11040, 0, "cuCtxCreate_v3" },
	{ "cuCtxCreate", 12050, 0, "cuCtxCreate_v4" },
	{ "cuMemcpyAsync", 12040, 2, "cuMemcpyAsync_ptsz" },
	{ "cuMemcpyHtoDAsync", 12040, 2, "cuMemcpyHtoDAsync_v2_ptsz" },
	{ "cuMemcpyDtoHAsync", 12040, 0, "cuMemcpyDtoHAsync_v2" },
	{ "cuMemsetD8Async", 12040, 2, "cuMemsetD8Async_ptsz" },
	{ "cuMemcpyPeerAsync", 12040, 2, "cuMemcpyPeerAsync_ptsz" },
	{ "cuLaunchHostFunc", 12040, 2, "cuLaunchHostFunc_ptsz" },
	{ "cuMemAllocAsync", 12040, 2, "cuMemAllocAsync_ptsz" },
	{ "cuMemFreeAsync", 12040, 2, "cuMemFreeAsync_ptsz" },
	{ "cuStreamWaitValue32", 11060, 0, "cuStreamWaitValue32" },
	{ "cuStreamWaitValue32", 11070, 0, "cuStreamWaitValue32_v2" },
	{ "cuStreamWriteValue32", 12040, 2, "cuStreamWriteValue32_v2_ptsz" },
	{ "cuMemcpyHtoD", 12040, 2, "cuMemcpyHtoD_v2_ptds" },
	{ "cuMemAlloc", 12040, 2, "cuMemAlloc_v2" },
	{ "cuDevicePrimaryCtxRelease", 12040, 0, "cuDevicePrimaryCtxRelease_v2" },
	{ "cuGraphInstantiate", 12040, 0, "cuGraphInstantiateWithFlags" },
	{ "cuGetProcAddress", 12040, 0, "cuGetProcAddress_v2" },
};

static void test_proc_address(void)
{
	CUdriverProcAddressQueryResult st;
	void *p;
	int v;

	for (size_t i = 0; i < sizeof(variants) / sizeof(variants[0]); i++) {
		void *want = dlsym(RTLD_DEFAULT, variants[i].want);

		p = NULL;
		st = 99;
		EXPECT(cuGetProcAddress_v2(variants[i].base, &p, variants[i].version, variants[i].flags, &st), CUDA_SUCCESS);
		if (p != want || !want || st != CU_GET_PROC_ADDRESS_SUCCESS) {
			failed++;
			printf("FAIL: %s at %d flags %d: got %p status %d, want %s (%p)\n", variants[i].base,
			       variants[i].version, variants[i].flags, p, st, variants[i].want, want);
		} else {
			passed++;
		}
	}
	/* Unknown symbols, versions before a symbol existed, bad queries. */
	p = (void *)1;
	EXPECT(cuGetProcAddress_v2("cuNoSuchThing", &p, 12040, 0, &st), CUDA_SUCCESS);
	CHECK(p == NULL && st == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
	EXPECT(cuGetProcAddress_v2("cuLaunchKernelEx", &p, 11000, 0, &st), CUDA_SUCCESS);
	CHECK(p == NULL && st == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
	EXPECT(cuGetProcAddress_v2("cuLaunchKernel", &p, 99000, 0, &st), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuGetProcAddress_v2("cuLaunchKernel", &p, 12040, 3, &st), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuGetProcAddress_v2(NULL, &p, 12040, 0, &st), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuGetProcAddress_v2("cuLaunchKernel", NULL, 12040, 0, &st), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuGetProcAddress_v2("cuLaunchKernel", &p, 12040, 0, NULL), CUDA_SUCCESS);
	CHECK(p != NULL);
	EXPECT(cuGetProcAddress("cuNoSuchThing", &p, 11080, 0), CUDA_ERROR_NOT_FOUND);
	EXPECT(cuGetProcAddress("cuStreamSynchronize", &p, 11080, 2), CUDA_SUCCESS);
	CHECK(p == dlsym(RTLD_DEFAULT, "cuStreamSynchronize_ptsz"));

	find(&cu.DriverGetVersion, "cuDriverGetVersion", 12040);
	EXPECT(cu.DriverGetVersion(&v), CUDA_SUCCESS);
	CHECK(v >= 12000);
}

static const char *image = "# a mix of kernels\n"
			   "kernel gemm ns_per_block 20000\n"
			   "kernel add ns_per_block 1000 ns_per_launch 5000\n"
			   "kernel persistent ns_per_launch 4000000\n"
			   "kernel noisy ns_per_block 1000 jitter 0.5\n";

static void on_host(void *arg)
{
	double *at = arg;

	*at = now_ms();
}

int main(void)
{
	CUcontext primary, p2, c3, c4, cur;
	CUmodule mod;
	CUfunction gemm, add, persistent, noisy;
	CUstream s1, s2;
	CUevent e1, e2, e3;
	CUdeviceptr d, d2, dpeer, dipc;
	CUgraph g, g2, g3, g4, g5;
	CUgraphExec ge;
	CUgraphExecUpdateResultInfo info;
	CUipcMemHandle ipc;
	unsigned flags;
	int active, polls;
	size_t nodes;
	float ms, ms2;
	double t0, host_at = 0;

	EXPECT(cuInit(0), CUDA_SUCCESS);
	test_proc_address();
	find(&cu.DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", 12040);
	find(&cu.DevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease", 12040);
	find(&cu.DevicePrimaryCtxReset, "cuDevicePrimaryCtxReset", 12040);
	find(&cu.DevicePrimaryCtxGetState, "cuDevicePrimaryCtxGetState", 12040);
	find(&cu.CtxCreate3, "cuCtxCreate", 12040);
	find(&cu.CtxCreate4, "cuCtxCreate", 12080);
	find(&cu.CtxDestroy, "cuCtxDestroy", 12040);
	find(&cu.CtxSetCurrent, "cuCtxSetCurrent", 12040);
	find(&cu.CtxGetCurrent, "cuCtxGetCurrent", 12040);
	find(&cu.CtxPushCurrent, "cuCtxPushCurrent", 12040);
	find(&cu.CtxPopCurrent, "cuCtxPopCurrent", 12040);
	find(&cu.CtxSynchronize2, "cuCtxSynchronize", 13000);
	find(&cu.ModuleLoadData, "cuModuleLoadData", 12040);
	find(&cu.ModuleGetFunction, "cuModuleGetFunction", 12040);
	find(&cu.LaunchKernel, "cuLaunchKernel", 12040);
	find(&cu.LaunchKernelEx, "cuLaunchKernelEx", 12040);
	find(&cu.LaunchHostFunc, "cuLaunchHostFunc", 12040);
	find(&cu.StreamCreate, "cuStreamCreate", 12040);
	find(&cu.StreamSynchronize, "cuStreamSynchronize", 12040);
	find(&cu.StreamQuery, "cuStreamQuery", 12040);
	find(&cu.StreamWaitEvent, "cuStreamWaitEvent", 12040);
	find(&cu.StreamWriteValue32, "cuStreamWriteValue32", 12040);
	find(&cu.StreamWaitValue32, "cuStreamWaitValue32", 12040);
	find(&cu.StreamBeginCapture, "cuStreamBeginCapture", 12040);
	find(&cu.StreamEndCapture, "cuStreamEndCapture", 12040);
	find(&cu.StreamBeginCaptureToGraph, "cuStreamBeginCaptureToGraph", 12040);
	find(&cu.GraphCreate, "cuGraphCreate", 12040);
	find(&cu.EventCreate, "cuEventCreate", 12040);
	find(&cu.EventRecord, "cuEventRecord", 12040);
	find(&cu.EventRecordWithFlags, "cuEventRecordWithFlags", 12040);
	find(&cu.EventQuery, "cuEventQuery", 12040);
	find(&cu.EventSynchronize, "cuEventSynchronize", 12040);
	find(&cu.EventElapsedTime, "cuEventElapsedTime", 12040);
	find(&cu.MemAlloc, "cuMemAlloc", 12040);
	find(&cu.MemAllocAsync, "cuMemAllocAsync", 12040);
	find(&cu.MemFreeAsync, "cuMemFreeAsync", 12040);
	find(&cu.MemcpyAsync, "cuMemcpyAsync", 12040);
	find(&cu.MemcpyPeerAsync, "cuMemcpyPeerAsync", 12040);
	find(&cu.MemsetD32, "cuMemsetD32", 12040);
	find(&cu.MemsetD32Async, "cuMemsetD32Async", 12040);
	find(&cu.IpcGetMemHandle, "cuIpcGetMemHandle", 12040);
	find(&cu.IpcOpenMemHandle, "cuIpcOpenMemHandle", 12040);
	find(&cu.IpcCloseMemHandle, "cuIpcCloseMemHandle", 12040);
	find(&cu.GraphInstantiate, "cuGraphInstantiate", 12040);
	find(&cu.GraphGetNodes, "cuGraphGetNodes", 12040);
	find(&cu.GraphExecUpdate, "cuGraphExecUpdate", 12040);
	find(&cu.GraphLaunch, "cuGraphLaunch", 12040);
	if (failed) {
		printf("%d passed, %d failed\n", passed, failed);
		return 1;
	}

	/* Primary context, as the runtime uses it. */
	EXPECT(cu.DevicePrimaryCtxGetState(0, &flags, &active), CUDA_SUCCESS);
	CHECK(active == 0);
	EXPECT(cu.DevicePrimaryCtxRetain(&primary, 0), CUDA_SUCCESS);
	EXPECT(cu.DevicePrimaryCtxRetain(&p2, 0), CUDA_SUCCESS);
	CHECK(p2 == primary);
	EXPECT(cu.DevicePrimaryCtxRetain(&p2, 9), CUDA_ERROR_INVALID_DEVICE);
	EXPECT(cu.DevicePrimaryCtxGetState(0, &flags, &active), CUDA_SUCCESS);
	CHECK(active == 1);
	EXPECT(cu.CtxDestroy(primary), CUDA_ERROR_INVALID_CONTEXT);
	EXPECT(cu.CtxGetCurrent(&cur), CUDA_SUCCESS);
	CHECK(cur == NULL); /* retaining does not make it current */
	EXPECT(cu.CtxSetCurrent(primary), CUDA_SUCCESS);

	/* The context stack. */
	EXPECT(cu.CtxCreate3(&c3, NULL, 0, 0, 0), CUDA_SUCCESS);
	EXPECT(cu.CtxCreate3(&c3, NULL, -1, 0, 0), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cu.CtxGetCurrent(&cur), CUDA_SUCCESS);
	CHECK(cur == c3);
	EXPECT(cu.CtxPopCurrent(&cur), CUDA_SUCCESS);
	CHECK(cur == c3);
	EXPECT(cu.CtxGetCurrent(&cur), CUDA_SUCCESS);
	CHECK(cur == primary);
	EXPECT(cu.CtxCreate4(&c4, NULL, 0, 0), CUDA_SUCCESS);
	EXPECT(cu.CtxPopCurrent(NULL), CUDA_SUCCESS);
	EXPECT(cu.CtxPushCurrent((CUcontext)(uintptr_t)0x42), CUDA_ERROR_INVALID_CONTEXT);

	/* Kernels: the image's cost lines. */
	EXPECT(cu.ModuleLoadData(&mod, "kernel k ns_per_block 10 jitter 2\n"), CUDA_ERROR_INVALID_IMAGE);
	EXPECT(cu.ModuleLoadData(&mod, "kernel k\n"), CUDA_ERROR_INVALID_IMAGE);
	EXPECT(cu.ModuleLoadData(&mod, "kernel k ns_per_block -1\n"), CUDA_ERROR_INVALID_IMAGE);
	EXPECT(cu.ModuleLoadData(&mod, "kernel k ns_per_flop 10\n"), CUDA_ERROR_INVALID_IMAGE);
	EXPECT(cu.ModuleLoadData(&mod, image), CUDA_SUCCESS);
	EXPECT(cu.ModuleGetFunction(&gemm, mod, "gemm"), CUDA_SUCCESS);
	EXPECT(cu.ModuleGetFunction(&add, mod, "add"), CUDA_SUCCESS);
	EXPECT(cu.ModuleGetFunction(&persistent, mod, "persistent"), CUDA_SUCCESS);
	EXPECT(cu.ModuleGetFunction(&noisy, mod, "noisy"), CUDA_SUCCESS);
	EXPECT(cu.StreamCreate(&s1, 1), CUDA_SUCCESS);
	EXPECT(cu.StreamCreate(&s2, 1), CUDA_SUCCESS);
	EXPECT(cu.EventCreate(&e1, 0), CUDA_SUCCESS);
	EXPECT(cu.EventCreate(&e2, 0), CUDA_SUCCESS);
	EXPECT(cu.EventCreate(&e3, 0), CUDA_SUCCESS);
	/* A persistent kernel costs the same whatever its grid. */
	for (int grid = 1; grid <= 1000; grid *= 1000) {
		EXPECT(cu.EventRecord(e1, s1), CUDA_SUCCESS);
		EXPECT(cu.LaunchKernel(persistent, (unsigned)grid, 1, 1, 128, 1, 1, 0, s1, NULL, NULL), CUDA_SUCCESS);
		EXPECT(cu.EventRecord(e2, s1), CUDA_SUCCESS);
		EXPECT(cu.EventSynchronize(e2), CUDA_SUCCESS);
		EXPECT(cu.EventElapsedTime(&ms, e1, e2), CUDA_SUCCESS);
		CHECK(ms >= 3.99f && ms < 8); /* not 1000 × 4 ms */
	}
	/* grid × ns_per_block + ns_per_launch: 100 blocks of add = 0.105 ms. */
	EXPECT(cu.EventRecord(e1, s1), CUDA_SUCCESS);
	for (int i = 0; i < 10; i++)
		EXPECT(cu.LaunchKernel(add, 100, 1, 1, 128, 1, 1, 0, s1, NULL, NULL), CUDA_SUCCESS);
	EXPECT(cu.EventRecord(e2, s1), CUDA_SUCCESS);
	EXPECT(cu.StreamSynchronize(s1), CUDA_SUCCESS);
	EXPECT(cu.EventElapsedTime(&ms, e1, e2), CUDA_SUCCESS);
	CHECK(ms >= 1.049f && ms < 3);
	/* Jitter of ±50% keeps the mean: 40 launches of 1 ms. */
	EXPECT(cu.EventRecord(e1, s1), CUDA_SUCCESS);
	for (int i = 0; i < 40; i++)
		EXPECT(cu.LaunchKernel(noisy, 1000, 1, 1, 128, 1, 1, 0, s1, NULL, NULL), CUDA_SUCCESS);
	EXPECT(cu.EventRecord(e2, s1), CUDA_SUCCESS);
	EXPECT(cu.StreamSynchronize(s1), CUDA_SUCCESS);
	EXPECT(cu.EventElapsedTime(&ms, e1, e2), CUDA_SUCCESS);
	CHECK(ms > 30 && ms < 50);

	/* cuLaunchKernelEx with attributes, on the per-thread default stream:
	 * it is not the legacy default stream. */
	{
		CUlaunchAttribute attrs[2] = { { .id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE },
					       { .id = CU_LAUNCH_ATTRIBUTE_PRIORITY } };
		CUlaunchConfig cfg = { 500, 1, 1, 128, 1, 1, 0, NULL, attrs, 2 };

		CUresult (*legacy_query)(CUstream) = NULL;
		CUdriverProcAddressQueryResult st;

		EXPECT(cuGetProcAddress_v2("cuStreamQuery", (void **)&legacy_query, 12040, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &st),
		       CUDA_SUCCESS);
		attrs[0].value.cooperative = 1;
		EXPECT(cu.LaunchKernelEx(&cfg, gemm, NULL, NULL), CUDA_SUCCESS); /* 10 ms */
		EXPECT(cu.StreamQuery(NULL), CUDA_ERROR_NOT_READY);
		EXPECT(legacy_query(NULL), CUDA_SUCCESS);
		EXPECT(cu.StreamQuery(CU_STREAM_PER_THREAD), CUDA_ERROR_NOT_READY);
		EXPECT(cu.CtxPushCurrent(c4), CUDA_SUCCESS);
		EXPECT(cu.StreamQuery(NULL), CUDA_SUCCESS); /* another context's per-thread stream */
		EXPECT(cu.CtxPopCurrent(NULL), CUDA_SUCCESS);
		EXPECT(cu.StreamSynchronize(NULL), CUDA_SUCCESS);
		EXPECT(cu.StreamQuery(NULL), CUDA_SUCCESS);
		attrs[1].id = 999;
		EXPECT(cu.LaunchKernelEx(&cfg, gemm, NULL, NULL), CUDA_ERROR_INVALID_VALUE);
		cfg.attrs = NULL;
		EXPECT(cu.LaunchKernelEx(&cfg, gemm, NULL, NULL), CUDA_ERROR_INVALID_VALUE);
	}

	/* Event polling, as PyTorch's allocator and NCCL do. */
	EXPECT(cu.LaunchKernel(gemm, 250, 1, 1, 128, 1, 1, 0, s1, NULL, NULL), CUDA_SUCCESS); /* 5 ms */
	EXPECT(cu.EventRecordWithFlags(e1, s1, 0), CUDA_SUCCESS);
	EXPECT(cu.EventRecordWithFlags(e1, s1, 7), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cu.EventQuery(e3), CUDA_SUCCESS); /* never recorded */
	t0 = now_ms();
	polls = 0;
	while (cu.EventQuery(e1) == CUDA_ERROR_NOT_READY)
		polls++;
	CHECK(polls > 0 && now_ms() - t0 > 3);
	EXPECT(cu.EventQuery((CUevent)(uintptr_t)0x77), 400);

	/* Cross-stream dependency: s2's work waits for s1's 10 ms kernel. */
	EXPECT(cu.LaunchKernel(gemm, 500, 1, 1, 128, 1, 1, 0, s1, NULL, NULL), CUDA_SUCCESS);
	EXPECT(cu.EventRecord(e1, s1), CUDA_SUCCESS);
	EXPECT(cu.StreamWaitEvent(s2, e1, 0), CUDA_SUCCESS);
	EXPECT(cu.LaunchKernel(add, 1, 1, 1, 1, 1, 1, 0, s2, NULL, NULL), CUDA_SUCCESS);
	EXPECT(cu.EventRecord(e2, s2), CUDA_SUCCESS);
	EXPECT(cu.StreamWaitEvent(s2, e1, 5), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cu.StreamWaitEvent(s2, (CUevent)(uintptr_t)0x77, 0), 400);
	EXPECT(cu.EventSynchronize(e2), CUDA_SUCCESS);
	EXPECT(cu.EventQuery(e1), CUDA_SUCCESS);
	EXPECT(cu.EventElapsedTime(&ms, e1, e2), CUDA_SUCCESS);
	CHECK(ms >= 0);

	/* A host function runs after the work before it, and holds back the
	 * work after it. */
	t0 = now_ms();
	EXPECT(cu.LaunchKernel(gemm, 250, 1, 1, 128, 1, 1, 0, s1, NULL, NULL), CUDA_SUCCESS);
	EXPECT(cu.LaunchHostFunc(s1, on_host, &host_at), CUDA_SUCCESS);
	EXPECT(cu.LaunchKernel(add, 1, 1, 1, 1, 1, 1, 0, s1, NULL, NULL), CUDA_SUCCESS);
	EXPECT(cu.EventRecord(e2, s1), CUDA_SUCCESS);
	EXPECT(cu.LaunchHostFunc(s1, NULL, NULL), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cu.StreamSynchronize(s1), CUDA_SUCCESS);
	CHECK(host_at - t0 >= 4.9);
	CHECK(host_at > 0 && host_at <= now_ms());

	/* Stream memory operations: s2 waits for a word s1 writes after 10 ms. */
	EXPECT(cu.MemAlloc(&d, 4096), CUDA_SUCCESS);
	EXPECT(cu.StreamWaitValue32(s2, d, 1, CU_STREAM_WAIT_VALUE_EQ), CUDA_SUCCESS);
	EXPECT(cu.EventRecord(e2, s2), CUDA_SUCCESS);
	EXPECT(cu.EventRecord(e1, s1), CUDA_SUCCESS);
	EXPECT(cu.LaunchKernel(gemm, 500, 1, 1, 128, 1, 1, 0, s1, NULL, NULL), CUDA_SUCCESS);
	EXPECT(cu.StreamWriteValue32(s1, d, 1, 0), CUDA_SUCCESS);
	EXPECT(cu.StreamSynchronize(s2), CUDA_SUCCESS);
	EXPECT(cu.EventElapsedTime(&ms, e1, e2), CUDA_SUCCESS);
	CHECK(ms >= 9.9f);
	EXPECT(cu.StreamWriteValue32(s1, d + 2, 1, 0), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cu.StreamWaitValue32(s1, 0x40, 1, 0), CUDA_ERROR_INVALID_VALUE);

	/* Stream-ordered memory, copies and memsets. */
	EXPECT(cu.MemAllocAsync(&d2, 1 << 20, s1), CUDA_SUCCESS);
	EXPECT(cu.MemAllocAsync(&d2, 0, s1), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cu.MemcpyAsync(d2, d, 4096, s1), CUDA_SUCCESS);
	EXPECT(cu.MemsetD32Async(d2, 7, 1024, s1), CUDA_SUCCESS);
	EXPECT(cu.MemsetD32(d2, 7, 1 << 18), CUDA_SUCCESS);
	EXPECT(cu.MemsetD32(d2 + 2, 7, 4), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cu.MemsetD32(d2, 7, (1 << 18) + 1), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cu.MemcpyAsync(0x10, 0x20, 16, s1), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cu.CtxPushCurrent(c4), CUDA_SUCCESS);
	EXPECT(cu.MemAlloc(&dpeer, 4096), CUDA_SUCCESS);
	EXPECT(cu.CtxPopCurrent(NULL), CUDA_SUCCESS);
	EXPECT(cu.MemcpyPeerAsync(dpeer, c4, d, primary, 4096, s1), CUDA_SUCCESS);
	EXPECT(cu.MemcpyPeerAsync(dpeer, primary, d, primary, 4096, s1), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cu.MemcpyPeerAsync(dpeer, (CUcontext)(uintptr_t)0x42, d, primary, 16, s1), CUDA_ERROR_INVALID_CONTEXT);
	EXPECT(cu.MemFreeAsync(d2, s1), CUDA_SUCCESS);
	EXPECT(cu.MemFreeAsync(d2, s1), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cu.StreamSynchronize(s1), CUDA_SUCCESS);

	/* IPC: another context opens the allocation at the same address. */
	EXPECT(cu.IpcGetMemHandle(&ipc, d), CUDA_SUCCESS);
	EXPECT(cu.IpcGetMemHandle(&ipc, d + 8), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cu.IpcGetMemHandle(&ipc, d), CUDA_SUCCESS);
	EXPECT(cu.CtxPushCurrent(c4), CUDA_SUCCESS);
	EXPECT(cu.IpcOpenMemHandle(&dipc, ipc, 1), CUDA_SUCCESS);
	CHECK(dipc == d);
	EXPECT(cu.IpcCloseMemHandle(dipc), CUDA_SUCCESS);
	EXPECT(cu.IpcCloseMemHandle(dipc), CUDA_ERROR_INVALID_VALUE);
	memset(&ipc, 0, sizeof(ipc));
	EXPECT(cu.IpcOpenMemHandle(&dipc, ipc, 1), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cu.CtxPopCurrent(NULL), CUDA_SUCCESS);

	/* A graph of many launches of different kernels costs their sum. */
	EXPECT(cu.StreamBeginCapture(s2, 0), CUDA_SUCCESS);
	for (int i = 0; i < 200; i++)
		EXPECT(cu.LaunchKernel(i % 4 ? add : gemm, 10, 1, 1, 128, 1, 1, 0, s2, NULL, NULL), CUDA_SUCCESS);
	EXPECT(cu.StreamEndCapture(s2, &g), CUDA_SUCCESS);
	nodes = 0;
	EXPECT(cu.GraphGetNodes(g, NULL, &nodes), CUDA_SUCCESS);
	CHECK(nodes == 200);
	EXPECT(cu.GraphInstantiate(&ge, g, 0), CUDA_SUCCESS);
	/* Each launch is timed behind a 50 ms kernel, so that all of its
	 * nodes are queued before the first runs: a host stall while they
	 * are written would otherwise idle the GPU between them. */
	EXPECT(cu.LaunchKernel(gemm, 2500, 1, 1, 128, 1, 1, 0, s2, NULL, NULL), CUDA_SUCCESS);
	EXPECT(cu.EventRecord(e1, s2), CUDA_SUCCESS);
	EXPECT(cu.GraphLaunch(ge, s2), CUDA_SUCCESS);
	EXPECT(cu.EventRecord(e2, s2), CUDA_SUCCESS);
	EXPECT(cu.StreamSynchronize(s2), CUDA_SUCCESS);
	EXPECT(cu.EventElapsedTime(&ms, e1, e2), CUDA_SUCCESS);
	CHECK(ms >= 12.24f && ms < 16); /* 50 × 0.2 ms + 150 × 0.015 ms */
	/* The same shape with larger grids: the update takes the new costs. */
	EXPECT(cu.StreamBeginCapture(s2, 0), CUDA_SUCCESS);
	for (int i = 0; i < 200; i++)
		EXPECT(cu.LaunchKernel(i % 4 ? add : gemm, 20, 1, 1, 128, 1, 1, 0, s2, NULL, NULL), CUDA_SUCCESS);
	EXPECT(cu.StreamEndCapture(s2, &g2), CUDA_SUCCESS);
	EXPECT(cu.GraphExecUpdate(ge, g2, &info), CUDA_SUCCESS);
	CHECK(info.result == 0);
	EXPECT(cu.LaunchKernel(gemm, 2500, 1, 1, 128, 1, 1, 0, s2, NULL, NULL), CUDA_SUCCESS);
	EXPECT(cu.EventRecord(e1, s2), CUDA_SUCCESS);
	EXPECT(cu.GraphLaunch(ge, s2), CUDA_SUCCESS);
	EXPECT(cu.EventRecord(e2, s2), CUDA_SUCCESS);
	EXPECT(cu.StreamSynchronize(s2), CUDA_SUCCESS);
	EXPECT(cu.EventElapsedTime(&ms2, e1, e2), CUDA_SUCCESS);
	CHECK(ms2 > 1.8f * ms);
	/* Another shape cannot update it. */
	EXPECT(cu.StreamBeginCapture(s2, 0), CUDA_SUCCESS);
	EXPECT(cu.LaunchKernel(add, 1, 1, 1, 1, 1, 1, 0, s2, NULL, NULL), CUDA_SUCCESS);
	EXPECT(cu.StreamEndCapture(s2, &g3), CUDA_SUCCESS);
	EXPECT(cu.GraphExecUpdate(ge, g3, &info), CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE);
	CHECK(info.result == 2);
	EXPECT(cu.GraphExecUpdate(ge, g3, NULL), CUDA_ERROR_INVALID_VALUE);
	/* Capture into an existing graph (CUDA 12.3): two captures add up. */
	EXPECT(cu.GraphCreate(&g4, 0), CUDA_SUCCESS);
	for (int i = 0; i < 2; i++) {
		EXPECT(cu.StreamBeginCaptureToGraph(s2, g4, NULL, NULL, 0, 0), CUDA_SUCCESS);
		EXPECT(cu.LaunchKernel(add, 1, 1, 1, 1, 1, 1, 0, s2, NULL, NULL), CUDA_SUCCESS);
		EXPECT(cu.StreamEndCapture(s2, &g5), CUDA_SUCCESS);
		CHECK(g5 == g4);
	}
	nodes = 0;
	EXPECT(cu.GraphGetNodes(g4, NULL, &nodes), CUDA_SUCCESS);
	CHECK(nodes == 2);

	/* The queue limit: 1024 pending entries per stream, then a launch
	 * blocks until one completes (here the 200 ms kernel at the head:
	 * long enough that 1023 launches fit before it ends even with a
	 * uprobe trap on each in a busy VM). */
	t0 = now_ms();
	EXPECT(cu.LaunchKernel(gemm, 10000, 1, 1, 128, 1, 1, 0, s1, NULL, NULL), CUDA_SUCCESS);
	for (int i = 0; i < 1023; i++)
		EXPECT(cu.LaunchKernel(add, 1, 1, 1, 1, 1, 1, 0, s1, NULL, NULL), CUDA_SUCCESS);
	CHECK(now_ms() - t0 < 150);
	EXPECT(cu.LaunchKernel(add, 1, 1, 1, 1, 1, 1, 0, s1, NULL, NULL), CUDA_SUCCESS);
	CHECK(now_ms() - t0 >= 190);
	EXPECT(cu.CtxSynchronize2(NULL), CUDA_SUCCESS);
	EXPECT(cu.CtxSynchronize2(c4), CUDA_SUCCESS);
	EXPECT(cu.CtxSynchronize2((CUcontext)(uintptr_t)0x42), CUDA_ERROR_INVALID_CONTEXT);

	/* Primary context teardown. */
	EXPECT(cu.CtxDestroy(c3), CUDA_SUCCESS);
	EXPECT(cu.CtxDestroy(c4), CUDA_SUCCESS);
	EXPECT(cu.DevicePrimaryCtxRelease(0), CUDA_SUCCESS);
	EXPECT(cu.DevicePrimaryCtxGetState(0, &flags, &active), CUDA_SUCCESS);
	CHECK(active == 1);
	EXPECT(cu.DevicePrimaryCtxRelease(0), CUDA_SUCCESS);
	EXPECT(cu.DevicePrimaryCtxGetState(0, &flags, &active), CUDA_SUCCESS);
	CHECK(active == 0);
	EXPECT(cu.DevicePrimaryCtxRelease(0), CUDA_ERROR_INVALID_CONTEXT);
	EXPECT(cu.StreamSynchronize(s1), 400);
	EXPECT(cu.DevicePrimaryCtxRetain(&primary, 0), CUDA_SUCCESS);
	EXPECT(cu.DevicePrimaryCtxReset(0), CUDA_SUCCESS);
	EXPECT(cu.DevicePrimaryCtxGetState(0, &flags, &active), CUDA_SUCCESS);
	CHECK(active == 0);

	printf("%d passed, %d failed\n", passed, failed);
	return failed != 0;
}
