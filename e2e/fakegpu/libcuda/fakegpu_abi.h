/* The contract between the simulated GPU (fakegpud, Go) and its libcuda.so.1:
 * the setup protocol on the Unix socket and the shared-memory layout of a
 * context (channels with GPFIFO-like rings, completion counters, event
 * timestamps) and of a GPU's doorbell page. fakegpu/layout.go mirrors it;
 * TestABILayout checks both agree. */
#ifndef FAKEGPU_ABI_H
#define FAKEGPU_ABI_H

#include <stdint.h>

#define FG_MAGIC_CTX 0x46474358u /* "FGCX" */
#define FG_MAGIC_DB 0x46474442u  /* "FGDB" */
#define FG_VERSION 1u

#define FG_MAX_CHANNELS 32
#define FG_RING_ENTRIES 1024
#define FG_MAX_EVENTS 1024

/* Ring entry kinds. */
#define FG_ENTRY_KERNEL 1
#define FG_ENTRY_COPY 2
#define FG_ENTRY_MARKER 3

#define FG_NO_EVENT 0xffffffffu

struct fg_entry {
	uint32_t kind;
	uint32_t event; /* event slot stamped at completion, or FG_NO_EVENT */
	uint64_t cost_ns;
	uint64_t bytes;
	uint64_t seq;
};

struct fg_channel {
	uint32_t active;  /* set by the client while the stream exists */
	uint32_t done;    /* completed entries (low 32 bits); futex word */
	uint64_t gp_put;  /* entries written by the client */
	uint64_t gp_get;  /* entries completed by the device */
	uint32_t waiters; /* clients sleeping on done */
	uint32_t pad[9];
	struct fg_entry ring[FG_RING_ENTRIES];
};

struct fg_ctx_shm {
	uint32_t magic;
	uint32_t version;
	uint32_t dead; /* the device went away */
	uint32_t pad;
	uint64_t event_ts[FG_MAX_EVENTS]; /* CLOCK_MONOTONIC ns of completion, 0 = pending */
	uint8_t pad2[48];
	struct fg_channel ch[FG_MAX_CHANNELS];
};

/* One page per GPU, shared by every context on it. */
struct fg_doorbell {
	uint32_t magic;
	uint32_t version;
	uint32_t ring;     /* the doorbell: clients add 1 after advancing gp_put; futex word */
	uint32_t sleeping; /* the device idles on the futex: wake it */
	uint32_t dead;
};

/* Setup protocol: fixed-size requests and responses on a SOCK_STREAM socket.
 * CTX_CREATE answers with two fds (SCM_RIGHTS): context shm, doorbell page. */
enum fg_op {
	FG_OP_HELLO = 1,      /* -> val0 gpus, val1 memory bytes per gpu, val2 copy bytes/s */
	FG_OP_CTX_CREATE = 2, /* gpu -> val0 context id; fds */
	FG_OP_CTX_DESTROY = 3,/* arg0 ctx */
	FG_OP_MEM_ALLOC = 4,  /* arg0 ctx, arg1 bytes -> val0 device address */
	FG_OP_MEM_FREE = 5,   /* arg0 ctx, arg1 address -> val0 bytes */
	FG_OP_STATS = 6,      /* arg0 1=reset -> val0 length of JSON that follows */
};

struct fg_req {
	uint32_t op;
	uint32_t gpu;
	uint64_t arg0;
	uint64_t arg1;
	uint64_t arg2;
	char name[32];
};

struct fg_resp {
	int32_t status; /* a CUresult */
	uint32_t pad;
	uint64_t val0;
	uint64_t val1;
	uint64_t val2;
};

#endif
