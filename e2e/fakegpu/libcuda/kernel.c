/* Modules, kernel launches, host functions, stream memory operations and
 * graphs of the simulated GPU's libcuda.so.1. A module's image is text, one
 * kernel per line:
 *
 *   kernel NAME ns_per_block N [ns_per_launch M] [jitter F]
 *   kernel NAME ns_per_launch M [jitter F]
 *
 * A launch costs grid × N + M ns of GPU time, scaled by a factor drawn
 * uniformly within 1 ± F (F ≤ 0.9); a kernel with only ns_per_launch is
 * persistent, its cost the same whatever its grid. Blank lines and lines
 * starting with # are ignored. */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* ---- modules ---- */

/* Parses one kernel line into f; -1 when it is not one. */
static int parse_kernel(char *line, struct func *f)
{
	char *save = NULL, *tok = strtok_r(line, " \t\r", &save);
	int have_cost = 0;

	if (!tok || strcmp(tok, "kernel"))
		return -1;
	tok = strtok_r(NULL, " \t\r", &save);
	if (!tok || strlen(tok) >= sizeof(f->name))
		return -1;
	memset(f, 0, sizeof(*f));
	strcpy(f->name, tok);
	while ((tok = strtok_r(NULL, " \t\r", &save))) {
		char *val = strtok_r(NULL, " \t\r", &save), *end = NULL;

		if (!val)
			return -1;
		if (!strcmp(tok, "jitter")) {
			f->jitter = strtod(val, &end);
			if (*end || !(f->jitter >= 0 && f->jitter <= 0.9))
				return -1;
			continue;
		}
		unsigned long long ns = strtoull(val, &end, 10);

		if (*end || val[0] == '-')
			return -1;
		if (!strcmp(tok, "ns_per_block"))
			f->ns_per_block = ns;
		else if (!strcmp(tok, "ns_per_launch"))
			f->ns_per_launch = ns;
		else
			return -1;
		have_cost = 1;
	}
	return have_cost ? 0 : -1;
}

/* Parses the text image; -1 when it holds a line that is not a kernel. */
static int parse_image(const char *img, struct module *m)
{
	const char *p = img;
	size_t total = 0;

	while (*p) {
		const char *eol = strchr(p, '\n');
		size_t len = eol ? (size_t)(eol - p) : strlen(p);
		char line[256];

		total += len + 1;
		if (total > (1u << 20) || len >= sizeof(line))
			return -1;
		memcpy(line, p, len);
		line[len] = 0;
		p = eol ? eol + 1 : p + len;
		if (line[strspn(line, " \t\r")] == 0 || line[strspn(line, " \t")] == '#')
			continue;
		if (m->n >= MAX_FUNCS || parse_kernel(line, &m->funcs[m->n]) < 0)
			return -1;
		m->n++;
	}
	return m->n > 0 ? 0 : -1;
}

CUAPI CUresult cuModuleLoadData(CUmodule *pm, const void *image)
{
	struct module *m;
	uint64_t h;

	REQUIRE_INIT();
	if (!pm || !image)
		return CUDA_ERROR_INVALID_VALUE;
	m = calloc(1, sizeof(*m));
	if (!m)
		return CUDA_ERROR_OUT_OF_MEMORY;
	if (parse_image(image, m) < 0) {
		free(m);
		return CUDA_ERROR_INVALID_IMAGE;
	}
	pthread_mutex_lock(&g_lock);
	if (!current_ctx()) {
		pthread_mutex_unlock(&g_lock);
		free(m);
		return CUDA_ERROR_INVALID_CONTEXT;
	}
	h = obj_new(T_MODULE, m);
	for (int i = 0; h && i < m->n; i++) {
		m->handles[i] = (CUfunction)(uintptr_t)obj_new(T_FUNC, &m->funcs[i]);
		if (!m->handles[i])
			h = 0;
	}
	if (!h) {
		for (int i = 0; i < m->n; i++)
			if (m->handles[i])
				obj_free(m->handles[i]);
		pthread_mutex_unlock(&g_lock);
		free(m);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	*pm = (CUmodule)(uintptr_t)h;
	pthread_mutex_unlock(&g_lock);
	return CUDA_SUCCESS;
}

CUAPI CUresult cuModuleGetFunction(CUfunction *pf, CUmodule hm, const char *name)
{
	struct module *m;
	CUresult r = CUDA_ERROR_NOT_FOUND;

	REQUIRE_INIT();
	if (!pf || !name)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&g_lock);
	m = obj_get(hm, T_MODULE);
	if (!m) {
		r = CUDA_ERROR_INVALID_HANDLE;
	} else {
		for (int i = 0; i < m->n; i++) {
			if (!strcmp(m->funcs[i].name, name)) {
				*pf = m->handles[i];
				r = CUDA_SUCCESS;
				break;
			}
		}
	}
	pthread_mutex_unlock(&g_lock);
	return r;
}

