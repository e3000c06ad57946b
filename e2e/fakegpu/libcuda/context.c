/* Contexts, streams and events of the simulated GPU's libcuda.so.1.
 * Contexts: cuCtxCreate (_v2, _v3, _v4), the per-device primary context
 * the CUDA runtime uses, and the per-thread context stack. Streams: the
 * legacy default stream of a context, the per-thread default stream that
 * the _ptsz entry points (and CU_STREAM_PER_THREAD) name, created streams,
 * and cross-stream dependencies that the device enforces. Events: records
 * the device stamps, queries, synchronizes. */
#include "internal.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define NV01_DEVICE_0 0x80
#define NV20_SUBDEVICE_0 0x2080
#define FERMI_VASPACE_A 0x90F1
#define KEPLER_CHANNEL_GROUP_A 0xA06C
#define NVA06C_CTRL_CMD_SET_TIMESLICE 0xA06C0103
#define NV2080_ENGINE_TYPE_GR0 1

typedef struct { uint32_t deviceId, hClientShare, hTargetClient, hTargetDevice, flags; uint32_t pad; uint64_t vaSpaceSize, vaStartInternal, vaLimitInternal; uint32_t vaMode, pad2; } NV0080_ALLOC_PARAMETERS;
typedef struct { uint32_t hObjectError, hObjectEccError, hVASpace, engineType; uint8_t bIsCallingContextVgpuPlugin; } NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS;
typedef struct { uint32_t subDeviceId; } NV2080_ALLOC_PARAMETERS;

/* ---- the calling thread's state ---- */

#define MAX_STACK 32
#define MAX_THREAD_STREAMS 8

/* The context stack; its top is the current context. */
static __thread CUcontext t_stack[MAX_STACK];
static __thread int t_depth;

/* Per-thread default streams, one per context the thread used. */
static __thread struct {
	CUcontext ctx;
	CUstream stream;
} t_streams[MAX_THREAD_STREAMS];

/* Forgets the thread's contexts and streams (a forked child starts over). */
void forget_thread_state(void)
{
	t_depth = 0;
	memset(t_streams, 0, sizeof(t_streams));
}

CUcontext current_handle(void)
{
	return t_depth ? t_stack[t_depth - 1] : NULL;
}

struct ctx *current_ctx(void)
{
	return obj_get(current_handle(), T_CTX);
}

/* Primary contexts: one per device, reference counted. */
static struct {
	CUcontext h;
	int refs;
	unsigned flags;
} g_primary[MAX_DEVICES];

/* ---- channels ---- */

int alloc_channel(struct ctx *c)
{
	for (int i = 0; i < FG_MAX_CHANNELS; i++) {
		if (!c->chan_used[i]) {
			c->chan_used[i] = 1;
			/* The device polls only the channels marked here. */
			__atomic_or_fetch(&c->shm->chans, 1u << i, __ATOMIC_RELEASE);
			__atomic_store_n(&c->shm->ch[i].active, 1, __ATOMIC_RELEASE);
			channel_setup_ioctls(c, i);
			return i;
		}
	}
	return -1;
}

void release_channel(struct ctx *c, int ch)
{
	channel_teardown_ioctls(c, ch);
	__atomic_store_n(&c->shm->ch[ch].active, 0, __ATOMIC_RELEASE);
	c->chan_used[ch] = 0;
}

/* ---- contexts ---- */

/* Creates a context on dev (under g_lock) and returns its handle, 0 with
 * *err set on failure. The RM objects a real libcuda allocates come first
 * (device, address space, channel group), then the simulator's context;
 * a timeslice the driver wants on the group is set as libcuda sets it. */
