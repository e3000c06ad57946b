/* gpuwork: GPU workloads for the simulated GPU (or any libcuda), loading
 * libcuda.so.1 with dlopen as the CUDA runtime does. Subcommands: hog,
 * infer, frames, storm, graph, fork, greedy (simple.c), loop (loop.c),
 * train, serve, collective (stacks.c). Each prints a JSON summary at exit
 * and, with --interval, one JSON line per interval. */
#define _GNU_SOURCE
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpuwork.h"

volatile sig_atomic_t g_stop;
const char *g_name;

static void on_signal(int sig)
{
	(void)sig;
	g_stop = 1;
}

static void usage(void)
{
	fprintf(stderr,
		"usage: gpuwork WORKLOAD [options]\n"
		"workloads:\n"
		"  hog         long kernels (--kernel-ms 20), deep queue (--depth 8), rare syncs; --streams N\n"
		"  infer       requests of --kernels 4 x --kernel-ms 0.25 + sync, at --rate R/s (0: closed loop);\n"
		"              --device-latency: also each request's time on the GPU, from when the GPU saw it\n"
		"              to its end (events around it), free of the host's wake-ups\n"
		"  frames      render loop at --fps 60, --frame-ms 8 of GPU work per frame, sync per frame\n"
		"  storm       tiny kernels (--kernel-ms 0.001) at --rate 20000 launches/s\n"
		"  graph       --kernels 8 x --kernel-ms 1 captured once, then only cuGraphLaunch + sync\n"
		"  fork        --children 4 processes run hog; the parent does no GPU work\n"
		"  greedy      huge kernels (--kernel-ms 50), never syncs\n"
		"  loop        a closed loop: kernels of --kernels-ms LIST (1) picked by --mix cycle|random|phase\n"
		"              (--phase-s S per kernel), over --streams N, a --sync stream|ctx|event|poll every\n"
		"              --sync-every N launches (4; 0: never), --think-ms T after each, --graph N kernels\n"
		"              per cuGraphLaunch (captured forked across the streams), --seed S; --threads N\n"
		"              runs the loop in N threads, each in a context of its own (a context per\n"
		"              thread, as multi-model servers make; --api runtime: all in the primary context),\n"
		"              thread i on GPU --gpu + i mod --spread N (1): a process on N GPUs\n"
		"  train       PyTorch-like training: --kernels 8 layers of --kernel-ms 2 GEMMs, elementwise and\n"
		"              optimizer kernels, an event-polled allocator, one sync per iteration (--api runtime)\n"
		"  serve       LLM-like serving at --rate 10 requests/s: prefill of --kernels 8 x --kernel-ms 1.5,\n"
		"              --tokens 16 decode steps of graph replays, polled (--api runtime)\n"
		"  alloc       device memory by --pattern: steps (--count 16 allocations of --step-mib 128),\n"
		"              torch (a caching allocator: --count tensors of mixed sizes, every third freed\n"
		"              into its cache, the cache emptied and the allocation retried at an OOM), vllm\n"
		"              (--count weight tensors of --step-mib, then a KV cache of 64 MiB blocks up to\n"
		"              --fraction 0.3 of cuMemGetInfo's total) or pool (--count rounds of\n"
		"              cuMemAllocAsync/cuMemFreeAsync, a sync every 4, the last frees left pooled) or\n"
		"              host (--count pinned host buffers of --step-mib, cuMemHostAlloc) or managed\n"
		"              (--count managed ranges of --step-mib, cuMemAllocManaged, the first freed again);\n"
		"              a line \"held BYTES\" after each change and \"done\" at the end; holds it for\n"
		"              --duration, frees it and exits\n"
		"  collective  --ranks 2 processes meeting every step through stream wait/write value, NCCL-like:\n"
		"              --kernels 4 x --kernel-ms 2 of compute per step (--api runtime)\n"
		"common: --duration S (10), --interval S (0: summary only), --gpu N (0),\n"
		"        --grid N (blocks per launch; default 1 µs blocks), --persistent (fixed-grid kernels),\n"
		"        --jitter F (kernel durations vary within ±F), --ex (launch with cuLaunchKernelEx),\n"
		"        --api driver|runtime (runtime: entry points from cuGetProcAddress_v2 with per-thread\n"
		"        default streams, the primary context, cuLaunchKernelEx)\n"
		"libcuda: libcuda.so.1 from the library path, GPUWORK_LIBCUDA=PATH, or GPUWORK_LIBCUDA=memfd:PATH\n"
		"         (a copy in an anonymous memory file, loaded under no file name);\n"
		"         GPUWORK_REOPEN_CTL=1 puts a fresh open of nvidiactl under libcuda's descriptor after\n"
		"         setup (its RM client then refuses controls made through it); =PATH an open of PATH\n");
}

