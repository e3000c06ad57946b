/* gpuwork: GPU workloads for the simulated GPU (or any libcuda), loading
 * libcuda.so.1 with dlopen as the CUDA runtime does. Subcommands: hog,
 * infer, frames, storm, graph, fork, greedy. Each prints a JSON summary at
 * exit and, with --interval, one JSON line per interval. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext, *CUstream, *CUevent, *CUmodule, *CUfunction, *CUgraph, *CUgraphExec;

static struct {
	CUresult (*Init)(unsigned);
	CUresult (*DeviceGet)(CUdevice *, int);
	CUresult (*CtxCreate)(CUcontext *, unsigned, CUdevice);
	CUresult (*CtxDestroy)(CUcontext);
	CUresult (*CtxSynchronize)(void);
	CUresult (*ModuleLoadData)(CUmodule *, const void *);
	CUresult (*ModuleGetFunction)(CUfunction *, CUmodule, const char *);
	CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
				 CUstream, void **, void **);
	CUresult (*StreamCreate)(CUstream *, unsigned);
	CUresult (*StreamSynchronize)(CUstream);
	CUresult (*EventCreate)(CUevent *, unsigned);
	CUresult (*EventRecord)(CUevent, CUstream);
	CUresult (*EventSynchronize)(CUevent);
	CUresult (*StreamBeginCapture)(CUstream, int);
	CUresult (*StreamEndCapture)(CUstream, CUgraph *);
	CUresult (*GraphInstantiate)(CUgraphExec *, CUgraph, unsigned long long);
	CUresult (*GraphLaunch)(CUgraphExec, CUstream);
	CUresult (*GetErrorName)(CUresult, const char **);
} cu;

struct opts {
	double duration, interval;
	int gpu, depth, kernels, streams, children;
	double kernel_ms, rate, fps, frame_ms;
};

static volatile sig_atomic_t g_stop;
static const char *g_name;

static void on_signal(int sig)
{
	(void)sig;
	g_stop = 1;
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void sleep_until(double t)
{
	struct timespec ts = { (time_t)t, (long)((t - (time_t)t) * 1e9) };

	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR && !g_stop)
		;
}

static void die(const char *what, CUresult r)
{
	const char *name = "?";

	if (cu.GetErrorName)
		cu.GetErrorName(r, &name);
	fprintf(stderr, "gpuwork %s: %s: %s (%d)\n", g_name, what, name ? name : "?", r);
	exit(2);
}

#define CHECK(call)                       \
	do {                              \
		CUresult _r = (call);     \
		if (_r)                   \
			die(#call, _r);   \
	} while (0)

static void load_libcuda(void)
{
	const char *path = getenv("GPUWORK_LIBCUDA");
	void *h = dlopen(path && *path ? path : "libcuda.so.1", RTLD_NOW);

	if (!h) {
		fprintf(stderr, "gpuwork: %s\n", dlerror());
		exit(2);
	}
#define SYM(field, name)                                          \
	do {                                                      \
		*(void **)&cu.field = dlsym(h, name);             \
		if (!cu.field) {                                  \
			fprintf(stderr, "gpuwork: %s missing\n", name); \
			exit(2);                                  \
		}                                                 \
	} while (0)
	SYM(Init, "cuInit");
	SYM(DeviceGet, "cuDeviceGet");
	SYM(CtxCreate, "cuCtxCreate_v2");
	SYM(CtxDestroy, "cuCtxDestroy_v2");
	SYM(CtxSynchronize, "cuCtxSynchronize");
	SYM(ModuleLoadData, "cuModuleLoadData");
	SYM(ModuleGetFunction, "cuModuleGetFunction");
	SYM(LaunchKernel, "cuLaunchKernel");
	SYM(StreamCreate, "cuStreamCreate");
	SYM(StreamSynchronize, "cuStreamSynchronize");
	SYM(EventCreate, "cuEventCreate");
	SYM(EventRecord, "cuEventRecord");
	SYM(EventSynchronize, "cuEventSynchronize");
	SYM(StreamBeginCapture, "cuStreamBeginCapture_v2");
	SYM(StreamEndCapture, "cuStreamEndCapture");
	SYM(GraphInstantiate, "cuGraphInstantiateWithFlags");
	SYM(GraphLaunch, "cuGraphLaunch");
	SYM(GetErrorName, "cuGetErrorName");
}

/* The one kernel: 1 µs per block, so a launch of N blocks costs N µs. */
static const char *image = "kernel work ns_per_block 1000\n";
static CUcontext g_ctx;
static CUfunction g_fn;

