/* Driver entry point access: cuGetProcAddress_v2 (and the 11.x
 * cuGetProcAddress), the way the CUDA runtime, PyTorch, NCCL and Triton
 * find every driver function but cuInit. A query names a base symbol
 * ("cuLaunchKernel"), the CUDA version the caller was built for and
 * whether it uses per-thread default streams; the answer is the address of
 * the exported variant real libcuda gives for them (docs/driver.md §1):
 * cuLaunchKernel or cuLaunchKernel_ptsz, cuCtxCreate_v2/_v3/_v4,
 * cuCtxSynchronize or cuCtxSynchronize_v2, ... so uprobes on the exported
 * symbols see every call. */
#include "internal.h"

#include <string.h>

/* CUdriverProcAddressQueryResult and the query flags of cuda.h. */
enum { PROC_SUCCESS = 0, PROC_SYMBOL_NOT_FOUND = 1, PROC_VERSION_NOT_SUFFICIENT = 2 };
enum { FLAG_LEGACY_STREAM = 1, FLAG_PER_THREAD_STREAM = 2 };

/* The exported functions, declared without a prototype: the table only
 * takes their addresses. */
#define DECLARE(sym) extern CUresult sym();
#define ENTRIES(X)                                                            \
	X(cuInit, cuInit, 2000, 0)                                            \
	X(cuDriverGetVersion, cuDriverGetVersion, 2020, 0)                    \
	X(cuDeviceGet, cuDeviceGet, 2000, 0)                                  \
	X(cuDeviceGetCount, cuDeviceGetCount, 2000, 0)                        \
	X(cuDeviceGetName, cuDeviceGetName, 2000, 0)                          \
	X(cuDeviceGetAttribute, cuDeviceGetAttribute, 2000, 0)                \
	X(cuDeviceTotalMem, cuDeviceTotalMem_v2, 3020, 0)                     \
	X(cuCtxCreate, cuCtxCreate_v2, 3020, 0)                               \
	X(cuCtxCreate, cuCtxCreate_v3, 11040, 0)                              \
	X(cuCtxCreate, cuCtxCreate_v4, 12050, 0)                              \
	X(cuCtxDestroy, cuCtxDestroy_v2, 4000, 0)                             \
	X(cuCtxSetCurrent, cuCtxSetCurrent, 4000, 0)                          \
	X(cuCtxGetCurrent, cuCtxGetCurrent, 4000, 0)                          \
	X(cuCtxPushCurrent, cuCtxPushCurrent_v2, 4000, 0)                     \
	X(cuCtxPopCurrent, cuCtxPopCurrent_v2, 4000, 0)                       \
	X(cuCtxGetDevice, cuCtxGetDevice, 2000, 0)                            \
	X(cuCtxSynchronize, cuCtxSynchronize, 2000, 0)                        \
	X(cuCtxSynchronize, cuCtxSynchronize_v2, 13000, 0)                    \
	X(cuCtxGetStreamPriorityRange, cuCtxGetStreamPriorityRange, 5050, 0)  \
	X(cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain, 7000, 0)        \
	X(cuDevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease, 7000, 0)      \
	X(cuDevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease_v2, 11000, 0)  \
	X(cuDevicePrimaryCtxReset, cuDevicePrimaryCtxReset, 7000, 0)          \
	X(cuDevicePrimaryCtxReset, cuDevicePrimaryCtxReset_v2, 11000, 0)      \
	X(cuDevicePrimaryCtxSetFlags, cuDevicePrimaryCtxSetFlags, 7000, 0)    \
	X(cuDevicePrimaryCtxSetFlags, cuDevicePrimaryCtxSetFlags_v2, 11000, 0) \
	X(cuDevicePrimaryCtxGetState, cuDevicePrimaryCtxGetState, 7000, 0)    \
	X(cuStreamCreate, cuStreamCreate, 2000, 0)                            \
	X(cuStreamCreateWithPriority, cuStreamCreateWithPriority, 5050, 0)    \
	X(cuStreamDestroy, cuStreamDestroy_v2, 4000, 0)                       \
	X(cuStreamSynchronize, cuStreamSynchronize, 2000, 0)                  \
	X(cuStreamSynchronize, cuStreamSynchronize_ptsz, 7000, 1)             \
	X(cuStreamQuery, cuStreamQuery, 2000, 0)                              \
	X(cuStreamQuery, cuStreamQuery_ptsz, 7000, 1)                         \
	X(cuStreamWaitEvent, cuStreamWaitEvent, 3020, 0)                      \
	X(cuStreamWaitEvent, cuStreamWaitEvent_ptsz, 7000, 1)                 \
	X(cuStreamGetCtx, cuStreamGetCtx, 9020, 0)                            \
	X(cuEventCreate, cuEventCreate, 2000, 0)                              \
	X(cuEventRecord, cuEventRecord, 2000, 0)                              \
	X(cuEventRecord, cuEventRecord_ptsz, 7000, 1)                         \
	X(cuEventRecordWithFlags, cuEventRecordWithFlags, 11010, 0)           \
	X(cuEventRecordWithFlags, cuEventRecordWithFlags_ptsz, 11010, 1)      \
	X(cuEventQuery, cuEventQuery, 2000, 0)                                \
	X(cuEventSynchronize, cuEventSynchronize, 2000, 0)                    \
	X(cuEventElapsedTime, cuEventElapsedTime, 2000, 0)                    \
	X(cuEventDestroy, cuEventDestroy_v2, 4000, 0)                         \
	X(cuModuleLoadData, cuModuleLoadData, 2000, 0)                        \
	X(cuModuleGetFunction, cuModuleGetFunction, 2000, 0)                  \
	X(cuModuleUnload, cuModuleUnload, 2000, 0)                            \
	X(cuLaunchKernel, cuLaunchKernel, 4000, 0)                            \
	X(cuLaunchKernel, cuLaunchKernel_ptsz, 7000, 1)                       \
	X(cuLaunchKernelEx, cuLaunchKernelEx, 11060, 0)                       \
	X(cuLaunchKernelEx, cuLaunchKernelEx_ptsz, 11060, 1)                  \
	X(cuLaunchCooperativeKernel, cuLaunchCooperativeKernel, 9000, 0)      \
	X(cuLaunchCooperativeKernel, cuLaunchCooperativeKernel_ptsz, 9000, 1) \
	X(cuLaunchHostFunc, cuLaunchHostFunc, 10000, 0)                       \
	X(cuLaunchHostFunc, cuLaunchHostFunc_ptsz, 10000, 1)                  \
	X(cuStreamWriteValue32, cuStreamWriteValue32, 8000, 0)                \
	X(cuStreamWriteValue32, cuStreamWriteValue32_v2, 11070, 0)            \
	X(cuStreamWriteValue32, cuStreamWriteValue32_v2_ptsz, 11070, 1)       \
	X(cuStreamWaitValue32, cuStreamWaitValue32, 8000, 0)                  \
	X(cuStreamWaitValue32, cuStreamWaitValue32_v2, 11070, 0)              \
	X(cuStreamWaitValue32, cuStreamWaitValue32_v2_ptsz, 11070, 1)         \
	X(cuStreamBeginCapture, cuStreamBeginCapture, 10000, 0)               \
	X(cuStreamBeginCapture, cuStreamBeginCapture_ptsz, 10000, 1)          \
	X(cuStreamBeginCapture, cuStreamBeginCapture_v2, 10010, 0)            \
	X(cuStreamBeginCapture, cuStreamBeginCapture_v2_ptsz, 10010, 1)       \
	X(cuStreamBeginCaptureToGraph, cuStreamBeginCaptureToGraph, 12030, 0) \
	X(cuStreamBeginCaptureToGraph, cuStreamBeginCaptureToGraph_ptsz, 12030, 1) \
	X(cuStreamEndCapture, cuStreamEndCapture, 10000, 0)                   \
	X(cuStreamEndCapture, cuStreamEndCapture_ptsz, 10000, 1)              \
	X(cuStreamIsCapturing, cuStreamIsCapturing, 10000, 0)                 \
	X(cuStreamIsCapturing, cuStreamIsCapturing_ptsz, 10000, 1)            \
	X(cuGraphCreate, cuGraphCreate, 10000, 0)                             \
	X(cuGraphInstantiateWithFlags, cuGraphInstantiateWithFlags, 11040, 0) \
	X(cuGraphInstantiate, cuGraphInstantiateWithFlags, 12000, 0)          \
	X(cuGraphGetNodes, cuGraphGetNodes, 10000, 0)                         \
	X(cuGraphExecUpdate, cuGraphExecUpdate_v2, 12000, 0)                  \
	X(cuGraphLaunch, cuGraphLaunch, 10000, 0)                             \
	X(cuGraphLaunch, cuGraphLaunch_ptsz, 10000, 1)                        \
	X(cuGraphExecDestroy, cuGraphExecDestroy, 10000, 0)                   \
	X(cuGraphDestroy, cuGraphDestroy, 10000, 0)                           \
	X(cuMemAlloc, cuMemAlloc_v2, 3020, 0)                                 \
	X(cuMemFree, cuMemFree_v2, 3020, 0)                                   \
	X(cuMemAllocAsync, cuMemAllocAsync, 11020, 0)                         \
	X(cuMemAllocAsync, cuMemAllocAsync_ptsz, 11020, 1)                    \
	X(cuMemFreeAsync, cuMemFreeAsync, 11020, 0)                           \
	X(cuMemFreeAsync, cuMemFreeAsync_ptsz, 11020, 1)                      \
	X(cuMemGetInfo, cuMemGetInfo_v2, 3020, 0)                             \
	X(cuMemHostAlloc, cuMemHostAlloc, 2020, 0)                            \
	X(cuMemAllocManaged, cuMemAllocManaged, 6000, 0)                      \
	X(cuMemAllocHost, cuMemAllocHost_v2, 3020, 0)                         \
	X(cuMemFreeHost, cuMemFreeHost, 2000, 0)                              \
	X(cuMemcpy, cuMemcpy, 4000, 0)                                        \
	X(cuMemcpy, cuMemcpy_ptds, 7000, 1)                                   \
	X(cuMemcpyAsync, cuMemcpyAsync, 4000, 0)                              \
	X(cuMemcpyAsync, cuMemcpyAsync_ptsz, 7000, 1)                         \
	X(cuMemcpyHtoD, cuMemcpyHtoD_v2, 3020, 0)                             \
	X(cuMemcpyHtoD, cuMemcpyHtoD_v2_ptds, 7000, 1)                        \
	X(cuMemcpyDtoH, cuMemcpyDtoH_v2, 3020, 0)                             \
	X(cuMemcpyDtoH, cuMemcpyDtoH_v2_ptds, 7000, 1)                        \
	X(cuMemcpyDtoD, cuMemcpyDtoD_v2, 3020, 0)                             \
	X(cuMemcpyDtoD, cuMemcpyDtoD_v2_ptds, 7000, 1)                        \
	X(cuMemcpyHtoDAsync, cuMemcpyHtoDAsync_v2, 3020, 0)                   \
	X(cuMemcpyHtoDAsync, cuMemcpyHtoDAsync_v2_ptsz, 7000, 1)              \
	X(cuMemcpyDtoHAsync, cuMemcpyDtoHAsync_v2, 3020, 0)                   \
	X(cuMemcpyDtoHAsync, cuMemcpyDtoHAsync_v2_ptsz, 7000, 1)              \
	X(cuMemcpyDtoDAsync, cuMemcpyDtoDAsync_v2, 3020, 0)                   \
	X(cuMemcpyDtoDAsync, cuMemcpyDtoDAsync_v2_ptsz, 7000, 1)              \
	X(cuMemcpyPeer, cuMemcpyPeer, 4000, 0)                                \
	X(cuMemcpyPeer, cuMemcpyPeer_ptds, 7000, 1)                           \
	X(cuMemcpyPeerAsync, cuMemcpyPeerAsync, 4000, 0)                      \
	X(cuMemcpyPeerAsync, cuMemcpyPeerAsync_ptsz, 7000, 1)                 \
	X(cuMemsetD8, cuMemsetD8_v2, 3020, 0)                                 \
	X(cuMemsetD8, cuMemsetD8_v2_ptds, 7000, 1)                            \
	X(cuMemsetD8Async, cuMemsetD8Async, 3020, 0)                          \
	X(cuMemsetD8Async, cuMemsetD8Async_ptsz, 7000, 1)                     \
	X(cuMemsetD32, cuMemsetD32_v2, 3020, 0)                               \
	X(cuMemsetD32, cuMemsetD32_v2_ptds, 7000, 1)                          \
	X(cuMemsetD32Async, cuMemsetD32Async, 3020, 0)                        \
	X(cuMemsetD32Async, cuMemsetD32Async_ptsz, 7000, 1)                   \
	X(cuIpcGetMemHandle, cuIpcGetMemHandle, 4010, 0)                      \
	X(cuIpcOpenMemHandle, cuIpcOpenMemHandle_v2, 11000, 0)                \
	X(cuIpcCloseMemHandle, cuIpcCloseMemHandle, 4010, 0)                  \
	X(cuGetErrorString, cuGetErrorString, 6000, 0)                        \
	X(cuGetErrorName, cuGetErrorName, 6000, 0)                            \
	X(cuGetProcAddress, cuGetProcAddress, 11030, 0)                       \
	X(cuGetProcAddress, cuGetProcAddress_v2, 12000, 0)

