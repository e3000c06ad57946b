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
#include <sys/mman.h>

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

/* Pinned host memory: host pages the driver pins for the GPU (an RM
 * allocation of NV01_MEMORY_SYSTEM under the current context's device);
 * the simulated GPU holds none of it. */
struct host_alloc {
	void *p;
	struct ctx *c;
	uint32_t handle;
};
static struct host_alloc g_host[MAX_ALLOCS];
static int g_nhost;

/* Managed memory: as the real libcuda, an mmap of the nvidia-uvm node
 * reserves the range (the simulator's node is the zero device: its pages
 * are host memory, made on touch); the simulated GPU holds none of it. */
struct managed_alloc {
	void *p;
	size_t len;
	struct ctx *c;
};
static struct managed_alloc g_managed[MAX_ALLOCS];
static int g_nmanaged;

/* managed_unmap unmaps the i-th managed range. */
static void managed_unmap(int i)
{
	munmap(g_managed[i].p, g_managed[i].len);
	g_managed[i] = g_managed[--g_nmanaged];
}

/* managed_free unmaps the managed range at p: 0 when there is none. */
static int managed_free(CUdeviceptr p)
{
	for (int i = 0; i < g_nmanaged; i++) {
		if ((CUdeviceptr)(uintptr_t)g_managed[i].p == p) {
			managed_unmap(i);
			return 1;
		}
	}
	return 0;
}

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
/* The driver allocates device memory in pages of CHUNK_BYTES; libcuda
 * carves allocations below SMALL_BYTES from shared chunks of that size,
 * each rounded to SMALL_ALIGN. */
#define CHUNK_BYTES ((size_t)2 << 20)
#define SMALL_BYTES ((size_t)1 << 20)
#define SMALL_ALIGN ((size_t)512)

static size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

/* Takes size bytes of device memory for c (under g_lock): the simulated
 * GPU allocates them, then the driver's RM allocation tells the probes, as
 * on a real host (where the driver does both in that ioctl). */
static CUresult dev_alloc(struct ctx *c, size_t size, CUdeviceptr *addr, uint32_t *handle)
{
	struct fg_req req = { .op = FG_OP_MEM_ALLOC, .arg0 = c->id, .arg1 = size };
	struct fg_resp resp;

	if (rpc(&req, &resp, NULL, 0) < 0)
		return CUDA_ERROR_DEVICE_UNAVAILABLE;
	if (resp.status == CUDA_ERROR_OUT_OF_MEMORY)
		nv_alloc_memory(c->h_device, size, NV_ERR_NO_MEMORY, 0);
	if (resp.status)
		return resp.status;
	*handle = nv_alloc_memory(c->h_device, size, 0, 0);
	*addr = resp.val0;
	return CUDA_SUCCESS;
}

/* Returns a device allocation of c (under g_lock): RM_FREE, as libcuda
 * does, and the simulated GPU frees it. */
static CUresult dev_free(struct ctx *c, CUdeviceptr addr, uint32_t handle)
{
	struct fg_req req = { .op = FG_OP_MEM_FREE, .arg0 = c->id, .arg1 = addr };
	struct fg_resp resp;

	if (rpc(&req, &resp, NULL, 0) < 0)
		return CUDA_ERROR_DEVICE_UNAVAILABLE;
	if (!resp.status && handle)
		nv_free(c->h_device, handle);
	return resp.status;
}

