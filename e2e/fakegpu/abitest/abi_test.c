/* ABI test of the simulated GPU's libcuda.so.1: declares the CUDA driver API
 * the way a program written against the real cuda.h sees it (its own
 * prototypes, standard types), links with -lcuda, and checks every exported
 * call and error path. `abi_test nodevice` checks cuInit without a device. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

typedef enum cudaError_enum {
	CUDA_SUCCESS = 0,
	CUDA_ERROR_INVALID_VALUE = 1,
	CUDA_ERROR_OUT_OF_MEMORY = 2,
	CUDA_ERROR_NOT_INITIALIZED = 3,
	CUDA_ERROR_NO_DEVICE = 100,
	CUDA_ERROR_INVALID_DEVICE = 101,
	CUDA_ERROR_INVALID_IMAGE = 200,
	CUDA_ERROR_INVALID_CONTEXT = 201,
	CUDA_ERROR_INVALID_HANDLE = 400,
	CUDA_ERROR_ILLEGAL_STATE = 401,
	CUDA_ERROR_NOT_FOUND = 500,
	CUDA_ERROR_NOT_READY = 600,
	CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900,
	CUDA_ERROR_STREAM_CAPTURE_UNMATCHED = 903,
	CUDA_ERROR_STREAM_CAPTURE_UNJOINED = 904,
	CUDA_ERROR_STREAM_CAPTURE_ISOLATION = 905,
	CUDA_ERROR_CAPTURED_EVENT = 907,
} CUresult;

typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphExec_st *CUgraphExec;
typedef enum { CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 1, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,
	       CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75 } CUdevice_attribute;
typedef enum { CU_STREAM_CAPTURE_MODE_GLOBAL = 0 } CUstreamCaptureMode;
typedef struct CUlaunchAttribute_st {
	int id;
	char pad[4];
	char value[64];
} CUlaunchAttribute;
typedef struct CUlaunchConfig_st {
	unsigned int gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
	CUstream hStream;
	CUlaunchAttribute *attrs;
	unsigned int numAttrs;
} CUlaunchConfig;

CUresult cuInit(unsigned int Flags);
CUresult cuDriverGetVersion(int *driverVersion);
CUresult cuDeviceGet(CUdevice *device, int ordinal);
CUresult cuDeviceGetCount(int *count);
CUresult cuDeviceGetName(char *name, int len, CUdevice dev);
CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev);
CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev);
CUresult cuCtxDestroy_v2(CUcontext ctx);
CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuCtxGetCurrent(CUcontext *pctx);
CUresult cuCtxSynchronize(void);
CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags);
CUresult cuStreamDestroy_v2(CUstream hStream);
CUresult cuStreamSynchronize(CUstream hStream);
CUresult cuStreamQuery(CUstream hStream);
CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags);
CUresult cuEventRecord(CUevent hEvent, CUstream hStream);
CUresult cuEventSynchronize(CUevent hEvent);
CUresult cuEventQuery(CUevent hEvent);
CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags);
CUresult cuStreamIsCapturing(CUstream hStream, int *captureStatus);
CUresult cuEventElapsedTime(float *pMilliseconds, CUevent hStart, CUevent hEnd);
CUresult cuEventDestroy_v2(CUevent hEvent);
CUresult cuModuleLoadData(CUmodule *module, const void *image);
CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name);
CUresult cuModuleUnload(CUmodule hmod);
CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
			unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
			unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra);
CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra);
CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode);
CUresult cuStreamBeginCapture(CUstream hStream);
CUresult cuStreamBeginCaptureToGraph(CUstream hStream, CUgraph hGraph, const void *dependencies,
				     const void *dependencyData, size_t numDependencies, CUstreamCaptureMode mode);
CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph);
CUresult cuGraphCreate(CUgraph *phGraph, unsigned int flags);
CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph, unsigned long long flags);
CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream);
CUresult cuGraphExecDestroy(CUgraphExec hGraphExec);
CUresult cuGraphDestroy(CUgraph hGraph);
CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize);
CUresult cuMemFree_v2(CUdeviceptr dptr);
CUresult cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount);
CUresult cuMemcpyDtoH_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount);
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount, CUstream hStream);
CUresult cuMemcpyDtoHAsync_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream);
CUresult cuMemsetD8_v2(CUdeviceptr dstDevice, unsigned char uc, size_t N);
CUresult cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream);
CUresult cuGetErrorString(CUresult error, const char **pStr);
CUresult cuGetErrorName(CUresult error, const char **pStr);

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

#define CHECK(cond)                                                              \
	do {                                                                     \
		if (cond) {                                                      \
			passed++;                                                \
		} else {                                                         \
			failed++;                                                \
			printf("FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);   \
		}                                                                \
	} while (0)

static const char *image = "# two kernels\nkernel k1us ns_per_block 1000\nkernel k10ms ns_per_block 10000000\n";

static double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* check_four_kernel_graph launches a graph of four 100 µs kernels on s
 * between two events and checks the time they measure. */
