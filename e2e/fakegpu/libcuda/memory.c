/* Device memory of the simulated GPU's libcuda.so.1: allocations (stream
 * ordered ones included), copies and memsets on the copy engine, and IPC
 * handles that let another process use an allocation (the stream memory
 * operations of two processes meet there). Contents are not simulated:
 * a copy or memset costs its bytes at the copy engine's bandwidth. The
 * _ptds variants of synchronous calls and the _ptsz variants of
 * asynchronous ones use the calling thread's default stream. */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

/* An IPC handle as this driver fills CUipcMemHandle's 64 bytes. */
#define IPC_MAGIC 0x46474950u /* "FGIP" */
typedef struct {
	char reserved[64];
} CUipcMemHandle;
struct ipc_handle {
	uint32_t magic;
	uint32_t dev;
	uint64_t addr;
	uint64_t bytes;
};

/* Allocations opened through IPC carry this bit in their size: freed by
 * cuIpcCloseMemHandle, never by cuMemFree. */
#define IPC_OPENED ((size_t)1 << 62)

int in_alloc(struct ctx *c, CUdeviceptr p, size_t n)
{
	for (int i = 0; i < c->nallocs; i++) {
		struct alloc *a = &c->allocs[i];
		size_t bytes = a->bytes & ~IPC_OPENED;

		if (p >= a->addr && n <= bytes && p - a->addr <= bytes - n)
			return 1;
	}
	return 0;
}

#define NV_ERR_NO_MEMORY 0x51

/* Allocates in c (under g_lock): the simulated GPU takes the memory, then
 * the driver's RM allocation tells the probes, as on a real host (where
 * the driver does both in that ioctl). */
static CUresult mem_alloc(struct ctx *c, CUdeviceptr *dptr, size_t bytes)
{
	struct fg_req req = { .op = FG_OP_MEM_ALLOC, .arg0 = c->id, .arg1 = bytes };
	struct fg_resp resp;
	uint32_t handle;

	if (c->nallocs >= MAX_ALLOCS)
		return CUDA_ERROR_OUT_OF_MEMORY;
	if (rpc(&req, &resp, NULL, 0) < 0)
		return CUDA_ERROR_DEVICE_UNAVAILABLE;
	if (resp.status == CUDA_ERROR_OUT_OF_MEMORY)
		nv_alloc_memory(c->h_device, bytes, NV_ERR_NO_MEMORY);
	if (resp.status)
		return resp.status;
	handle = nv_alloc_memory(c->h_device, bytes, 0);
	c->allocs[c->nallocs++] = (struct alloc){ resp.val0, bytes, handle };
	*dptr = resp.val0;
	return CUDA_SUCCESS;
}

/* Frees an allocation of c (under g_lock). */
static CUresult mem_free(struct ctx *c, CUdeviceptr dptr)
{
	struct fg_req req = { .op = FG_OP_MEM_FREE, .arg0 = c->id, .arg1 = dptr };
	struct fg_resp resp;

	for (int i = 0; i < c->nallocs; i++) {
		if (c->allocs[i].addr != dptr || (c->allocs[i].bytes & IPC_OPENED))
			continue;
		if (rpc(&req, &resp, NULL, 0) < 0)
			return CUDA_ERROR_DEVICE_UNAVAILABLE;
		if (!resp.status && c->allocs[i].handle)
			nv_free(c->h_device, c->allocs[i].handle);
		c->allocs[i] = c->allocs[--c->nallocs];
		return resp.status;
	}
	return CUDA_ERROR_INVALID_VALUE;
}

CUAPI CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes)
{
	struct ctx *c;
	CUresult r;

	REQUIRE_INIT();
	if (!dptr || !bytes)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&g_lock);
	c = current_ctx();
	r = c ? mem_alloc(c, dptr, bytes) : CUDA_ERROR_INVALID_CONTEXT;
	pthread_mutex_unlock(&g_lock);
	return r;
}

CUAPI CUresult cuMemFree_v2(CUdeviceptr dptr)
{
	struct ctx *c;
	CUresult r;

	REQUIRE_INIT();
	pthread_mutex_lock(&g_lock);
	c = current_ctx();
	r = c ? mem_free(c, dptr) : CUDA_ERROR_INVALID_CONTEXT;
	pthread_mutex_unlock(&g_lock);
	return r;
}

/* cuMemAllocAsync and cuMemFreeAsync: stream ordered in CUDA; here the
 * memory is there (or gone) at once, which no stream-ordered program can
 * tell apart. */