CUAPI CUresult cuModuleUnload(CUmodule hm)
{
	struct module *m;

	REQUIRE_INIT();
	pthread_mutex_lock(&g_lock);
	m = obj_get(hm, T_MODULE);
	if (!m) {
		pthread_mutex_unlock(&g_lock);
		return CUDA_ERROR_INVALID_HANDLE;
	}
	for (int i = 0; i < m->n; i++)
		obj_free(m->handles[i]);
	obj_free(hm);
	pthread_mutex_unlock(&g_lock);
	free(m);
	return CUDA_SUCCESS;
}

/* ---- launches ---- */

/* A per-thread generator for kernels' jitter (xorshift64*). */
static __thread uint64_t t_rng;

static double uniform(void)
{
	if (!t_rng) {
		struct timespec ts;

		clock_gettime(CLOCK_MONOTONIC, &ts);
		t_rng = ((uint64_t)getpid() << 32) ^ (uint64_t)syscall(SYS_gettid) ^ (uint64_t)ts.tv_nsec;
		t_rng |= 1;
	}
	t_rng ^= t_rng >> 12;
	t_rng ^= t_rng << 25;
	t_rng ^= t_rng >> 27;
	return (double)((t_rng * 0x2545F4914F6CDD1DULL) >> 11) / 9007199254740992.0;
}

#define MAX_COST_NS 60000000000ull

/* The GPU time of one launch of f over blocks blocks. */
static uint64_t launch_cost(const struct func *f, uint64_t blocks)
{
	unsigned __int128 cost = (unsigned __int128)blocks * f->ns_per_block + f->ns_per_launch;
	double ns;

	if (cost > MAX_COST_NS)
		cost = MAX_COST_NS;
	ns = (double)cost;
	if (f->jitter > 0)
		ns *= 1 + f->jitter * (2 * uniform() - 1);
	return (uint64_t)ns;
}

static int graph_add(struct graph *g, uint32_t kind, uint64_t cost, uint64_t bytes, uint64_t a0, uint64_t a1)
{
	if (g->n == g->cap) {
		size_t cap = g->cap ? g->cap * 2 : 16;
		struct node *n;

		if (cap > (1u << 20))
			return -1;
		n = realloc(g->nodes, cap * sizeof(*n));
		if (!n)
			return -1;
		g->nodes = n;
		g->cap = cap;
	}
	g->nodes[g->n++] = (struct node){ kind, cost, bytes, a0, a1 };
	return 0;
}

int capture_add(struct stream *s, uint32_t kind, uint64_t cost, uint64_t bytes, uint64_t a0, uint64_t a1)
{
	if (graph_add(s->capture, kind, cost, bytes, a0, a1))
		return -1;
	s->capture_nodes++;
	s->capture_joined = 0; /* its new tail must be joined back */
	return 0;
}

/* capture_stop ends the capture g on every stream in it and for every
 * event recorded in it (under g_lock). */