static CUcontext ctx_new(CUdevice dev, unsigned flags, CUresult *err)
{
	struct fg_req req = { .op = FG_OP_CTX_CREATE };
	struct fg_resp resp;
	int fds[2] = { -1, -1 };
	struct ctx *c;
	struct stream *s;
	uint64_t h;

	c = calloc(1, sizeof(*c));
	s = calloc(1, sizeof(*s));
	if (!c || !s) {
		*err = CUDA_ERROR_OUT_OF_MEMORY;
		goto fail;
	}
	c->dev = dev;
	c->flags = flags;
	if (!g_nouveau) {
		NV0080_ALLOC_PARAMETERS dp = { .deviceId = g_gpu[dev] };
		NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS tp = { 0 };

		NV2080_ALLOC_PARAMETERS sp = { 0 };

		c->h_device = new_handle();
		c->h_subdevice = new_handle();
		c->h_vaspace = new_handle();
		c->h_tsg = new_handle();
		nv_alloc21(g_hclient, c->h_device, NV01_DEVICE_0, &dp);
		nv_alloc21(c->h_device, c->h_subdevice, NV20_SUBDEVICE_0, &sp);
		nv_alloc21(c->h_device, c->h_vaspace, FERMI_VASPACE_A, NULL);
		tp.hVASpace = c->h_vaspace;
		tp.engineType = NV2080_ENGINE_TYPE_GR0;
		req.tsg_at = monotonic_ns();
		nv_alloc21(c->h_device, c->h_tsg, KEPLER_CHANNEL_GROUP_A, &tp);
	}
	req.gpu = g_gpu[dev];
	req.arg0 = g_hclient;
	req.arg1 = c->h_tsg;
	req.arg2 = c->h_subdevice;
	if (rpc(&req, &resp, fds, 2) < 0) {
		*err = CUDA_ERROR_DEVICE_UNAVAILABLE;
		goto fail;
	}
	if (resp.status != 0) {
		*err = resp.status;
		goto fail;
	}
	if (fds[0] < 0 || fds[1] < 0) {
		*err = CUDA_ERROR_UNKNOWN;
		goto fail;
	}
	c->shm = mmap(NULL, sizeof(struct fg_ctx_shm), PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
	c->db = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fds[1], 0);
	close(fds[0]);
	close(fds[1]);
	if (c->shm == MAP_FAILED || c->db == MAP_FAILED || c->shm->magic != FG_MAGIC_CTX || c->db->magic != FG_MAGIC_DB ||
	    c->shm->version != FG_VERSION || c->db->version != FG_VERSION) { /* a fakegpud of another build */
		*err = CUDA_ERROR_UNKNOWN;
		goto fail;
	}
	c->id = resp.val0;
	if (resp.val1 && !g_nouveau) {
		uint64_t us = resp.val1;

		nv_control(c->h_tsg, NVA06C_CTRL_CMD_SET_TIMESLICE, &us, sizeof(us));
		rpc_control(c->h_tsg, NVA06C_CTRL_CMD_SET_TIMESLICE, &us, sizeof(us));
	}
	s->ctx = c;
	s->ch = alloc_channel(c);
	h = obj_new(T_CTX, c);
	s->ctx_handle = (CUcontext)(uintptr_t)h;
	c->null_stream = (CUstream)(uintptr_t)obj_new(T_STREAM, s);
	if (!h || !c->null_stream) {
		if (h)
			obj_free((void *)(uintptr_t)h);
		*err = CUDA_ERROR_OUT_OF_MEMORY;
		goto fail;
	}
	return (CUcontext)(uintptr_t)h;
fail:
	free(s);
	free(c);
	return NULL;
}

/* Destroys a context (under g_lock): its streams, events and channels,
 * its RM objects, the simulator's context. */
static void ctx_free(CUcontext h, struct ctx *c)
{
	struct fg_req req = { .op = FG_OP_CTX_DESTROY };
	struct fg_resp resp;

	host_forget(c);
	for (uint32_t i = 0; i < MAX_OBJS; i++) {
		struct obj *o = &g_objs[i];

		if (o->type == T_STREAM && ((struct stream *)o->p)->ctx == c) {
			struct stream *s = o->p;

			o->type = T_FREE;
			capture_leave(s);
			free(s);
		} else if (o->type == T_EVENT && ((struct event *)o->p)->ctx == c) {
			free(o->p);
			o->type = T_FREE;
		}
	}
	for (int i = FG_MAX_CHANNELS - 1; i >= 0; i--)
		if (c->chan_used[i])
			release_channel(c, i);
	if (!g_nouveau) {
		mem_release_all(c); /* one RM_FREE each, as libcuda does */
		nv_free(c->h_device, c->h_tsg);
		nv_free(c->h_device, c->h_vaspace);
		nv_free(c->h_device, c->h_subdevice);
		nv_free(g_hclient, c->h_device);
	}
	req.arg0 = c->id;
	rpc(&req, &resp, NULL, 0);
	munmap(c->shm, sizeof(struct fg_ctx_shm));
	munmap(c->db, 4096);
	obj_free(h);
	free(c);
	for (int i = 0; i < t_depth; i++) {
		if (t_stack[i] == h) {
			memmove(&t_stack[i], &t_stack[i + 1], (size_t)(t_depth - i - 1) * sizeof(t_stack[0]));
			t_depth--;
			i--;
		}
	}
}

