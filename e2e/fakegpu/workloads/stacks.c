/* gpuwork's workloads shaped like real stacks, reaching libcuda as the CUDA
 * runtime does (entry points from cuGetProcAddress_v2 with the per-thread
 * default stream flag, the primary context, cuLaunchKernelEx):
 *   train       a training loop as PyTorch runs it: forward and backward
 *               passes of GEMM-like and elementwise kernels, an optimizer
 *               step of many tiny kernels, a caching allocator that polls
 *               cuEventQuery before it reuses memory, an input copy on a
 *               side stream the compute stream waits for, one blocking
 *               sync per iteration;
 *   serve       LLM serving: requests arrive at --rate; each runs an eager
 *               prefill of large kernels, then --tokens decode steps as
 *               graph replays of a hundred kernels of different costs,
 *               polling an event per token; latency percentiles;
 *   collective  --ranks processes that meet at every step through stream
 *               memory operations on a shared buffer (cuStreamWriteValue32,
 *               cuStreamWaitValue32), as NCCL's kernels meet, with a host
 *               function per step and an event polled by a proxy. */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpuwork.h"

/* ---- train ---- */

enum { GEMM_FWD, GEMM_BWD, ELEMWISE, REDUCE, OPTIM, TRAIN_KERNELS };

int run_train(const struct opts *o)
{
	double gemm = o->kernel_ms;
	double ms[TRAIN_KERNELS] = { gemm, 2 * gemm, 0.08, 0.2, 0.02 };
	struct kernel k[TRAIN_KERNELS];
	int layers = o->kernels < 1 ? 1 : o->kernels;
	CUstream copy;
	CUevent loaded, step[2];
	CUdeviceptr input;
	struct progress p;
	struct samples it_ms = { 0 };
	uint64_t iters = 0, reused = 0;

	setup(o);
	load_kernels(o, ms, TRAIN_KERNELS, k);
	CHECK(cu.StreamCreate(&copy, 1));
	CHECK(cu.EventCreate(&loaded, 0));
	CHECK(cu.EventCreate(&step[0], 0));
	CHECK(cu.EventCreate(&step[1], 0));
	CHECK(cu.MemAlloc(&input, 1 << 20));
	progress_init(&p, o);
	double end = p.t0 + o->duration;
	while (!g_stop && now_s() < end) {
		double t0 = now_s();
		CUdeviceptr act = 0;

		/* The caching allocator: memory the previous step freed is reused
		 * once its event has completed; it polls, it never blocks. */
		if (iters > 0 && cu.EventQuery(step[(iters - 1) & 1]) == 0)
			reused++;
		CHECK(cu.MemAllocAsync(&act, 4 << 20, NULL));
		/* The next batch's input, copied on a side stream. */
		CHECK(cu.LaunchKernel(k[ELEMWISE].fn, k[ELEMWISE].blocks, 1, 1, 128, 1, 1, 0, copy, NULL, NULL));
		CHECK(cu.EventRecord(loaded, copy));
		CHECK(cu.StreamWaitEvent(NULL, loaded, 0));
		for (int l = 0; l < layers; l++) { /* forward */
			launch_kernel(o, &k[GEMM_FWD], NULL);
			launch_kernel(o, &k[ELEMWISE], NULL);
			launch_kernel(o, &k[ELEMWISE], NULL);
		}
		launch_kernel(o, &k[REDUCE], NULL); /* the loss */
		for (int l = 0; l < layers; l++) { /* backward */
			launch_kernel(o, &k[GEMM_BWD], NULL);
			launch_kernel(o, &k[ELEMWISE], NULL);
		}
		for (int j = 0; j < 3 * layers; j++) /* the optimizer's multi-tensor apply */
			launch_kernel(o, &k[OPTIM], NULL);
		CHECK(cu.MemFreeAsync(act, NULL));
		CHECK(cu.EventRecord(step[iters & 1], NULL));
		CHECK(cu.StreamSynchronize(NULL)); /* loss.item() */
		iters++;
		p.kernels += (uint64_t)(6 * layers + 2);
		p.gpu_ms += layers * (ms[GEMM_FWD] + ms[GEMM_BWD] + 3 * ms[ELEMWISE] + 3 * ms[OPTIM]) + ms[REDUCE] +
			    ms[ELEMWISE];
		add_sample(&it_ms, (now_s() - t0) * 1e3);
		progress_tick(&p, &it_ms, "iteration");
	}
	summary_head(&p);
	printf(",\"iterations\":%llu,\"iteration_p50_ms\":%.3f,\"iteration_p99_ms\":%.3f,\"allocator_reuses\":%llu}\n",
	       (unsigned long long)iters, pct(&it_ms, 0, 50), pct(&it_ms, 0, 99), (unsigned long long)reused);
	return 0;
}

