/* libcuda.so.1 for the simulated GPU: the CUDA driver API's names and
 * signatures over fakegpud. Setup goes over fakegpud's Unix socket and issues
 * the real nvidia ioctl encodings (RM_ALLOC of a TSG and GPFIFO channels,
 * GET_WORK_SUBMIT_TOKEN, RM_FREE) on the simulator's control node, or DRM
 * nouveau ioctls in nouveau mode, so probes see a real host's traffic.
 * Launches write ring entries in shared memory, advance GPPut and ring a
 * doorbell word: no system call. Syncs sleep on futexes (FAKEGPU_SYNC=spin
 * busy-waits). Handles are checked table entries: a bad handle is an error,
 * never a crash. Device memory contents are not simulated, only time. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "fakegpu_abi.h"

#define CUAPI __attribute__((visibility("default")))

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphExec_st *CUgraphExec;

typedef struct CUlaunchAttribute_st {
	int id;
	char pad[4];
	char value[64];
} CUlaunchAttribute;

typedef struct CUlaunchConfig_st {
	unsigned int gridDimX, gridDimY, gridDimZ;
	unsigned int blockDimX, blockDimY, blockDimZ;
	unsigned int sharedMemBytes;
	CUstream hStream;
	CUlaunchAttribute *attrs;
	unsigned int numAttrs;
} CUlaunchConfig;

enum {
	CUDA_SUCCESS = 0,
	CUDA_ERROR_INVALID_VALUE = 1,
	CUDA_ERROR_OUT_OF_MEMORY = 2,
	CUDA_ERROR_NOT_INITIALIZED = 3,
	CUDA_ERROR_DEINITIALIZED = 4,
	CUDA_ERROR_DEVICE_UNAVAILABLE = 46,
	CUDA_ERROR_NO_DEVICE = 100,
	CUDA_ERROR_INVALID_DEVICE = 101,
	CUDA_ERROR_INVALID_IMAGE = 200,
	CUDA_ERROR_INVALID_CONTEXT = 201,
	CUDA_ERROR_INVALID_HANDLE = 400,
	CUDA_ERROR_ILLEGAL_STATE = 401,
	CUDA_ERROR_NOT_FOUND = 500,
	CUDA_ERROR_NOT_READY = 600,
	CUDA_ERROR_LAUNCH_FAILED = 719,
	CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900,
	CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901,
	CUDA_ERROR_UNKNOWN = 999,
};

/* ---- nvidia and nouveau ioctl encodings ---- */

#define IOC_RW 3u
#define IOC_W 1u
#define IOC(dir, type, nr, size) (((dir) << 30) | ((size) << 16) | ((type) << 8) | (nr))
#define NV_IOWR(nr, size) IOC(IOC_RW, 'F', nr, size)
#define NV_ESC_RM_FREE 0x29
#define NV_ESC_RM_CONTROL 0x2A
#define NV_ESC_RM_ALLOC 0x2B
#define NV_ESC_IOCTL_XFER_CMD 211
#define NV01_ROOT_CLIENT 0x41
#define NV01_DEVICE_0 0x80
#define FERMI_VASPACE_A 0x90F1
#define KEPLER_CHANNEL_GROUP_A 0xA06C
#define HOPPER_CHANNEL_GPFIFO_A 0xC86F
#define NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN 0xC36F0108
#define NV2080_ENGINE_TYPE_GR0 1

typedef struct { uint32_t hRoot, hObjectParent, hObjectNew, hClass; uint64_t pAllocParms; uint32_t paramsSize, status; } NVOS21_PARAMETERS;
typedef struct { uint32_t hRoot, hObjectParent, hObjectNew, hClass; uint64_t pAllocParms, pRightsRequested; uint32_t paramsSize, flags, status; uint32_t pad; } NVOS64_PARAMETERS;
typedef struct { uint32_t hClient, hObject, cmd, flags; uint64_t params; uint32_t paramsSize, status; } NVOS54_PARAMETERS;
typedef struct { uint32_t hRoot, hObjectParent, hObjectOld, status; } NVOS00_PARAMETERS;
typedef struct { uint32_t cmd, size; uint64_t ptr; } nv_ioctl_xfer_t;
typedef struct { uint32_t deviceId, hClientShare, hTargetClient, hTargetDevice, flags; uint32_t pad; uint64_t vaSpaceSize, vaStartInternal, vaLimitInternal; uint32_t vaMode, pad2; } NV0080_ALLOC_PARAMETERS;
typedef struct { uint32_t hObjectError, hObjectEccError, hVASpace, engineType; uint8_t bIsCallingContextVgpuPlugin; } NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS;
typedef struct { uint32_t hObjectError, hObjectBuffer; uint64_t gpFifoOffset; uint32_t gpFifoEntries, flags, hContextShare, hVASpace, hHandleVASpace; uint32_t hUserdMemory[8]; uint64_t userdOffset[8]; uint32_t engineType, cid, subDeviceId, hObjectEccError; } NV_CHANNEL_ALLOC_PARAMS;
typedef struct { uint32_t workSubmitToken; } NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN_PARAMS;

#define DRM_CMD(nr) (0x40 + (nr))
#define NOUVEAU_CHANNEL_ALLOC 0x02
#define NOUVEAU_CHANNEL_FREE 0x03
#define NOUVEAU_EXEC 0x12
#define NOUVEAU_GEM_CPU_PREP 0x42
struct drm_nouveau_channel_alloc { uint32_t fb_ctxdma_handle, tt_ctxdma_handle; int32_t channel; uint32_t pushbuf_domains, notifier_handle; struct { uint32_t handle, grclass; } subchan[8]; uint32_t nr_subchan; };
struct drm_nouveau_channel_free { int32_t channel; };
struct drm_nouveau_exec_push { uint64_t va; uint32_t va_len, flags; };
struct drm_nouveau_exec { uint32_t channel, push_count, wait_count, sig_count; uint64_t wait_ptr, sig_ptr, push_ptr; };
struct drm_nouveau_gem_cpu_prep { uint32_t handle, flags; };

/* ---- objects and handles ---- */