/* cuCtxCreate's common body: a new context, pushed on the thread's stack. */
static CUresult ctx_create(CUcontext *pctx, unsigned flags, CUdevice dev)
{
	CUresult r = CUDA_SUCCESS;
	CUcontext h;

	REQUIRE_INIT();
	if (!pctx || flags > 0x3f)
		return CUDA_ERROR_INVALID_VALUE;
	if (dev < 0 || (uint32_t)dev >= g_ngpus)
		return CUDA_ERROR_INVALID_DEVICE;
	pthread_mutex_lock(&g_lock);
	if (t_depth == MAX_STACK) {
		pthread_mutex_unlock(&g_lock);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	h = ctx_new(dev, flags, &r);
	if (h) {
		t_stack[t_depth++] = h;
		*pctx = h;
	}
	pthread_mutex_unlock(&g_lock);
	return r;
}

CUAPI CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
	return ctx_create(pctx, flags, dev);
}

/* cuCtxCreate_v3(pctx, CUexecAffinityParam *paramsArray, numParams, flags,
 * dev): affinity (SM count) is accepted and not simulated. */
CUAPI CUresult cuCtxCreate_v3(CUcontext *pctx, void *params, int numParams, unsigned int flags, CUdevice dev)
{
	if (numParams < 0 || (numParams > 0 && !params))
		return CUDA_ERROR_INVALID_VALUE;
	return ctx_create(pctx, flags, dev);
}

/* cuCtxCreate_v4(pctx, CUctxCreateParams *params, flags, dev) (CUDA 12.5):
 * the params (affinity, a CIG) are optional and not simulated. */
CUAPI CUresult cuCtxCreate_v4(CUcontext *pctx, void *params, unsigned int flags, CUdevice dev)
{
	(void)params;
	return ctx_create(pctx, flags, dev);
}

CUAPI CUresult cuCtxDestroy_v2(CUcontext ctx)
{
	struct ctx *c;

	REQUIRE_INIT();
	pthread_mutex_lock(&g_lock);
	c = obj_get(ctx, T_CTX);
	if (!c) {
		pthread_mutex_unlock(&g_lock);
		return CUDA_ERROR_INVALID_CONTEXT;
	}
	for (int d = 0; d < MAX_DEVICES; d++) {
		if (g_primary[d].h == ctx) { /* a primary context is released, not destroyed */
			pthread_mutex_unlock(&g_lock);
			return CUDA_ERROR_INVALID_CONTEXT;
		}
	}
	ctx_free(ctx, c);
	pthread_mutex_unlock(&g_lock);
	return CUDA_SUCCESS;
}

CUAPI CUresult cuCtxSetCurrent(CUcontext ctx)
{
	REQUIRE_INIT();
	if (ctx) {
		pthread_mutex_lock(&g_lock);
		struct ctx *c = obj_get(ctx, T_CTX);
		pthread_mutex_unlock(&g_lock);
		if (!c)
			return CUDA_ERROR_INVALID_CONTEXT;
		if (t_depth == 0)
			t_depth = 1;
		t_stack[t_depth - 1] = ctx;
	} else if (t_depth > 0) {
		t_depth--; /* NULL pops the top, as CUDA documents */
	}
	return CUDA_SUCCESS;
}

CUAPI CUresult cuCtxGetCurrent(CUcontext *pctx)
{
	REQUIRE_INIT();
	if (!pctx)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&g_lock);
	*pctx = current_ctx() ? current_handle() : NULL;
	pthread_mutex_unlock(&g_lock);
	return CUDA_SUCCESS;
}

CUAPI CUresult cuCtxPushCurrent_v2(CUcontext ctx)
{
	struct ctx *c;

	REQUIRE_INIT();
	pthread_mutex_lock(&g_lock);
	c = obj_get(ctx, T_CTX);
	pthread_mutex_unlock(&g_lock);
	if (!c)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (t_depth == MAX_STACK)
		return CUDA_ERROR_OUT_OF_MEMORY;
	t_stack[t_depth++] = ctx;
	return CUDA_SUCCESS;
}

