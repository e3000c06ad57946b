/* libcuda.so.1 for the simulated GPU: the CUDA driver API's names and
 * signatures over fakegpud. This part holds what the others share: the
 * checked handle table, the setup socket, the nvidia and nouveau ioctls a
 * real host's libcuda issues (RM_ALLOC of a TSG and GPFIFO channels,
 * GET_WORK_SUBMIT_TOKEN, SET_TIMESLICE, RM_FREE) on the simulator's control
 * node, submission (ring entries in shared memory, GPPut, a doorbell word:
 * no system call) and completion (futex sleeps, FAKEGPU_SYNC=spin
 * busy-waits), initialisation, devices and error strings. Handles are
 * checked table entries: a bad handle is an error, never a crash. Device
 * memory contents are not simulated, only time. */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
struct obj g_objs[MAX_OBJS];
int g_init;
int g_nouveau;
/* Device memory is allocated with RM_VID_HEAP_CONTROL (FAKEGPU_ALLOC=vidheap)
 * instead of RM_ALLOC of NV01_MEMORY_LOCAL_USER. */
static int g_vidheap;
uint32_t g_ngpus;
/* g_gpu[ordinal] is the simulated GPU a CUDA device ordinal names: the
 * GPUs CUDA_VISIBLE_DEVICES lists, in its order, or all of them. */
uint32_t g_gpu[MAX_DEVICES];
uint64_t g_mem;
uint32_t g_hclient;
/* The CUDA version this driver reports (CUDA 13.0; FAKEGPU_CUDA_VERSION
 * sets another, e.g. 12040, to exercise what older drivers return). */
int g_driver_version = 13000;

static int g_atfork;
static int g_sock = -1;
static int g_nvfd = -1;
static int g_drmfd = -1;
static int g_uvmfd = -1;
static int g_spin;
static uint32_t g_next_handle = 0x5c000000;

static uint64_t make_handle(int type, uint32_t gen, uint32_t idx)
{
	return ((uint64_t)type << 56) | ((uint64_t)(gen & 0xffffff) << 32) | (idx + 1);
}

uint64_t obj_new(int type, void *p)
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

void *obj_get(const void *handle, int type)
{
	uint64_t h = (uint64_t)(uintptr_t)handle;
	uint32_t idx = (uint32_t)(h & 0xffffffff) - 1;

	if (!h || (int)(h >> 56) != type || idx >= MAX_OBJS)
		return NULL;
	if (g_objs[idx].type != type || (g_objs[idx].gen & 0xffffff) != ((h >> 32) & 0xffffff))
		return NULL;
	return g_objs[idx].p;
}

void obj_free(const void *handle)
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

static int send_all(const void *buf, size_t n)
{
	const char *p = buf;

	while (n > 0) {
		ssize_t w = send(g_sock, p, n, MSG_NOSIGNAL);

		if (w <= 0) {
			if (w < 0 && errno == EINTR)
				continue;
			return -1;
		}
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

static int recv_all(void *buf, size_t n)
{
	char *p = buf;

	while (n > 0) {
		ssize_t r = recv(g_sock, p, n, 0);

		if (r <= 0) {
			if (r < 0 && errno == EINTR)
				continue;
			return -1;
		}
		p += r;
		n -= (size_t)r;
	}
	return 0;
}

static int send_all(const void *buf, size_t n);

/* Sends a request with a file descriptor attached (SCM_RIGHTS). */
static int send_fd(struct fg_req *req, int fd)
{
	char cbuf[CMSG_SPACE(sizeof(int))];
	struct iovec iov = { .iov_base = req, .iov_len = sizeof(*req) };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf) };
	struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
	ssize_t n;

	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(c), &fd, sizeof(int));
	do {
		n = sendmsg(g_sock, &msg, MSG_NOSIGNAL);
	} while (n < 0 && errno == EINTR);
	if (n != (ssize_t)sizeof(*req))
		return n > 0 ? send_all((char *)req + n, sizeof(*req) - (size_t)n) : -1;
	return 0;
}