/* ---- serve ---- */

#define DECODE_NODES 100

int run_serve(const struct opts *o)
{
	/* Prefill kernels of --kernel-ms; a decode step's 100 kernels of 5 µs to
	 * 60 µs (about 2 ms a token). */
	double ms[8] = { o->kernel_ms, 0.005, 0.01, 0.02, 0.04, 0.06, 0.03, 0.015 };
	struct kernel k[8];
	int prefill = o->kernels < 1 ? 1 : o->kernels, tokens = o->tokens < 1 ? 1 : o->tokens;
	CUstream cap;
	CUgraph g;
	CUgraphExec decode;
	CUevent tok;
	struct progress p;
	struct samples ttft = { 0 }, lat = { 0 };
	uint64_t i = 0, decoded = 0;
	double decode_ms = 0;

	setup(o);
	load_kernels(o, ms, 8, k);
	CHECK(cu.StreamCreate(&cap, 1));
	CHECK(cu.StreamBeginCapture(cap, 0));
	for (int j = 0; j < DECODE_NODES; j++) {
		launch_kernel(o, &k[1 + j % 7], cap);
		decode_ms += ms[1 + j % 7];
	}
	CHECK(cu.StreamEndCapture(cap, &g));
	CHECK(cu.GraphInstantiate(&decode, g, 0));
	CHECK(cu.EventCreate(&tok, 0));
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
		for (int j = 0; j < prefill; j++) /* prefill, eager */
			launch_kernel(o, &k[0], NULL);
		for (int t = 0; t < tokens && !g_stop; t++) {
			CHECK(cu.GraphLaunch(decode, NULL));
			CHECK(cu.EventRecord(tok, NULL));
			while (cu.EventQuery(tok) == CUDA_ERROR_NOT_READY && !g_stop)
				usleep(100);
			if (t == 0)
				add_sample(&ttft, (now_s() - arrival) * 1e3);
			decoded++;
		}
		add_sample(&lat, (now_s() - arrival) * 1e3);
		p.kernels += (uint64_t)(prefill + tokens * DECODE_NODES);
		p.gpu_ms += prefill * ms[0] + tokens * decode_ms;
		i++;
		progress_tick(&p, &lat, "latency");
	}
	CHECK(cu.StreamSynchronize(NULL));
	summary_head(&p);
	printf(",\"requests\":%zu,\"tokens\":%llu,\"rate\":%.1f,\"ttft_p50_ms\":%.3f,\"ttft_p99_ms\":%.3f,"
	       "\"latency_p50_ms\":%.3f,\"latency_p99_ms\":%.3f}\n",
	       lat.n, (unsigned long long)decoded, o->rate, pct(&ttft, 0, 50), pct(&ttft, 0, 99), pct(&lat, 0, 50),
	       pct(&lat, 0, 99));
	return 0;
}

/* ---- collective ---- */

#define MAX_RANKS 8

static volatile uint64_t steps_done;

static void on_step(void *arg)
{
	(void)arg;
	__atomic_add_fetch(&steps_done, 1, __ATOMIC_RELAXED);
}

/* One rank: compute, then meet the others at every step through the flags
 * buffer (a 32-bit word per rank). */
