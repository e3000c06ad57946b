/* Internals shared by the parts of the simulated GPU's libcuda.so.1: CUDA
 * types as the driver API declares them, the checked handle table, the
 * objects behind handles, and the helpers every part uses (setup socket,
 * nvidia/nouveau ioctls, submission and completion). */
#ifndef FAKEGPU_LIBCUDA_INTERNAL_H
#define FAKEGPU_LIBCUDA_INTERNAL_H

#define _GNU_SOURCE
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "fakegpu_abi.h"

#define CUAPI __attribute__((visibility("default")))

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long cuuint64_t;
typedef unsigned int cuuint32_t;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphExec_st *CUgraphExec;
typedef void (*CUhostFn)(void *userData);

/* The special stream handles of cuda.h. */
#define CU_STREAM_LEGACY ((CUstream)0x1)
#define CU_STREAM_PER_THREAD ((CUstream)0x2)

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

/* The highest CUlaunchAttributeID this library knows (CUDA 13). */
#define CU_LAUNCH_ATTRIBUTE_MAX 20

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
	CUDA_ERROR_CONTEXT_ALREADY_CURRENT = 202,
	CUDA_ERROR_INVALID_HANDLE = 400,
	CUDA_ERROR_ILLEGAL_STATE = 401,
	CUDA_ERROR_NOT_FOUND = 500,
	CUDA_ERROR_NOT_READY = 600,
	CUDA_ERROR_LAUNCH_FAILED = 719,
	CUDA_ERROR_NOT_SUPPORTED = 801,
	CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900,
	CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901,
	CUDA_ERROR_STREAM_CAPTURE_UNMATCHED = 903,
	CUDA_ERROR_STREAM_CAPTURE_UNJOINED = 904,
	CUDA_ERROR_STREAM_CAPTURE_ISOLATION = 905,
	CUDA_ERROR_CAPTURED_EVENT = 907,
	CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE = 910,
	CUDA_ERROR_UNKNOWN = 999,
};

/* ---- objects and handles ---- */

enum obj_type { T_FREE = 0, T_CTX, T_STREAM, T_EVENT, T_MODULE, T_FUNC, T_GRAPH, T_EXEC };

#define MAX_OBJS 16384
#define MAX_ALLOCS 4096
#define MAX_FUNCS 256
#define MAX_DEVICES 64

/* One node of a captured graph: a ring entry to write at each launch. */
struct node {
	uint32_t kind;
	uint64_t cost_ns;
	uint64_t bytes;
	uint64_t a0, a1;
};

struct graph {
	struct node *nodes;
	size_t n, cap;
};

struct alloc {
	CUdeviceptr addr;
	size_t bytes;
	uint32_t handle; /* its RM memory object (0: none: carved from a chunk, or an IPC opening) */
	int chunk;       /* the chunk it was carved from; -1: a device allocation of its own */
};

/* A device allocation of CHUNK_BYTES that small allocations are carved
 * from, as libcuda sub-allocates them: returned to the device when the
 * last allocation carved from it is freed. */
struct chunk {
	CUdeviceptr addr;
	size_t used; /* bytes carved so far (bump allocation) */
	int live;    /* allocations carved from it not freed yet; -1: the slot is free */
	uint32_t handle;
};

/* A block the stream-ordered pool keeps after cuMemFreeAsync: still the
 * device's until the context's next synchronization releases it, and
 * reused by a cuMemAllocAsync of its size before that. */
struct pooled {
	CUdeviceptr addr;
	size_t size;
	uint32_t handle;
};

#define MAX_CHUNKS 256
#define MAX_POOLED 256

struct ctx {
	uint64_t id;
	int dev;
	unsigned flags;
	struct fg_ctx_shm *shm;
	struct fg_doorbell *db;
	uint8_t chan_used[FG_MAX_CHANNELS];
	uint8_t ev_used[FG_MAX_EVENTS];
	uint32_t h_device, h_subdevice, h_vaspace, h_tsg, h_chan[FG_MAX_CHANNELS];
	int drm_channel;
	CUstream null_stream;
	struct alloc allocs[MAX_ALLOCS];
	int nallocs;
	struct chunk chunks[MAX_CHUNKS];
	int nchunks; /* slots used, free ones (live -1) included */
	struct pooled pool[MAX_POOLED];
	int npooled;
};

struct stream {
	struct ctx *ctx;
	CUcontext ctx_handle;
	int ch;
	unsigned flags;
	struct graph *capture;
	const void *capture_into; /* the CUgraph captured into (cuStreamBeginCaptureToGraph); NULL: a new one */
	/* A multi-stream capture: the origin began it; other streams join it by
	 * waiting on an event recorded in it (a fork) and must be joined back
	 * (a capturing stream waits on an event recorded after their last node)
	 * before the origin ends it. */
	int capture_origin;
	int capture_joined;
	uint64_t capture_nodes; /* nodes this stream added to its capture */
};