#define DECLARE_ENTRY(base, sym, since, ptsz) DECLARE(sym)
ENTRIES(DECLARE_ENTRY)

static const struct entry {
	const char *base;
	int since;    /* the CUDA version that introduced this variant */
	int per_thread; /* the variant for per-thread default streams */
	void *fn;
} entries[] = {
#define ROW(base, sym, since, ptsz) { #base, since, ptsz, (void *)sym },
	ENTRIES(ROW)
#undef ROW
};

/* lookup resolves a query; returns the status and sets *pfn. */
static int lookup(const char *symbol, void **pfn, int version, int per_thread)
{
	const struct entry *best = NULL;
	int found = 0;

	for (size_t i = 0; i < sizeof(entries) / sizeof(entries[0]); i++) {
		const struct entry *e = &entries[i];

		if (strcmp(e->base, symbol))
			continue;
		found = 1;
		if (e->since > version || (e->per_thread && !per_thread))
			continue;
		/* The per-thread variant wins where asked for, then the newest. */
		if (!best || e->per_thread > best->per_thread ||
		    (e->per_thread == best->per_thread && e->since > best->since))
			best = e;
	}
	*pfn = best ? best->fn : NULL;
	if (best)
		return PROC_SUCCESS;
	return found ? PROC_VERSION_NOT_SUFFICIENT : PROC_SYMBOL_NOT_FOUND;
}

CUAPI CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags, int *symbolStatus)
{
	int status;

	if (!symbol || !pfn || flags > FLAG_PER_THREAD_STREAM)
		return CUDA_ERROR_INVALID_VALUE;
	*pfn = NULL;
	if (cudaVersion > g_driver_version)
		return CUDA_ERROR_INVALID_VALUE;
	status = lookup(symbol, pfn, cudaVersion, flags == FLAG_PER_THREAD_STREAM);
	if (symbolStatus)
		*symbolStatus = status;
	return CUDA_SUCCESS;
}

/* The CUDA 11.3–11.8 signature: no status, CUDA_ERROR_NOT_FOUND instead. */
CUAPI CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
	int status;
	CUresult r = cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, &status);

	if (r == CUDA_SUCCESS && status != PROC_SUCCESS)
		return CUDA_ERROR_NOT_FOUND;
	return r;
}
