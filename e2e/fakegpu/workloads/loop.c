/* gpuwork loop: the general closed loop the scenario fuzzer draws from.
 * Kernels of --kernels-ms (each its own function) are picked by --mix
 * (cycle through them, random, or one per --phase-s phase), launched round
 * robin over --streams (or as graphs of --graph kernels, captured forked
 * across the streams and joined back), with a sync every
 * --sync-every launches (0: never; the queue limit blocks the loop instead)
 * of kind --sync: stream (each stream used), ctx, event (record and
 * synchronize one per stream) or poll (record, then cuEventQuery until
 * done); --think-ms of CPU time follows each sync. --threads N runs the loop
 * in N threads, each in a context of its own (thread_context), thread i on
 * GPU --gpu + i mod --spread, and sums them in the summary. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpuwork.h"

#define MAX_KERNELS 32
#define MAX_STREAMS 31
#define MAX_THREADS 64

enum sync_kind { SYNC_STREAM, SYNC_CTX, SYNC_EVENT, SYNC_POLL };
enum mix_kind { MIX_CYCLE, MIX_RANDOM, MIX_PHASE };

/* Parses "0.5,10,2" into ms; returns the count, -1 on a bad list. */
static int parse_list(const char *s, double *ms, int max)
{
	char *copy = strdup(s), *save = NULL, *tok;
	int n = 0;

	for (tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		char *end;
		double v = strtod(tok, &end);

		if (*end || !(v > 0 && v <= 60000) || n == max) {
			free(copy);
			return -1;
		}
		ms[n++] = v;
	}
	free(copy);
	return n;
}

/* Polls an event until it completes; the loop's waits as NCCL's proxy and
 * PyTorch's allocator do them, without blocking in the driver. */
static void poll_event(CUevent e)
{
	CUresult r;

	while ((r = cu.EventQuery(e)) == CUDA_ERROR_NOT_READY && !g_stop)
		usleep(100);
	if (r && r != CUDA_ERROR_NOT_READY)
		die("cuEventQuery", r);
}

/* One thread's loop: its kernels, streams and figures. */
struct loop_thread {
	const struct opts *o;
	const double *ms;
	int n, index;
	enum sync_kind sync;
	enum mix_kind mix;
	pthread_t tid;
	struct progress p;
	struct samples waits;
	uint64_t launches, syncs;
};

static void loop_body(struct loop_thread *t);

static void *loop_thread_main(void *arg)
{
	struct loop_thread *t = arg;

	thread_context(t->o, t->o->gpu + t->index % (t->o->spread < 1 ? 1 : t->o->spread));
	loop_body(t);
	return NULL;
}

int run_loop(const struct opts *o)
{
	static struct loop_thread threads[MAX_THREADS];
	double ms[MAX_KERNELS];
	int n = parse_list(o->kernel_list, ms, MAX_KERNELS);
	int nthreads = o->threads < 1 ? 1 : o->threads;
	enum sync_kind sync = SYNC_STREAM;
	enum mix_kind mix = MIX_CYCLE;
	struct progress sum;
	struct samples waits = { 0 };
	uint64_t launches = 0, syncs = 0;

	if (n <= 0) {
		fprintf(stderr, "gpuwork loop: --kernels-ms %s: want a list of kernel durations in ms, such as 0.5,10\n",
			o->kernel_list);
		return 2;
	}
	if (nthreads > MAX_THREADS) {
		fprintf(stderr, "gpuwork loop: --threads %d: want at most %d\n", nthreads, MAX_THREADS);
		return 2;
	}
	if (!strcmp(o->sync, "ctx"))
		sync = SYNC_CTX;
	else if (!strcmp(o->sync, "event"))
		sync = SYNC_EVENT;
	else if (!strcmp(o->sync, "poll"))
		sync = SYNC_POLL;
	else if (strcmp(o->sync, "stream")) {
		fprintf(stderr, "gpuwork loop: --sync %s: want stream, ctx, event or poll\n", o->sync);
		return 2;
	}
	if (!strcmp(o->mix, "random"))
		mix = MIX_RANDOM;
	else if (!strcmp(o->mix, "phase"))
		mix = MIX_PHASE;
	else if (strcmp(o->mix, "cycle")) {
		fprintf(stderr, "gpuwork loop: --mix %s: want cycle, random or phase\n", o->mix);
		return 2;
	}

	setup(o); /* the first thread's context */
	for (int i = 0; i < nthreads; i++) {
		threads[i] = (struct loop_thread){ .o = o, .ms = ms, .n = n, .index = i, .sync = sync, .mix = mix };
		if (i > 0 && pthread_create(&threads[i].tid, NULL, loop_thread_main, &threads[i])) {
			fprintf(stderr, "gpuwork loop: cannot start thread %d\n", i);
			exit(2);
		}
	}
	loop_body(&threads[0]);
	sum = threads[0].p;
	for (int i = 0; i < nthreads; i++) {
		if (i > 0) {
			pthread_join(threads[i].tid, NULL);
			sum.kernels += threads[i].p.kernels;
			sum.gpu_ms += threads[i].p.gpu_ms;
		}
		add_samples(&waits, &threads[i].waits);
		launches += threads[i].launches;
		syncs += threads[i].syncs;
	}
	summary_head(&sum);
	printf(",\"launches\":%llu,\"syncs\":%llu,\"sync_p50_ms\":%.3f,\"sync_p99_ms\":%.3f", (unsigned long long)launches,
	       (unsigned long long)syncs, pct(&waits, 0, 50), pct(&waits, 0, 99));
	if (nthreads > 1)
		printf(",\"threads\":%d", nthreads);
	printf("}\n");
	return 0;
}