static void check_four_kernel_graph(CUgraphExec ge, CUstream s, CUevent e1, CUevent e2)
{
	float ms = 0;

	EXPECT(cuEventRecord(e1, s), CUDA_SUCCESS);
	EXPECT(cuGraphLaunch(ge, s), CUDA_SUCCESS);
	EXPECT(cuEventRecord(e2, s), CUDA_SUCCESS);
	EXPECT(cuStreamSynchronize(s), CUDA_SUCCESS);
	EXPECT(cuEventElapsedTime(&ms, e1, e2), CUDA_SUCCESS);
	CHECK(ms >= 0.399f && ms < 0.9f);
}

int main(int argc, char **argv)
{
	CUdevice dev;
	CUcontext ctx, cur, ctx2;
	CUmodule mod;
	CUfunction k1us, k10ms, f;
	CUstream s, s2;
	CUevent e1, e2;
	CUgraph g;
	CUgraphExec ge;
	CUdeviceptr d, d2;
	const char *str;
	char name[64], host[4096];
	int n, v;
	float ms;
	double t0;
	CUstream bogus_stream = (CUstream)(uintptr_t)0xdeadbeef;
	CUfunction bogus_fn = (CUfunction)(uintptr_t)0x1234;

	if (argc > 1 && !strcmp(argv[1], "nodevice")) {
		EXPECT(cuInit(0), CUDA_ERROR_NO_DEVICE);
		EXPECT(cuDeviceGetCount(&n), CUDA_ERROR_NOT_INITIALIZED);
		printf("%d passed, %d failed\n", passed, failed);
		return failed != 0;
	}

	/* Before cuInit. */
	EXPECT(cuDriverGetVersion(&v), CUDA_SUCCESS);
	CHECK(v >= 12000);
	EXPECT(cuDriverGetVersion(NULL), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuDeviceGetCount(&n), CUDA_ERROR_NOT_INITIALIZED);
	EXPECT(cuCtxCreate_v2(&ctx, 0, 0), CUDA_ERROR_NOT_INITIALIZED);
	EXPECT(cuInit(1), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuInit(0), CUDA_SUCCESS);
	EXPECT(cuInit(0), CUDA_SUCCESS);

	/* Devices. */
	EXPECT(cuDeviceGetCount(&n), CUDA_SUCCESS);
	CHECK(n == 1);
	EXPECT(cuDeviceGetCount(NULL), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuDeviceGet(&dev, 0), CUDA_SUCCESS);
	EXPECT(cuDeviceGet(&dev, 7), CUDA_ERROR_INVALID_DEVICE);
	EXPECT(cuDeviceGet(&dev, -1), CUDA_ERROR_INVALID_DEVICE);
	EXPECT(cuDeviceGet(NULL, 0), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuDeviceGetName(name, sizeof(name), 0), CUDA_SUCCESS);
	CHECK(strstr(name, "fakegpu") != NULL);
	EXPECT(cuDeviceGetName(name, 0, 0), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuDeviceGetName(name, sizeof(name), 3), CUDA_ERROR_INVALID_DEVICE);
	EXPECT(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, 0), CUDA_SUCCESS);
	CHECK(v == 1024);
	EXPECT(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 0), CUDA_SUCCESS);
	EXPECT(cuDeviceGetAttribute(&v, (CUdevice_attribute)9999, 0), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuDeviceGetAttribute(NULL, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 0), CUDA_ERROR_INVALID_VALUE);

	/* Contexts. */
	EXPECT(cuCtxSynchronize(), CUDA_ERROR_INVALID_CONTEXT);
	EXPECT(cuCtxCreate_v2(NULL, 0, 0), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuCtxCreate_v2(&ctx, 0, 5), CUDA_ERROR_INVALID_DEVICE);
	EXPECT(cuCtxCreate_v2(&ctx, 0, dev), CUDA_SUCCESS);
	EXPECT(cuCtxGetCurrent(&cur), CUDA_SUCCESS);
	CHECK(cur == ctx);
	EXPECT(cuCtxGetCurrent(NULL), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuCtxSetCurrent((CUcontext)(uintptr_t)0x42), CUDA_ERROR_INVALID_CONTEXT);
	EXPECT(cuCtxSetCurrent(ctx), CUDA_SUCCESS);
	EXPECT(cuCtxDestroy_v2((CUcontext)(uintptr_t)0x42), CUDA_ERROR_INVALID_CONTEXT);

	/* Modules. */
	EXPECT(cuModuleLoadData(&mod, "not a kernel image"), CUDA_ERROR_INVALID_IMAGE);
	EXPECT(cuModuleLoadData(&mod, "kernel x ns_per_block"), CUDA_ERROR_INVALID_IMAGE);
	EXPECT(cuModuleLoadData(&mod, ""), CUDA_ERROR_INVALID_IMAGE);
	EXPECT(cuModuleLoadData(NULL, image), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuModuleLoadData(&mod, image), CUDA_SUCCESS);
	EXPECT(cuModuleGetFunction(&k1us, mod, "k1us"), CUDA_SUCCESS);
	EXPECT(cuModuleGetFunction(&k10ms, mod, "k10ms"), CUDA_SUCCESS);
	EXPECT(cuModuleGetFunction(&f, mod, "nope"), CUDA_ERROR_NOT_FOUND);
	EXPECT(cuModuleGetFunction(&f, (CUmodule)(uintptr_t)0x99, "k1us"), CUDA_ERROR_INVALID_HANDLE);
	EXPECT(cuModuleGetFunction(NULL, mod, "k1us"), CUDA_ERROR_INVALID_VALUE);

	/* Launches on the default stream, and their errors. */
	EXPECT(cuLaunchKernel(k1us, 10, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL), CUDA_SUCCESS);
	EXPECT(cuLaunchKernel(k1us, 0, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuLaunchKernel(k1us, 1, 1, 1, 2048, 1, 1, 0, NULL, NULL, NULL), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuLaunchKernel(bogus_fn, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL), CUDA_ERROR_INVALID_HANDLE);
	EXPECT(cuLaunchKernel(k1us, 1, 1, 1, 1, 1, 1, 0, bogus_stream, NULL, NULL), CUDA_ERROR_INVALID_HANDLE);
	EXPECT(cuCtxSynchronize(), CUDA_SUCCESS);

	/* Streams and events; a 10 ms kernel measured by events. */
	EXPECT(cuStreamCreate(NULL, 0), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuStreamCreate(&s, 0), CUDA_SUCCESS);
	EXPECT(cuStreamCreate(&s2, 1), CUDA_SUCCESS);
	EXPECT(cuEventCreate(&e1, 0), CUDA_SUCCESS);
	EXPECT(cuEventCreate(&e2, 0), CUDA_SUCCESS);
	EXPECT(cuEventElapsedTime(&ms, e1, e2), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuEventRecord(e1, s), CUDA_SUCCESS);
	EXPECT(cuLaunchKernel(k10ms, 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL), CUDA_SUCCESS);
	EXPECT(cuEventRecord(e2, s), CUDA_SUCCESS);
	EXPECT(cuStreamQuery(s), CUDA_ERROR_NOT_READY);
	t0 = now_ms();
	EXPECT(cuEventSynchronize(e2), CUDA_SUCCESS);
	CHECK(now_ms() - t0 > 5);
	EXPECT(cuStreamQuery(s), CUDA_SUCCESS);
	EXPECT(cuEventElapsedTime(&ms, e1, e2), CUDA_SUCCESS);
	CHECK(ms >= 9.99f && ms < 10.5f);
	if (!(ms >= 9.99f && ms < 10.5f))
		printf("elapsed %.3f ms for a 10 ms kernel\n", ms);
	EXPECT(cuEventElapsedTime(NULL, e1, e2), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuEventRecord((CUevent)(uintptr_t)0x77, s), CUDA_ERROR_INVALID_HANDLE);
	EXPECT(cuEventSynchronize((CUevent)(uintptr_t)0x77), CUDA_ERROR_INVALID_HANDLE);
	{
		CUlaunchConfig cfg = { 5, 2, 1, 64, 1, 1, 0, s2, NULL, 0 };

		EXPECT(cuLaunchKernelEx(&cfg, k1us, NULL, NULL), CUDA_SUCCESS);
		EXPECT(cuLaunchKernelEx(NULL, k1us, NULL, NULL), CUDA_ERROR_INVALID_VALUE);
	}
	EXPECT(cuStreamSynchronize(s2), CUDA_SUCCESS);
	EXPECT(cuStreamSynchronize(bogus_stream), CUDA_ERROR_INVALID_HANDLE);
	EXPECT(cuStreamQuery(bogus_stream), CUDA_ERROR_INVALID_HANDLE);

	/* Memory and copies. */
	EXPECT(cuMemAlloc_v2(&d, 0), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuMemAlloc_v2(NULL, 16), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuMemAlloc_v2(&d, (size_t)1 << 50), CUDA_ERROR_OUT_OF_MEMORY);
	EXPECT(cuMemAlloc_v2(&d, 1 << 20), CUDA_SUCCESS);
	CHECK(d != 0);
	EXPECT(cuMemAlloc_v2(&d2, 4096), CUDA_SUCCESS);
	CHECK(d2 != d);
	memset(host, 7, sizeof(host));
	EXPECT(cuMemcpyHtoD_v2(d, host, sizeof(host)), CUDA_SUCCESS);
	EXPECT(cuMemcpyDtoH_v2(host, d, sizeof(host)), CUDA_SUCCESS);
	EXPECT(cuMemcpyHtoDAsync_v2(d, host, sizeof(host), s), CUDA_SUCCESS);
	EXPECT(cuMemcpyDtoHAsync_v2(host, d, sizeof(host), s), CUDA_SUCCESS);
	EXPECT(cuMemsetD8_v2(d, 0, 1 << 20), CUDA_SUCCESS);
	EXPECT(cuMemsetD8Async(d2, 1, 4096, s), CUDA_SUCCESS);
	EXPECT(cuStreamSynchronize(s), CUDA_SUCCESS);
	EXPECT(cuMemcpyHtoD_v2(d, host, (1 << 20) + 1), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuMemcpyHtoD_v2(d + 4096, NULL, 16), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuMemcpyDtoH_v2(host, 0x10, 16), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuMemsetD8_v2(d2 + 4000, 0, 200), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuMemcpyHtoDAsync_v2(d, host, 16, bogus_stream), CUDA_ERROR_INVALID_HANDLE);
	EXPECT(cuMemFree_v2(d2), CUDA_SUCCESS);
	EXPECT(cuMemFree_v2(d2), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuMemFree_v2(d + 1), CUDA_ERROR_INVALID_VALUE);

	/* Graphs. */
	EXPECT(cuStreamBeginCapture_v2(NULL, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
	EXPECT(cuStreamEndCapture(s, &g), CUDA_ERROR_ILLEGAL_STATE);
	EXPECT(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
	EXPECT(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_ERROR_ILLEGAL_STATE);
	for (int i = 0; i < 2; i++)
		EXPECT(cuLaunchKernel(k1us, 100, 1, 1, 32, 1, 1, 0, s, NULL, NULL), CUDA_SUCCESS);
	EXPECT(cuStreamQuery(s), CUDA_SUCCESS); /* captured launches do not run */
	EXPECT(cuStreamSynchronize(s), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
	/* The capture forks to s2 through an event and is joined back: s2's
	 * launches are nodes of the same graph (four kernels in all). */
	EXPECT(cuEventRecord(e1, s), CUDA_SUCCESS); /* a point in the graph, nothing on the device */
	EXPECT(cuEventSynchronize(e1), CUDA_ERROR_CAPTURED_EVENT);
	EXPECT(cuEventQuery(e1), CUDA_ERROR_CAPTURED_EVENT);
	EXPECT(cuStreamWaitEvent(s2, e1, 0), CUDA_SUCCESS);
	EXPECT(cuStreamIsCapturing(s2, &n), CUDA_SUCCESS);
	CHECK(n == 1);
	EXPECT(cuStreamSynchronize(s2), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
	for (int i = 0; i < 2; i++)
		EXPECT(cuLaunchKernel(k1us, 100, 1, 1, 32, 1, 1, 0, s2, NULL, NULL), CUDA_SUCCESS);
	EXPECT(cuStreamQuery(s2), CUDA_SUCCESS);
	EXPECT(cuStreamEndCapture(s2, &g), CUDA_ERROR_STREAM_CAPTURE_UNMATCHED); /* s2 did not begin it */
	EXPECT(cuEventRecord(e2, s2), CUDA_SUCCESS);
	EXPECT(cuStreamWaitEvent(s, e2, 0), CUDA_SUCCESS); /* joined back */
	EXPECT(cuStreamEndCapture(s, NULL), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuStreamEndCapture(s, &g), CUDA_SUCCESS);
	EXPECT(cuStreamIsCapturing(s2, &n), CUDA_SUCCESS);
	CHECK(n == 0); /* the capture ended for the stream that joined it too */
	EXPECT(cuStreamSynchronize(s2), CUDA_SUCCESS);
	EXPECT(cuStreamWaitEvent(s2, e1, 0), CUDA_ERROR_CAPTURED_EVENT);
	EXPECT(cuGraphInstantiateWithFlags(&ge, g, 0), CUDA_SUCCESS);
	EXPECT(cuGraphInstantiateWithFlags(&ge, (CUgraph)(uintptr_t)0x5, 0), CUDA_ERROR_INVALID_HANDLE);
	EXPECT(cuGraphInstantiateWithFlags(NULL, g, 0), CUDA_ERROR_INVALID_VALUE);
	check_four_kernel_graph(ge, s, e1, e2);
	EXPECT(cuGraphLaunch((CUgraphExec)(uintptr_t)0x5, s), CUDA_ERROR_INVALID_HANDLE);
	EXPECT(cuGraphExecDestroy(ge), CUDA_SUCCESS);
	EXPECT(cuGraphExecDestroy(ge), CUDA_ERROR_INVALID_HANDLE);
	EXPECT(cuGraphDestroy(g), CUDA_SUCCESS);
	EXPECT(cuGraphDestroy(g), CUDA_ERROR_INVALID_HANDLE);
	/* A fork never joined back invalidates the capture; another capture's
	 * event is isolated from this one. */
	EXPECT(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
	EXPECT(cuEventRecord(e1, s), CUDA_SUCCESS);
	EXPECT(cuStreamWaitEvent(s2, e1, 0), CUDA_SUCCESS);
	EXPECT(cuLaunchKernel(k1us, 100, 1, 1, 32, 1, 1, 0, s2, NULL, NULL), CUDA_SUCCESS);
	EXPECT(cuEventRecord(e2, s2), CUDA_SUCCESS);
	EXPECT(cuStreamWaitEvent(s, e2, 0), CUDA_SUCCESS);
	EXPECT(cuLaunchKernel(k1us, 100, 1, 1, 32, 1, 1, 0, s2, NULL, NULL), CUDA_SUCCESS); /* after the join */
	g = (CUgraph)(uintptr_t)0x5;
	EXPECT(cuStreamEndCapture(s, &g), CUDA_ERROR_STREAM_CAPTURE_UNJOINED);
	CHECK(g == NULL);
	EXPECT(cuStreamIsCapturing(s2, &n), CUDA_SUCCESS);
	CHECK(n == 0);
	EXPECT(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
	EXPECT(cuStreamBeginCapture_v2(s2, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
	EXPECT(cuEventRecord(e1, s), CUDA_SUCCESS);
	EXPECT(cuStreamWaitEvent(s2, e1, 0), CUDA_ERROR_STREAM_CAPTURE_ISOLATION);
	EXPECT(cuStreamEndCapture(s2, &g), CUDA_SUCCESS);
	EXPECT(cuGraphDestroy(g), CUDA_SUCCESS);
	EXPECT(cuStreamEndCapture(s, &g), CUDA_SUCCESS);
	EXPECT(cuGraphDestroy(g), CUDA_SUCCESS);
	EXPECT(cuStreamBeginCapture(NULL), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED); /* CUDA 10.0's, no mode */
	EXPECT(cuStreamBeginCapture(s), CUDA_SUCCESS);
	EXPECT(cuStreamBeginCapture(s), CUDA_ERROR_ILLEGAL_STATE);
	EXPECT(cuStreamEndCapture(s, &g), CUDA_SUCCESS);
	EXPECT(cuGraphDestroy(g), CUDA_SUCCESS);
	/* CUDA 12.3's capture into an existing graph: two captures of two
	 * kernels each add up to one graph of four. */
	EXPECT(cuGraphCreate(NULL, 0), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuGraphCreate(&g, 1), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuGraphCreate(&g, 0), CUDA_SUCCESS);
	EXPECT(cuStreamBeginCaptureToGraph(s, NULL, NULL, NULL, 0, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuStreamBeginCaptureToGraph(s, g, NULL, NULL, 1, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuStreamBeginCaptureToGraph(s, (CUgraph)(uintptr_t)0x5, NULL, NULL, 0, CU_STREAM_CAPTURE_MODE_GLOBAL),
	       CUDA_ERROR_INVALID_HANDLE);
	for (int round = 0; round < 2; round++) {
		CUgraph into = NULL;

		EXPECT(cuStreamBeginCaptureToGraph(s, g, NULL, NULL, 0, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
		EXPECT(cuStreamBeginCaptureToGraph(s, g, NULL, NULL, 0, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_ERROR_ILLEGAL_STATE);
		for (int i = 0; i < 2; i++)
			EXPECT(cuLaunchKernel(k1us, 100, 1, 1, 32, 1, 1, 0, s, NULL, NULL), CUDA_SUCCESS);
		EXPECT(cuGraphDestroy(g), CUDA_ERROR_ILLEGAL_STATE); /* a stream captures into it */
		EXPECT(cuStreamEndCapture(s, &into), CUDA_SUCCESS);
		CHECK(into == g);
	}
	EXPECT(cuGraphInstantiateWithFlags(&ge, g, 0), CUDA_SUCCESS);
	check_four_kernel_graph(ge, s, e1, e2);
	EXPECT(cuGraphExecDestroy(ge), CUDA_SUCCESS);
	EXPECT(cuGraphDestroy(g), CUDA_SUCCESS);

	/* Error strings. */
	EXPECT(cuGetErrorString(CUDA_SUCCESS, &str), CUDA_SUCCESS);
	CHECK(str && !strcmp(str, "no error"));
	EXPECT(cuGetErrorName(CUDA_ERROR_OUT_OF_MEMORY, &str), CUDA_SUCCESS);
	CHECK(str && !strcmp(str, "CUDA_ERROR_OUT_OF_MEMORY"));
	EXPECT(cuGetErrorName((CUresult)12345, &str), CUDA_ERROR_INVALID_VALUE);
	CHECK(str == NULL);
	EXPECT(cuGetErrorString(CUDA_SUCCESS, NULL), CUDA_ERROR_INVALID_VALUE);

	/* Teardown, and handles of a destroyed context. */
	EXPECT(cuEventDestroy_v2(e1), CUDA_SUCCESS);
	EXPECT(cuEventDestroy_v2(e1), CUDA_ERROR_INVALID_HANDLE);
	EXPECT(cuStreamDestroy_v2(s2), CUDA_SUCCESS);
	EXPECT(cuStreamDestroy_v2(s2), CUDA_ERROR_INVALID_HANDLE);
	EXPECT(cuStreamDestroy_v2(NULL), CUDA_ERROR_INVALID_HANDLE);
	EXPECT(cuModuleUnload(mod), CUDA_SUCCESS);
	EXPECT(cuModuleUnload(mod), CUDA_ERROR_INVALID_HANDLE);
	EXPECT(cuLaunchKernel(k1us, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL), CUDA_ERROR_INVALID_HANDLE);
	EXPECT(cuCtxCreate_v2(&ctx2, 0, dev), CUDA_SUCCESS);
	EXPECT(cuCtxDestroy_v2(ctx2), CUDA_SUCCESS);
	EXPECT(cuCtxSetCurrent(ctx), CUDA_SUCCESS);
	EXPECT(cuCtxDestroy_v2(ctx), CUDA_SUCCESS);
	EXPECT(cuCtxDestroy_v2(ctx), CUDA_ERROR_INVALID_CONTEXT);
	EXPECT(cuStreamSynchronize(s), CUDA_ERROR_INVALID_HANDLE);
	EXPECT(cuEventSynchronize(e2), CUDA_ERROR_INVALID_HANDLE);
	EXPECT(cuCtxSynchronize(), CUDA_ERROR_INVALID_CONTEXT);
	EXPECT(cuMemAlloc_v2(&d, 16), CUDA_ERROR_INVALID_CONTEXT);

	printf("%d passed, %d failed\n", passed, failed);
	return failed != 0;
}
