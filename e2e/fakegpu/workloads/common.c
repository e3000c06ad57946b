/* What gpuwork's workloads share: loading libcuda (by name as the driver
 * API is used, or through cuGetProcAddress_v2 as the CUDA runtime does),
 * the context, kernels, time, randomness, statistics and progress lines. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "gpuwork.h"

struct cuda cu;

void die(const char *what, CUresult r)
{
	const char *name = "?";

	if (cu.GetErrorName)
		cu.GetErrorName(r, &name);
	fprintf(stderr, "gpuwork %s: %s: %s (%d)\n", g_name, what, name ? name : "?", r);
	exit(2);
}

double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

void sleep_until(double t)
{
	struct timespec ts = { (time_t)t, (long)((t - (time_t)t) * 1e9) };

	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR && !g_stop)
		;
}

/* xorshift64*: the workloads' own randomness, reproducible by --seed. */
uint64_t rnd(uint64_t *s)
{
	*s ^= *s >> 12;
	*s ^= *s << 25;
	*s ^= *s >> 27;
	return *s * 0x2545F4914F6CDD1DULL;
}

double rnd01(uint64_t *s)
{
	return (double)(rnd(s) >> 11) / 9007199254740992.0;
}

/* ---- loading libcuda ---- */

#define PER_THREAD_DEFAULT_STREAM 2

typedef CUresult (*getproc_fn)(const char *, void **, int, unsigned long long, int *);

/* cuGetProcAddress_v2 under --api runtime, and the CUDA version the loader
 * asks it for: a CUDA 13.0 runtime's, or the driver's if that is older. */
static getproc_fn getproc;
static int runtime_version = 13000;

static void *find(void *lib, getproc_fn gp, const char *name, const char *base, int required)
{
	void *p = NULL;

	if (gp) {
		int status = -1;

		if (gp(base, &p, runtime_version, PER_THREAD_DEFAULT_STREAM, &status) || status)
			p = NULL;
	} else {
		p = dlsym(lib, name);
	}
	if (!p && required) {
		fprintf(stderr, "gpuwork: %s missing\n", gp ? base : name);
		exit(2);
	}
	return p;
}

#ifndef GPUWORK_STATIC
/* memfd_copy copies a file into an anonymous memory file and returns the
 * path that opens it (/proc/self/fd/N): a library loaded from there is
 * mapped as "/memfd:... (deleted)", under no file name at all. */
static const char *memfd_copy(const char *path)
{
	static char name[64];
	char buf[65536];
	FILE *in = fopen(path, "rb");
	int fd = memfd_create("gpuwork", MFD_CLOEXEC);
	size_t n;

	if (!in || fd < 0) {
		fprintf(stderr, "gpuwork: memfd copy of %s: %s\n", path, strerror(errno));
		exit(2);
	}
	while ((n = fread(buf, 1, sizeof buf, in)) > 0) {
		if (write(fd, buf, n) != (ssize_t)n) {
			fprintf(stderr, "gpuwork: memfd copy of %s: %s\n", path, strerror(errno));
			exit(2);
		}
	}
	fclose(in);
	snprintf(name, sizeof name, "/proc/self/fd/%d", fd);
	return name;
}
#endif

#ifdef GPUWORK_STATIC
/* gpuwork-static has the simulated driver linked in, its symbols stripped:
 * no libcuda is loaded or mapped, no symbol names an entry point (a tenant
 * whose launches no uprobe can see). Its entry points come from its own
 * cuGetProcAddress_v2, as --api runtime does. */
CUresult cuInit(unsigned int flags);
CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, unsigned long long flags, int *status);
#endif