static void setup(const struct opts *o)
{
	CUdevice dev;
	CUmodule mod;

	load_libcuda();
	CHECK(cu.Init(0));
	CHECK(cu.DeviceGet(&dev, o->gpu));
	CHECK(cu.CtxCreate(&g_ctx, 0, dev));
	CHECK(cu.ModuleLoadData(&mod, image));
	CHECK(cu.ModuleGetFunction(&g_fn, mod, "work"));
}

static unsigned blocks_for(double ms)
{
	double b = ms * 1000.0;

	return b < 1 ? 1 : (unsigned)llround(b);
}

static void launch(unsigned blocks, CUstream s)
{
	CHECK(cu.LaunchKernel(g_fn, blocks, 1, 1, 128, 1, 1, 0, s, NULL, NULL));
}

/* ---- statistics ---- */

struct samples {
	double *v;
	size_t n, cap;
};

static void add_sample(struct samples *s, double x)
{
	if (s->n == s->cap) {
		s->cap = s->cap ? s->cap * 2 : 1024;
		s->v = realloc(s->v, s->cap * sizeof(double));
		if (!s->v)
			exit(2);
	}
	s->v[s->n++] = x;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

static double pct(struct samples *s, size_t from, double p)
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

static double share_over(struct samples *s, double limit)
{
	size_t k = 0;

	for (size_t i = 0; i < s->n; i++)
		k += s->v[i] > limit;
	return s->n ? (double)k / s->n : 0;
}

/* ---- progress ---- */

struct progress {
	double t0, next, interval;
	uint64_t kernels, last_kernels;
	double gpu_ms, last_gpu_ms;
	size_t last_samples;
};

static void progress_init(struct progress *p, const struct opts *o)
{
	memset(p, 0, sizeof(*p));
	p->t0 = now_s();
	p->interval = o->interval;
	p->next = p->t0 + o->interval;
}

/* Prints one interval line when due; lat adds latency percentiles. */
static void progress_tick(struct progress *p, struct samples *lat, const char *lat_name)
{
	double t = now_s();

	if (p->interval <= 0 || t < p->next)
		return;
	printf("{\"workload\":\"%s\",\"pid\":%d,\"t\":%.3f,\"kernels\":%llu,\"gpu_ms\":%.3f", g_name, getpid(),
	       t - p->t0, (unsigned long long)(p->kernels - p->last_kernels), p->gpu_ms - p->last_gpu_ms);
	if (lat) {
		printf(",\"count\":%zu,\"%s_p50_ms\":%.3f,\"%s_p99_ms\":%.3f", lat->n - p->last_samples, lat_name,
		       pct(lat, p->last_samples, 50), lat_name, pct(lat, p->last_samples, 99));
		p->last_samples = lat->n;
	}
	printf("}\n");
	fflush(stdout);
	p->last_kernels = p->kernels;
	p->last_gpu_ms = p->gpu_ms;
	while (p->next <= t)
		p->next += p->interval;
}

static void summary_head(struct progress *p)
{
	printf("{\"workload\":\"%s\",\"pid\":%d,\"summary\":true,\"duration_s\":%.3f,\"kernels\":%llu,\"gpu_ms\":%.3f",
	       g_name, getpid(), now_s() - p->t0, (unsigned long long)p->kernels, p->gpu_ms);
}

/* ---- workloads ---- */

/* hog: long kernels, a deep queue, a sync only every `depth` launches. */
static int run_hog(const struct opts *o, double kernel_ms)
{
	struct progress p;
	int nst = o->streams < 1 ? 1 : o->streams;
	CUstream st[32];
	CUevent ev[2];
	unsigned blocks = blocks_for(kernel_ms);
	int batch = 0;

	setup(o);
	for (int i = 0; i < nst && i < 32; i++)
		CHECK(cu.StreamCreate(&st[i], 0));
	CHECK(cu.EventCreate(&ev[0], 0));
	CHECK(cu.EventCreate(&ev[1], 0));
	progress_init(&p, o);
	double end = p.t0 + o->duration;
	while (!g_stop && now_s() < end) {
		for (int i = 0; i < o->depth; i++)
			launch(blocks, st[i % nst]);
		CHECK(cu.EventRecord(ev[batch & 1], st[0]));
		if (batch > 0)
			CHECK(cu.EventSynchronize(ev[(batch - 1) & 1]));
		/* Count what is known complete: everything before the previous batch's event
		 * on stream 0; other streams are synchronised at the end. */
		p.kernels += o->depth;
		p.gpu_ms += o->depth * blocks / 1000.0;
		batch++;
		progress_tick(&p, NULL, NULL);
	}
	CHECK(cu.CtxSynchronize());
	summary_head(&p);
	printf(",\"kernel_ms\":%.3f,\"streams\":%d}\n", blocks / 1000.0, nst);
	return 0;
}

/* greedy: huge kernels, never a sync; blocks only when the ring is full. */
static int run_greedy(const struct opts *o)
{
	struct progress p;
	unsigned blocks = blocks_for(o->kernel_ms);

	setup(o);
	progress_init(&p, o);
	double end = p.t0 + o->duration;
	while (!g_stop && now_s() < end) {
		launch(blocks, NULL);
		p.kernels++;
		p.gpu_ms += blocks / 1000.0;
		progress_tick(&p, NULL, NULL);
	}
	summary_head(&p);
	printf(",\"kernel_ms\":%.3f,\"synced\":false}\n", blocks / 1000.0);
	fflush(stdout);
	_exit(0); /* leave queued work behind, as a killed greedy tenant would */
}

/* infer: requests of a few short kernels and a sync; open loop at --rate
 * (latency counted from the scheduled arrival) or closed loop. */
static int run_infer(const struct opts *o)
{
	struct progress p;
	struct samples lat = { 0 };
	CUstream s;
	unsigned blocks = blocks_for(o->kernel_ms);
	uint64_t i = 0;

	setup(o);
	CHECK(cu.StreamCreate(&s, 0));
	progress_init(&p, o);
	double end = p.t0 + o->duration;
	while (!g_stop) {
		double arrival = o->rate > 0 ? p.t0 + i / o->rate : now_s();

		if (arrival >= end)
			break;
		if (o->rate > 0)
			sleep_until(arrival);
		if (g_stop)
			break;
		for (int k = 0; k < o->kernels; k++)
			launch(blocks, s);
		CHECK(cu.StreamSynchronize(s));
		add_sample(&lat, (now_s() - arrival) * 1e3);
		p.kernels += o->kernels;
		p.gpu_ms += o->kernels * blocks / 1000.0;
		i++;
		progress_tick(&p, &lat, "latency");
	}
	summary_head(&p);
	printf(",\"requests\":%zu,\"rate\":%.1f,\"latency_p50_ms\":%.3f,\"latency_p95_ms\":%.3f,\"latency_p99_ms\":%.3f,"
	       "\"latency_max_ms\":%.3f}\n",
	       lat.n, o->rate, pct(&lat, 0, 50), pct(&lat, 0, 95), pct(&lat, 0, 99), pct(&lat, 0, 100));
	return 0;
}

/* frames: a render loop at a target FPS with a sync per frame; frame time
 * is the interval between frame completions. */
static int run_frames(const struct opts *o)
{
	struct progress p;
	struct samples ft = { 0 };
	CUstream s;
	double frame = 1.0 / o->fps;
	int nk = o->kernels < 1 ? 1 : o->kernels;
	unsigned blocks = blocks_for(o->frame_ms / nk);
	double last = 0, next;
	uint64_t frames = 0;

	setup(o);
	CHECK(cu.StreamCreate(&s, 0));
	progress_init(&p, o);
	double end = p.t0 + o->duration;
	next = p.t0;
	while (!g_stop && now_s() < end) {
		sleep_until(next);
		for (int k = 0; k < nk; k++)
			launch(blocks, s);
		CHECK(cu.StreamSynchronize(s));
		double t = now_s();
		if (last > 0)
			add_sample(&ft, (t - last) * 1e3);
		last = t;
		frames++;
		p.kernels += nk;
		p.gpu_ms += nk * blocks / 1000.0;
		next += frame;
		if (next < t)
			next = t; /* late: render the next frame at once, no catch-up burst */
		progress_tick(&p, &ft, "frame");
	}
	double dur = now_s() - p.t0;
	summary_head(&p);
	printf(",\"frames\":%llu,\"target_fps\":%.1f,\"fps\":%.2f,\"frame_p50_ms\":%.3f,\"frame_p95_ms\":%.3f,"
	       "\"frame_p99_ms\":%.3f,\"over_34ms\":%.4f,\"over_60ms\":%.4f}\n",
	       (unsigned long long)frames, o->fps, frames / dur, pct(&ft, 0, 50), pct(&ft, 0, 95), pct(&ft, 0, 99),
	       share_over(&ft, 34), share_over(&ft, 60));
	return 0;
}

/* storm: tiny kernels at a high launch rate, a sync every 1000 launches. */
static int run_storm(const struct opts *o)
{
	struct progress p;
	CUstream s;
	unsigned blocks = blocks_for(o->kernel_ms);
	uint64_t n = 0;

	setup(o);
	CHECK(cu.StreamCreate(&s, 0));
	progress_init(&p, o);
	double end = p.t0 + o->duration;
	while (!g_stop) {
		double t = now_s();
		uint64_t due = o->rate > 0 ? (uint64_t)((t - p.t0) * o->rate) : n + 1000;

		if (t >= end)
			break;
		while (n < due) {
			launch(blocks, s);
			n++;
			if (n % 1000 == 0)
				CHECK(cu.StreamSynchronize(s));
		}
		p.kernels = n;
		p.gpu_ms = n * blocks / 1000.0;
		progress_tick(&p, NULL, NULL);
		if (o->rate > 0)
			sleep_until(t + 0.001);
	}
	CHECK(cu.StreamSynchronize(s));
	double dur = now_s() - p.t0;
	summary_head(&p);
	printf(",\"launches_per_s\":%.1f}\n", n / dur);
	return 0;
}

/* graph: work submitted only through cuGraphLaunch. */
static int run_graph(const struct opts *o)
{
	struct progress p;
	CUstream s;
	CUgraph g;
	CUgraphExec ge;
	unsigned blocks = blocks_for(o->kernel_ms);
	int nk = o->kernels < 1 ? 1 : o->kernels;

	setup(o);
	CHECK(cu.StreamCreate(&s, 0));
	CHECK(cu.StreamBeginCapture(s, 0));
	for (int k = 0; k < nk; k++)
		launch(blocks, s);
	CHECK(cu.StreamEndCapture(s, &g));
	CHECK(cu.GraphInstantiate(&ge, g, 0));
	progress_init(&p, o);
	double end = p.t0 + o->duration;
	while (!g_stop && now_s() < end) {
		CHECK(cu.GraphLaunch(ge, s));
		CHECK(cu.StreamSynchronize(s));
		p.kernels += nk;
		p.gpu_ms += nk * blocks / 1000.0;
		progress_tick(&p, NULL, NULL);
	}
	summary_head(&p);
	printf(",\"graph_kernels\":%d}\n", nk);
	return 0;
}

/* fork: the parent does no GPU work; its children run hog. */
static int run_fork(const struct opts *o)
{
	pid_t kids[64];
	int n = o->children < 1 ? 1 : (o->children > 64 ? 64 : o->children);
	int failed = 0;
	double t0 = now_s();

	for (int i = 0; i < n; i++) {
		kids[i] = fork();
		if (kids[i] < 0) {
			perror("gpuwork fork");
			return 2;
		}
		if (kids[i] == 0) {
			g_name = "fork-child";
			exit(run_hog(o, o->kernel_ms));
		}
	}
	for (int i = 0; i < n; i++) {
		int st;

		while (waitpid(kids[i], &st, 0) < 0 && errno == EINTR) {
			for (int j = 0; g_stop && j < n; j++)
				kill(kids[j], SIGTERM);
		}
		failed += !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	}
	printf("{\"workload\":\"fork\",\"pid\":%d,\"summary\":true,\"duration_s\":%.3f,\"children\":%d,\"failed\":%d}\n",
	       getpid(), now_s() - t0, n, failed);
	return failed ? 1 : 0;
}

static void usage(void)
{
	fprintf(stderr,
		"usage: gpuwork WORKLOAD [options]\n"
		"workloads:\n"
		"  hog     long kernels (--kernel-ms 20), deep queue (--depth 8), rare syncs; --streams N\n"
		"  infer   requests of --kernels 4 x --kernel-ms 0.25 + sync, at --rate R/s (0: closed loop)\n"
		"  frames  render loop at --fps 60, --frame-ms 8 of GPU work per frame, sync per frame\n"
		"  storm   tiny kernels (--kernel-ms 0.001) at --rate 20000 launches/s\n"
		"  graph   --kernels 8 x --kernel-ms 1 captured once, then only cuGraphLaunch + sync\n"
		"  fork    --children 4 processes run hog; the parent does no GPU work\n"
		"  greedy  huge kernels (--kernel-ms 50), never syncs\n"
		"common: --duration S (10), --interval S (0: summary only), --gpu N (0)\n"
		"libcuda: libcuda.so.1 from the library path, or GPUWORK_LIBCUDA=PATH\n");
}

int main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "duration", required_argument, 0, 'd' }, { "interval", required_argument, 0, 'i' },
		{ "gpu", required_argument, 0, 'g' },      { "kernel-ms", required_argument, 0, 'k' },
		{ "depth", required_argument, 0, 'D' },    { "rate", required_argument, 0, 'r' },
		{ "kernels", required_argument, 0, 'n' },  { "fps", required_argument, 0, 'f' },
		{ "frame-ms", required_argument, 0, 'F' }, { "streams", required_argument, 0, 's' },
		{ "children", required_argument, 0, 'c' }, { "help", no_argument, 0, 'h' },
		{ 0, 0, 0, 0 },
	};
	struct opts o = { .duration = 10, .depth = 8, .kernels = 4, .streams = 1, .children = 4, .fps = 60,
			  .frame_ms = 8, .kernel_ms = -1, .rate = -1 };
	struct sigaction sa = { .sa_handler = on_signal };
	int c;

	if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
		usage();
		return argc < 2 ? 2 : 0;
	}
	g_name = argv[1];
	optind = 2;
	while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
		char *endp = NULL;
		double v = optarg ? strtod(optarg, &endp) : 0;

		if (optarg && (*endp || v < 0 || !isfinite(v))) {
			for (int i = 0; lo[i].name; i++)
				if (lo[i].val == c)
					fprintf(stderr, "gpuwork: --%s %s: want a non-negative number\n", lo[i].name, optarg);
			return 2;
		}
		switch (c) {
		case 'd': o.duration = v; break;
		case 'i': o.interval = v; break;
		case 'g': o.gpu = (int)v; break;
		case 'k': o.kernel_ms = v; break;
		case 'D': o.depth = v < 1 ? 1 : (int)v; break;
		case 'r': o.rate = v; break;
		case 'n': o.kernels = (int)v; break;
		case 'f': o.fps = v > 0 ? v : 60; break;
		case 'F': o.frame_ms = v; break;
		case 's': o.streams = (int)v; break;
		case 'c': o.children = (int)v; break;
		case 'h': usage(); return 0;
		default: usage(); return 2;
		}
	}
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	setvbuf(stdout, NULL, _IOLBF, 0);

	if (!strcmp(g_name, "hog"))
		return run_hog(&o, o.kernel_ms < 0 ? 20 : o.kernel_ms);
	if (!strcmp(g_name, "greedy")) {
		o.kernel_ms = o.kernel_ms < 0 ? 50 : o.kernel_ms;
		return run_greedy(&o);
	}
	if (!strcmp(g_name, "infer")) {
		o.kernel_ms = o.kernel_ms < 0 ? 0.25 : o.kernel_ms;
		o.rate = o.rate < 0 ? 0 : o.rate;
		return run_infer(&o);
	}
	if (!strcmp(g_name, "frames"))
		return run_frames(&o);
	if (!strcmp(g_name, "storm")) {
		o.kernel_ms = o.kernel_ms < 0 ? 0.001 : o.kernel_ms;
		o.rate = o.rate < 0 ? 20000 : o.rate;
		return run_storm(&o);
	}
	if (!strcmp(g_name, "graph")) {
		o.kernel_ms = o.kernel_ms < 0 ? 1 : o.kernel_ms;
		o.kernels = o.kernels == 4 ? 8 : o.kernels;
		return run_graph(&o);
	}
	if (!strcmp(g_name, "fork")) {
		o.kernel_ms = o.kernel_ms < 0 ? 20 : o.kernel_ms;
		return run_fork(&o);
	}
	fprintf(stderr, "gpuwork: unknown workload %s\n", g_name);
	usage();
	return 2;
}