enum obj_type { T_FREE = 0, T_CTX, T_STREAM, T_EVENT, T_MODULE, T_FUNC, T_GRAPH, T_EXEC };

#define MAX_OBJS 16384
#define MAX_ALLOCS 4096
#define MAX_FUNCS 256

struct node {
	uint32_t kind;
	uint64_t cost_ns;
	uint64_t bytes;
};

struct graph {
	struct node *nodes;
	size_t n, cap;
};

struct alloc {
	CUdeviceptr addr;
	size_t bytes;
};

struct ctx {
	uint64_t id;
	int dev;
	struct fg_ctx_shm *shm;
	struct fg_doorbell *db;
	uint8_t chan_used[FG_MAX_CHANNELS];
	uint8_t ev_used[FG_MAX_EVENTS];
	uint32_t h_device, h_vaspace, h_tsg, h_chan[FG_MAX_CHANNELS];
	int drm_channel;
	CUstream null_stream;
	struct alloc allocs[MAX_ALLOCS];
	int nallocs;
};

struct stream {
	struct ctx *ctx;
	CUcontext ctx_handle;
	int ch;
	struct graph *capture;
};

struct event {
	struct ctx *ctx;
	CUcontext ctx_handle;
	uint32_t slot;
	int ch;
	uint64_t seq;
	int recorded;
};

struct func {
	char name[64];
	uint64_t ns_per_block;
};

struct module {
	struct func funcs[MAX_FUNCS];
	CUfunction handles[MAX_FUNCS];
	int n;
};