static void capture_stop(const struct graph *g)
{
	for (uint32_t i = 0; i < MAX_OBJS; i++) {
		if (g_objs[i].type == T_STREAM && ((struct stream *)g_objs[i].p)->capture == g) {
			struct stream *s = g_objs[i].p;

			s->capture = NULL;
			s->capture_into = NULL;
			s->capture_origin = s->capture_joined = 0;
		} else if (g_objs[i].type == T_EVENT && ((struct event *)g_objs[i].p)->capture == g) {
			struct event *e = g_objs[i].p;

			e->capture = NULL;
			e->capture_from = NULL;
		}
	}
}

void capture_leave(struct stream *s)
{
	struct graph *g = s->capture;

	for (uint32_t i = 0; i < MAX_OBJS; i++)
		if (g_objs[i].type == T_EVENT && ((struct event *)g_objs[i].p)->capture_from == s)
			((struct event *)g_objs[i].p)->capture_from = NULL;
	if (!g || !s->capture_origin) {
		s->capture = NULL;
		return;
	}
	capture_stop(g);
	if (!s->capture_into) {
		free(g->nodes);
		free(g);
	}
}

static CUresult launch(CUfunction hf, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
		       CUstream hs, int per_thread)
{
	struct func *f;
	struct stream *s;
	CUresult r = CUDA_SUCCESS;
	uint64_t blocks = (uint64_t)gx * gy * gz, ns;

	REQUIRE_INIT();
	if (!gx || !gy || !gz || !bx || !by || !bz || (uint64_t)bx * by * bz > 1024)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&g_lock);
	f = obj_get(hf, T_FUNC);
	if (!f)
		r = CUDA_ERROR_INVALID_HANDLE;
	s = r ? NULL : get_stream(hs, per_thread, &r);
	if (r) {
		pthread_mutex_unlock(&g_lock);
		return r;
	}
	ns = launch_cost(f, blocks);
	if (s->capture) {
		r = capture_add(s, FG_ENTRY_KERNEL, ns, 0, blocks, 0) ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_SUCCESS;
		pthread_mutex_unlock(&g_lock);
		return r;
	}
	pthread_mutex_unlock(&g_lock);
	return submit(s->ctx, s->ch, FG_ENTRY_KERNEL, ns, 0, FG_NO_EVENT, blocks, 0);
}

CUAPI CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
			      unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
			      unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra)
{
	(void)sharedMemBytes;
	(void)kernelParams;
	(void)extra;
	return launch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, hStream, 0);
}

CUAPI CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
				   unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
				   unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra)
{
	(void)sharedMemBytes;
	(void)kernelParams;
	(void)extra;
	return launch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, hStream, 1);
}

CUAPI CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
					 unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
					 unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
					 void **kernelParams)
{
	(void)sharedMemBytes;
	(void)kernelParams;
	return launch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, hStream, 0);
}

CUAPI CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
					      unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
					      unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
					      void **kernelParams)
{
	(void)sharedMemBytes;
	(void)kernelParams;
	return launch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, hStream, 1);
}

/* cuLaunchKernelEx: the launch attributes (cooperative, cluster shape,
 * priority, ...) are checked and accepted; the simulated device runs the
 * kernel the same way whatever they ask. */
static CUresult launch_ex(const CUlaunchConfig *cfg, CUfunction f, int per_thread)
{
	if (!cfg || (cfg->numAttrs && !cfg->attrs))
		return CUDA_ERROR_INVALID_VALUE;
	for (unsigned i = 0; i < cfg->numAttrs; i++)
		if (cfg->attrs[i].id < 0 || cfg->attrs[i].id > CU_LAUNCH_ATTRIBUTE_MAX)
			return CUDA_ERROR_INVALID_VALUE;
	return launch(f, cfg->gridDimX, cfg->gridDimY, cfg->gridDimZ, cfg->blockDimX, cfg->blockDimY, cfg->blockDimZ,
		      cfg->hStream, per_thread);
}

CUAPI CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra)
{
	(void)kernelParams;
	(void)extra;
	return launch_ex(config, f, 0);
}

CUAPI CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra)
{
	(void)kernelParams;
	(void)extra;
	return launch_ex(config, f, 1);
}

/* ---- host functions ---- */

/* A host function waiting for the work before it on its channel. */
struct host_call {
	struct ctx *ctx;
	int ch;
	uint64_t seq;
	CUhostFn fn;
	void *data;
	struct host_call *next;
};