CUAPI CUresult cuCtxPopCurrent_v2(CUcontext *pctx)
{
	REQUIRE_INIT();
	if (t_depth == 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	t_depth--;
	if (pctx)
		*pctx = t_stack[t_depth];
	return CUDA_SUCCESS;
}

CUAPI CUresult cuCtxGetDevice(CUdevice *dev)
{
	struct ctx *c;

	REQUIRE_INIT();
	if (!dev)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&g_lock);
	c = current_ctx();
	if (c)
		*dev = c->dev;
	pthread_mutex_unlock(&g_lock);
	return c ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

/* Waits for every channel of a context to drain what was queued when the
 * call began. */
static CUresult ctx_sync(CUcontext h)
{
	struct ctx *c;
	uint64_t target[FG_MAX_CHANNELS];
	uint8_t used[FG_MAX_CHANNELS];

	REQUIRE_INIT();
	pthread_mutex_lock(&g_lock);
	c = h ? obj_get(h, T_CTX) : current_ctx();
	if (!c) {
		pthread_mutex_unlock(&g_lock);
		return CUDA_ERROR_INVALID_CONTEXT;
	}
	for (int i = 0; i < FG_MAX_CHANNELS; i++) {
		used[i] = c->chan_used[i];
		target[i] = c->shm->ch[i].gp_put;
	}
	pthread_mutex_unlock(&g_lock);
	nouveau_wait_ioctl(c, 0);
	for (int i = 0; i < FG_MAX_CHANNELS; i++) {
		if (used[i]) {
			CUresult r = wait_channel(c, i, target[i]);

			if (r)
				return r;
		}
	}
	pool_release(c);
	return CUDA_SUCCESS;
}

CUAPI CUresult cuCtxSynchronize(void)
{
	return ctx_sync(NULL);
}

/* cuCtxSynchronize_v2(ctx) (CUDA 13.0): NULL synchronizes the current one. */
CUAPI CUresult cuCtxSynchronize_v2(CUcontext ctx)
{
	return ctx_sync(ctx);
}

/* ---- primary contexts ---- */

CUAPI CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
	CUresult r = CUDA_SUCCESS;

	REQUIRE_INIT();
	if (!pctx)
		return CUDA_ERROR_INVALID_VALUE;
	if (dev < 0 || (uint32_t)dev >= g_ngpus || dev >= MAX_DEVICES)
		return CUDA_ERROR_INVALID_DEVICE;
	pthread_mutex_lock(&g_lock);
	if (!obj_get(g_primary[dev].h, T_CTX)) {
		g_primary[dev].h = ctx_new(dev, g_primary[dev].flags, &r);
		g_primary[dev].refs = 0;
	}
	if (g_primary[dev].h) {
		g_primary[dev].refs++;
		*pctx = g_primary[dev].h;
	}
	pthread_mutex_unlock(&g_lock);
	return r;
}

static CUresult primary_check(CUdevice dev)
{
	REQUIRE_INIT();
	if (dev < 0 || (uint32_t)dev >= g_ngpus || dev >= MAX_DEVICES)
		return CUDA_ERROR_INVALID_DEVICE;
	return CUDA_SUCCESS;
}

/* Drops the primary context of dev (under g_lock). */
static void primary_drop(CUdevice dev)
{
	struct ctx *c = obj_get(g_primary[dev].h, T_CTX);

	if (c)
		ctx_free(g_primary[dev].h, c);
	g_primary[dev].h = NULL;
	g_primary[dev].refs = 0;
}

CUAPI CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
	CUresult r = primary_check(dev);

	if (r)
		return r;
	pthread_mutex_lock(&g_lock);
	if (g_primary[dev].refs == 0 || !obj_get(g_primary[dev].h, T_CTX))
		r = CUDA_ERROR_INVALID_CONTEXT;
	else if (--g_primary[dev].refs == 0)
		primary_drop(dev);
	pthread_mutex_unlock(&g_lock);
	return r;
}

CUAPI CUresult cuDevicePrimaryCtxRelease(CUdevice dev)
{
	return cuDevicePrimaryCtxRelease_v2(dev);
}

CUAPI CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
	CUresult r = primary_check(dev);

	if (r)
		return r;
	pthread_mutex_lock(&g_lock);
	primary_drop(dev);
	pthread_mutex_unlock(&g_lock);
	return CUDA_SUCCESS;
}