/* Carves n bytes from a chunk of c with room, or a new chunk. */
static CUresult carve(struct ctx *c, size_t n, CUdeviceptr *addr, int *chunk)
{
	int free_slot = -1;

	n = round_up(n, SMALL_ALIGN);
	for (int i = 0; i < c->nchunks; i++) {
		struct chunk *k = &c->chunks[i];

		if (k->live < 0) {
			free_slot = free_slot < 0 ? i : free_slot;
		} else if (CHUNK_BYTES - k->used >= n) {
			*addr = k->addr + k->used;
			k->used += n;
			k->live++;
			*chunk = i;
			return CUDA_SUCCESS;
		}
	}
	if (free_slot < 0) {
		if (c->nchunks >= MAX_CHUNKS)
			return CUDA_ERROR_OUT_OF_MEMORY;
		free_slot = c->nchunks++;
	}
	struct chunk *k = &c->chunks[free_slot];
	CUresult r = dev_alloc(c, CHUNK_BYTES, &k->addr, &k->handle);

	if (r) {
		k->live = -1;
		return r;
	}
	k->used = n;
	k->live = 1;
	*addr = k->addr;
	*chunk = free_slot;
	return CUDA_SUCCESS;
}

/* Allocates bytes in c (under g_lock): small ones carved from chunks,
 * others in pages of their own; a stream-ordered allocation first reuses
 * a block its pool kept of that size. */
static CUresult mem_alloc(struct ctx *c, CUdeviceptr *dptr, size_t bytes, int ordered)
{
	struct alloc a = { .bytes = bytes, .chunk = -1 };
	CUresult r = CUDA_SUCCESS;

	if (c->nallocs >= MAX_ALLOCS)
		return CUDA_ERROR_OUT_OF_MEMORY;
	if (bytes < SMALL_BYTES) {
		r = carve(c, bytes, &a.addr, &a.chunk);
	} else {
		size_t size = round_up(bytes, CHUNK_BYTES);
		int i = 0;

		while (ordered && i < c->npooled && c->pool[i].size != size)
			i++;
		if (ordered && i < c->npooled) {
			a.addr = c->pool[i].addr;
			a.handle = c->pool[i].handle;
			c->pool[i] = c->pool[--c->npooled];
		} else {
			r = dev_alloc(c, size, &a.addr, &a.handle);
		}
	}
	if (r)
		return r;
	c->allocs[c->nallocs++] = a;
	*dptr = a.addr;
	return CUDA_SUCCESS;
}

/* Frees an allocation of c (under g_lock): a carved one returns its chunk
 * to the device once the chunk is empty; a stream-ordered free of one of
 * its own keeps it in the pool until the context's next synchronization. */
static CUresult mem_free(struct ctx *c, CUdeviceptr dptr, int ordered)
{
	for (int i = 0; i < c->nallocs; i++) {
		struct alloc a = c->allocs[i];
		CUresult r = CUDA_SUCCESS;

		if (a.addr != dptr || (a.bytes & IPC_OPENED))
			continue;
		if (a.chunk >= 0) {
			struct chunk *k = &c->chunks[a.chunk];

			if (--k->live == 0) {
				r = dev_free(c, k->addr, k->handle);
				k->live = -1;
			}
		} else if (ordered && c->npooled < MAX_POOLED) {
			c->pool[c->npooled++] = (struct pooled){ a.addr, round_up(a.bytes, CHUNK_BYTES), a.handle };
		} else {
			r = dev_free(c, a.addr, a.handle);
		}
		c->allocs[i] = c->allocs[--c->nallocs];
		return r;
	}
	return CUDA_ERROR_INVALID_VALUE;
}

void pool_release(struct ctx *c)
{
	pthread_mutex_lock(&g_lock);
	while (c->npooled > 0) {
		struct pooled p = c->pool[--c->npooled];

		dev_free(c, p.addr, p.handle);
	}
	pthread_mutex_unlock(&g_lock);
}