static pthread_mutex_t h_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t h_cond = PTHREAD_COND_INITIALIZER;
static struct host_call *h_queue;
static int h_started;

/* The host function thread: runs each call once the work queued before it
 * has completed, then lets the channel go on past it. Calls run with
 * h_lock held, so a context is not destroyed under a running call (a host
 * function must not call the CUDA API, as CUDA requires). */
static void *host_runner(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&h_lock);
	for (;;) {
		int ran = 0;

		for (struct host_call **pp = &h_queue; *pp;) {
			struct host_call *h = *pp;
			struct fg_channel *fc = &h->ctx->shm->ch[h->ch];

			if (__atomic_load_n(&fc->gp_get, __ATOMIC_ACQUIRE) < h->seq) {
				pp = &h->next;
				continue;
			}
			*pp = h->next;
			h->fn(h->data);
			__atomic_store_n(&fc->host_done, h->seq + 1, __ATOMIC_RELEASE);
			ring_doorbell(h->ctx);
			free(h);
			ran = 1;
		}
		if (!ran) {
			struct timespec ts;

			clock_gettime(CLOCK_REALTIME, &ts);
			ts.tv_nsec += 200000; /* look again in 0.2 ms, or when a call arrives */
			if (ts.tv_nsec >= 1000000000L) {
				ts.tv_sec++;
				ts.tv_nsec -= 1000000000L;
			}
			if (h_queue)
				pthread_cond_timedwait(&h_cond, &h_lock, &ts);
			else
				pthread_cond_wait(&h_cond, &h_lock);
		}
	}
	return NULL;
}

/* Drops the host functions of a context being destroyed (under g_lock). */
void host_forget(struct ctx *c)
{
	pthread_mutex_lock(&h_lock);
	for (struct host_call **pp = &h_queue; *pp;) {
		struct host_call *h = *pp;

		if (h->ctx == c) {
			*pp = h->next;
			free(h);
		} else {
			pp = &h->next;
		}
	}
	pthread_mutex_unlock(&h_lock);
}

CUresult host_func(struct stream *s, CUhostFn fn, void *data)
{
	struct host_call *h = calloc(1, sizeof(*h));
	uint64_t seq = s->ctx->shm->ch[s->ch].gp_put;
	CUresult r = CUDA_SUCCESS;

	if (!h)
		return CUDA_ERROR_OUT_OF_MEMORY;
	*h = (struct host_call){ s->ctx, s->ch, seq, fn, data, NULL };
	pthread_mutex_lock(&h_lock);
	if (!h_started) {
		pthread_t t;
		pthread_attr_t a;

		pthread_attr_init(&a);
		pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
		if (pthread_create(&t, &a, host_runner, NULL) == 0)
			h_started = 1;
		else
			r = CUDA_ERROR_OUT_OF_MEMORY;
	}
	pthread_mutex_unlock(&h_lock);
	/* Submitted without h_lock: a full ring waits for the runner. The
	 * entry lands at seq, since only this thread writes the stream. */
	if (!r)
		r = submit(s->ctx, s->ch, FG_ENTRY_HOST, 0, 0, FG_NO_EVENT, 0, 0);
	if (r) {
		free(h);
		return r;
	}
	pthread_mutex_lock(&h_lock);
	struct host_call **pp = &h_queue;

	while (*pp)
		pp = &(*pp)->next;
	*pp = h;
	pthread_cond_signal(&h_cond);
	pthread_mutex_unlock(&h_lock);
	return CUDA_SUCCESS;
}

static CUresult launch_host_func(CUstream hs, CUhostFn fn, void *data, int per_thread)
{
	struct stream *s;
	CUresult r = CUDA_SUCCESS;

	REQUIRE_INIT();
	if (!fn)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&g_lock);
	s = get_stream(hs, per_thread, &r);
	if (!r && s->capture)
		r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
	pthread_mutex_unlock(&g_lock);
	if (r)
		return r;
	return host_func(s, fn, data);
}

