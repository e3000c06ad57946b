/* gpuwork: GPU workloads for the simulated GPU (or any libcuda). Shared
 * declarations of its parts: the CUDA driver API as the workloads call it,
 * loaded by name (the driver API as a program written against cuda.h uses
 * it) or, with --api runtime, through cuGetProcAddress_v2 with the
 * per-thread default stream flag as the CUDA runtime does; options;
 * kernels; statistics and progress lines. */
#ifndef GPUWORK_H
#define GPUWORK_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext, *CUstream, *CUevent, *CUmodule, *CUfunction, *CUgraph, *CUgraphExec;
typedef void (*CUhostFn)(void *);

typedef struct {
	int id;
	char pad[4];
	char value[64];
} CUlaunchAttribute;

typedef struct {
	unsigned int gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
	CUstream hStream;
	CUlaunchAttribute *attrs;
	unsigned int numAttrs;
} CUlaunchConfig;

typedef struct {
	char reserved[64];
} CUipcMemHandle;

#define CUDA_ERROR_NOT_READY 600
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CU_STREAM_WAIT_VALUE_GEQ 0

/* The driver API entry points the workloads use. */
struct cuda {
	CUresult (*Init)(unsigned);
	CUresult (*DeviceGet)(CUdevice *, int);
	CUresult (*CtxCreate)(CUcontext *, unsigned, CUdevice);
	CUresult (*CtxSetCurrent)(CUcontext);
	CUresult (*DevicePrimaryCtxRetain)(CUcontext *, CUdevice);
	CUresult (*CtxSynchronize)(void);
	CUresult (*ModuleLoadData)(CUmodule *, const void *);
	CUresult (*ModuleGetFunction)(CUfunction *, CUmodule, const char *);
	CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
				 CUstream, void **, void **);
	CUresult (*LaunchKernelEx)(const CUlaunchConfig *, CUfunction, void **, void **);
	CUresult (*LaunchHostFunc)(CUstream, CUhostFn, void *);
	CUresult (*StreamCreate)(CUstream *, unsigned);
	CUresult (*StreamSynchronize)(CUstream);
	CUresult (*StreamWaitEvent)(CUstream, CUevent, unsigned);
	CUresult (*StreamWriteValue32)(CUstream, CUdeviceptr, unsigned, unsigned);
	CUresult (*StreamWaitValue32)(CUstream, CUdeviceptr, unsigned, unsigned);
	CUresult (*EventCreate)(CUevent *, unsigned);
	CUresult (*EventRecord)(CUevent, CUstream);
	CUresult (*EventQuery)(CUevent);
	CUresult (*EventSynchronize)(CUevent);
	CUresult (*EventElapsedTime)(float *, CUevent, CUevent);
	CUresult (*StreamBeginCapture)(CUstream, int);
	CUresult (*StreamEndCapture)(CUstream, CUgraph *);
	CUresult (*GraphInstantiate)(CUgraphExec *, CUgraph, unsigned long long);
	CUresult (*GraphLaunch)(CUgraphExec, CUstream);
	CUresult (*MemAlloc)(CUdeviceptr *, size_t);
	CUresult (*MemFree)(CUdeviceptr);
	CUresult (*MemGetInfo)(size_t *, size_t *);
	CUresult (*MemHostAlloc)(void **, size_t, unsigned);
	CUresult (*MemAllocManaged)(CUdeviceptr *, size_t, unsigned);
	CUresult (*MemFreeHost)(void *);
	CUresult (*MemAllocAsync)(CUdeviceptr *, size_t, CUstream);
	CUresult (*MemFreeAsync)(CUdeviceptr, CUstream);
	CUresult (*IpcGetMemHandle)(CUipcMemHandle *, CUdeviceptr);
	CUresult (*IpcOpenMemHandle)(CUdeviceptr *, CUipcMemHandle, unsigned);
	CUresult (*GetErrorName)(CUresult, const char **);
};

extern struct cuda cu;

/* Options of every workload (each uses the ones its usage names). */
struct opts {
	double duration, interval;
	int gpu, depth, kernels, streams, children, grid;
	double kernel_ms, rate, fps, frame_ms;
	int runtime; /* --api runtime */
	/* loop */
	const char *kernel_list; /* --kernels-ms */
	const char *mix;         /* cycle | random | phase */
	double phase_s, think_ms, jitter;
	int sync_every, graph_nodes, persistent, launch_ex;
	int threads; /* loop --threads: each in a context of its own */
	int spread;  /* loop --spread: thread i on GPU gpu + i mod spread */
	int device_latency; /* infer --device-latency */
	const char *sync; /* stream | ctx | event | poll */
	uint64_t seed;
	/* serve */
	int tokens;
	/* collective */
	int ranks;
	/* alloc */
	double step_mib, fraction;
	int count;
	const char *pattern; /* steps | torch | vllm | pool | host */
};

extern volatile sig_atomic_t g_stop;
extern const char *g_name;

void die(const char *what, CUresult r);
#define CHECK(call)                     \
	do {                            \
		CUresult _r = (call);   \
		if (_r)                 \
			die(#call, _r); \
	} while (0)

double now_s(void);
void sleep_until(double t);
uint64_t rnd(uint64_t *state);
double rnd01(uint64_t *state);

/* Loads libcuda and makes a context current on the GPU: a created one, or
 * with --api runtime the primary context, entry points found through
 * cuGetProcAddress_v2 with the per-thread default stream flag. */
void setup(const struct opts *o);
/* Makes a context current for the calling thread, after setup: one of its
 * own (cuCtxCreate), or with --api runtime the primary context. */
void thread_context(const struct opts *o, int gpu);

/* A kernel of the workload: its function and the grid it launches with. */
struct kernel {
	CUfunction fn;
	unsigned blocks;
	double ms;
};

/* Loads n kernels of ms[i] milliseconds each (--grid, --jitter and
 * --persistent shape them) in one module. */
void load_kernels(const struct opts *o, const double *ms, int n, struct kernel *out);
/* Launches k on stream s (cuLaunchKernelEx under --api runtime or --ex). */
void launch_kernel(const struct opts *o, const struct kernel *k, CUstream s);

/* ---- statistics and progress ---- */

struct samples {
	double *v;
	size_t n, cap;
};

void add_sample(struct samples *s, double x);
/* Appends every sample of from to s. */
void add_samples(struct samples *s, const struct samples *from);
double pct(struct samples *s, size_t from, double p);
double share_over(struct samples *s, double limit);

struct progress {
	double t0, next, interval;
	uint64_t kernels, last_kernels;
	double gpu_ms, last_gpu_ms;
	size_t last_samples;
	struct samples *sync; /* when set, each line adds its sync waits' percentiles */
	size_t last_sync;
	struct samples *device; /* when set, each line adds its device latencies' percentiles */
	size_t last_device;
	int thread; /* when not -1, each line names the thread (loop --threads) */
};

void progress_init(struct progress *p, const struct opts *o);
void progress_tick(struct progress *p, struct samples *lat, const char *lat_name);
void summary_head(struct progress *p);

/* The workloads. */
int run_hog(const struct opts *o, double kernel_ms);
int run_alloc(const struct opts *o);
int run_greedy(const struct opts *o);
int run_infer(const struct opts *o);
int run_frames(const struct opts *o);
int run_storm(const struct opts *o);
int run_graph(const struct opts *o);
int run_fork(const struct opts *o);
int run_loop(const struct opts *o);
int run_train(const struct opts *o);
int run_serve(const struct opts *o);
int run_collective(const struct opts *o);

#endif