/* Long options; those below 256 take a number. */
enum { O_API = 256, O_KERNELS_MS, O_MIX, O_SYNC, O_PERSISTENT, O_EX, O_DEVICE_LATENCY, O_PATTERN };

int main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "duration", required_argument, 0, 'd' },  { "interval", required_argument, 0, 'i' },
		{ "gpu", required_argument, 0, 'g' },       { "kernel-ms", required_argument, 0, 'k' },
		{ "depth", required_argument, 0, 'D' },     { "rate", required_argument, 0, 'r' },
		{ "kernels", required_argument, 0, 'n' },   { "fps", required_argument, 0, 'f' },
		{ "frame-ms", required_argument, 0, 'F' },  { "streams", required_argument, 0, 's' },
		{ "children", required_argument, 0, 'c' },  { "grid", required_argument, 0, 'G' },
		{ "phase-s", required_argument, 0, 'P' },   { "think-ms", required_argument, 0, 'T' },
		{ "jitter", required_argument, 0, 'J' },    { "sync-every", required_argument, 0, 'E' },
		{ "graph", required_argument, 0, 'R' },     { "seed", required_argument, 0, 'S' },
		{ "tokens", required_argument, 0, 'K' },    { "ranks", required_argument, 0, 'N' },
		{ "threads", required_argument, 0, 'H' },    { "spread", required_argument, 0, 'V' },
		{ "step-mib", required_argument, 0, 'M' },  { "count", required_argument, 0, 'C' },
		{ "fraction", required_argument, 0, 'X' },  { "pattern", required_argument, 0, O_PATTERN },
		{ "api", required_argument, 0, O_API },     { "kernels-ms", required_argument, 0, O_KERNELS_MS },
		{ "mix", required_argument, 0, O_MIX },     { "sync", required_argument, 0, O_SYNC },
		{ "persistent", no_argument, 0, O_PERSISTENT }, { "ex", no_argument, 0, O_EX },
		{ "device-latency", no_argument, 0, O_DEVICE_LATENCY },
		{ "help", no_argument, 0, 'h' },            { 0, 0, 0, 0 },
	};
	struct opts o = { .duration = 10, .depth = 8, .kernels = -1, .streams = 1, .children = 4, .fps = 60,
			  .frame_ms = 8, .kernel_ms = -1, .rate = -1, .kernel_list = "1", .mix = "cycle",
			  .sync_every = 4, .sync = "stream", .tokens = 16, .ranks = 2, .threads = 1, .spread = 1, .step_mib = 128, .count = 16,
			  .fraction = 0.3, .pattern = "steps" };
	struct sigaction sa = { .sa_handler = on_signal };
	const char *api = NULL;
	int c;

	if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
		usage();
		return argc < 2 ? 2 : 0;
	}
	g_name = argv[1];
	optind = 2;
	while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
		char *endp = NULL;
		double v = 0;

		if (optarg && c < 256) {
			v = strtod(optarg, &endp);
			if (*endp || v < 0 || !isfinite(v)) {
				for (int i = 0; lo[i].name; i++)
					if (lo[i].val == c)
						fprintf(stderr, "gpuwork: --%s %s: want a non-negative number\n", lo[i].name, optarg);
				return 2;
			}
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
		case 'G': o.grid = (int)v; break;
		case 'P': o.phase_s = v; break;
		case 'T': o.think_ms = v; break;
		case 'J':
			if (v > 0.9) {
				fprintf(stderr, "gpuwork: --jitter %s: want 0 to 0.9\n", optarg);
				return 2;
			}
			o.jitter = v;
			break;
		case 'E': o.sync_every = (int)v; break;
		case 'R': o.graph_nodes = (int)v; break;
		case 'S': o.seed = (uint64_t)v; break;
		case 'K': o.tokens = (int)v; break;
		case 'N': o.ranks = (int)v; break;
		case 'H': o.threads = v < 1 ? 1 : (int)v; break;
		case 'V': o.spread = v < 1 ? 1 : (int)v; break;
		case 'M': o.step_mib = v; break;
		case 'C': o.count = (int)v; break;
		case 'X': o.fraction = v; break;
		case O_PATTERN: o.pattern = optarg; break;
		case O_API: api = optarg; break;
		case O_KERNELS_MS: o.kernel_list = optarg; break;
		case O_MIX: o.mix = optarg; break;
		case O_SYNC: o.sync = optarg; break;
		case O_PERSISTENT: o.persistent = 1; break;
		case O_EX: o.launch_ex = 1; break;
		case O_DEVICE_LATENCY: o.device_latency = 1; break;
		case 'h': usage(); return 0;
		default: usage(); return 2;
		}
	}
	if (api && strcmp(api, "driver") && strcmp(api, "runtime")) {
		fprintf(stderr, "gpuwork: --api %s: want driver or runtime\n", api);
		return 2;
	}
	/* The stacks reach libcuda as the runtime does unless told otherwise. */
	int stack = !strcmp(g_name, "train") || !strcmp(g_name, "serve") || !strcmp(g_name, "collective");

	o.runtime = api ? !strcmp(api, "runtime") : stack;