static CUresult alloc_async(CUdeviceptr *dptr, size_t bytes, CUstream hs, int per_thread)
{
	struct stream *s;
	CUresult r = CUDA_SUCCESS;

	REQUIRE_INIT();
	if (!dptr || !bytes)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&g_lock);
	s = get_stream(hs, per_thread, &r);
	if (!r)
		r = mem_alloc(s->ctx, dptr, bytes);
	pthread_mutex_unlock(&g_lock);
	return r;
}

static CUresult free_async(CUdeviceptr dptr, CUstream hs, int per_thread)
{
	struct stream *s;
	CUresult r = CUDA_SUCCESS;

	REQUIRE_INIT();
	pthread_mutex_lock(&g_lock);
	s = get_stream(hs, per_thread, &r);
	if (!r)
		r = mem_free(s->ctx, dptr);
	pthread_mutex_unlock(&g_lock);
	return r;
}

CUAPI CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytes, CUstream hs)
{
	return alloc_async(dptr, bytes, hs, 0);
}

CUAPI CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytes, CUstream hs)
{
	return alloc_async(dptr, bytes, hs, 1);
}

CUAPI CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hs)
{
	return free_async(dptr, hs, 0);
}

CUAPI CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hs)
{
	return free_async(dptr, hs, 1);
}

CUAPI CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total)
{
	REQUIRE_INIT();
	if (!free_bytes || !total)
		return CUDA_ERROR_INVALID_VALUE;
	*total = (size_t)g_mem;
	*free_bytes = (size_t)g_mem; /* other processes' use is not known here */
	return CUDA_SUCCESS;
}

/* ---- copies and memsets ---- */

/* Which sides of a copy must be device memory. */
enum { DEV_DST = 1, DEV_SRC = 2, DEV_EITHER = 4 };

/* A copy or memset of n bytes on the copy engine, on stream hs (sync: the
 * default stream, and wait for it). dctx and sctx, when set, are the
 * contexts the device addresses belong to (peer copies); otherwise the
 * stream's. */
static CUresult copy_op(CUdeviceptr dst, CUdeviceptr src, size_t n, int need, struct ctx *dctx, struct ctx *sctx,
			CUstream hs, int per_thread, int sync)
{
	struct stream *s;
	CUresult r = CUDA_SUCCESS;

	REQUIRE_INIT();
	if (!n)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&g_lock);
	s = get_stream(sync ? NULL : hs, per_thread, &r);
	if (!r) {
		struct ctx *d = dctx ? dctx : s->ctx, *sc = sctx ? sctx : s->ctx;
		int dd = dst && in_alloc(d, dst, n), sd = src && in_alloc(sc, src, n);

		if (((need & DEV_DST) && !dd) || ((need & DEV_SRC) && !sd) || ((need & DEV_EITHER) && !dd && !sd) ||
		    !dst || (!src && (need & DEV_SRC)))
			r = CUDA_ERROR_INVALID_VALUE;
	}
	if (!r && s->capture) {
		r = capture_add(s, FG_ENTRY_COPY, 0, n, 0, 0) ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_SUCCESS;
		pthread_mutex_unlock(&g_lock);
		return r;
	}
	pthread_mutex_unlock(&g_lock);
	if (r)
		return r;
	r = submit(s->ctx, s->ch, FG_ENTRY_COPY, 0, n, FG_NO_EVENT, 0, 0);
	if (r || !sync)
		return r;
	return sync_channel(s->ctx, s->ch);
}

#define HOST(p) ((CUdeviceptr)(uintptr_t)(p))

CUAPI CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n)
{
	return src ? copy_op(dst, HOST(src), n, DEV_DST, NULL, NULL, NULL, 0, 1) : CUDA_ERROR_INVALID_VALUE;
}

CUAPI CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dst, const void *src, size_t n)
{
	return src ? copy_op(dst, HOST(src), n, DEV_DST, NULL, NULL, NULL, 1, 1) : CUDA_ERROR_INVALID_VALUE;
}

CUAPI CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n)
{
	return dst ? copy_op(HOST(dst), src, n, DEV_SRC, NULL, NULL, NULL, 0, 1) : CUDA_ERROR_INVALID_VALUE;
}

CUAPI CUresult cuMemcpyDtoH_v2_ptds(void *dst, CUdeviceptr src, size_t n)
{
	return dst ? copy_op(HOST(dst), src, n, DEV_SRC, NULL, NULL, NULL, 1, 1) : CUDA_ERROR_INVALID_VALUE;
}

