/* gpuwork's single-purpose workloads: hog, greedy, infer, frames, storm,
 * graph and fork. Each prints a JSON summary at exit and, with
 * --interval, one JSON line per interval. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpuwork.h"

/* One kernel of kernel_ms, loaded after setup. */
static struct kernel one_kernel(const struct opts *o, double kernel_ms)
{
	struct kernel k;

	load_kernels(o, &kernel_ms, 1, &k);
	return k;
}

/* hog: long kernels, a deep queue, a sync only every `depth` launches. */
int run_hog(const struct opts *o, double kernel_ms)
{
	struct progress p;
	int nst = o->streams < 1 ? 1 : (o->streams > 31 ? 31 : o->streams);
	CUstream st[32];
	CUevent ev[2];
	struct kernel k;
	int batch = 0;

	setup(o);
	k = one_kernel(o, kernel_ms);
	for (int i = 0; i < nst; i++)
		CHECK(cu.StreamCreate(&st[i], 0));
	CHECK(cu.EventCreate(&ev[0], 0));
	CHECK(cu.EventCreate(&ev[1], 0));
	progress_init(&p, o);
	double end = p.t0 + o->duration;
	while (!g_stop && now_s() < end) {
		for (int i = 0; i < o->depth; i++)
			launch_kernel(o, &k, st[i % nst]);
		CHECK(cu.EventRecord(ev[batch & 1], st[0]));
		if (batch > 0)
			CHECK(cu.EventSynchronize(ev[(batch - 1) & 1]));
		/* Count what is known complete: everything before the previous batch's event
		 * on stream 0; other streams are synchronised at the end. */
		p.kernels += o->depth;
		p.gpu_ms += o->depth * k.ms;
		batch++;
		progress_tick(&p, NULL, NULL);
	}
	CHECK(cu.CtxSynchronize());
	summary_head(&p);
	printf(",\"kernel_ms\":%.3f,\"streams\":%d}\n", k.ms, nst);
	return 0;
}

/* greedy: huge kernels, never a sync; blocks only when the ring is full. */
int run_greedy(const struct opts *o)
{
	struct progress p;
	struct kernel k;

	setup(o);
	k = one_kernel(o, o->kernel_ms);
	progress_init(&p, o);
	double end = p.t0 + o->duration;
	while (!g_stop && now_s() < end) {
		launch_kernel(o, &k, NULL);
		p.kernels++;
		p.gpu_ms += k.ms;
		progress_tick(&p, NULL, NULL);
	}
	summary_head(&p);
	printf(",\"kernel_ms\":%.3f,\"synced\":false}\n", k.ms);
	fflush(stdout);
	_exit(0); /* leave queued work behind, as a killed greedy tenant would */
}

/* infer: requests of a few short kernels and a sync; open loop at --rate
 * (latency counted from the scheduled arrival) or closed loop. The sync
 * wait alone (what a p99_sync_ms SLO is on) is reported beside it. */