struct obj {
	uint8_t type;
	uint32_t gen;
	void *p;
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static struct obj g_objs[MAX_OBJS];
static int g_init;
static int g_atfork;
static int g_sock = -1;
static int g_nvfd = -1;
static int g_drmfd = -1;
static int g_nouveau;
static int g_spin;
static uint32_t g_ngpus;
static uint64_t g_mem;
static uint32_t g_hclient;
static uint32_t g_next_handle = 0x5c000000;
static __thread CUcontext t_current;

static uint64_t make_handle(int type, uint32_t gen, uint32_t idx)
{
	return ((uint64_t)type << 56) | ((uint64_t)(gen & 0xffffff) << 32) | (idx + 1);
}

/* obj_new and obj_get run under g_lock. */
static uint64_t obj_new(int type, void *p)
{
	for (uint32_t i = 0; i < MAX_OBJS; i++) {
		if (g_objs[i].type == T_FREE) {
			g_objs[i].type = type;
			g_objs[i].gen++;
			g_objs[i].p = p;
			return make_handle(type, g_objs[i].gen, i);
		}
	}
	return 0;
}

static void *obj_get(const void *handle, int type)
{
	uint64_t h = (uint64_t)(uintptr_t)handle;
	uint32_t idx = (uint32_t)(h & 0xffffffff) - 1;

	if (!h || (int)(h >> 56) != type || idx >= MAX_OBJS)
		return NULL;
	if (g_objs[idx].type != type || (g_objs[idx].gen & 0xffffff) != ((h >> 32) & 0xffffff))
		return NULL;
	return g_objs[idx].p;
}

static void obj_free(const void *handle)
{
	uint64_t h = (uint64_t)(uintptr_t)handle;
	uint32_t idx = (uint32_t)(h & 0xffffffff) - 1;

	if (idx < MAX_OBJS) {
		g_objs[idx].type = T_FREE;
		g_objs[idx].p = NULL;
	}
}

/* ---- setup socket ---- */

static const char *socket_path(void)
{
	const char *p = getenv("FAKEGPU_SOCKET");
	return p && *p ? p : "/run/fakegpu/fakegpu.sock";
}

static int rpc(struct fg_req *req, struct fg_resp *resp, int *fds, int nfds)
{
	char cbuf[CMSG_SPACE(sizeof(int) * 2)];
	struct iovec iov = { .iov_base = resp, .iov_len = sizeof(*resp) };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
	size_t got = 0;

	if (send(g_sock, req, sizeof(*req), MSG_NOSIGNAL) != (ssize_t)sizeof(*req))
		return -1;
	if (nfds) {
		msg.msg_control = cbuf;
		msg.msg_controllen = sizeof(cbuf);
	}
	while (got < sizeof(*resp)) {
		ssize_t n;

		iov.iov_base = (char *)resp + got;
		iov.iov_len = sizeof(*resp) - got;
		n = recvmsg(g_sock, &msg, MSG_CMSG_CLOEXEC);
		if (n <= 0)
			return -1;
		if (nfds && got == 0) {
			struct cmsghdr *c = CMSG_FIRSTHDR(&msg);

			/* Missing fds stay -1: the caller checks. */
			if (c && c->cmsg_type == SCM_RIGHTS && c->cmsg_len == CMSG_LEN(sizeof(int) * nfds))
				memcpy(fds, CMSG_DATA(c), sizeof(int) * nfds);
			msg.msg_control = NULL;
			msg.msg_controllen = 0;
		}
		got += n;
	}
	return 0;
}

static int device_gone(struct ctx *c)
{
	char b;
	struct pollfd p = { .fd = g_sock, .events = POLLIN };

	if (__atomic_load_n(&c->shm->dead, __ATOMIC_ACQUIRE) || __atomic_load_n(&c->db->dead, __ATOMIC_ACQUIRE))
		return 1;
	if (poll(&p, 1, 0) == 1 && (p.revents & (POLLHUP | POLLERR)))
		return 1;
	if (p.revents & POLLIN)
		return recv(g_sock, &b, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
	return 0;
}

/* ---- nvidia / nouveau ioctls (the traffic shape of a real host) ---- */

static uint32_t new_handle(void)
{
	return ++g_next_handle;
}

static void nv_alloc21(uint32_t parent, uint32_t handle, uint32_t cls, void *params, uint32_t size)
{
	NVOS21_PARAMETERS p = { g_hclient, parent, handle, cls, (uint64_t)(uintptr_t)params, size, 0 };

	if (g_nvfd >= 0)
		ioctl(g_nvfd, NV_IOWR(NV_ESC_RM_ALLOC, sizeof(p)), &p);
}

/* Channel allocations go through IOCTL_XFER_CMD with NVOS64, as the driver
 * does for parameters it passes indirectly. */
static void nv_alloc64_xfer(uint32_t parent, uint32_t handle, uint32_t cls, void *params, uint32_t size)
{
	NVOS64_PARAMETERS p = { g_hclient, parent, handle, cls, (uint64_t)(uintptr_t)params, 0, size, 0, 0, 0 };
	nv_ioctl_xfer_t x = { NV_ESC_RM_ALLOC, sizeof(p), (uint64_t)(uintptr_t)&p };

	if (g_nvfd >= 0)
		ioctl(g_nvfd, NV_IOWR(NV_ESC_IOCTL_XFER_CMD, sizeof(x)), &x);
}

static void nv_control(uint32_t object, uint32_t cmd, void *params, uint32_t size)
{
	NVOS54_PARAMETERS p = { g_hclient, object, cmd, 0, (uint64_t)(uintptr_t)params, size, 0 };

	if (g_nvfd >= 0)
		ioctl(g_nvfd, NV_IOWR(NV_ESC_RM_CONTROL, sizeof(p)), &p);
}

static void nv_free(uint32_t parent, uint32_t handle)
{
	NVOS00_PARAMETERS p = { g_hclient, parent, handle, 0 };

	if (g_nvfd >= 0)
		ioctl(g_nvfd, NV_IOWR(NV_ESC_RM_FREE, sizeof(p)), &p);
}

static void channel_setup_ioctls(struct ctx *c, int ch)
{
	if (g_nouveau) {
		struct drm_nouveau_channel_alloc a = { 0 };

		if (ch == 0) {
			a.channel = (int32_t)(c->id * FG_MAX_CHANNELS);
			c->drm_channel = a.channel;
			ioctl(g_drmfd, IOC(IOC_RW, 'd', DRM_CMD(NOUVEAU_CHANNEL_ALLOC), sizeof(a)), &a);
		}
		return;
	}
	NV_CHANNEL_ALLOC_PARAMS cp = { 0 };
	NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN_PARAMS tok;

	c->h_chan[ch] = new_handle();
	cp.gpFifoOffset = (uint64_t)(uintptr_t)&c->shm->ch[ch].ring[0];
	cp.gpFifoEntries = FG_RING_ENTRIES;
	cp.hVASpace = c->h_vaspace;
	cp.engineType = NV2080_ENGINE_TYPE_GR0;
	nv_alloc64_xfer(c->h_tsg, c->h_chan[ch], HOPPER_CHANNEL_GPFIFO_A, &cp, sizeof(cp));
	/* The simulator's token names the doorbell's channel: (context << 5) | channel. */
	tok.workSubmitToken = (uint32_t)(c->id << 5) | (uint32_t)ch;
	nv_control(c->h_chan[ch], NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN, &tok, sizeof(tok));
}

static void channel_teardown_ioctls(struct ctx *c, int ch)
{
	if (g_nouveau) {
		if (ch == 0) {
			struct drm_nouveau_channel_free f = { c->drm_channel };

			ioctl(g_drmfd, IOC(IOC_W, 'd', DRM_CMD(NOUVEAU_CHANNEL_FREE), sizeof(f)), &f);
		}
		return;
	}
	nv_free(c->h_tsg, c->h_chan[ch]);
}

/* ---- submission and completion ---- */

static void futex_wait(uint32_t *addr, uint32_t val, long ns)
{
	struct timespec ts = { ns / 1000000000L, ns % 1000000000L };

	syscall(SYS_futex, addr, FUTEX_WAIT, val, &ts, NULL, 0);
}

static void futex_wake(uint32_t *addr)
{
	syscall(SYS_futex, addr, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* Waits until channel ch of c has completed `target` entries. */
static CUresult wait_channel(struct ctx *c, int ch, uint64_t target)
{
	struct fg_channel *fc = &c->shm->ch[ch];

	for (;;) {
		uint32_t done = __atomic_load_n(&fc->done, __ATOMIC_SEQ_CST);

		if (__atomic_load_n(&fc->gp_get, __ATOMIC_SEQ_CST) >= target)
			return CUDA_SUCCESS;
		if (g_spin) {
			if (device_gone(c))
				return CUDA_ERROR_DEVICE_UNAVAILABLE;
			__builtin_ia32_pause();
			continue;
		}
		__atomic_add_fetch(&fc->waiters, 1, __ATOMIC_SEQ_CST);
		futex_wait(&fc->done, done, 20 * 1000 * 1000);
		__atomic_sub_fetch(&fc->waiters, 1, __ATOMIC_SEQ_CST);
		if (__atomic_load_n(&fc->gp_get, __ATOMIC_SEQ_CST) < target && device_gone(c))
			return CUDA_ERROR_DEVICE_UNAVAILABLE;
	}
}

/* Writes one entry on stream s and rings the doorbell. Called without
 * g_lock; a stream is used by one thread at a time, as CUDA requires for
 * ordering. */
static CUresult submit(struct ctx *c, int ch, uint32_t kind, uint64_t cost, uint64_t bytes, uint32_t ev)
{
	struct fg_channel *fc = &c->shm->ch[ch];
	uint64_t put = fc->gp_put;
	struct fg_entry *e;
	int was_empty;

	if (put - __atomic_load_n(&fc->gp_get, __ATOMIC_ACQUIRE) >= FG_RING_ENTRIES) {
		CUresult r = wait_channel(c, ch, put - FG_RING_ENTRIES + 1); /* the ring is full: block */

		if (r)
			return r;
	}
	if (__atomic_load_n(&c->shm->dead, __ATOMIC_ACQUIRE))
		return CUDA_ERROR_DEVICE_UNAVAILABLE;
	was_empty = __atomic_load_n(&fc->gp_get, __ATOMIC_ACQUIRE) == put;
	e = &fc->ring[put % FG_RING_ENTRIES];
	e->kind = kind;
	e->event = ev;
	e->cost_ns = cost;
	e->bytes = bytes;
	e->seq = put;
	__atomic_store_n(&fc->gp_put, put + 1, __ATOMIC_RELEASE);
	__atomic_add_fetch(&c->db->ring, 1, __ATOMIC_SEQ_CST);
	/* A doorbell on an idle channel wakes a sleeping device; entries queued
	 * behind pending ones are found when it next wakes. */
	if (was_empty && __atomic_load_n(&c->db->sleeping, __ATOMIC_SEQ_CST))
		futex_wake(&c->db->ring);
	if (g_nouveau) {
		struct drm_nouveau_exec_push push = { (uint64_t)(uintptr_t)e, sizeof(*e), 0 };
		struct drm_nouveau_exec x = { (uint32_t)(c->drm_channel + ch), 1, 0, 0, 0, 0, (uint64_t)(uintptr_t)&push };

		ioctl(g_drmfd, IOC(IOC_RW, 'd', DRM_CMD(NOUVEAU_EXEC), sizeof(x)), &x);
	}
	return CUDA_SUCCESS;
}

static void nouveau_wait_ioctl(struct ctx *c, int ch)
{
	if (g_nouveau) {
		struct drm_nouveau_gem_cpu_prep p = { (uint32_t)(c->drm_channel + ch), 0 };

		ioctl(g_drmfd, IOC(IOC_W, 'd', DRM_CMD(NOUVEAU_GEM_CPU_PREP), sizeof(p)), &p);
	}
}

static CUresult sync_channel(struct ctx *c, int ch)
{
	uint64_t target = c->shm->ch[ch].gp_put;

	nouveau_wait_ioctl(c, ch);
	return wait_channel(c, ch, target);
}

/* ---- init, version, devices ---- */

static void atfork_child(void)
{
	/* Like CUDA, a child cannot use its parent's contexts: start over. */
	if (g_sock >= 0)
		close(g_sock);
	if (g_nvfd >= 0)
		close(g_nvfd);
	if (g_drmfd >= 0)
		close(g_drmfd);
	g_sock = g_nvfd = g_drmfd = -1;
	memset(g_objs, 0, sizeof(g_objs));
	g_init = 0;
	t_current = NULL;
	pthread_mutex_init(&g_lock, NULL);
}

static void open_node(const char *name, int *fd)
{
	char path[PATH_MAX];
	const char *sock = socket_path();
	const char *slash = strrchr(sock, '/');
	int dirlen = slash ? (int)(slash - sock) : 1;

	snprintf(path, sizeof(path), "%.*s/%s", dirlen, slash ? sock : ".", name);
	*fd = open(path, O_RDWR | O_CLOEXEC);
}

CUAPI CUresult cuInit(unsigned int flags)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct fg_req req = { .op = FG_OP_HELLO };
	struct fg_resp resp;
	struct timeval tv = { 10, 0 };
	const char *mode = getenv("FAKEGPU_MODE");
	const char *sync = getenv("FAKEGPU_SYNC");
	CUresult r = CUDA_SUCCESS;

	if (flags != 0)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&g_lock);
	if (g_init)
		goto out;
	if (!g_atfork) {
		pthread_atfork(NULL, NULL, atfork_child);
		g_atfork = 1;
	}
	g_nouveau = mode && !strcmp(mode, "nouveau");
	g_spin = sync && !strcmp(sync, "spin");
	g_sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	strncpy(sa.sun_path, socket_path(), sizeof(sa.sun_path) - 1);
	if (g_sock < 0 || connect(g_sock, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		r = CUDA_ERROR_NO_DEVICE;
		goto fail;
	}
	setsockopt(g_sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	if (rpc(&req, &resp, NULL, 0) < 0 || resp.status != 0 || resp.val0 == 0) {
		r = CUDA_ERROR_NO_DEVICE;
		goto fail;
	}
	g_ngpus = (uint32_t)resp.val0;
	g_mem = resp.val1;
	if (g_nouveau) {
		open_node("renderD128", &g_drmfd);
	} else {
		open_node("nvidiactl", &g_nvfd);
		g_hclient = 0xc1e00000u | ((uint32_t)getpid() & 0xffff);
		nv_alloc21(0, g_hclient, NV01_ROOT_CLIENT, NULL, 0);
	}
	g_init = 1;
	goto out;
fail:
	if (g_sock >= 0)
		close(g_sock);
	g_sock = -1;
out:
	pthread_mutex_unlock(&g_lock);
	return r;
}

CUAPI CUresult cuDriverGetVersion(int *v)
{
	if (!v)
		return CUDA_ERROR_INVALID_VALUE;
	*v = 12040;
	return CUDA_SUCCESS;
}

#define REQUIRE_INIT()                                   \
	do {                                             \
		if (!__atomic_load_n(&g_init, __ATOMIC_ACQUIRE)) \
			return CUDA_ERROR_NOT_INITIALIZED; \
	} while (0)

CUAPI CUresult cuDeviceGetCount(int *count)
{
	REQUIRE_INIT();
	if (!count)
		return CUDA_ERROR_INVALID_VALUE;
	*count = (int)g_ngpus;
	return CUDA_SUCCESS;
}

CUAPI CUresult cuDeviceGet(CUdevice *dev, int ordinal)
{
	REQUIRE_INIT();
	if (!dev)
		return CUDA_ERROR_INVALID_VALUE;
	if (ordinal < 0 || (uint32_t)ordinal >= g_ngpus)
		return CUDA_ERROR_INVALID_DEVICE;
	*dev = ordinal;
	return CUDA_SUCCESS;
}

CUAPI CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
	REQUIRE_INIT();
	if (!name || len <= 0)
		return CUDA_ERROR_INVALID_VALUE;
	if (dev < 0 || (uint32_t)dev >= g_ngpus)
		return CUDA_ERROR_INVALID_DEVICE;
	snprintf(name, (size_t)len, "fakegpu Simulated GPU %d", dev);
	return CUDA_SUCCESS;
}

/* CUdevice_attribute values this device answers. */
enum {
	ATTR_MAX_THREADS_PER_BLOCK = 1,
	ATTR_WARP_SIZE = 10,
	ATTR_CLOCK_RATE = 13,
	ATTR_MULTIPROCESSOR_COUNT = 16,
	ATTR_COMPUTE_CAPABILITY_MAJOR = 75,
	ATTR_COMPUTE_CAPABILITY_MINOR = 76,
};

CUAPI CUresult cuDeviceGetAttribute(int *pi, int attrib, CUdevice dev)
{
	REQUIRE_INIT();
	if (!pi)
		return CUDA_ERROR_INVALID_VALUE;
	if (dev < 0 || (uint32_t)dev >= g_ngpus)
		return CUDA_ERROR_INVALID_DEVICE;
	switch (attrib) {
	case ATTR_MAX_THREADS_PER_BLOCK: *pi = 1024; break;
	case ATTR_WARP_SIZE: *pi = 32; break;
	case ATTR_CLOCK_RATE: *pi = 1755000; break;
	case ATTR_MULTIPROCESSOR_COUNT: *pi = 132; break;
	case ATTR_COMPUTE_CAPABILITY_MAJOR: *pi = 9; break;
	case ATTR_COMPUTE_CAPABILITY_MINOR: *pi = 0; break;
	default: return CUDA_ERROR_INVALID_VALUE;
	}
	return CUDA_SUCCESS;
}

/* ---- contexts ---- */

static struct ctx *current_ctx(void)
{
	return obj_get(t_current, T_CTX);
}

static int alloc_channel(struct ctx *c)
{
	for (int i = 0; i < FG_MAX_CHANNELS; i++) {
		if (!c->chan_used[i]) {
			c->chan_used[i] = 1;
			__atomic_store_n(&c->shm->ch[i].active, 1, __ATOMIC_RELEASE);
			channel_setup_ioctls(c, i);
			return i;
		}
	}
	return -1;
}

static void release_channel(struct ctx *c, int ch)
{
	channel_teardown_ioctls(c, ch);
	__atomic_store_n(&c->shm->ch[ch].active, 0, __ATOMIC_RELEASE);
	c->chan_used[ch] = 0;
}

CUAPI CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
	struct fg_req req = { .op = FG_OP_CTX_CREATE };
	struct fg_resp resp;
	int fds[2] = { -1, -1 };
	struct ctx *c;
	struct stream *s;
	CUresult r = CUDA_SUCCESS;
	uint64_t h;

	REQUIRE_INIT();
	if (!pctx || flags > 0x3f)
		return CUDA_ERROR_INVALID_VALUE;
	if (dev < 0 || (uint32_t)dev >= g_ngpus)
		return CUDA_ERROR_INVALID_DEVICE;
	c = calloc(1, sizeof(*c));
	s = calloc(1, sizeof(*s));
	if (!c || !s) {
		free(c);
		free(s);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	pthread_mutex_lock(&g_lock);
	req.gpu = (uint32_t)dev;
	if (rpc(&req, &resp, fds, 2) < 0) {
		r = CUDA_ERROR_DEVICE_UNAVAILABLE;
		goto fail;
	}
	if (resp.status != 0) {
		r = resp.status;
		goto fail;
	}
	if (fds[0] < 0 || fds[1] < 0) {
		r = CUDA_ERROR_UNKNOWN;
		goto fail;
	}
	c->shm = mmap(NULL, sizeof(struct fg_ctx_shm), PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
	c->db = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fds[1], 0);
	close(fds[0]);
	close(fds[1]);
	if (c->shm == MAP_FAILED || c->db == MAP_FAILED || c->shm->magic != FG_MAGIC_CTX || c->db->magic != FG_MAGIC_DB) {
		r = CUDA_ERROR_UNKNOWN;
		goto fail;
	}
	c->id = resp.val0;
	c->dev = dev;
	if (!g_nouveau) {
		NV0080_ALLOC_PARAMETERS dp = { .deviceId = (uint32_t)dev };
		NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS tp = { 0 };

		c->h_device = new_handle();
		c->h_vaspace = new_handle();
		c->h_tsg = new_handle();
		nv_alloc21(g_hclient, c->h_device, NV01_DEVICE_0, &dp, sizeof(dp));
		nv_alloc21(c->h_device, c->h_vaspace, FERMI_VASPACE_A, NULL, 0);
		tp.hVASpace = c->h_vaspace;
		tp.engineType = NV2080_ENGINE_TYPE_GR0;
		nv_alloc21(c->h_device, c->h_tsg, KEPLER_CHANNEL_GROUP_A, &tp, sizeof(tp));
	}
	s->ctx = c;
	s->ch = alloc_channel(c);
	h = obj_new(T_CTX, c);
	s->ctx_handle = (CUcontext)(uintptr_t)h;
	c->null_stream = (CUstream)(uintptr_t)obj_new(T_STREAM, s);
	if (!h || !c->null_stream) {
		r = CUDA_ERROR_OUT_OF_MEMORY;
		goto fail;
	}
	*pctx = (CUcontext)(uintptr_t)h;
	t_current = *pctx;
	pthread_mutex_unlock(&g_lock);
	return CUDA_SUCCESS;
fail:
	pthread_mutex_unlock(&g_lock);
	free(s);
	free(c);
	return r;
}

CUAPI CUresult cuCtxDestroy_v2(CUcontext ctx)
{
	struct fg_req req = { .op = FG_OP_CTX_DESTROY };
	struct fg_resp resp;
	struct ctx *c;

	REQUIRE_INIT();
	pthread_mutex_lock(&g_lock);
	c = obj_get(ctx, T_CTX);
	if (!c) {
		pthread_mutex_unlock(&g_lock);
		return CUDA_ERROR_INVALID_CONTEXT;
	}
	/* Release every object of the context. */
	for (uint32_t i = 0; i < MAX_OBJS; i++) {
		struct obj *o = &g_objs[i];

		if (o->type == T_STREAM && ((struct stream *)o->p)->ctx == c) {
			struct stream *s = o->p;

			free(s->capture ? s->capture->nodes : NULL);
			free(s->capture);
			free(s);
			o->type = T_FREE;
		} else if (o->type == T_EVENT && ((struct event *)o->p)->ctx == c) {
			free(o->p);
			o->type = T_FREE;
		}
	}
	for (int i = FG_MAX_CHANNELS - 1; i >= 0; i--)
		if (c->chan_used[i])
			release_channel(c, i);
	if (!g_nouveau) {
		nv_free(c->h_device, c->h_tsg);
		nv_free(c->h_device, c->h_vaspace);
		nv_free(g_hclient, c->h_device);
	}
	req.arg0 = c->id;
	rpc(&req, &resp, NULL, 0);
	munmap(c->shm, sizeof(struct fg_ctx_shm));
	munmap(c->db, 4096);
	obj_free(ctx);
	free(c);
	if (t_current == ctx)
		t_current = NULL;
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
	}
	t_current = ctx;
	return CUDA_SUCCESS;
}

CUAPI CUresult cuCtxGetCurrent(CUcontext *pctx)
{
	REQUIRE_INIT();
	if (!pctx)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&g_lock);
	*pctx = obj_get(t_current, T_CTX) ? t_current : NULL;
	pthread_mutex_unlock(&g_lock);
	return CUDA_SUCCESS;
}

CUAPI CUresult cuCtxSynchronize(void)
{
	struct ctx *c;
	uint64_t target[FG_MAX_CHANNELS];
	uint8_t used[FG_MAX_CHANNELS];

	REQUIRE_INIT();
	pthread_mutex_lock(&g_lock);
	c = current_ctx();
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
	return CUDA_SUCCESS;
}

/* ---- streams ---- */

/* Resolves a stream handle (NULL: the current context's default stream). */
static struct stream *get_stream(CUstream h, CUresult *err)
{
	struct stream *s;

