/* The contract between the simulated GPU (fakegpud, Go) and its libcuda.so.1:
 * the setup protocol on the Unix socket and the shared-memory layout of a
 * context (channels with GPFIFO-like rings, completion counters, event
 * timestamps) and of a GPU's doorbell page. fakegpu/layout.go mirrors it;
 * TestLayoutMatchesC checks both agree. */
#ifndef FAKEGPU_ABI_H
#define FAKEGPU_ABI_H

#include <stdint.h>

#define FG_MAGIC_CTX 0x46474358u /* "FGCX" */
#define FG_MAGIC_DB 0x46474442u  /* "FGDB" */
#define FG_VERSION 3u

#define FG_MAX_CHANNELS 32
#define FG_RING_ENTRIES 1024
#define FG_MAX_EVENTS 1024

/* Ring entry kinds. */
#define FG_ENTRY_KERNEL 1      /* a0: blocks (the grid) */
#define FG_ENTRY_COPY 2        /* bytes on the copy engine */
#define FG_ENTRY_MARKER 3      /* completes at once: an event record */
#define FG_ENTRY_WAIT_EVENT 4  /* a0: context id, a1: channel << 56 | entries that channel must have completed */
#define FG_ENTRY_HOST 5        /* a host function: completes once the channel's host_done passes its seq */
#define FG_ENTRY_WRITE_VALUE 6 /* a0: device address, a1: the 32-bit value written */
#define FG_ENTRY_WAIT_VALUE 7  /* a0: device address, a1: value | condition << 32 (FG_WAIT_*) */

/* Conditions of FG_ENTRY_WAIT_VALUE, as CU_STREAM_WAIT_VALUE_*. */
#define FG_WAIT_GEQ 0
#define FG_WAIT_EQ 1
#define FG_WAIT_AND 2
#define FG_WAIT_NOR 3

#define FG_NO_EVENT 0xffffffffu

struct fg_entry {
	uint32_t kind;
	uint32_t event; /* event slot stamped at completion, or FG_NO_EVENT */
	uint64_t cost_ns;
	uint64_t bytes;
	uint64_t seq;
	uint64_t a0;
	uint64_t a1;
};

struct fg_channel {
	uint32_t active;    /* set by the client while the stream exists */
	uint32_t done;      /* completed entries (low 32 bits); futex word */
	uint64_t gp_put;    /* entries written by the client */
	uint64_t gp_get;    /* entries completed by the device */
	uint32_t waiters;   /* clients sleeping on done */
	uint32_t pad0;
	uint64_t host_done; /* host functions the client has run: entries below this seq */
	uint64_t ring_at;   /* CLOCK_MONOTONIC ns of the first doorbell the device has not polled; 0: none */
	uint32_t pad[4];
	struct fg_entry ring[FG_RING_ENTRIES];
};

struct fg_ctx_shm {
	uint32_t magic;
	uint32_t version;
	uint32_t dead; /* the device went away */
	uint32_t chans; /* bit i: the client has used channel i (set before its first entry, never cleared) */
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
	FG_OP_HELLO = 1,       /* arg0 RM client; the open control file it was allocated on
	                        * (SCM_RIGHTS) -> val0 gpus, val1 memory bytes per gpu,
	                        * val2 copy bytes/s */
	FG_OP_CTX_CREATE = 2,  /* gpu, arg0 RM client, arg1 channel group (TSG), arg2 subdevice
	                        * -> val0 context id, val1 the timeslice (µs) the driver's
	                        * libcuda sets on the group (0: it leaves the default); fds */
	FG_OP_CTX_DESTROY = 3, /* arg0 ctx */
	FG_OP_MEM_ALLOC = 4,   /* arg0 ctx, arg1 bytes -> val0 device address */
	FG_OP_MEM_FREE = 5,    /* arg0 ctx, arg1 address -> val0 bytes */
	FG_OP_STATS = 6,       /* arg0 1=reset -> val0 length of JSON that follows */
	FG_OP_CHANNEL = 7,     /* arg0 ctx, arg1 channel, arg2 its RM handle (0: freed) */
	FG_OP_RM_CONTROL = 8,  /* gpu: params size; arg0 RM client, arg1 object, arg2 control
	                        * command; the params follow the request; an RM_CONTROL
	                        * as the driver takes it, made through the file descriptor
	                        * attached (SCM_RIGHTS), or through the sender's own
	                        * client's file when none is -> status the NV_STATUS, val0
	                        * the params size returned, the params follow the response;
	                        * one read after its deadline is not made (NV_ERR_TIMEOUT) */
};

struct fg_req {
	uint32_t op;
	uint32_t gpu;
	uint64_t arg0;
	uint64_t arg1;
	uint64_t arg2;
	union {
		char name[32];
		/* FG_OP_CTX_CREATE: CLOCK_MONOTONIC ns of the channel group's
		 * allocation, its place on the runlist (0: now) */
		uint64_t tsg_at;
		/* FG_OP_RM_CONTROL: CLOCK_MONOTONIC ns after which the sender no
		 * longer waits (0: none): as a driver's ioctl, a control is made
		 * while its caller waits or not at all */
		struct {
			uint64_t pad;
			uint64_t deadline;
		};
	};
};

struct fg_resp {
	int32_t status; /* a CUresult, or an NV_STATUS for FG_OP_RM_CONTROL */
	uint32_t pad;
	uint64_t val0;
	uint64_t val1;
	uint64_t val2;
};

/* The most params one FG_OP_RM_CONTROL carries (GET_PID_INFO is 14408). */
#define FG_MAX_RM_PARAMS 16384

#endif