CUAPI CUresult cuLaunchHostFunc(CUstream hs, CUhostFn fn, void *userData)
{
	return launch_host_func(hs, fn, userData, 0);
}

CUAPI CUresult cuLaunchHostFunc_ptsz(CUstream hs, CUhostFn fn, void *userData)
{
	return launch_host_func(hs, fn, userData, 1);
}

/* ---- stream memory operations ---- */

/* A 32-bit write or wait on device memory, ordered in the stream: the
 * device performs the write, or holds the stream until the word meets the
 * condition (flags: CU_STREAM_WAIT_VALUE_GEQ 0, EQ 1, AND 2, NOR 3). */
static CUresult mem_op(CUstream hs, CUdeviceptr addr, cuuint32_t value, unsigned flags, int write, int per_thread)
{
	struct stream *s;
	CUresult r = CUDA_SUCCESS;
	uint32_t kind = write ? FG_ENTRY_WRITE_VALUE : FG_ENTRY_WAIT_VALUE;
	uint64_t a1 = value;

	REQUIRE_INIT();
	if (!addr || addr % 4 || (write && flags > 1) || (!write && (flags & ~0x43u) != 0))
		return CUDA_ERROR_INVALID_VALUE;
	if (!write)
		a1 |= (uint64_t)(flags & 3) << 32;
	pthread_mutex_lock(&g_lock);
	s = get_stream(hs, per_thread, &r);
	if (!r && !in_alloc(s->ctx, addr, 4))
		r = CUDA_ERROR_INVALID_VALUE;
	if (!r && s->capture) {
		r = capture_add(s, kind, 0, 0, addr, a1) ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_SUCCESS;
		pthread_mutex_unlock(&g_lock);
		return r;
	}
	pthread_mutex_unlock(&g_lock);
	if (r)
		return r;
	return submit(s->ctx, s->ch, kind, 0, 0, FG_NO_EVENT, addr, a1);
}

CUAPI CUresult cuStreamWriteValue32_v2(CUstream hs, CUdeviceptr addr, cuuint32_t value, unsigned int flags)
{
	return mem_op(hs, addr, value, flags, 1, 0);
}

CUAPI CUresult cuStreamWriteValue32_v2_ptsz(CUstream hs, CUdeviceptr addr, cuuint32_t value, unsigned int flags)
{
	return mem_op(hs, addr, value, flags, 1, 1);
}

CUAPI CUresult cuStreamWaitValue32_v2(CUstream hs, CUdeviceptr addr, cuuint32_t value, unsigned int flags)
{
	return mem_op(hs, addr, value, flags, 0, 0);
}

CUAPI CUresult cuStreamWaitValue32_v2_ptsz(CUstream hs, CUdeviceptr addr, cuuint32_t value, unsigned int flags)
{
	return mem_op(hs, addr, value, flags, 0, 1);
}

/* The pre-11.7 names, as libcuda still exports them. */
CUAPI CUresult cuStreamWriteValue32(CUstream hs, CUdeviceptr addr, cuuint32_t value, unsigned int flags)
{
	return mem_op(hs, addr, value, flags, 1, 0);
}

CUAPI CUresult cuStreamWaitValue32(CUstream hs, CUdeviceptr addr, cuuint32_t value, unsigned int flags)
{
	return mem_op(hs, addr, value, flags, 0, 0);
}

/* ---- graphs ---- */

/* begin_capture starts capturing a stream's work into a new graph, or
 * into the existing graph into (cuStreamBeginCaptureToGraph). */