static void load_libcuda(int runtime)
{
	void *h = NULL;
#ifdef GPUWORK_STATIC
	cu.Init = cuInit;
	getproc = cuGetProcAddress_v2;
	if (runtime) {
		CUresult (*version)(int *) = NULL;
		int v = 0, st = -1;
#else
	const char *path = getenv("GPUWORK_LIBCUDA");

	if (path && strncmp(path, "memfd:", 6) == 0)
		path = memfd_copy(path + 6);
	h = dlopen(path && *path ? path : "libcuda.so.1", RTLD_NOW);

	if (!h) {
		fprintf(stderr, "gpuwork: %s\n", dlerror());
		exit(2);
	}
	/* As the runtime does: only cuInit and cuGetProcAddress_v2 by name. */
	*(void **)&cu.Init = find(h, NULL, "cuInit", "cuInit", 1);
	if (runtime) {
		CUresult (*version)(int *) = NULL;
		int v = 0, st = -1;

		*(void **)&getproc = find(h, NULL, "cuGetProcAddress_v2", "cuGetProcAddress", 1);
#endif
		if (getproc("cuDriverGetVersion", (void **)&version, 2020, 0, &st) == 0 && version && version(&v) == 0 &&
		    v < runtime_version)
			runtime_version = v;
	}
#define SYM(field, name, base, required) *(void **)&cu.field = find(h, getproc, name, base, required)
	SYM(DeviceGet, "cuDeviceGet", "cuDeviceGet", 1);
	SYM(CtxCreate, "cuCtxCreate_v2", "cuCtxCreate", !runtime);
	SYM(CtxSetCurrent, "cuCtxSetCurrent", "cuCtxSetCurrent", 1);
	SYM(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRetain", runtime);
	SYM(CtxSynchronize, "cuCtxSynchronize", "cuCtxSynchronize", !runtime);
	SYM(ModuleLoadData, "cuModuleLoadData", "cuModuleLoadData", 1);
	SYM(ModuleGetFunction, "cuModuleGetFunction", "cuModuleGetFunction", 1);
	SYM(LaunchKernel, "cuLaunchKernel", "cuLaunchKernel", 1);
	SYM(LaunchKernelEx, "cuLaunchKernelEx", "cuLaunchKernelEx", runtime);
	SYM(LaunchHostFunc, "cuLaunchHostFunc", "cuLaunchHostFunc", 0);
	SYM(StreamCreate, "cuStreamCreate", "cuStreamCreate", 1);
	SYM(StreamSynchronize, "cuStreamSynchronize", "cuStreamSynchronize", 1);
	SYM(StreamWaitEvent, "cuStreamWaitEvent", "cuStreamWaitEvent", 0);
	SYM(StreamWriteValue32, "cuStreamWriteValue32_v2", "cuStreamWriteValue32", 0);
	SYM(StreamWaitValue32, "cuStreamWaitValue32_v2", "cuStreamWaitValue32", 0);
	SYM(EventCreate, "cuEventCreate", "cuEventCreate", 1);
	SYM(EventRecord, "cuEventRecord", "cuEventRecord", 1);
	SYM(EventQuery, "cuEventQuery", "cuEventQuery", 1);
	SYM(EventSynchronize, "cuEventSynchronize", "cuEventSynchronize", 1);
	SYM(EventElapsedTime, "cuEventElapsedTime", "cuEventElapsedTime", 0);
	SYM(StreamBeginCapture, "cuStreamBeginCapture_v2", "cuStreamBeginCapture", 1);
	SYM(StreamEndCapture, "cuStreamEndCapture", "cuStreamEndCapture", 1);
	SYM(GraphInstantiate, "cuGraphInstantiateWithFlags", "cuGraphInstantiate", 1);
	SYM(GraphLaunch, "cuGraphLaunch", "cuGraphLaunch", 1);
	SYM(MemAlloc, "cuMemAlloc_v2", "cuMemAlloc", 1);
	SYM(MemFree, "cuMemFree_v2", "cuMemFree", 1);
	SYM(MemGetInfo, "cuMemGetInfo_v2", "cuMemGetInfo", 1);
	SYM(MemHostAlloc, "cuMemHostAlloc", "cuMemHostAlloc", 0);
	SYM(MemAllocManaged, "cuMemAllocManaged", "cuMemAllocManaged", 0);
	SYM(MemFreeHost, "cuMemFreeHost", "cuMemFreeHost", 0);
	SYM(MemAllocAsync, "cuMemAllocAsync", "cuMemAllocAsync", 0);
	SYM(MemFreeAsync, "cuMemFreeAsync", "cuMemFreeAsync", 0);
	SYM(IpcGetMemHandle, "cuIpcGetMemHandle", "cuIpcGetMemHandle", 0);
	SYM(IpcOpenMemHandle, "cuIpcOpenMemHandle_v2", "cuIpcOpenMemHandle", 0);
	SYM(GetErrorName, "cuGetErrorName", "cuGetErrorName", 1);
#undef SYM
}

/* The context-wide synchronize of the runtime's cudaDeviceSynchronize:
 * cuCtxSynchronize_v2 (CUDA 13) or cuCtxSynchronize, found by version. */
static CUresult (*ctx_sync_v2)(CUcontext);

static CUresult runtime_ctx_sync(void)
{
	return ctx_sync_v2(NULL);
}

/* GPUWORK_REOPEN_CTL=1: puts a fresh open of the same control node under
 * every descriptor of libcuda's nvidiactl. Its RM client stays bound to
 * the file it was created on, which the process no longer holds, so the
 * driver refuses controls made through the descriptor (a process that
 * closed and reopened the node: what gpuarb must take as that process's
 * trouble, not the GPU's). GPUWORK_REOPEN_CTL=PATH puts an open of PATH
 * there instead (a hostile tenant's own node, with a server of its own
 * beside it: gpuarb must steer through neither). */
static void reopen_control_files(void)
{
	char link[64], path[4096];
	const char *swap = getenv("GPUWORK_REOPEN_CTL");

	if (!swap)
		return;
	for (int fd = 0; fd < 1024; fd++) {
		ssize_t n;
		int fresh;

		snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
		n = readlink(link, path, sizeof(path) - 1);
		if (n <= 0)
			continue;
		path[n] = 0;
		if (n < 10 || strcmp(path + n - 10, "/nvidiactl"))
			continue;
		fresh = open(swap[0] == '/' ? swap : path, O_RDWR | O_CLOEXEC);
		if (fresh < 0 || dup3(fresh, fd, O_CLOEXEC) < 0) {
			fprintf(stderr, "gpuwork: GPUWORK_REOPEN_CTL: %s: %s\n", path, strerror(errno));
			exit(2);
		}
		close(fresh);
	}
}

void setup(const struct opts *o)
{
	CUdevice dev;
	CUcontext ctx;

	load_libcuda(o->runtime);
	CHECK(cu.Init(0));
	CHECK(cu.DeviceGet(&dev, o->gpu));
	if (!o->runtime) {
		CHECK(cu.CtxCreate(&ctx, 0, dev));
		reopen_control_files();
		return;
	}
	CHECK(cu.DevicePrimaryCtxRetain(&ctx, dev));
	CHECK(cu.CtxSetCurrent(ctx));
	/* A CUDA 13 runtime's device synchronize is cuCtxSynchronize_v2; an
	 * older driver has only cuCtxSynchronize. */
	int st = -1;

	if (runtime_version >= 13000) {
		if (getproc("cuCtxSynchronize", (void **)&ctx_sync_v2, runtime_version, PER_THREAD_DEFAULT_STREAM, &st) ||
		    !ctx_sync_v2)
			die("cuGetProcAddress_v2(cuCtxSynchronize)", st);
		cu.CtxSynchronize = runtime_ctx_sync;
	} else if (getproc("cuCtxSynchronize", (void **)&cu.CtxSynchronize, runtime_version, PER_THREAD_DEFAULT_STREAM, &st) ||
		   !cu.CtxSynchronize) {
		die("cuGetProcAddress_v2(cuCtxSynchronize)", st);
	}
	reopen_control_files();
}

void thread_context(const struct opts *o, int gpu)
{
	CUdevice dev;
	CUcontext ctx;

	CHECK(cu.DeviceGet(&dev, gpu));
	if (!o->runtime) {
		CHECK(cu.CtxCreate(&ctx, 0, dev));
		return;
	}
	CHECK(cu.DevicePrimaryCtxRetain(&ctx, dev));
	CHECK(cu.CtxSetCurrent(ctx));
}

/* ---- kernels ---- */

void load_kernels(const struct opts *o, const double *ms, int n, struct kernel *out)
{
	size_t cap = 128 + (size_t)n * 96, len = 0;
	char *img = malloc(cap);
	CUmodule mod;

	if (!img)
		exit(2);
	img[0] = 0;
	for (int i = 0; i < n; i++) {
		unsigned blocks;

		if (o->persistent) {
			/* A persistent kernel: one wave of blocks, its cost whatever the grid. */
			blocks = 132;
			len += (size_t)snprintf(img + len, cap - len, "kernel k%d ns_per_launch %.0f", i, ms[i] * 1e6);
		} else {
			double b = o->grid > 0 ? o->grid : ms[i] * 1000.0; /* default: 1 µs blocks */

			blocks = b < 1 ? 1 : (unsigned)llround(b);
			len += (size_t)snprintf(img + len, cap - len, "kernel k%d ns_per_block %.0f", i, ms[i] * 1e6 / blocks);
		}
		if (o->jitter > 0)
			len += (size_t)snprintf(img + len, cap - len, " jitter %.3f", o->jitter);
		len += (size_t)snprintf(img + len, cap - len, "\n");
		out[i].blocks = blocks;
		out[i].ms = ms[i];
	}
	CHECK(cu.ModuleLoadData(&mod, img));
	for (int i = 0; i < n; i++) {
		char name[16];

		snprintf(name, sizeof(name), "k%d", i);
		CHECK(cu.ModuleGetFunction(&out[i].fn, mod, name));
	}
	free(img);
}

void launch_kernel(const struct opts *o, const struct kernel *k, CUstream s)
{
	if (o->runtime || o->launch_ex) {
		CUlaunchConfig cfg = { k->blocks, 1, 1, 128, 1, 1, 0, s, NULL, 0 };

		CHECK(cu.LaunchKernelEx(&cfg, k->fn, NULL, NULL));
		return;
	}
	CHECK(cu.LaunchKernel(k->fn, k->blocks, 1, 1, 128, 1, 1, 0, s, NULL, NULL));
}

/* ---- statistics ---- */

void add_sample(struct samples *s, double x)
{
	if (s->n == s->cap) {
		s->cap = s->cap ? s->cap * 2 : 1024;
		s->v = realloc(s->v, s->cap * sizeof(double));
		if (!s->v)
			exit(2);
	}
	s->v[s->n++] = x;
}

void add_samples(struct samples *s, const struct samples *from)
{
	for (size_t i = 0; i < from->n; i++)
		add_sample(s, from->v[i]);
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

double pct(struct samples *s, size_t from, double p)
{
	size_t n = s->n - from;
	double *tmp;
	double r;

	if (!n)
		return 0;
	tmp = malloc(n * sizeof(double));
	memcpy(tmp, s->v + from, n * sizeof(double));
	qsort(tmp, n, sizeof(double), cmp_double);
	r = tmp[(size_t)fmin((double)n - 1, floor(p / 100.0 * n))];
	free(tmp);
	return r;
}

double share_over(struct samples *s, double limit)
{
	size_t k = 0;

	for (size_t i = 0; i < s->n; i++)
		k += s->v[i] > limit;
	return s->n ? (double)k / s->n : 0;
}

/* ---- progress ---- */

void progress_init(struct progress *p, const struct opts *o)
{
	memset(p, 0, sizeof(*p));
	p->t0 = now_s();
	p->thread = -1;
	p->interval = o->interval;
	p->next = p->t0 + o->interval;
}

/* Prints one interval line when due; lat adds latency percentiles. */
void progress_tick(struct progress *p, struct samples *lat, const char *lat_name)
{
	double t = now_s();

	if (p->interval <= 0 || t < p->next)
		return;
	flockfile(stdout); /* one line at a time from the threads of loop --threads */
	printf("{\"workload\":\"%s\",\"pid\":%d,\"t\":%.3f,\"kernels\":%llu,\"gpu_ms\":%.3f", g_name, getpid(),
	       t - p->t0, (unsigned long long)(p->kernels - p->last_kernels), p->gpu_ms - p->last_gpu_ms);
	if (p->thread >= 0)
		printf(",\"thread\":%d", p->thread);
	if (lat) {
		printf(",\"count\":%zu,\"%s_p50_ms\":%.3f,\"%s_p99_ms\":%.3f", lat->n - p->last_samples, lat_name,
		       pct(lat, p->last_samples, 50), lat_name, pct(lat, p->last_samples, 99));
		p->last_samples = lat->n;
	}
	if (p->sync) {
		printf(",\"sync_p50_ms\":%.3f,\"sync_p99_ms\":%.3f", pct(p->sync, p->last_sync, 50),
		       pct(p->sync, p->last_sync, 99));
		p->last_sync = p->sync->n;
	}
	if (p->device) {
		printf(",\"device_latency_p50_ms\":%.3f,\"device_latency_p99_ms\":%.3f", pct(p->device, p->last_device, 50),
		       pct(p->device, p->last_device, 99));
		p->last_device = p->device->n;
	}
	printf("}\n");
	fflush(stdout);
	funlockfile(stdout);
	p->last_kernels = p->kernels;
	p->last_gpu_ms = p->gpu_ms;
	while (p->next <= t)
		p->next += p->interval;
}

void summary_head(struct progress *p)
{
	printf("{\"workload\":\"%s\",\"pid\":%d,\"summary\":true,\"duration_s\":%.3f,\"kernels\":%llu,\"gpu_ms\":%.3f",
	       g_name, getpid(), now_s() - p->t0, (unsigned long long)p->kernels, p->gpu_ms);
}