/* Reads one response without file descriptors. */
static int rpc_reply(struct fg_resp *resp)
{
	return recv_all(resp, sizeof(*resp));
}

int rpc(struct fg_req *req, struct fg_resp *resp, int *fds, int nfds)
{
	char cbuf[CMSG_SPACE(sizeof(int) * 2)];
	struct iovec iov = { .iov_base = resp, .iov_len = sizeof(*resp) };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
	size_t got = 0;

	if (send_all(req, sizeof(*req)) < 0)
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

/* The NV_STATUS of a control fakegpud could not be asked about. */
#define NV_ERR_GENERIC 0xffff

uint32_t rpc_control(uint32_t object, uint32_t cmd, void *params, uint32_t size)
{
	struct fg_req req = { .op = FG_OP_RM_CONTROL, .gpu = size, .arg0 = g_hclient, .arg1 = object, .arg2 = cmd };
	struct fg_resp resp;

	if (size > FG_MAX_RM_PARAMS || send_all(&req, sizeof(req)) < 0 || send_all(params, size) < 0 ||
	    recv_all(&resp, sizeof(resp)) < 0 || resp.val0 != size || recv_all(params, size) < 0)
		return NV_ERR_GENERIC;
	return (uint32_t)resp.status;
}

int device_gone(struct ctx *c)
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

#define IOC_RW 3u
#define IOC_W 1u
#define IOC(dir, type, nr, size) (((dir) << 30) | ((size) << 16) | ((type) << 8) | (nr))
#define NV_IOWR(nr, size) IOC(IOC_RW, 'F', nr, size)
#define NV_ESC_RM_FREE 0x29
#define NV_ESC_RM_CONTROL 0x2A
#define NV_ESC_RM_ALLOC 0x2B
#define NV_ESC_IOCTL_XFER_CMD 211
#define NV_ESC_RM_VID_HEAP_CONTROL 0x4A
#define NV01_ROOT_CLIENT 0x41
#define NV01_MEMORY_LOCAL_USER 0x40
#define NV01_MEMORY_SYSTEM 0x3E
#define NVOS32_FUNCTION_ALLOC_SIZE 2
#define HOPPER_CHANNEL_GPFIFO_A 0xC86F
#define NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN 0xC36F0108
#define NV2080_ENGINE_TYPE_GR0 1

typedef struct { uint32_t hRoot, hObjectParent, hObjectNew, hClass; uint64_t pAllocParms; uint32_t paramsSize, status; } NVOS21_PARAMETERS;
typedef struct { uint32_t hRoot, hObjectParent, hObjectNew, hClass; uint64_t pAllocParms, pRightsRequested; uint32_t paramsSize, flags, status; uint32_t pad; } NVOS64_PARAMETERS;
typedef struct { uint32_t hClient, hObject, cmd, flags; uint64_t params; uint32_t paramsSize, status; } NVOS54_PARAMETERS;
typedef struct { uint32_t hRoot, hObjectParent, hObjectOld, status; } NVOS00_PARAMETERS;
typedef struct { uint32_t cmd, size; uint64_t ptr; } nv_ioctl_xfer_t;
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

uint32_t new_handle(void)
{
	return ++g_next_handle;
}

/* paramsSize is 0, as the real libcuda leaves it (real-GPU check, driver
 * 580): the driver sizes a class's parameters from its class table. */
void nv_alloc21(uint32_t parent, uint32_t handle, uint32_t cls, void *params)
{
	NVOS21_PARAMETERS p = { g_hclient, parent, handle, cls, (uint64_t)(uintptr_t)params, 0, 0 };

	if (g_nvfd >= 0)
		ioctl(g_nvfd, NV_IOWR(NV_ESC_RM_ALLOC, sizeof(p)), &p);
}

/* Channel allocations go through IOCTL_XFER_CMD with NVOS64, as the driver
 * does for parameters it passes indirectly. */
void nv_alloc64_xfer(uint32_t parent, uint32_t handle, uint32_t cls, void *params)
{
	NVOS64_PARAMETERS p = { g_hclient, parent, handle, cls, (uint64_t)(uintptr_t)params, 0, 0, 0, 0, 0 };
	nv_ioctl_xfer_t x = { NV_ESC_RM_ALLOC, sizeof(p), (uint64_t)(uintptr_t)&p };

	if (g_nvfd >= 0)
		ioctl(g_nvfd, NV_IOWR(NV_ESC_IOCTL_XFER_CMD, sizeof(x)), &x);
}

/* Device memory as the driver allocates it: NVOS64 RM_ALLOC of
 * NV01_MEMORY_LOCAL_USER (NV01_MEMORY_SYSTEM for pinned host memory,
 * host) under the device, its 128-byte
 * NV_MEMORY_ALLOCATION_PARAMS with the size at byte 64 and paramsSize 0,
 * as the real libcuda sends it (or RM_VID_HEAP_CONTROL ALLOC_SIZE, the
 * size at byte 88 of NVOS32_PARAMETERS). The simulator has decided the
 * outcome already: status is what the driver writes back (0, or
 * NV_ERR_NO_MEMORY with the ioctl returning 0), and is in the parameters
 * when the ioctl returns, where the probes read it. */
uint32_t nv_alloc_memory(uint32_t device, uint64_t bytes, uint32_t status, int host)
{
	uint32_t handle = new_handle();

	if (g_nvfd < 0)
		return 0;
	if (g_vidheap && !host) {
		uint8_t p[184];

		memset(p, 0, sizeof(p));
		memcpy(p + 0, &g_hclient, 4);
		memcpy(p + 4, &device, 4);
		*(uint32_t *)(p + 8) = NVOS32_FUNCTION_ALLOC_SIZE;
		memcpy(p + 20, &status, 4);
		memcpy(p + 44, &handle, 4);
		memcpy(p + 88, &bytes, 8);
		ioctl(g_nvfd, NV_IOWR(NV_ESC_RM_VID_HEAP_CONTROL, sizeof(p)), p);
	} else {
		uint8_t params[128];
		NVOS64_PARAMETERS a = { g_hclient, device, handle, host ? NV01_MEMORY_SYSTEM : NV01_MEMORY_LOCAL_USER,
					(uint64_t)(uintptr_t)params, 0, 0, 0, status, 0 };

		memset(params, 0, sizeof(params));
		memcpy(params + 64, &bytes, 8);
		ioctl(g_nvfd, NV_IOWR(NV_ESC_RM_ALLOC, sizeof(a)), &a);
	}
	return status ? 0 : handle;
}

void nv_control(uint32_t object, uint32_t cmd, void *params, uint32_t size)
{
	NVOS54_PARAMETERS p = { g_hclient, object, cmd, 0, (uint64_t)(uintptr_t)params, size, 0 };

	if (g_nvfd >= 0)
		ioctl(g_nvfd, NV_IOWR(NV_ESC_RM_CONTROL, sizeof(p)), &p);
}

void nv_free(uint32_t parent, uint32_t handle)
{
	NVOS00_PARAMETERS p = { g_hclient, parent, handle, 0 };

	if (g_nvfd >= 0)
		ioctl(g_nvfd, NV_IOWR(NV_ESC_RM_FREE, sizeof(p)), &p);
}

void channel_setup_ioctls(struct ctx *c, int ch)
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
	struct fg_req req = { .op = FG_OP_CHANNEL };
	struct fg_resp resp;

	c->h_chan[ch] = new_handle();
	cp.gpFifoOffset = (uint64_t)(uintptr_t)&c->shm->ch[ch].ring[0];
	cp.gpFifoEntries = FG_RING_ENTRIES;
	cp.hVASpace = c->h_vaspace;
	cp.engineType = NV2080_ENGINE_TYPE_GR0;
	nv_alloc64_xfer(c->h_tsg, c->h_chan[ch], HOPPER_CHANNEL_GPFIFO_A, &cp);
	/* The simulator's token names the doorbell's channel: (context << 5) | channel. */
	tok.workSubmitToken = (uint32_t)(c->id << 5) | (uint32_t)ch;
	nv_control(c->h_chan[ch], NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN, &tok, sizeof(tok));
	/* The driver knows its channels by handle: tell the simulated one. */
	req.arg0 = c->id;
	req.arg1 = (uint64_t)ch;
	req.arg2 = c->h_chan[ch];
	rpc(&req, &resp, NULL, 0);
}