void mem_release_all(struct ctx *c)
{
	for (int i = 0; i < c->nallocs; i++)
		if (c->allocs[i].handle)
			nv_free(c->h_device, c->allocs[i].handle);
	for (int i = 0; i < c->nchunks; i++)
		if (c->chunks[i].live >= 0)
			nv_free(c->h_device, c->chunks[i].handle);
	for (int i = 0; i < c->npooled; i++)
		nv_free(c->h_device, c->pool[i].handle);
	for (int i = 0; i < g_nhost; i++) {
		if (g_host[i].c != c)
			continue;
		nv_free(c->h_device, g_host[i].handle);
		free(g_host[i].p);
		g_host[i--] = g_host[--g_nhost];
	}
	for (int i = 0; i < g_nmanaged; i++)
		if (g_managed[i].c == c)
			managed_unmap(i--);
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
	r = c ? mem_alloc(c, dptr, bytes, 0) : CUDA_ERROR_INVALID_CONTEXT;
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
	if (managed_free(dptr))
		r = CUDA_SUCCESS;
	else
		r = c ? mem_free(c, dptr, 0) : CUDA_ERROR_INVALID_CONTEXT;
	pthread_mutex_unlock(&g_lock);
	return r;
}

/* cuMemAllocManaged: a range of the nvidia-uvm node, in 2 MiB granules. */
CUAPI CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytes, unsigned int flags)
{
	size_t len = round_up(bytes, (size_t)2 << 20);
	CUresult r = CUDA_SUCCESS;
	void *p;

	(void)flags;
	REQUIRE_INIT();
	if (!dptr || !bytes)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&g_lock);
	if (!current_ctx())
		r = CUDA_ERROR_INVALID_CONTEXT;
	else if (nv_uvm_fd() < 0)
		r = CUDA_ERROR_NOT_SUPPORTED;
	else if (g_nmanaged >= MAX_ALLOCS ||
		 (p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, nv_uvm_fd(), 0)) == MAP_FAILED)
		r = CUDA_ERROR_OUT_OF_MEMORY;
	else {
		g_managed[g_nmanaged++] = (struct managed_alloc){ p, len, current_ctx() };
		*dptr = (CUdeviceptr)(uintptr_t)p;
	}
	pthread_mutex_unlock(&g_lock);
	return r;
}

/* cuMemAllocAsync and cuMemFreeAsync: stream ordered in CUDA; here the
 * memory is there at once (which no stream-ordered program can tell
 * apart), and a freed block stays in the context's pool until its next
 * synchronization, as CUDA's default pool with release threshold 0. */
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
		r = mem_alloc(s->ctx, dptr, bytes, 1);
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
		r = mem_free(s->ctx, dptr, 1);
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

CUAPI CUresult cuMemHostAlloc(void **pp, size_t bytes, unsigned int flags)
{
	struct ctx *c;
	CUresult r = CUDA_SUCCESS;

	(void)flags;
	REQUIRE_INIT();
	if (!pp || !bytes)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&g_lock);
	c = current_ctx();
	if (!c)
		r = CUDA_ERROR_INVALID_CONTEXT;
	else if (g_nhost >= MAX_ALLOCS || !(*pp = calloc(1, bytes)))
		r = CUDA_ERROR_OUT_OF_MEMORY;
	else
		g_host[g_nhost++] = (struct host_alloc){ *pp, c, nv_alloc_memory(c->h_device, bytes, 0, 1) };
	pthread_mutex_unlock(&g_lock);
	return r;
}

CUAPI CUresult cuMemAllocHost_v2(void **pp, size_t bytes)
{
	return cuMemHostAlloc(pp, bytes, 0);
}

CUAPI CUresult cuMemFreeHost(void *p)
{
	CUresult r = CUDA_ERROR_INVALID_VALUE;

	REQUIRE_INIT();
	pthread_mutex_lock(&g_lock);
	for (int i = 0; i < g_nhost; i++) {
		if (g_host[i].p != p)
			continue;
		nv_free(g_host[i].c->h_device, g_host[i].handle);
		free(p);
		g_host[i] = g_host[--g_nhost];
		r = CUDA_SUCCESS;
		break;
	}
	pthread_mutex_unlock(&g_lock);
	return r;
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
		c->allocs[c->nallocs++] = (struct alloc){ h.addr, (size_t)h.bytes | IPC_OPENED, 0, -1 };
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