static void loop_body(struct loop_thread *t)
{
	const struct opts *o = t->o;
	const double *ms = t->ms;
	int n = t->n;
	struct kernel k[MAX_KERNELS];
	CUgraphExec graphs[MAX_KERNELS];
	CUstream st[MAX_STREAMS];
	CUevent ev[MAX_STREAMS];
	uint8_t used[MAX_STREAMS] = { 0 };
	struct progress *pp = &t->p;
	int nst = o->streams < 1 ? 1 : (o->streams > MAX_STREAMS ? MAX_STREAMS : o->streams);
	int graph = o->graph_nodes > 0 ? o->graph_nodes : 0;
	enum sync_kind sync = t->sync;
	enum mix_kind mix = t->mix;
	uint64_t seed = o->seed ? o->seed + (uint64_t)t->index : (uint64_t)getpid() * 2654435761u + 1 + (uint64_t)t->index,
		 launches = 0;

	load_kernels(o, ms, n, k);
	for (int i = 0; i < nst; i++) {
		if (i == 0 && o->runtime)
			st[i] = NULL; /* the per-thread default stream, as the runtime's */
		else
			CHECK(cu.StreamCreate(&st[i], 1));
		CHECK(cu.EventCreate(&ev[i], 0));
	}
	if (graph) {
		/* One graph per kernel: graph i holds `graph` launches cycling through
		 * the kernels from i, so graphs differ in cost as kernels do. With
		 * several streams the capture forks to the others through an event
		 * and joins them back, as a multi-stream capture (PyTorch's side
		 * streams) does: launch j goes to stream j % streams. */
		CUstream cap, on[MAX_STREAMS];

		CHECK(cu.StreamCreate(&cap, 1));
		on[0] = cap;
		for (int i = 1; i < nst; i++)
			on[i] = st[i];
		for (int i = 0; i < n; i++) {
			CUgraph g;

			CHECK(cu.StreamBeginCapture(cap, 0));
			CHECK(cu.EventRecord(ev[0], cap));
			for (int j = 1; j < nst; j++)
				CHECK(cu.StreamWaitEvent(on[j], ev[0], 0));
			for (int j = 0; j < graph; j++)
				launch_kernel(o, &k[(i + j) % n], on[j % nst]);
			for (int j = 1; j < nst; j++) {
				CHECK(cu.EventRecord(ev[j], on[j]));
				CHECK(cu.StreamWaitEvent(cap, ev[j], 0));
			}
			CHECK(cu.StreamEndCapture(cap, &g));
			CHECK(cu.GraphInstantiate(&graphs[i], g, 0));
		}
	}
	progress_init(pp, o);
	if (o->threads > 1)
		pp->thread = t->index;
	double end = pp->t0 + o->duration;
	while (!g_stop && now_s() < end) {
		int pick;

		switch (mix) {
		case MIX_RANDOM:
			pick = (int)(rnd(&seed) % (uint64_t)n);
			break;
		case MIX_PHASE:
			pick = o->phase_s > 0 ? (int)((now_s() - pp->t0) / o->phase_s) % n : 0;
			break;
		default:
			pick = (int)(launches % (uint64_t)n);
		}
		int s = (int)(launches % (uint64_t)nst);

		if (graph) {
			CHECK(cu.GraphLaunch(graphs[pick], st[s]));
			for (int j = 0; j < graph; j++)
				pp->gpu_ms += k[(pick + j) % n].ms;
			pp->kernels += graph;
		} else {
			launch_kernel(o, &k[pick], st[s]);
			pp->gpu_ms += k[pick].ms;
			pp->kernels++;
		}
		used[s] = 1;
		launches++;
		if (o->sync_every > 0 && launches % (uint64_t)o->sync_every == 0) {
			double t0 = now_s();

			switch (sync) {
			case SYNC_CTX:
				CHECK(cu.CtxSynchronize());
				break;
			case SYNC_STREAM:
				for (int i = 0; i < nst; i++)
					if (used[i])
						CHECK(cu.StreamSynchronize(st[i]));
				break;
			case SYNC_EVENT:
			case SYNC_POLL:
				for (int i = 0; i < nst; i++)
					if (used[i])
						CHECK(cu.EventRecord(ev[i], st[i]));
				for (int i = 0; i < nst; i++) {
					if (!used[i])
						continue;
					if (sync == SYNC_EVENT)
						CHECK(cu.EventSynchronize(ev[i]));
					else
						poll_event(ev[i]);
				}
				break;
			}
			memset(used, 0, sizeof(used));
			add_sample(&t->waits, (now_s() - t0) * 1e3);
			t->syncs++;
			if (o->think_ms > 0)
				usleep((useconds_t)(o->think_ms * 1000));
		}
		progress_tick(pp, &t->waits, "sync");
	}
	if (o->sync_every > 0)
		CHECK(cu.CtxSynchronize());
	t->launches = launches;
}