CUAPI CUresult cuDevicePrimaryCtxReset(CUdevice dev)
{
	return cuDevicePrimaryCtxReset_v2(dev);
}

CUAPI CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags)
{
	CUresult r = primary_check(dev);

	if (r)
		return r;
	if (flags > 0x3f)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&g_lock);
	g_primary[dev].flags = flags;
	pthread_mutex_unlock(&g_lock);
	return CUDA_SUCCESS;
}

CUAPI CUresult cuDevicePrimaryCtxSetFlags(CUdevice dev, unsigned int flags)
{
	return cuDevicePrimaryCtxSetFlags_v2(dev, flags);
}

CUAPI CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
	CUresult r = primary_check(dev);

	if (r)
		return r;
	if (!flags || !active)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&g_lock);
	*flags = g_primary[dev].flags;
	*active = obj_get(g_primary[dev].h, T_CTX) != NULL;
	pthread_mutex_unlock(&g_lock);
	return CUDA_SUCCESS;
}

/* ---- streams ---- */

/* A new stream of c (under g_lock), 0 when no channel or handle is left. */
static CUstream stream_new(struct ctx *c, CUcontext ch, unsigned flags)
{
	struct stream *s = calloc(1, sizeof(*s));
	uint64_t h;

	if (!s || (s->ch = alloc_channel(c)) < 0) {
		free(s);
		return NULL;
	}
	s->ctx = c;
	s->ctx_handle = ch;
	s->flags = flags;
	h = obj_new(T_STREAM, s);
	if (!h) {
		release_channel(c, s->ch);
		free(s);
	}
	return (CUstream)(uintptr_t)h;
}

/* The calling thread's default stream in the current context (under
 * g_lock), made on first use: work on it is ordered only with itself. */
static struct stream *thread_stream(CUresult *err)
{
	CUcontext ch = current_handle();
	struct ctx *c = obj_get(ch, T_CTX);
	int slot = -1;

	if (!c) {
		*err = CUDA_ERROR_INVALID_CONTEXT;
		return NULL;
	}
	for (int i = 0; i < MAX_THREAD_STREAMS; i++) {
		if (t_streams[i].ctx == ch) {
			struct stream *s = obj_get(t_streams[i].stream, T_STREAM);

			if (s)
				return s;
			slot = i;
			break;
		}
		if (slot < 0 && !obj_get(t_streams[i].ctx, T_CTX))
			slot = i; /* free, or of a destroyed context */
	}
	if (slot < 0) {
		*err = CUDA_ERROR_OUT_OF_MEMORY;
		return NULL;
	}
	t_streams[slot].ctx = ch;
	t_streams[slot].stream = stream_new(c, ch, 1);
	if (!t_streams[slot].stream) {
		t_streams[slot].ctx = NULL;
		*err = CUDA_ERROR_OUT_OF_MEMORY;
		return NULL;
	}
	return obj_get(t_streams[slot].stream, T_STREAM);
}

struct stream *get_stream(CUstream h, int per_thread, CUresult *err)
{
	struct stream *s;

	if (h == CU_STREAM_PER_THREAD || (!h && per_thread))
		return thread_stream(err);
	if (!h || h == CU_STREAM_LEGACY) {
		struct ctx *c = current_ctx();

		if (!c) {
			*err = CUDA_ERROR_INVALID_CONTEXT;
			return NULL;
		}
		h = c->null_stream;
	}
	s = obj_get(h, T_STREAM);
	if (!s)
		*err = CUDA_ERROR_INVALID_HANDLE;
	return s;
}

static CUresult stream_create(CUstream *ps, unsigned int flags)
{
	struct ctx *c;

	REQUIRE_INIT();
	if (!ps || flags > 1)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&g_lock);
	c = current_ctx();
	if (!c) {
		pthread_mutex_unlock(&g_lock);
		return CUDA_ERROR_INVALID_CONTEXT;
	}
	*ps = stream_new(c, current_handle(), flags);
	pthread_mutex_unlock(&g_lock);
	return *ps ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

CUAPI CUresult cuStreamCreate(CUstream *ps, unsigned int flags)
{
	return stream_create(ps, flags);
}

/* Priorities are accepted, not simulated: the device runs a context's
 * streams round robin. */
CUAPI CUresult cuStreamCreateWithPriority(CUstream *ps, unsigned int flags, int priority)
{
	(void)priority;
	return stream_create(ps, flags);
}