void channel_teardown_ioctls(struct ctx *c, int ch)
{
	struct fg_req req = { .op = FG_OP_CHANNEL, .arg0 = c->id, .arg1 = (uint64_t)ch };
	struct fg_resp resp;

	if (g_nouveau) {
		if (ch == 0) {
			struct drm_nouveau_channel_free f = { c->drm_channel };

			ioctl(g_drmfd, IOC(IOC_W, 'd', DRM_CMD(NOUVEAU_CHANNEL_FREE), sizeof(f)), &f);
		}
		return;
	}
	nv_free(c->h_tsg, c->h_chan[ch]);
	rpc(&req, &resp, NULL, 0);
}

void nouveau_wait_ioctl(struct ctx *c, int ch)
{
	if (g_nouveau) {
		struct drm_nouveau_gem_cpu_prep p = { (uint32_t)(c->drm_channel + ch), 0 };

		ioctl(g_drmfd, IOC(IOC_W, 'd', DRM_CMD(NOUVEAU_GEM_CPU_PREP), sizeof(p)), &p);
	}
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
CUresult wait_channel(struct ctx *c, int ch, uint64_t target)
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

/* The CLOCK_MONOTONIC time in ns, the device's clock. */
uint64_t monotonic_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Tells the device something changed (a host function ran): rings the
 * doorbell, waking the device if it sleeps. */
void ring_doorbell(struct ctx *c)
{
	__atomic_add_fetch(&c->db->ring, 1, __ATOMIC_SEQ_CST);
	if (__atomic_load_n(&c->db->sleeping, __ATOMIC_SEQ_CST))
		futex_wake(&c->db->ring);
}

/* Writes one entry on channel ch and rings the doorbell. Called without
 * g_lock; a stream is used by one thread at a time, as CUDA requires for
 * ordering. A full ring (FG_RING_ENTRIES pending) blocks the caller until
 * an entry completes, as a real stream blocks its launcher. */
CUresult submit(struct ctx *c, int ch, uint32_t kind, uint64_t cost, uint64_t bytes, uint32_t ev, uint64_t a0,
		uint64_t a1)
{
	struct fg_channel *fc = &c->shm->ch[ch];
	uint64_t put = fc->gp_put;
	struct fg_entry *e;
	int was_empty;

	if (put - __atomic_load_n(&fc->gp_get, __ATOMIC_ACQUIRE) >= FG_RING_ENTRIES) {
		CUresult r = wait_channel(c, ch, put - FG_RING_ENTRIES + 1);

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
	e->a0 = a0;
	e->a1 = a1;
	/* When the doorbell rang, for the device to start the entry then
	 * however late its thread gets a CPU: a GPU sees a doorbell at once. */
	if (!__atomic_load_n(&fc->ring_at, __ATOMIC_RELAXED))
		__atomic_store_n(&fc->ring_at, monotonic_ns(), __ATOMIC_RELAXED);
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

CUresult sync_channel(struct ctx *c, int ch)
{
	uint64_t target = c->shm->ch[ch].gp_put;

	nouveau_wait_ioctl(c, ch);
	return wait_channel(c, ch, target);
}

/* ---- init, version, devices ---- */

void forget_thread_state(void); /* context.c */

static void atfork_child(void)
{
	/* Like CUDA, a child cannot use its parent's contexts: start over. */
	if (g_sock >= 0)
		close(g_sock);
	if (g_nvfd >= 0)
		close(g_nvfd);
	if (g_drmfd >= 0)
		close(g_drmfd);
	if (g_uvmfd >= 0)
		close(g_uvmfd);
	g_sock = g_nvfd = g_drmfd = g_uvmfd = -1;
	memset(g_objs, 0, sizeof(g_objs));
	g_init = 0;
	forget_thread_state();
	pthread_mutex_init(&g_lock, NULL);
}

int nv_uvm_fd(void)
{
	return g_uvmfd;
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

/* A client handle unique on the host, as the driver hands out: the pid
 * alone repeats across pid namespaces (every container's first process
 * is 1). */
static uint32_t new_client_handle(void)
{
	uint32_t r = 0;

	if (syscall(SYS_getrandom, &r, sizeof(r), 0) != (long)sizeof(r))
		r = (uint32_t)getpid() ^ (uint32_t)time(NULL);
	return 0xc1d00000u | (r & 0xfffffu) | 1u;
}

/* visible_devices numbers the n simulated GPUs as CUDA does: the ones
 * CUDA_VISIBLE_DEVICES lists by index, in its order, up to the first entry
 * that names none (or repeats one), or all n when it is unset. It fills
 * g_gpu and returns how many ordinals there are. */
static uint32_t visible_devices(uint32_t n)
{
	const char *list = getenv("CUDA_VISIBLE_DEVICES");
	uint32_t count = 0;

	if (n > MAX_DEVICES)
		n = MAX_DEVICES;
	if (!list) {
		for (; count < n; count++)
			g_gpu[count] = count;
		return count;
	}
	while (*list && count < n) {
		char *end;
		unsigned long id = strtoul(list, &end, 10);
		int seen = 0;

		if (end == list || id >= n || (*end && *end != ','))
			break;
		for (uint32_t i = 0; i < count; i++)
			seen |= g_gpu[i] == id;
		if (seen)
			break;
		g_gpu[count++] = (uint32_t)id;
		list = *end ? end + 1 : end;
	}
	return count;
}

CUAPI CUresult cuInit(unsigned int flags)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct fg_req req = { .op = FG_OP_HELLO };
	struct fg_resp resp;
	struct timeval tv = { 10, 0 };
	const char *mode = getenv("FAKEGPU_MODE");
	const char *sync = getenv("FAKEGPU_SYNC");
	const char *ver = getenv("FAKEGPU_CUDA_VERSION");
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
	if (ver && atoi(ver) >= 11000)
		g_driver_version = atoi(ver);
	g_nouveau = mode && !strcmp(mode, "nouveau");
	g_spin = sync && !strcmp(sync, "spin");
	g_vidheap = getenv("FAKEGPU_ALLOC") && !strcmp(getenv("FAKEGPU_ALLOC"), "vidheap");
	g_sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	strncpy(sa.sun_path, socket_path(), sizeof(sa.sun_path) - 1);
	if (g_sock < 0 || connect(g_sock, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		r = CUDA_ERROR_NO_DEVICE;
		goto fail;
	}
	setsockopt(g_sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	if (g_nouveau) {
		open_node("renderD128", &g_drmfd);
	} else {
		/* The RM client is bound to the open control file it is allocated
		 * on; the simulated driver gets that file with the hello, to tell
		 * later controls on the client from strangers'. */
		open_node("nvidiactl", &g_nvfd);
		if (g_uvmfd < 0)
			open_node("nvidia-uvm", &g_uvmfd);
		g_hclient = new_client_handle();
		nv_alloc21(0, g_hclient, NV01_ROOT_CLIENT, NULL);
		req.arg0 = g_hclient;
	}
	if ((g_nvfd >= 0 ? send_fd(&req, g_nvfd) : send_all(&req, sizeof(req))) < 0 || rpc_reply(&resp) < 0 ||
	    resp.status != 0 || resp.val0 == 0) {
		r = CUDA_ERROR_NO_DEVICE;
		goto fail;
	}
	g_ngpus = visible_devices((uint32_t)resp.val0);
	if (g_ngpus == 0) {
		r = CUDA_ERROR_NO_DEVICE;
		goto fail;
	}
	g_mem = resp.val1;
	g_init = 1;
	goto out;
fail:
	if (g_sock >= 0)
		close(g_sock);
	if (g_nvfd >= 0)
		close(g_nvfd);
	if (g_drmfd >= 0)
		close(g_drmfd);
	g_sock = g_nvfd = g_drmfd = -1;
out:
	pthread_mutex_unlock(&g_lock);
	return r;
}

CUAPI CUresult cuDriverGetVersion(int *v)
{
	if (!v)
		return CUDA_ERROR_INVALID_VALUE;
	*v = g_driver_version;
	return CUDA_SUCCESS;
}

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

CUAPI CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
	REQUIRE_INIT();
	if (!bytes)
		return CUDA_ERROR_INVALID_VALUE;
	if (dev < 0 || (uint32_t)dev >= g_ngpus)
		return CUDA_ERROR_INVALID_DEVICE;
	*bytes = (size_t)g_mem;
	return CUDA_SUCCESS;
}

/* CUdevice_attribute values this device answers. */
enum {
	ATTR_MAX_THREADS_PER_BLOCK = 1,
	ATTR_WARP_SIZE = 10,
	ATTR_CLOCK_RATE = 13,
	ATTR_MULTIPROCESSOR_COUNT = 16,
	ATTR_CONCURRENT_KERNELS = 31,
	ATTR_UNIFIED_ADDRESSING = 41,
	ATTR_COMPUTE_CAPABILITY_MAJOR = 75,
	ATTR_COMPUTE_CAPABILITY_MINOR = 76,
	ATTR_CAN_USE_STREAM_MEM_OPS = 92,
	ATTR_MEMORY_POOLS_SUPPORTED = 115,
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
	case ATTR_CONCURRENT_KERNELS: *pi = 1; break;
	case ATTR_UNIFIED_ADDRESSING: *pi = 1; break;
	case ATTR_COMPUTE_CAPABILITY_MAJOR: *pi = 9; break;
	case ATTR_COMPUTE_CAPABILITY_MINOR: *pi = 0; break;
	case ATTR_CAN_USE_STREAM_MEM_OPS: *pi = 1; break;
	case ATTR_MEMORY_POOLS_SUPPORTED: *pi = 1; break;
	default: return CUDA_ERROR_INVALID_VALUE;
	}
	return CUDA_SUCCESS;
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
	{ CUDA_ERROR_CONTEXT_ALREADY_CURRENT, "CUDA_ERROR_CONTEXT_ALREADY_CURRENT", "context already current" },
	{ CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle" },
	{ CUDA_ERROR_ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE", "the operation cannot be performed in the present state" },
	{ CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found" },
	{ CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready" },
	{ CUDA_ERROR_LAUNCH_FAILED, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure" },
	{ CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported" },
	{ CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", "operation not permitted when stream is capturing" },
	{ CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED", "operation failed due to a previous error during capture" },
	{ CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED", "the capture was not initiated in this stream" },
	{ CUDA_ERROR_STREAM_CAPTURE_UNJOINED, "CUDA_ERROR_STREAM_CAPTURE_UNJOINED", "the capture sequence contains a fork that was not joined to the primary stream" },
	{ CUDA_ERROR_STREAM_CAPTURE_ISOLATION, "CUDA_ERROR_STREAM_CAPTURE_ISOLATION", "a dependency would have been created which crosses the capture sequence boundary" },
	{ CUDA_ERROR_CAPTURED_EVENT, "CUDA_ERROR_CAPTURED_EVENT", "the operation is not permitted on an event which was last recorded in a capturing stream" },
	{ CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE, "CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE", "the graph update was not performed because it included changes which violated constraints specific to instantiated graph update" },
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