static CUresult begin_capture(CUstream hs, int mode, int per_thread, CUgraph into)
{
	struct stream *s;
	struct graph *g = NULL;
	CUresult r = CUDA_SUCCESS;

	REQUIRE_INIT();
	if (mode < 0 || mode > 2)
		return CUDA_ERROR_INVALID_VALUE;
	if ((!hs && !per_thread) || hs == CU_STREAM_LEGACY)
		return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED; /* the legacy default stream cannot capture */
	pthread_mutex_lock(&g_lock);
	s = get_stream(hs, per_thread, &r);
	if (!r && s->capture)
		r = CUDA_ERROR_ILLEGAL_STATE;
	if (!r && into && !(g = obj_get(into, T_GRAPH)))
		r = CUDA_ERROR_INVALID_HANDLE;
	if (!r && !g && !(g = calloc(1, sizeof(struct graph))))
		r = CUDA_ERROR_OUT_OF_MEMORY;
	if (!r) {
		s->capture = g;
		s->capture_into = into;
		s->capture_origin = 1;
		s->capture_joined = 0;
		s->capture_nodes = 0;
	}
	pthread_mutex_unlock(&g_lock);
	return r;
}

CUAPI CUresult cuStreamBeginCapture_v2(CUstream hs, int mode)
{
	return begin_capture(hs, mode, 0, NULL);
}

CUAPI CUresult cuStreamBeginCapture_v2_ptsz(CUstream hs, int mode)
{
	return begin_capture(hs, mode, 1, NULL);
}

/* The CUDA 10.0 entry points, without a mode: a global capture. */
CUAPI CUresult cuStreamBeginCapture(CUstream hs)
{
	return begin_capture(hs, 0, 0, NULL);
}

CUAPI CUresult cuStreamBeginCapture_ptsz(CUstream hs)
{
	return begin_capture(hs, 0, 1, NULL);
}

/* CUDA 12.3's: capture into an existing graph, after the given nodes
 * (the simulator appends; the dependencies are checked, not kept). */
static CUresult begin_capture_to_graph(CUstream hs, CUgraph hg, const void *deps, const void *edges, size_t ndeps,
				       int mode, int per_thread)
{
	(void)edges;
	if (!hg || (ndeps && !deps))
		return CUDA_ERROR_INVALID_VALUE;
	return begin_capture(hs, mode, per_thread, hg);
}

CUAPI CUresult cuStreamBeginCaptureToGraph(CUstream hs, CUgraph hg, const void *deps, const void *edges, size_t ndeps,
					   int mode)
{
	return begin_capture_to_graph(hs, hg, deps, edges, ndeps, mode, 0);
}

CUAPI CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream hs, CUgraph hg, const void *deps, const void *edges,
						size_t ndeps, int mode)
{
	return begin_capture_to_graph(hs, hg, deps, edges, ndeps, mode, 1);
}

CUAPI CUresult cuGraphCreate(CUgraph *pg, unsigned int flags)
{
	struct graph *g;
	uint64_t h;

	REQUIRE_INIT();
	if (!pg || flags)
		return CUDA_ERROR_INVALID_VALUE;
	if (!(g = calloc(1, sizeof(*g))))
		return CUDA_ERROR_OUT_OF_MEMORY;
	pthread_mutex_lock(&g_lock);
	h = obj_new(T_GRAPH, g);
	pthread_mutex_unlock(&g_lock);
	if (!h) {
		free(g);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	*pg = (CUgraph)(uintptr_t)h;
	return CUDA_SUCCESS;
}

/* capture_unjoined tells whether a stream that joined the capture g still
 * has captured work no capturing stream waits on (under g_lock). */
static int capture_unjoined(const struct graph *g)
{
	for (uint32_t i = 0; i < MAX_OBJS; i++) {
		const struct stream *s = g_objs[i].p;

		if (g_objs[i].type == T_STREAM && s->capture == g && !s->capture_origin && !s->capture_joined)
			return 1;
	}
	return 0;
}

/* end_capture ends the capture its origin stream began: every stream that
 * joined it must have been joined back, else the capture is invalidated
 * and its graph dropped, as CUDA does. */
static CUresult end_capture(CUstream hs, CUgraph *pg, int per_thread)
{
	struct stream *s;
	struct graph *g = NULL;
	CUresult r = CUDA_SUCCESS;
	uint64_t h;

	REQUIRE_INIT();
	if (!pg)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&g_lock);
	s = get_stream(hs, per_thread, &r);
	if (!r && !s->capture)
		r = CUDA_ERROR_ILLEGAL_STATE;
	if (!r && !s->capture_origin)
		r = CUDA_ERROR_STREAM_CAPTURE_UNMATCHED; /* a stream that joined it cannot end it */
	if (!r)
		g = s->capture;
	if (!r && capture_unjoined(g)) {
		const void *into = s->capture_into;

		capture_stop(g);
		if (!into) {
			free(g->nodes);
			free(g);
		}
		*pg = NULL;
		r = CUDA_ERROR_STREAM_CAPTURE_UNJOINED;
	} else if (!r && s->capture_into) {
		*pg = (CUgraph)s->capture_into;
		capture_stop(g);
	} else if (!r) {
		h = obj_new(T_GRAPH, g);
		if (!h) {
			r = CUDA_ERROR_OUT_OF_MEMORY;
		} else {
			*pg = (CUgraph)(uintptr_t)h;
			capture_stop(g);
		}
	}
	pthread_mutex_unlock(&g_lock);
	return r;
}