static int collective_rank(const struct opts *o, int rank, int ranks, int rd, int *wr)
{
	double ms[2] = { o->kernel_ms, 0.2 };
	struct kernel k[2];
	int nk = o->kernels < 1 ? 1 : o->kernels;
	CUdeviceptr flags;
	CUipcMemHandle h;
	CUevent done;
	struct progress p;
	uint32_t step = 0;

	setup(o);
	load_kernels(o, ms, 2, k);
	if (rank == 0) {
		CHECK(cu.MemAlloc(&flags, 4096));
		CHECK(cu.IpcGetMemHandle(&h, flags));
		for (int r = 1; r < ranks; r++)
			if (write(wr[r], &h, sizeof(h)) != (ssize_t)sizeof(h))
				return 2;
	} else {
		if (read(rd, &h, sizeof(h)) != (ssize_t)sizeof(h))
			return 2;
		CHECK(cu.IpcOpenMemHandle(&flags, h, 1));
	}
	CHECK(cu.EventCreate(&done, 0));
	progress_init(&p, o);
	double end = p.t0 + o->duration;
	while (!g_stop && now_s() < end) {
		step++;
		for (int j = 0; j < nk; j++)
			launch_kernel(o, &k[0], NULL);
		CHECK(cu.StreamWriteValue32(NULL, flags + 4 * (CUdeviceptr)rank, step, 0));
		for (int r = 0; r < ranks; r++)
			if (r != rank)
				CHECK(cu.StreamWaitValue32(NULL, flags + 4 * (CUdeviceptr)r, step, CU_STREAM_WAIT_VALUE_GEQ));
		launch_kernel(o, &k[1], NULL); /* the reduction */
		CHECK(cu.LaunchHostFunc(NULL, on_step, NULL));
		CHECK(cu.EventRecord(done, NULL));
		while (cu.EventQuery(done) == CUDA_ERROR_NOT_READY && !g_stop) /* the proxy */
			usleep(100);
		p.kernels += (uint64_t)nk + 1;
		p.gpu_ms += nk * ms[0] + ms[1];
		progress_tick(&p, NULL, NULL);
	}
	/* The ranks stop a step apart: the last flag releases whoever waits
	 * for a step this rank will not take. The stream drains unless a
	 * rank is gone (killed: its flag never comes), for at most 2 s. */
	CHECK(cu.StreamWriteValue32(NULL, flags + 4 * (CUdeviceptr)rank, UINT32_MAX, 0));
	CHECK(cu.EventRecord(done, NULL));
	for (double give_up = now_s() + 2; cu.EventQuery(done) == CUDA_ERROR_NOT_READY && !g_stop && now_s() < give_up;)
		usleep(1000);
	summary_head(&p);
	printf(",\"rank\":%d,\"steps\":%u,\"host_callbacks\":%llu}\n", rank, step,
	       (unsigned long long)__atomic_load_n(&steps_done, __ATOMIC_RELAXED));
	return 0;
}

int run_collective(const struct opts *o)
{
	int ranks = o->ranks < 2 ? 2 : (o->ranks > MAX_RANKS ? MAX_RANKS : o->ranks);
	int pipes[MAX_RANKS][2], wr[MAX_RANKS] = { 0 };
	pid_t kids[MAX_RANKS];
	int failed = 0, rc;

	for (int r = 1; r < ranks; r++) {
		if (pipe(pipes[r]) < 0) {
			perror("gpuwork collective: pipe");
			return 2;
		}
		wr[r] = pipes[r][1];
	}
	for (int r = 1; r < ranks; r++) {
		kids[r] = fork();
		if (kids[r] < 0) {
			perror("gpuwork collective: fork");
			return 2;
		}
		if (kids[r] == 0) {
			/* A rank outlives no parent: it stops with it. */
			prctl(PR_SET_PDEATHSIG, SIGTERM);
			if (getppid() == 1)
				exit(2);
			/* Only its own read end: a rank 0 that dies ends its read. */
			for (int q = 1; q < ranks; q++) {
				close(pipes[q][1]);
				if (q != r)
					close(pipes[q][0]);
			}
			exit(collective_rank(o, r, ranks, pipes[r][0], NULL));
		}
	}
	for (int r = 1; r < ranks; r++)
		close(pipes[r][0]);
	rc = collective_rank(o, 0, ranks, -1, wr);
	for (int r = 1; r < ranks; r++) {
		int st;

		while (waitpid(kids[r], &st, 0) < 0 && errno == EINTR)
			;
		failed += !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	}
	return rc || failed ? 1 : 0;
}