struct event {
	struct ctx *ctx;
	CUcontext ctx_handle;
	uint32_t slot;
	int ch;
	uint64_t seq;
	int recorded;
	/* Recorded in a stream capture: a point in the graph (after the
	 * recording stream's capture_mark-th node), not a record on the device;
	 * capture is cleared when the capture ends, captured when it is recorded
	 * again outside one. */
	int captured;
	struct graph *capture;
	struct stream *capture_from;
	uint64_t capture_mark;
};

/* A kernel of a loaded module. Its GPU time per launch is
 * grid × ns_per_block + ns_per_launch, each launch scaled by a factor
 * drawn within ±jitter. */
struct func {
	char name[64];
	uint64_t ns_per_block;
	uint64_t ns_per_launch;
	double jitter;
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

extern pthread_mutex_t g_lock;
extern struct obj g_objs[MAX_OBJS];
extern int g_init;
extern int g_nouveau;
extern uint32_t g_ngpus;
extern uint32_t g_gpu[MAX_DEVICES];
extern uint64_t g_mem;
extern int g_driver_version;

#define REQUIRE_INIT()                                           \
	do {                                                     \
		if (!__atomic_load_n(&g_init, __ATOMIC_ACQUIRE)) \
			return CUDA_ERROR_NOT_INITIALIZED;       \
	} while (0)

/* obj_new, obj_get and obj_free run under g_lock. */
uint64_t obj_new(int type, void *p);
void *obj_get(const void *handle, int type);
void obj_free(const void *handle);

/* Setup socket. rpc sends a request and reads the response (and nfds
 * file descriptors); rpc_control sends an RM control to fakegpud. */
struct fg_resp;
int rpc(struct fg_req *req, struct fg_resp *resp, int *fds, int nfds);
uint32_t rpc_control(uint32_t object, uint32_t cmd, void *params, uint32_t size);

/* nvidia and nouveau ioctls, issued as a real host's libcuda does. */
uint32_t new_handle(void);
extern uint32_t g_hclient;
void nv_alloc21(uint32_t parent, uint32_t handle, uint32_t cls, void *params);
void nv_alloc64_xfer(uint32_t parent, uint32_t handle, uint32_t cls, void *params);
void nv_control(uint32_t object, uint32_t cmd, void *params, uint32_t size);
void nv_free(uint32_t parent, uint32_t handle);
/* The nvidia-uvm node, opened at cuInit as the real libcuda opens
 * /dev/nvidia-uvm (-1: none). */
int nv_uvm_fd(void);
uint32_t nv_alloc_memory(uint32_t device, uint64_t bytes, uint32_t status, int host);
void channel_setup_ioctls(struct ctx *c, int ch);
void channel_teardown_ioctls(struct ctx *c, int ch);
void nouveau_wait_ioctl(struct ctx *c, int ch);

/* Submission and completion. */
CUresult submit(struct ctx *c, int ch, uint32_t kind, uint64_t cost, uint64_t bytes, uint32_t ev, uint64_t a0,
		uint64_t a1);
CUresult wait_channel(struct ctx *c, int ch, uint64_t target);
CUresult sync_channel(struct ctx *c, int ch);
int device_gone(struct ctx *c);
void ring_doorbell(struct ctx *c);
uint64_t monotonic_ns(void);

/* Contexts and streams (context.c). current_ctx runs under g_lock.
 * get_stream resolves a stream handle: NULL is the legacy default stream,
 * or with per_thread the calling thread's own default stream. */
struct ctx *current_ctx(void);
CUcontext current_handle(void);
struct stream *get_stream(CUstream h, int per_thread, CUresult *err);
int alloc_channel(struct ctx *c);
void release_channel(struct ctx *c, int ch);

/* Host functions (kernel.c): run by a thread once the work before them
 * ran; host_forget drops those of a context being destroyed. */
CUresult host_func(struct stream *s, CUhostFn fn, void *data);
void host_forget(struct ctx *c);

/* Memory (memory.c). */
int in_alloc(struct ctx *c, CUdeviceptr p, size_t n);
/* Releases what c's stream-ordered pool keeps (at a synchronization). */
void pool_release(struct ctx *c);
/* Frees, as RM objects, every allocation of c, pinned host memory
 * included (its destruction; under g_lock). */
void mem_release_all(struct ctx *c);

/* Graph capture (kernel.c, under g_lock): capture_add adds a node to a
 * capturing stream's graph; capture_leave takes a stream being destroyed
 * out of its capture (an origin's capture ends for every stream in it). */
int capture_add(struct stream *s, uint32_t kind, uint64_t cost, uint64_t bytes, uint64_t a0, uint64_t a1);
void capture_leave(struct stream *s);

#endif