CUAPI CUresult cuStreamEndCapture(CUstream hs, CUgraph *pg)
{
	return end_capture(hs, pg, 0);
}

CUAPI CUresult cuStreamEndCapture_ptsz(CUstream hs, CUgraph *pg)
{
	return end_capture(hs, pg, 1);
}

static CUresult is_capturing(CUstream hs, int *status, int per_thread)
{
	struct stream *s;
	CUresult r = CUDA_SUCCESS;

	REQUIRE_INIT();
	if (!status)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&g_lock);
	s = get_stream(hs, per_thread, &r);
	if (s)
		*status = s->capture ? 1 : 0; /* CU_STREAM_CAPTURE_STATUS_ACTIVE, _NONE */
	pthread_mutex_unlock(&g_lock);
	return r;
}

CUAPI CUresult cuStreamIsCapturing(CUstream hs, int *captureStatus)
{
	return is_capturing(hs, captureStatus, 0);
}

CUAPI CUresult cuStreamIsCapturing_ptsz(CUstream hs, int *captureStatus)
{
	return is_capturing(hs, captureStatus, 1);
}

/* A copy of a graph's nodes, NULL when memory runs out. */
static struct graph *graph_copy(const struct graph *g)
{
	struct graph *e = calloc(1, sizeof(*e));

	if (e && g->n) {
		e->nodes = malloc(g->n * sizeof(*e->nodes));
		if (!e->nodes) {
			free(e);
			return NULL;
		}
		memcpy(e->nodes, g->nodes, g->n * sizeof(*e->nodes));
		e->n = e->cap = g->n;
	}
	return e;
}

CUAPI CUresult cuGraphInstantiateWithFlags(CUgraphExec *pe, CUgraph hg, unsigned long long flags)
{
	struct graph *g, *e;
	uint64_t h;

	REQUIRE_INIT();
	if (!pe || flags > 0xf)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&g_lock);
	g = obj_get(hg, T_GRAPH);
	if (!g) {
		pthread_mutex_unlock(&g_lock);
		return CUDA_ERROR_INVALID_HANDLE;
	}
	e = graph_copy(g);
	h = e ? obj_new(T_EXEC, e) : 0;
	if (!h) {
		pthread_mutex_unlock(&g_lock);
		if (e)
			free(e->nodes);
		free(e);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	*pe = (CUgraphExec)(uintptr_t)h;
	pthread_mutex_unlock(&g_lock);
	return CUDA_SUCCESS;
}

CUAPI CUresult cuGraphGetNodes(CUgraph hg, void **nodes, size_t *numNodes)
{
	struct graph *g;

	REQUIRE_INIT();
	if (!numNodes)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&g_lock);
	g = obj_get(hg, T_GRAPH);
	if (g) {
		if (nodes)
			for (size_t i = 0; i < *numNodes && i < g->n; i++)
				nodes[i] = (void *)(uintptr_t)(i + 1);
		*numNodes = g->n;
	}
	pthread_mutex_unlock(&g_lock);
	return g ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

/* CUgraphExecUpdateResultInfo and its results. */
typedef struct {
	int result;
	void *errorNode, *errorFromNode;
} CUgraphExecUpdateResultInfo;