CUAPI CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
	return copy_op(dst, src, n, DEV_DST | DEV_SRC, NULL, NULL, NULL, 0, 1);
}

CUAPI CUresult cuMemcpyDtoD_v2_ptds(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
	return copy_op(dst, src, n, DEV_DST | DEV_SRC, NULL, NULL, NULL, 1, 1);
}

CUAPI CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream hs)
{
	return src ? copy_op(dst, HOST(src), n, DEV_DST, NULL, NULL, hs, 0, 0) : CUDA_ERROR_INVALID_VALUE;
}

CUAPI CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dst, const void *src, size_t n, CUstream hs)
{
	return src ? copy_op(dst, HOST(src), n, DEV_DST, NULL, NULL, hs, 1, 0) : CUDA_ERROR_INVALID_VALUE;
}

CUAPI CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream hs)
{
	return dst ? copy_op(HOST(dst), src, n, DEV_SRC, NULL, NULL, hs, 0, 0) : CUDA_ERROR_INVALID_VALUE;
}

CUAPI CUresult cuMemcpyDtoHAsync_v2_ptsz(void *dst, CUdeviceptr src, size_t n, CUstream hs)
{
	return dst ? copy_op(HOST(dst), src, n, DEV_SRC, NULL, NULL, hs, 1, 0) : CUDA_ERROR_INVALID_VALUE;
}

CUAPI CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream hs)
{
	return copy_op(dst, src, n, DEV_DST | DEV_SRC, NULL, NULL, hs, 0, 0);
}

CUAPI CUresult cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream hs)
{
	return copy_op(dst, src, n, DEV_DST | DEV_SRC, NULL, NULL, hs, 1, 0);
}

/* cuMemcpy and cuMemcpyAsync: unified addressing, one side at least in
 * device memory. */
CUAPI CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
	return copy_op(dst, src, n, DEV_EITHER, NULL, NULL, NULL, 0, 1);
}

CUAPI CUresult cuMemcpy_ptds(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
	return copy_op(dst, src, n, DEV_EITHER, NULL, NULL, NULL, 1, 1);
}

CUAPI CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream hs)
{
	return copy_op(dst, src, n, DEV_EITHER, NULL, NULL, hs, 0, 0);
}

CUAPI CUresult cuMemcpyAsync_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream hs)
{
	return copy_op(dst, src, n, DEV_EITHER, NULL, NULL, hs, 1, 0);
}

/* Peer copies: between allocations of two contexts. */
static CUresult copy_peer(CUdeviceptr dst, CUcontext dc, CUdeviceptr src, CUcontext sc, size_t n, CUstream hs,
			  int per_thread, int sync)
{
	struct ctx *d, *s;

	REQUIRE_INIT();
	pthread_mutex_lock(&g_lock);
	d = obj_get(dc, T_CTX);
	s = obj_get(sc, T_CTX);
	pthread_mutex_unlock(&g_lock);
	if (!d || !s)
		return CUDA_ERROR_INVALID_CONTEXT;
	return copy_op(dst, src, n, DEV_DST | DEV_SRC, d, s, hs, per_thread, sync);
}

CUAPI CUresult cuMemcpyPeer(CUdeviceptr dst, CUcontext dc, CUdeviceptr src, CUcontext sc, size_t n)
{
	return copy_peer(dst, dc, src, sc, n, NULL, 0, 1);
}

CUAPI CUresult cuMemcpyPeer_ptds(CUdeviceptr dst, CUcontext dc, CUdeviceptr src, CUcontext sc, size_t n)
{
	return copy_peer(dst, dc, src, sc, n, NULL, 1, 1);
}

CUAPI CUresult cuMemcpyPeerAsync(CUdeviceptr dst, CUcontext dc, CUdeviceptr src, CUcontext sc, size_t n, CUstream hs)
{
	return copy_peer(dst, dc, src, sc, n, hs, 0, 0);
}

CUAPI CUresult cuMemcpyPeerAsync_ptsz(CUdeviceptr dst, CUcontext dc, CUdeviceptr src, CUcontext sc, size_t n,
				      CUstream hs)
{
	return copy_peer(dst, dc, src, sc, n, hs, 1, 0);
}

CUAPI CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char uc, size_t n)
{
	(void)uc;
	return copy_op(dst, 0, n, DEV_DST, NULL, NULL, NULL, 0, 1);
}

CUAPI CUresult cuMemsetD8_v2_ptds(CUdeviceptr dst, unsigned char uc, size_t n)
{
	(void)uc;
	return copy_op(dst, 0, n, DEV_DST, NULL, NULL, NULL, 1, 1);
}