int run_infer(const struct opts *o)
{
	struct progress p;
	struct samples lat = { 0 }, waits = { 0 }, device = { 0 };
	CUstream s;
	CUevent seen = NULL, ended = NULL;
	struct kernel k;
	uint64_t i = 0;

	setup(o);
	k = one_kernel(o, o->kernel_ms);
	CHECK(cu.StreamCreate(&s, 0));
	progress_init(&p, o);
	p.sync = &waits;
	if (o->device_latency) {
		if (!cu.EventElapsedTime) {
			fprintf(stderr, "gpuwork infer: --device-latency: libcuda has no cuEventElapsedTime\n");
			return 2;
		}
		CHECK(cu.EventCreate(&seen, 0));
		CHECK(cu.EventCreate(&ended, 0));
		p.device = &device;
	}
	double end = p.t0 + o->duration;
	while (!g_stop) {
		double arrival = o->rate > 0 ? p.t0 + i / o->rate : now_s();

		if (arrival >= end)
			break;
		if (o->rate > 0)
			sleep_until(arrival);
		if (g_stop)
			break;
		/* The device completes a marker on an idle stream as it sees it, so
		 * the events bracket the request's queueing and running on the GPU. */
		if (seen)
			CHECK(cu.EventRecord(seen, s));
		for (int j = 0; j < o->kernels; j++)
			launch_kernel(o, &k, s);
		if (ended)
			CHECK(cu.EventRecord(ended, s));
		double synced = now_s();
		CHECK(cu.StreamSynchronize(s));
		double done = now_s();
		add_sample(&waits, (done - synced) * 1e3);
		add_sample(&lat, (done - arrival) * 1e3);
		if (seen) {
			float ms = 0;

			CHECK(cu.EventElapsedTime(&ms, seen, ended));
			add_sample(&device, ms);
		}
		p.kernels += o->kernels;
		p.gpu_ms += o->kernels * k.ms;
		i++;
		progress_tick(&p, &lat, "latency");
	}
	summary_head(&p);
	printf(",\"requests\":%zu,\"rate\":%.1f,\"latency_p50_ms\":%.3f,\"latency_p95_ms\":%.3f,\"latency_p99_ms\":%.3f,"
	       "\"latency_max_ms\":%.3f,\"sync_p99_ms\":%.3f",
	       lat.n, o->rate, pct(&lat, 0, 50), pct(&lat, 0, 95), pct(&lat, 0, 99), pct(&lat, 0, 100), pct(&waits, 0, 99));
	if (seen)
		printf(",\"device_latency_p50_ms\":%.3f,\"device_latency_p99_ms\":%.3f,\"device_latency_max_ms\":%.3f",
		       pct(&device, 0, 50), pct(&device, 0, 99), pct(&device, 0, 100));
	printf("}\n");
	return 0;
}

/* frames: a render loop at a target FPS with a sync per frame; frame time
 * is the interval between frame completions. */