enum { UPDATE_SUCCESS = 0, UPDATE_ERROR_TOPOLOGY_CHANGED = 2, UPDATE_ERROR_NODE_TYPE_CHANGED = 3 };

/* cuGraphExecUpdate_v2: an instantiated graph takes the nodes of graph
 * (their costs: new grids and kernels) when its shape is the same. */
CUAPI CUresult cuGraphExecUpdate_v2(CUgraphExec he, CUgraph hg, CUgraphExecUpdateResultInfo *info)
{
	struct graph *e, *g;
	int result = UPDATE_SUCCESS;

	REQUIRE_INIT();
	if (!info)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&g_lock);
	e = obj_get(he, T_EXEC);
	g = obj_get(hg, T_GRAPH);
	if (!e || !g) {
		pthread_mutex_unlock(&g_lock);
		return CUDA_ERROR_INVALID_HANDLE;
	}
	if (e->n != g->n)
		result = UPDATE_ERROR_TOPOLOGY_CHANGED;
	for (size_t i = 0; !result && i < g->n; i++)
		if (e->nodes[i].kind != g->nodes[i].kind)
			result = UPDATE_ERROR_NODE_TYPE_CHANGED;
	if (!result && g->n)
		memcpy(e->nodes, g->nodes, g->n * sizeof(*e->nodes));
	pthread_mutex_unlock(&g_lock);
	info->result = result;
	info->errorNode = info->errorFromNode = NULL;
	return result ? CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE : CUDA_SUCCESS;
}

/* Launching a graph writes its nodes on the stream's channel, in order. */
static CUresult graph_launch(CUgraphExec he, CUstream hs, int per_thread)
{
	struct graph *e, *copy = NULL;
	struct stream *s;
	CUresult r = CUDA_SUCCESS;

	REQUIRE_INIT();
	pthread_mutex_lock(&g_lock);
	e = obj_get(he, T_EXEC);
	if (!e)
		r = CUDA_ERROR_INVALID_HANDLE;
	s = r ? NULL : get_stream(hs, per_thread, &r);
	if (!r && s->capture)
		r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
	if (!r && !(copy = graph_copy(e)))
		r = CUDA_ERROR_OUT_OF_MEMORY;
	pthread_mutex_unlock(&g_lock);
	if (r)
		return r;
	for (size_t i = 0; i < copy->n && !r; i++) {
		struct node *n = &copy->nodes[i];

		r = submit(s->ctx, s->ch, n->kind, n->cost_ns, n->bytes, FG_NO_EVENT, n->a0, n->a1);
	}
	free(copy->nodes);
	free(copy);
	return r;
}

CUAPI CUresult cuGraphLaunch(CUgraphExec he, CUstream hs)
{
	return graph_launch(he, hs, 0);
}

CUAPI CUresult cuGraphLaunch_ptsz(CUgraphExec he, CUstream hs)
{
	return graph_launch(he, hs, 1);
}

static CUresult destroy_graph_obj(const void *h, int type)
{
	struct graph *g;

	REQUIRE_INIT();
	pthread_mutex_lock(&g_lock);
	g = obj_get(h, type);
	if (!g) {
		pthread_mutex_unlock(&g_lock);
		return CUDA_ERROR_INVALID_HANDLE;
	}
	for (uint32_t i = 0; i < MAX_OBJS; i++) {
		if (g_objs[i].type == T_STREAM && ((struct stream *)g_objs[i].p)->capture == g) {
			pthread_mutex_unlock(&g_lock);
			return CUDA_ERROR_ILLEGAL_STATE; /* a stream captures into it */
		}
	}
	obj_free(h);
	pthread_mutex_unlock(&g_lock);
	free(g->nodes);
	free(g);
	return CUDA_SUCCESS;
}

CUAPI CUresult cuGraphExecDestroy(CUgraphExec he)
{
	return destroy_graph_obj(he, T_EXEC);
}

CUAPI CUresult cuGraphDestroy(CUgraph hg)
{
	return destroy_graph_obj(hg, T_GRAPH);
}