CUAPI CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char uc, size_t n, CUstream hs)
{
	(void)uc;
	return copy_op(dst, 0, n, DEV_DST, NULL, NULL, hs, 0, 0);
}

CUAPI CUresult cuMemsetD8Async_ptsz(CUdeviceptr dst, unsigned char uc, size_t n, CUstream hs)
{
	(void)uc;
	return copy_op(dst, 0, n, DEV_DST, NULL, NULL, hs, 1, 0);
}

/* cuMemsetD32: n 32-bit words; the address must be 4-byte aligned. */
static CUresult memset32(CUdeviceptr dst, size_t n, CUstream hs, int per_thread, int sync)
{
	if (dst % 4 || n > SIZE_MAX / 4)
		return CUDA_ERROR_INVALID_VALUE;
	return copy_op(dst, 0, n * 4, DEV_DST, NULL, NULL, hs, per_thread, sync);
}

CUAPI CUresult cuMemsetD32_v2(CUdeviceptr dst, unsigned int ui, size_t n)
{
	(void)ui;
	return memset32(dst, n, NULL, 0, 1);
}

CUAPI CUresult cuMemsetD32_v2_ptds(CUdeviceptr dst, unsigned int ui, size_t n)
{
	(void)ui;
	return memset32(dst, n, NULL, 1, 1);
}

CUAPI CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned int ui, size_t n, CUstream hs)
{
	(void)ui;
	return memset32(dst, n, hs, 0, 0);
}

CUAPI CUresult cuMemsetD32Async_ptsz(CUdeviceptr dst, unsigned int ui, size_t n, CUstream hs)
{
	(void)ui;
	return memset32(dst, n, hs, 1, 0);
}

/* ---- IPC ---- */

CUAPI CUresult cuIpcGetMemHandle(CUipcMemHandle *handle, CUdeviceptr dptr)
{
	struct ipc_handle h = { .magic = IPC_MAGIC };
	struct ctx *c;
	CUresult r = CUDA_ERROR_INVALID_VALUE;

	REQUIRE_INIT();
	if (!handle)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&g_lock);
	c = current_ctx();
	for (int i = 0; c && i < c->nallocs; i++) {
		if (c->allocs[i].addr == dptr && !(c->allocs[i].bytes & IPC_OPENED)) {
			h.dev = (uint32_t)c->dev;
			h.addr = dptr;
			h.bytes = c->allocs[i].bytes;
			memset(handle, 0, sizeof(*handle));
			memcpy(handle, &h, sizeof(h));
			r = CUDA_SUCCESS;
		}
	}
	pthread_mutex_unlock(&g_lock);
	return c ? r : CUDA_ERROR_INVALID_CONTEXT;
}

/* The simulated GPU has one address space per device: the allocation keeps
 * its address in the opening process. */
CUAPI CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int flags)
{
	struct ipc_handle h;
	struct ctx *c;
	CUresult r = CUDA_SUCCESS;

	REQUIRE_INIT();
	memcpy(&h, &handle, sizeof(h));
	if (!pdptr || flags > 1 || h.magic != IPC_MAGIC || !h.addr || !h.bytes)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&g_lock);
	c = current_ctx();
	if (!c)
		r = CUDA_ERROR_INVALID_CONTEXT;
	else if ((uint32_t)c->dev != h.dev)
		r = CUDA_ERROR_INVALID_DEVICE;
	else if (c->nallocs >= MAX_ALLOCS)
		r = CUDA_ERROR_OUT_OF_MEMORY;
	else {
		c->allocs[c->nallocs++] = (struct alloc){ h.addr, (size_t)h.bytes | IPC_OPENED, 0 };
		*pdptr = h.addr;
	}
	pthread_mutex_unlock(&g_lock);
	return r;
}

CUAPI CUresult cuIpcCloseMemHandle(CUdeviceptr dptr)
{
	struct ctx *c;
	CUresult r = CUDA_ERROR_INVALID_VALUE;

	REQUIRE_INIT();
	pthread_mutex_lock(&g_lock);
	c = current_ctx();
	for (int i = 0; c && i < c->nallocs; i++) {
		if (c->allocs[i].addr == dptr && (c->allocs[i].bytes & IPC_OPENED)) {
			c->allocs[i] = c->allocs[--c->nallocs];
			r = CUDA_SUCCESS;
			break;
		}
	}
	pthread_mutex_unlock(&g_lock);
	return c ? r : CUDA_ERROR_INVALID_CONTEXT;
}