int run_frames(const struct opts *o)
{
	struct progress p;
	struct samples ft = { 0 };
	CUstream s;
	double frame = 1.0 / o->fps;
	int nk = o->kernels < 1 ? 1 : o->kernels;
	struct kernel k;
	double last = 0, next;
	uint64_t frames = 0;

	setup(o);
	k = one_kernel(o, o->frame_ms / nk);
	CHECK(cu.StreamCreate(&s, 0));
	progress_init(&p, o);
	double end = p.t0 + o->duration;
	next = p.t0;
	while (!g_stop && now_s() < end) {
		sleep_until(next);
		for (int j = 0; j < nk; j++)
			launch_kernel(o, &k, s);
		CHECK(cu.StreamSynchronize(s));
		double t = now_s();
		if (last > 0)
			add_sample(&ft, (t - last) * 1e3);
		last = t;
		frames++;
		p.kernels += nk;
		p.gpu_ms += nk * k.ms;
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
int run_storm(const struct opts *o)
{
	struct progress p;
	CUstream s;
	struct kernel k;
	uint64_t n = 0;

	setup(o);
	k = one_kernel(o, o->kernel_ms);
	CHECK(cu.StreamCreate(&s, 0));
	progress_init(&p, o);
	double end = p.t0 + o->duration;
	while (!g_stop) {
		double t = now_s();
		uint64_t due = o->rate > 0 ? (uint64_t)((t - p.t0) * o->rate) : n + 1000;

		if (t >= end)
			break;
		while (n < due) {
			launch_kernel(o, &k, s);
			n++;
			if (n % 1000 == 0)
				CHECK(cu.StreamSynchronize(s));
		}
		p.kernels = n;
		p.gpu_ms = n * k.ms;
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
int run_graph(const struct opts *o)
{
	struct progress p;
	CUstream s;
	CUgraph g;
	CUgraphExec ge;
	struct kernel k;
	int nk = o->kernels < 1 ? 1 : o->kernels;

	setup(o);
	k = one_kernel(o, o->kernel_ms);
	CHECK(cu.StreamCreate(&s, 0));
	CHECK(cu.StreamBeginCapture(s, 0));
	for (int j = 0; j < nk; j++)
		launch_kernel(o, &k, s);
	CHECK(cu.StreamEndCapture(s, &g));
	CHECK(cu.GraphInstantiate(&ge, g, 0));
	progress_init(&p, o);
	double end = p.t0 + o->duration;
	while (!g_stop && now_s() < end) {
		CHECK(cu.GraphLaunch(ge, s));
		CHECK(cu.StreamSynchronize(s));
		p.kernels += nk;
		p.gpu_ms += nk * k.ms;
		progress_tick(&p, NULL, NULL);
	}
	summary_head(&p);
	printf(",\"graph_kernels\":%d}\n", nk);
	return 0;
}

/* fork: the parent does no GPU work; its children run hog. */
int run_fork(const struct opts *o)
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

/* alloc: device memory in one of its patterns, held, then freed. A GPU
 * memory limit may end it at an allocation (SIGKILL): what it printed
 * last is what it held. */

/* The live allocations of an alloc run, and what it reports it holds. */
struct held {
	CUdeviceptr p[4096];
	size_t size[4096];
	int n;
	unsigned long long bytes;
};

static void held_add(struct held *h, CUdeviceptr p, size_t size)
{
	h->p[h->n] = p;
	h->size[h->n++] = size;
	h->bytes += size;
	printf("held %llu\n", h->bytes);
}

/* Frees the i-th live allocation (cuMemFree, or cuMemFreeAsync on s). */
static void held_free(struct held *h, int i, CUstream s)
{
	if (s)
		CHECK(cu.MemFreeAsync(h->p[i], s));
	else
		CHECK(cu.MemFree(h->p[i]));
	h->bytes -= h->size[i];
	h->p[i] = h->p[--h->n];
	h->size[i] = h->size[h->n];
	printf("held %llu\n", h->bytes);
}

/* torch: a caching allocator. Tensors of mixed sizes; every third step
 * frees the oldest live tensor into the cache (kept from the driver) and a
 * later tensor of no more than its size takes it back; at an OOM the
 * cache is emptied (cuMemFree of every cached block) and the allocation
 * retried once. */
static void alloc_torch(const struct opts *o, struct held *live)
{
	static const size_t sizes[] = { 512 << 10, 96 << 10, 20 << 20, 3 << 20, 130 << 20, 700 << 10, 48 << 20 };
	struct held cache = { .n = 0 };

	for (int i = 0; i < o->count && live->n < 4000 && !g_stop; i++) {
		size_t want = sizes[i % (sizeof(sizes) / sizeof(sizes[0]))];
		int hit = -1;
		CUdeviceptr p;
		CUresult r;

		for (int j = 0; j < cache.n && hit < 0; j++)
			if (cache.size[j] >= want)
				hit = j;
		if (hit >= 0) {
			held_add(live, cache.p[hit], cache.size[hit]);
			cache.bytes -= cache.size[hit];
			cache.p[hit] = cache.p[--cache.n];
			cache.size[hit] = cache.size[cache.n];
		} else {
			r = cu.MemAlloc(&p, want);
			if (r == CUDA_ERROR_OUT_OF_MEMORY) {
				while (cache.n > 0)
					held_free(&cache, 0, NULL);
				r = cu.MemAlloc(&p, want);
			}
			if (r == CUDA_ERROR_OUT_OF_MEMORY) {
				printf("oom\n");
				break;
			}
			CHECK(r);
			held_add(live, p, want);
		}
		if (i % 3 == 2 && live->n > 1) {
			cache.p[cache.n] = live->p[0];
			cache.size[cache.n++] = live->size[0];
			live->bytes -= live->size[0];
			live->p[0] = live->p[--live->n];
			live->size[0] = live->size[live->n];
		}
	}
	for (int j = 0; j < cache.n; j++) /* what the cache keeps is held too */
		held_add(live, cache.p[j], cache.size[j]);
}

/* vllm: weights, then a KV cache of 64 MiB blocks sized from a fraction of
 * the GPU's memory, as vLLM's --gpu-memory-utilization does. */
static void alloc_vllm(const struct opts *o, struct held *live, size_t step)
{
	size_t free_b, total, block = (size_t)64 << 20;
	CUdeviceptr p;

	CHECK(cu.MemGetInfo(&free_b, &total));
	for (int i = 0; i < o->count && !g_stop; i++) {
		CHECK(cu.MemAlloc(&p, step));
		held_add(live, p, step);
	}
	while (live->bytes + block <= (unsigned long long)(o->fraction * (double)total) && live->n < 4000 && !g_stop) {
		CHECK(cu.MemAlloc(&p, block));
		held_add(live, p, block);
	}
}

/* pool: rounds of stream-ordered allocations freed the round after, a
 * stream sync every fourth round (which releases what the pool keeps);
 * the last round's frees stay pooled. */
static void alloc_pool(const struct opts *o, struct held *live)
{
	static const size_t sizes[] = { 4 << 20, 16 << 20, 300 << 10, 64 << 20 };
	CUstream s;
	CUdeviceptr p;

	CHECK(cu.StreamCreate(&s, 0));
	for (int i = 0; i < o->count && !g_stop; i++) {
		int before = live->n;

		for (int k = 0; k < 4; k++) {
			CHECK(cu.MemAllocAsync(&p, sizes[(i + k) % 4], s));
			held_add(live, p, sizes[(i + k) % 4]);
		}
		while (before-- > 0)
			held_free(live, 0, s);
		if (i % 4 == 3 && i + 1 < o->count)
			CHECK(cu.StreamSynchronize(s));
	}
}

int run_alloc(const struct opts *o)
{
	size_t step = (size_t)(o->step_mib * (1 << 20));
	static struct held live;
	double end;

	if (!step || o->count > 4000) {
		fprintf(stderr, "gpuwork alloc: want --step-mib above 0 and --count up to 4000\n");
		return 2;
	}
	setup(o);
	if (!strcmp(o->pattern, "steps")) {
		for (int i = 0; i < o->count; i++) {
			CUdeviceptr p;

			CHECK(cu.MemAlloc(&p, step));
			held_add(&live, p, step);
		}
	} else if (!strcmp(o->pattern, "torch")) {
		alloc_torch(o, &live);
	} else if (!strcmp(o->pattern, "vllm")) {
		alloc_vllm(o, &live, step);
	} else if (!strcmp(o->pattern, "pool")) {
		alloc_pool(o, &live);
	} else if (!strcmp(o->pattern, "managed")) {
		for (int i = 0; i < o->count; i++) {
			CUdeviceptr p;

			CHECK(cu.MemAllocManaged(&p, step, 1 /* CU_MEM_ATTACH_GLOBAL */));
			held_add(&live, p, step);
		}
		if (live.n > 1)
			held_free(&live, 0, NULL); /* the first range unmapped again */
	} else if (!strcmp(o->pattern, "host")) {
		for (int i = 0; i < o->count; i++) {
			void *p;

			CHECK(cu.MemHostAlloc(&p, step, 0));
			printf("held %llu\n", (unsigned long long)step * (unsigned long long)(i + 1));
		}
	} else {
		fprintf(stderr, "gpuwork alloc: --pattern %s: want steps, torch, vllm, pool, managed or host\n", o->pattern);
		return 2;
	}
	printf("done\n");
	end = now_s() + o->duration;
	while (!g_stop && now_s() < end)
		usleep(10000);
	while (live.n > 0)
		held_free(&live, 0, NULL);
	return 0;
}