	if (!h) {
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

CUAPI CUresult cuStreamCreate(CUstream *ps, unsigned int flags)
{
	struct ctx *c;
	struct stream *s;
	uint64_t h;

	REQUIRE_INIT();
	if (!ps || flags > 1)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&g_lock);
	c = current_ctx();
	if (!c) {
		pthread_mutex_unlock(&g_lock);
		return CUDA_ERROR_INVALID_CONTEXT;
	}
	s = calloc(1, sizeof(*s));
	if (!s || (s->ch = alloc_channel(c)) < 0) {
		pthread_mutex_unlock(&g_lock);
		free(s);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	s->ctx = c;
	s->ctx_handle = t_current;
	h = obj_new(T_STREAM, s);
	if (!h) {
		release_channel(c, s->ch);
		pthread_mutex_unlock(&g_lock);
		free(s);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	*ps = (CUstream)(uintptr_t)h;
	pthread_mutex_unlock(&g_lock);
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
	pthread_mutex_unlock(&g_lock);
	free(s->capture ? s->capture->nodes : NULL);
	free(s->capture);
	free(s);
	return r == CUDA_ERROR_DEVICE_UNAVAILABLE ? r : CUDA_SUCCESS;
}

CUAPI CUresult cuStreamSynchronize(CUstream h)
{
	struct stream *s;
	CUresult r = CUDA_SUCCESS;

	REQUIRE_INIT();
	pthread_mutex_lock(&g_lock);
	s = get_stream(h, &r);
	if (s && s->capture)
		r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
	pthread_mutex_unlock(&g_lock);
	if (r)
		return r;
	return sync_channel(s->ctx, s->ch);
}

CUAPI CUresult cuStreamQuery(CUstream h)
{
	struct stream *s;
	CUresult r = CUDA_SUCCESS;
	struct fg_channel *fc;

	REQUIRE_INIT();
	pthread_mutex_lock(&g_lock);
	s = get_stream(h, &r);
	pthread_mutex_unlock(&g_lock);
	if (r)
		return r;
	fc = &s->ctx->shm->ch[s->ch];
	if (device_gone(s->ctx))
		return CUDA_ERROR_DEVICE_UNAVAILABLE;
	return __atomic_load_n(&fc->gp_get, __ATOMIC_ACQUIRE) >= fc->gp_put ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
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
	e->ctx_handle = t_current;
	*pe = (CUevent)(uintptr_t)h;
	pthread_mutex_unlock(&g_lock);
	return CUDA_SUCCESS;
}

CUAPI CUresult cuEventRecord(CUevent he, CUstream hs)
{
	struct event *e;
	struct stream *s;
	CUresult r = CUDA_SUCCESS;

	REQUIRE_INIT();
	pthread_mutex_lock(&g_lock);
	e = obj_get(he, T_EVENT);
	if (!e)
		r = CUDA_ERROR_INVALID_HANDLE;
	s = r ? NULL : get_stream(hs, &r);
	if (!r && s->ctx != e->ctx)
		r = CUDA_ERROR_INVALID_CONTEXT;
	if (!r && s->capture)
		r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
	if (!r) {
		__atomic_store_n(&e->ctx->shm->event_ts[e->slot], 0, __ATOMIC_RELEASE);
		e->ch = s->ch;
		e->seq = s->ctx->shm->ch[s->ch].gp_put;
		e->recorded = 1;
	}
	pthread_mutex_unlock(&g_lock);
	if (r)
		return r;
	return submit(s->ctx, s->ch, FG_ENTRY_MARKER, 0, 0, e->slot);
}

CUAPI CUresult cuEventSynchronize(CUevent he)
{
	struct event *e;
	struct event copy;

	REQUIRE_INIT();
	pthread_mutex_lock(&g_lock);
	e = obj_get(he, T_EVENT);
	if (e)
		copy = *e;
	pthread_mutex_unlock(&g_lock);
	if (!e)
		return CUDA_ERROR_INVALID_HANDLE;
	if (!copy.recorded)
		return CUDA_SUCCESS;
	nouveau_wait_ioctl(copy.ctx, copy.ch);
	return wait_channel(copy.ctx, copy.ch, copy.seq + 1);
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

/* ---- modules and kernels ---- */

/* Parses the text image: one `kernel NAME ns_per_block N` per line; blank
 * lines and lines starting with # are ignored. */
static int parse_image(const char *img, struct module *m)
{
	const char *p = img;
	size_t total = 0;

	while (*p) {
		const char *eol = strchr(p, '\n');
		size_t len = eol ? (size_t)(eol - p) : strlen(p);
		char line[256], name[64], kw1[16], kw2[16], extra[2];
		unsigned long long ns;
		int n;

		total += len + 1;
		if (total > (1u << 20) || len >= sizeof(line))
			return -1;
		memcpy(line, p, len);
		line[len] = 0;
		p = eol ? eol + 1 : p + len;
		if (line[strspn(line, " \t\r")] == 0 || line[strspn(line, " \t")] == '#')
			continue;
		n = sscanf(line, "%15s %63s %15s %llu %1s", kw1, name, kw2, &ns, extra);
		if (n != 4 || strcmp(kw1, "kernel") || strcmp(kw2, "ns_per_block") || m->n >= MAX_FUNCS)
			return -1;
		snprintf(m->funcs[m->n].name, sizeof(m->funcs[m->n].name), "%s", name);
		m->funcs[m->n].ns_per_block = ns;
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

static int graph_add(struct graph *g, uint32_t kind, uint64_t cost, uint64_t bytes)
{
	if (g->n == g->cap) {
		size_t cap = g->cap ? g->cap * 2 : 16;
		struct node *n = realloc(g->nodes, cap * sizeof(*n));

		if (!n || cap > (1u << 20))
			return -1;
		g->nodes = n;
		g->cap = cap;
	}
	g->nodes[g->n++] = (struct node){ kind, cost, bytes };
	return 0;
}

static CUresult launch(CUfunction hf, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
		       unsigned bz, CUstream hs)
{
	struct func *f;
	struct stream *s;
	CUresult r = CUDA_SUCCESS;
	unsigned __int128 cost;
	uint64_t ns;

	REQUIRE_INIT();
	if (!gx || !gy || !gz || !bx || !by || !bz || (uint64_t)bx * by * bz > 1024)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&g_lock);
	f = obj_get(hf, T_FUNC);
	if (!f)
		r = CUDA_ERROR_INVALID_HANDLE;
	s = r ? NULL : get_stream(hs, &r);
	if (r) {
		pthread_mutex_unlock(&g_lock);
		return r;
	}
	cost = (unsigned __int128)gx * gy * gz * f->ns_per_block;
	ns = cost > (unsigned __int128)60000000000ull ? 60000000000ull : (uint64_t)cost;
	if (s->capture) {
		r = graph_add(s->capture, FG_ENTRY_KERNEL, ns, 0) ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_SUCCESS;
		pthread_mutex_unlock(&g_lock);
		return r;
	}
	pthread_mutex_unlock(&g_lock);
	return submit(s->ctx, s->ch, FG_ENTRY_KERNEL, ns, 0, FG_NO_EVENT);
}

CUAPI CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
			      unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
			      unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra)
{
	(void)sharedMemBytes;
	(void)kernelParams;
	(void)extra;
	return launch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, hStream);
}

CUAPI CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra)
{
	(void)kernelParams;
	(void)extra;
	if (!config)
		return CUDA_ERROR_INVALID_VALUE;
	return launch(f, config->gridDimX, config->gridDimY, config->gridDimZ, config->blockDimX, config->blockDimY,
		      config->blockDimZ, config->hStream);
}

/* ---- graphs ---- */

CUAPI CUresult cuStreamBeginCapture_v2(CUstream hs, int mode)
{
	struct stream *s;
	CUresult r = CUDA_SUCCESS;

	REQUIRE_INIT();
	if (mode < 0 || mode > 2)
		return CUDA_ERROR_INVALID_VALUE;
	if (!hs)
		return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED; /* the legacy default stream cannot capture */
	pthread_mutex_lock(&g_lock);
	s = get_stream(hs, &r);
	if (!r && s->capture)
		r = CUDA_ERROR_ILLEGAL_STATE;
	if (!r && !(s->capture = calloc(1, sizeof(struct graph))))
		r = CUDA_ERROR_OUT_OF_MEMORY;
	pthread_mutex_unlock(&g_lock);
	return r;
}

CUAPI CUresult cuStreamEndCapture(CUstream hs, CUgraph *pg)
{
	struct stream *s;
	CUresult r = CUDA_SUCCESS;
	uint64_t h;

	REQUIRE_INIT();
	if (!pg)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&g_lock);
	s = get_stream(hs, &r);
	if (!r && !s->capture)
		r = CUDA_ERROR_ILLEGAL_STATE;
	if (!r) {
		h = obj_new(T_GRAPH, s->capture);
		if (!h) {
			r = CUDA_ERROR_OUT_OF_MEMORY;
		} else {
			*pg = (CUgraph)(uintptr_t)h;
			s->capture = NULL;
		}
	}
	pthread_mutex_unlock(&g_lock);
	return r;
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
	e = calloc(1, sizeof(*e));
	if (e && g->n) {
		e->nodes = malloc(g->n * sizeof(*e->nodes));
		if (e->nodes) {
			memcpy(e->nodes, g->nodes, g->n * sizeof(*e->nodes));
			e->n = e->cap = g->n;
		}
	}
	h = (e && (e->nodes || !g->n)) ? obj_new(T_EXEC, e) : 0;
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

CUAPI CUresult cuGraphLaunch(CUgraphExec he, CUstream hs)
{
	struct graph *e;
	struct stream *s;
	CUresult r = CUDA_SUCCESS;
	struct graph copy;

	REQUIRE_INIT();
	pthread_mutex_lock(&g_lock);
	e = obj_get(he, T_EXEC);
	if (!e)
		r = CUDA_ERROR_INVALID_HANDLE;
	s = r ? NULL : get_stream(hs, &r);
	if (!r && s->capture)
		r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
	if (!r) {
		copy.n = e->n;
		copy.nodes = malloc((e->n ? e->n : 1) * sizeof(*copy.nodes));
		if (!copy.nodes)
			r = CUDA_ERROR_OUT_OF_MEMORY;
		else if (e->n)
			memcpy(copy.nodes, e->nodes, e->n * sizeof(*copy.nodes));
	}
	pthread_mutex_unlock(&g_lock);
	if (r)
		return r;
	for (size_t i = 0; i < copy.n && !r; i++)
		r = submit(s->ctx, s->ch, copy.nodes[i].kind, copy.nodes[i].cost_ns, copy.nodes[i].bytes, FG_NO_EVENT);
	free(copy.nodes);
	return r;
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

/* ---- memory ---- */

CUAPI CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes)
{
	struct fg_req req = { .op = FG_OP_MEM_ALLOC };
	struct fg_resp resp;
	struct ctx *c;
	CUresult r = CUDA_SUCCESS;

	REQUIRE_INIT();
	if (!dptr || !bytes)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&g_lock);
	c = current_ctx();
	if (!c) {
		r = CUDA_ERROR_INVALID_CONTEXT;
	} else if (c->nallocs >= MAX_ALLOCS) {
		r = CUDA_ERROR_OUT_OF_MEMORY;
	} else {
		req.arg0 = c->id;
		req.arg1 = bytes;
		if (rpc(&req, &resp, NULL, 0) < 0)
			r = CUDA_ERROR_DEVICE_UNAVAILABLE;
		else if (resp.status)
			r = resp.status;
		else {
			c->allocs[c->nallocs++] = (struct alloc){ resp.val0, bytes };
			*dptr = resp.val0;
		}
	}
	pthread_mutex_unlock(&g_lock);
	return r;
}

CUAPI CUresult cuMemFree_v2(CUdeviceptr dptr)
{
	struct fg_req req = { .op = FG_OP_MEM_FREE };
	struct fg_resp resp;
	struct ctx *c;
	CUresult r = CUDA_ERROR_INVALID_VALUE;

	REQUIRE_INIT();
	pthread_mutex_lock(&g_lock);
	c = current_ctx();
	if (!c) {
		r = CUDA_ERROR_INVALID_CONTEXT;
	} else {
		for (int i = 0; i < c->nallocs; i++) {
			if (c->allocs[i].addr != dptr)
				continue;
			req.arg0 = c->id;
			req.arg1 = dptr;
			if (rpc(&req, &resp, NULL, 0) < 0) {
				r = CUDA_ERROR_DEVICE_UNAVAILABLE;
				break;
			}
			c->allocs[i] = c->allocs[--c->nallocs];
			r = resp.status;
			break;
		}
	}
	pthread_mutex_unlock(&g_lock);
	return r;
}

/* Checks [p, p+n) lies inside one allocation of c. */
static int in_alloc(struct ctx *c, CUdeviceptr p, size_t n)
{
	for (int i = 0; i < c->nallocs; i++) {
		struct alloc *a = &c->allocs[i];

		if (p >= a->addr && n <= a->bytes && p - a->addr <= a->bytes - n)
			return 1;
	}
	return 0;
}

/* A copy or memset on the copy engine; sync waits for it. */
static CUresult copy_op(CUdeviceptr dev, const void *host, size_t n, CUstream hs, int need_host, int sync)
{
	struct stream *s;
	CUresult r = CUDA_SUCCESS;

	REQUIRE_INIT();
	if (!n || (need_host && !host))
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&g_lock);
	s = get_stream(sync ? NULL : hs, &r);
	if (!r && !in_alloc(s->ctx, dev, n))
		r = CUDA_ERROR_INVALID_VALUE;
	if (!r && s->capture) {
		r = graph_add(s->capture, FG_ENTRY_COPY, 0, n) ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_SUCCESS;
		pthread_mutex_unlock(&g_lock);
		return r;
	}
	pthread_mutex_unlock(&g_lock);
	if (r)
		return r;
	r = submit(s->ctx, s->ch, FG_ENTRY_COPY, 0, n, FG_NO_EVENT);
	if (r || !sync)
		return r;
	return sync_channel(s->ctx, s->ch);
}

CUAPI CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n)
{
	return copy_op(dst, src, n, NULL, 1, 1);
}