CUAPI CUresult cuCtxGetStreamPriorityRange(int *least, int *greatest)
{
	REQUIRE_INIT();
	if (least)
		*least = 0;
	if (greatest)
		*greatest = -5;
	return CUDA_SUCCESS;
}

CUAPI CUresult cuStreamDestroy_v2(CUstream h)
{
	struct stream *s;
	CUresult r;

	REQUIRE_INIT();
	pthread_mutex_lock(&g_lock);
	s = obj_get(h, T_STREAM);
	if (!s || !h || s->ctx->null_stream == h) {
		pthread_mutex_unlock(&g_lock);
		return CUDA_ERROR_INVALID_HANDLE;
	}
	obj_free(h);
	pthread_mutex_unlock(&g_lock);
	/* Work already queued completes before the channel is reused. */
	r = sync_channel(s->ctx, s->ch);
	pthread_mutex_lock(&g_lock);
	release_channel(s->ctx, s->ch);
	capture_leave(s);
	pthread_mutex_unlock(&g_lock);
	free(s);
	return r == CUDA_ERROR_DEVICE_UNAVAILABLE ? r : CUDA_SUCCESS;
}

static CUresult stream_sync(CUstream h, int per_thread)
{
	struct stream *s;
	CUresult r = CUDA_SUCCESS;

	REQUIRE_INIT();
	pthread_mutex_lock(&g_lock);
	s = get_stream(h, per_thread, &r);
	if (s && s->capture)
		r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
	pthread_mutex_unlock(&g_lock);
	if (r)
		return r;
	r = sync_channel(s->ctx, s->ch);
	if (!r)
		pool_release(s->ctx);
	return r;
}

CUAPI CUresult cuStreamSynchronize(CUstream h)
{
	return stream_sync(h, 0);
}

CUAPI CUresult cuStreamSynchronize_ptsz(CUstream h)
{
	return stream_sync(h, 1);
}

static CUresult stream_query(CUstream h, int per_thread)
{
	struct stream *s;
	CUresult r = CUDA_SUCCESS;
	struct fg_channel *fc;

	REQUIRE_INIT();
	pthread_mutex_lock(&g_lock);
	s = get_stream(h, per_thread, &r);
	pthread_mutex_unlock(&g_lock);
	if (r)
		return r;
	fc = &s->ctx->shm->ch[s->ch];
	if (device_gone(s->ctx))
		return CUDA_ERROR_DEVICE_UNAVAILABLE;
	return __atomic_load_n(&fc->gp_get, __ATOMIC_ACQUIRE) >= fc->gp_put ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUAPI CUresult cuStreamQuery(CUstream h)
{
	return stream_query(h, 0);
}

CUAPI CUresult cuStreamQuery_ptsz(CUstream h)
{
	return stream_query(h, 1);
}

/* wait_captured waits on an event recorded in a running capture (under
 * g_lock): a stream outside any capture joins it (a fork), one in the same
 * capture orders after the event, which joins the recording stream back
 * when nothing was captured on it since. The simulator replays a graph's
 * nodes in order, so neither needs a node; another capture's event is
 * isolated from this one. */
static CUresult wait_captured(struct stream *s, const struct event *e)
{
	struct stream *from = e->capture_from;

	if (s->capture && s->capture != e->capture)
		return CUDA_ERROR_STREAM_CAPTURE_ISOLATION;
	if (!s->capture) {
		s->capture = e->capture;
		s->capture_into = NULL;
		s->capture_origin = s->capture_joined = 0;
		s->capture_nodes = 0;
		return CUDA_SUCCESS;
	}
	if (from && from != s && from->capture == e->capture && from->capture_nodes == e->capture_mark)
		from->capture_joined = 1;
	return CUDA_SUCCESS;
}

/* cuStreamWaitEvent: work the stream gets after this waits, on the device,
 * until the event's record has completed. */
static CUresult stream_wait_event(CUstream hs, CUevent he, unsigned int flags, int per_thread)
{
	struct stream *s;
	struct event *e;
	CUresult r = CUDA_SUCCESS;
	uint64_t a0 = 0, a1 = 0;
	int recorded;

	REQUIRE_INIT();
	if (flags > 1)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&g_lock);
	e = obj_get(he, T_EVENT);
	if (!e)
		r = CUDA_ERROR_INVALID_HANDLE;
	s = r ? NULL : get_stream(hs, per_thread, &r);
	if (!r && e->capture) {
		r = wait_captured(s, e);
		pthread_mutex_unlock(&g_lock);
		return r;
	}
	if (!r && e->captured)
		r = CUDA_ERROR_CAPTURED_EVENT; /* recorded in a capture that has ended */
	recorded = e && e->recorded;
	if (!r && recorded) {
		a0 = e->ctx->id;
		a1 = ((uint64_t)e->ch << 56) | (e->seq + 1);
	}
	if (!r && s->capture) {
		/* Captured into the graph; an event never recorded is no dependency. */
		r = recorded && capture_add(s, FG_ENTRY_WAIT_EVENT, 0, 0, a0, a1) ? CUDA_ERROR_OUT_OF_MEMORY
										     : CUDA_SUCCESS;
		pthread_mutex_unlock(&g_lock);
		return r;
	}
	pthread_mutex_unlock(&g_lock);
	if (r || !recorded)
		return r;
	return submit(s->ctx, s->ch, FG_ENTRY_WAIT_EVENT, 0, 0, FG_NO_EVENT, a0, a1);
}