#ifdef GPUWORK_STATIC
	if (!o.runtime && api) {
		fprintf(stderr, "gpuwork-static: --api driver: its entry points come only from cuGetProcAddress_v2\n");
		return 2;
	}
	o.runtime = 1;
#endif
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	setvbuf(stdout, NULL, _IOLBF, 0);

#define DEFAULT(field, v) ((field) < 0 ? (v) : (field))
	if (!strcmp(g_name, "hog"))
		return run_hog(&o, DEFAULT(o.kernel_ms, 20));
	if (!strcmp(g_name, "greedy")) {
		o.kernel_ms = DEFAULT(o.kernel_ms, 50);
		return run_greedy(&o);
	}
	if (!strcmp(g_name, "infer")) {
		o.kernel_ms = DEFAULT(o.kernel_ms, 0.25);
		o.kernels = DEFAULT(o.kernels, 4);
		o.rate = DEFAULT(o.rate, 0);
		return run_infer(&o);
	}
	if (!strcmp(g_name, "frames")) {
		o.kernels = DEFAULT(o.kernels, 4);
		return run_frames(&o);
	}
	if (!strcmp(g_name, "storm")) {
		o.kernel_ms = DEFAULT(o.kernel_ms, 0.001);
		o.rate = DEFAULT(o.rate, 20000);
		return run_storm(&o);
	}
	if (!strcmp(g_name, "graph")) {
		o.kernel_ms = DEFAULT(o.kernel_ms, 1);
		o.kernels = DEFAULT(o.kernels, 8);
		return run_graph(&o);
	}
	if (!strcmp(g_name, "fork")) {
		o.kernel_ms = DEFAULT(o.kernel_ms, 20);
		return run_fork(&o);
	}
	if (!strcmp(g_name, "loop"))
		return run_loop(&o);
	if (!strcmp(g_name, "alloc"))
		return run_alloc(&o);
	if (!strcmp(g_name, "train")) {
		o.kernel_ms = DEFAULT(o.kernel_ms, 2);
		o.kernels = DEFAULT(o.kernels, 8);
		return run_train(&o);
	}
	if (!strcmp(g_name, "serve")) {
		o.kernel_ms = DEFAULT(o.kernel_ms, 1.5);
		o.kernels = DEFAULT(o.kernels, 8);
		o.rate = DEFAULT(o.rate, 10);
		return run_serve(&o);
	}
	if (!strcmp(g_name, "collective")) {
		o.kernel_ms = DEFAULT(o.kernel_ms, 2);
		o.kernels = DEFAULT(o.kernels, 4);
		return run_collective(&o);
	}
	fprintf(stderr, "gpuwork: unknown workload %s\n", g_name);
	usage();
	return 2;
}