CUAPI CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n)
{
	return copy_op(src, dst, n, NULL, 1, 1);
}

CUAPI CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream hs)
{
	return copy_op(dst, src, n, hs, 1, 0);
}

CUAPI CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream hs)
{
	return copy_op(src, dst, n, hs, 1, 0);
}

CUAPI CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char uc, size_t n)
{
	(void)uc;
	return copy_op(dst, NULL, n, NULL, 0, 1);
}

CUAPI CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char uc, size_t n, CUstream hs)
{
	(void)uc;
	return copy_op(dst, NULL, n, hs, 0, 0);
}

/* ---- errors ---- */

static const struct {
	CUresult code;
	const char *name, *text;
} errs[] = {
	{ CUDA_SUCCESS, "CUDA_SUCCESS", "no error" },
	{ CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument" },
	{ CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory" },
	{ CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error" },
	{ CUDA_ERROR_DEINITIALIZED, "CUDA_ERROR_DEINITIALIZED", "driver shutting down" },
	{ CUDA_ERROR_DEVICE_UNAVAILABLE, "CUDA_ERROR_DEVICE_UNAVAILABLE", "CUDA-capable device(s) is/are busy or unavailable" },
	{ CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected" },
	{ CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal" },
	{ CUDA_ERROR_INVALID_IMAGE, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid" },
	{ CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context" },
	{ CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle" },
	{ CUDA_ERROR_ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE", "the operation cannot be performed in the present state" },
	{ CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found" },
	{ CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready" },
	{ CUDA_ERROR_LAUNCH_FAILED, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure" },
	{ CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", "operation not permitted when stream is capturing" },
	{ CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED", "operation failed due to a previous error during capture" },
	{ CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error" },
};

CUAPI CUresult cuGetErrorString(CUresult e, const char **p)
{
	if (!p)
		return CUDA_ERROR_INVALID_VALUE;
	for (size_t i = 0; i < sizeof(errs) / sizeof(errs[0]); i++) {
		if (errs[i].code == e) {
			*p = errs[i].text;
			return CUDA_SUCCESS;
		}
	}
	*p = NULL;
	return CUDA_ERROR_INVALID_VALUE;
}

CUAPI CUresult cuGetErrorName(CUresult e, const char **p)
{
	if (!p)
		return CUDA_ERROR_INVALID_VALUE;
	for (size_t i = 0; i < sizeof(errs) / sizeof(errs[0]); i++) {
		if (errs[i].code == e) {
			*p = errs[i].name;
			return CUDA_SUCCESS;
		}
	}
	*p = NULL;
	return CUDA_ERROR_INVALID_VALUE;
}