CUAPI CUresult cuStreamWaitEvent(CUstream hs, CUevent he, unsigned int flags)
{
	return stream_wait_event(hs, he, flags, 0);
}

CUAPI CUresult cuStreamWaitEvent_ptsz(CUstream hs, CUevent he, unsigned int flags)
{
	return stream_wait_event(hs, he, flags, 1);
}

CUAPI CUresult cuStreamGetCtx(CUstream hs, CUcontext *pctx)
{
	struct stream *s;
	CUresult r = CUDA_SUCCESS;

	REQUIRE_INIT();
	if (!pctx)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&g_lock);
	s = get_stream(hs, 0, &r);
	if (s)
		*pctx = s->ctx_handle;
	pthread_mutex_unlock(&g_lock);
	return r;
}

/* ---- events ---- */

CUAPI CUresult cuEventCreate(CUevent *pe, unsigned int flags)
{
	struct ctx *c;
	struct event *e;
	uint64_t h;

	REQUIRE_INIT();
	if (!pe || flags > 0xf)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&g_lock);
	c = current_ctx();
	if (!c) {
		pthread_mutex_unlock(&g_lock);
		return CUDA_ERROR_INVALID_CONTEXT;
	}
	e = calloc(1, sizeof(*e));
	if (!e) {
		pthread_mutex_unlock(&g_lock);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	e->slot = FG_NO_EVENT;
	for (uint32_t i = 0; i < FG_MAX_EVENTS; i++) {
		if (!c->ev_used[i]) {
			c->ev_used[i] = 1;
			e->slot = i;
			break;
		}
	}
	h = e->slot == FG_NO_EVENT ? 0 : obj_new(T_EVENT, e);
	if (!h) {
		if (e->slot != FG_NO_EVENT)
			c->ev_used[e->slot] = 0;
		pthread_mutex_unlock(&g_lock);
		free(e);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	e->ctx = c;
	e->ctx_handle = current_handle();
	*pe = (CUevent)(uintptr_t)h;
	pthread_mutex_unlock(&g_lock);
	return CUDA_SUCCESS;
}

static CUresult event_record(CUevent he, CUstream hs, unsigned int flags, int per_thread)
{
	struct event *e;
	struct stream *s;
	CUresult r = CUDA_SUCCESS;

	REQUIRE_INIT();
	if (flags > 1)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&g_lock);
	e = obj_get(he, T_EVENT);
	if (!e)
		r = CUDA_ERROR_INVALID_HANDLE;
	s = r ? NULL : get_stream(hs, per_thread, &r);
	if (!r && s->ctx != e->ctx)
		r = CUDA_ERROR_INVALID_CONTEXT;
	if (!r && s->capture) {
		/* A point in the graph other streams can fork from or join to;
		 * nothing is written on the device. */
		e->captured = 1;
		e->recorded = 0;
		e->capture = s->capture;
		e->capture_from = s;
		e->capture_mark = s->capture_nodes;
		pthread_mutex_unlock(&g_lock);
		return CUDA_SUCCESS;
	}
	if (!r) {
		__atomic_store_n(&e->ctx->shm->event_ts[e->slot], 0, __ATOMIC_RELEASE);
		e->ch = s->ch;
		e->seq = s->ctx->shm->ch[s->ch].gp_put;
		e->recorded = 1;
		e->captured = 0;
	}
	pthread_mutex_unlock(&g_lock);
	if (r)
		return r;
	return submit(s->ctx, s->ch, FG_ENTRY_MARKER, 0, 0, e->slot, 0, 0);
}

CUAPI CUresult cuEventRecord(CUevent he, CUstream hs)
{
	return event_record(he, hs, 0, 0);
}

CUAPI CUresult cuEventRecord_ptsz(CUevent he, CUstream hs)
{
	return event_record(he, hs, 0, 1);
}

CUAPI CUresult cuEventRecordWithFlags(CUevent he, CUstream hs, unsigned int flags)
{
	return event_record(he, hs, flags, 0);
}

CUAPI CUresult cuEventRecordWithFlags_ptsz(CUevent he, CUstream hs, unsigned int flags)
{
	return event_record(he, hs, flags, 1);
}

/* event_copy reads an event's state, 0 when the handle is bad. */
static int event_copy(CUevent he, struct event *out)
{
	struct event *e;

	pthread_mutex_lock(&g_lock);
	e = obj_get(he, T_EVENT);
	if (e)
		*out = *e;
	pthread_mutex_unlock(&g_lock);
	return e != NULL;
}

CUAPI CUresult cuEventQuery(CUevent he)
{
	struct event e;

	REQUIRE_INIT();
	if (!event_copy(he, &e))
		return CUDA_ERROR_INVALID_HANDLE;
	if (e.captured)
		return CUDA_ERROR_CAPTURED_EVENT;
	if (!e.recorded)
		return CUDA_SUCCESS;
	if (device_gone(e.ctx))
		return CUDA_ERROR_DEVICE_UNAVAILABLE;
	return __atomic_load_n(&e.ctx->shm->ch[e.ch].gp_get, __ATOMIC_ACQUIRE) > e.seq ? CUDA_SUCCESS
											 : CUDA_ERROR_NOT_READY;
}

CUAPI CUresult cuEventSynchronize(CUevent he)
{
	struct event e;

	REQUIRE_INIT();
	if (!event_copy(he, &e))
		return CUDA_ERROR_INVALID_HANDLE;
	if (e.captured)
		return CUDA_ERROR_CAPTURED_EVENT;
	if (!e.recorded)
		return CUDA_SUCCESS;
	nouveau_wait_ioctl(e.ctx, e.ch);
	CUresult r = wait_channel(e.ctx, e.ch, e.seq + 1);

	if (!r)
		pool_release(e.ctx);
	return r;
}

CUAPI CUresult cuEventElapsedTime(float *ms, CUevent hstart, CUevent hend)
{
	struct event *a, *b;
	uint64_t ta, tb;
	CUresult r = CUDA_SUCCESS;

	REQUIRE_INIT();
	if (!ms)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&g_lock);
	a = obj_get(hstart, T_EVENT);
	b = obj_get(hend, T_EVENT);
	if (!a || !b) {
		r = CUDA_ERROR_INVALID_HANDLE;
	} else if (a->captured || b->captured) {
		r = CUDA_ERROR_CAPTURED_EVENT;
	} else if (!a->recorded || !b->recorded) {
		r = CUDA_ERROR_INVALID_VALUE;
	} else {
		ta = __atomic_load_n(&a->ctx->shm->event_ts[a->slot], __ATOMIC_ACQUIRE);
		tb = __atomic_load_n(&b->ctx->shm->event_ts[b->slot], __ATOMIC_ACQUIRE);
		if (!ta || !tb)
			r = CUDA_ERROR_NOT_READY;
		else
			*ms = (float)((double)((int64_t)(tb - ta)) / 1e6);
	}
	pthread_mutex_unlock(&g_lock);
	return r;
}

CUAPI CUresult cuEventDestroy_v2(CUevent he)
{
	struct event *e;

	REQUIRE_INIT();
	pthread_mutex_lock(&g_lock);
	e = obj_get(he, T_EVENT);
	if (!e) {
		pthread_mutex_unlock(&g_lock);
		return CUDA_ERROR_INVALID_HANDLE;
	}
	e->ctx->ev_used[e->slot] = 0;
	obj_free(he);
	pthread_mutex_unlock(&g_lock);
	free(e);
	return CUDA_SUCCESS;
}
