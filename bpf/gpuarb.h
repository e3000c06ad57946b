/* Shared definitions of the gpuarb BPF programs: event layout, map values and
 * the minimal CO-RE views of the kernel structures the probes read. */
#ifndef GPUARB_H
#define GPUARB_H

#define GPUARB_PAYLOAD 64

/* Device kinds stored in the device table. */
enum dev_kind {
	DEV_NONE = 0,
	DEV_NVIDIA_CTL = 1,
	DEV_NVIDIA_GPU = 2,
	DEV_NVIDIA_UVM = 3,
	DEV_DRM = 4,
};

/* The nvidia RM vocabulary the probes read (docs/driver.md §3,
 * docs/memory.md §1): package nvrm has the same values, and a test
 * compares them. */
enum nv_rm {
	NV_MAGIC = 'F',
	NV_ESC_RM_FREE = 0x29,
	NV_ESC_RM_CONTROL = 0x2A,
	NV_ESC_RM_ALLOC = 0x2B,
	NV_ESC_RM_VID_HEAP_CONTROL = 0x4A,
	NV_ESC_IOCTL_XFER_CMD = 211,
	NV_TSG_CLASS = 0xA06C,
	NV_DEVICE_CLASS = 0x80, /* NV01_DEVICE_0: params begin with its deviceId */
	NV_SUBDEVICE_CLASS = 0x2080,
	/* Every GPFIFO channel class ends in 0x6F. */
	NV_CHANNEL_CLASS_MASK = 0xFF,
	NV_CHANNEL_CLASS_LOW = 0x6F,
	/* Video memory: NV01_MEMORY_LOCAL_USER and _PRIVILEGED, their
	 * NV_MEMORY_ALLOCATION_PARAMS' size at byte 64; NV01_MEMORY_SYSTEM,
	 * pinned host memory with the same parameters, recorded, never
	 * charged. */
	NV_MEM_LOCAL_USER = 0x40,
	NV_MEM_LOCAL_PRIVILEGED = 0x3F,
	NV_MEM_SYSTEM = 0x3E,
	NV_MEM_SIZE_OFFSET = 64,
	/* NVOS32_PARAMETERS (RM_VID_HEAP_CONTROL): its least size, the
	 * functions ALLOC_SIZE and ALLOC_SIZE_RANGE, hMemory and their sizes. */
	NVOS32_MIN_SIZE = 96,
	NVOS32_FUNCTION_OFFSET = 8,
	NVOS32_STATUS_OFFSET = 20,
	NVOS32_FUNCTION_ALLOC_SIZE = 2,
	NVOS32_FUNCTION_ALLOC_SIZE_RANGE = 14,
	NVOS32_HMEMORY_OFFSET = 44,
	NVOS32_SIZE_OFFSET = 88,
	NVOS32_RANGE_SIZE_OFFSET = 80,
	/* sizeof(NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS): three handles,
	 * engineType, a bool. */
	NV_TSG_PARAMS_SIZE = 20,
	/* NVOS21/NVOS64 (RM_ALLOC): parent, new object, class, params; then
	 * their own paramsSize and status. */
	NV_ALLOC_PARENT_OFFSET = 4,
	NV_ALLOC_OBJECT_OFFSET = 8,
	NV_ALLOC_CLASS_OFFSET = 12,
	NV_ALLOC_PARAMS_OFFSET = 16,
	NVOS21_PARAMS_SIZE_OFFSET = 24,
	NVOS21_STATUS_OFFSET = 28,
	NVOS64_SIZE = 48,
	NVOS64_PARAMS_SIZE_OFFSET = 32,
	NVOS64_STATUS_OFFSET = 40,
	/* NVOS00 (RM_FREE): object and status. */
	NV_FREE_OBJECT_OFFSET = 8,
	NV_FREE_STATUS_OFFSET = 12,
	/* NVOS54 (RM_CONTROL): params and their size. */
	NV_CONTROL_PARAMS_OFFSET = 16,
	NV_CONTROL_PARAMS_SIZE_OFFSET = 24,
};

/* Event types on the ring buffer. */
enum event_type {
	EV_IOCTL = 1,
	EV_CUDA = 2,
	EV_EXIT = 3,
	EV_LAUNCH = 4,
	EV_MAP = 5,
};

/* libcuda entry points gpuarb probes, one number per exported variant. The
 * number is the uprobe's cookie (bpf_get_attach_cookie), so one program
 * serves every variant of a call shape; bpf2go generates the Go constants
 * (bpf.CudaFunc) from this enum, and bpf.EntryPoints names each symbol. */
enum cuda_func {
	CU_LAUNCH_KERNEL = 1,
	CU_LAUNCH_KERNEL_PTSZ,
	CU_LAUNCH_KERNEL_EX,
	CU_LAUNCH_KERNEL_EX_PTSZ,
	CU_LAUNCH_COOPERATIVE,
	CU_LAUNCH_COOPERATIVE_PTSZ,
	CU_GRAPH_LAUNCH,
	CU_GRAPH_LAUNCH_PTSZ,
	CU_EVENT_RECORD,
	CU_EVENT_RECORD_PTSZ,
	CU_EVENT_RECORD_WITH_FLAGS,
	CU_EVENT_RECORD_WITH_FLAGS_PTSZ,
	CU_STREAM_WAIT_EVENT,
	CU_STREAM_WAIT_EVENT_PTSZ,
	CU_STREAM_SYNC,
	CU_STREAM_SYNC_PTSZ,
	CU_CTX_SYNC,
	CU_CTX_SYNC_V2,
	CU_EVENT_SYNC,
	CU_EVENT_QUERY,
	CU_STREAM_QUERY,
	CU_STREAM_QUERY_PTSZ,
	CU_CTX_CREATE_V2,
	CU_CTX_CREATE_V3,
	CU_CTX_CREATE_V4,
	CU_PRIMARY_CTX_RETAIN,
	CU_CTX_DESTROY,
	CU_PRIMARY_CTX_RELEASE,
	CU_PRIMARY_CTX_RELEASE_V2,
	CU_PRIMARY_CTX_RESET,
	CU_PRIMARY_CTX_RESET_V2,
	CU_MEM_ALLOC,
	CU_MEM_ALLOC_ASYNC,
	CU_MEM_ALLOC_ASYNC_PTSZ,
	CU_MEM_FREE,
	CU_MEM_FREE_ASYNC,
	CU_MEM_FREE_ASYNC_PTSZ,
	CU_MEMCPY_HTOD,
	CU_MEMCPY_HTOD_PTDS,
	CU_MEMCPY_DTOH,
	CU_MEMCPY_DTOH_PTDS,
	CU_MEMCPY_DTOD,
	CU_MEMCPY_DTOD_PTDS,
	CU_MEMCPY_HTOD_ASYNC,
	CU_MEMCPY_HTOD_ASYNC_PTSZ,
	CU_MEMCPY_DTOH_ASYNC,
	CU_MEMCPY_DTOH_ASYNC_PTSZ,
	CU_MEMCPY_DTOD_ASYNC,
	CU_MEMCPY_DTOD_ASYNC_PTSZ,
	CU_MEMCPY,
	CU_MEMCPY_PTDS,
	CU_MEMCPY_ASYNC,
	CU_MEMCPY_ASYNC_PTSZ,
	CU_MEMCPY_PEER,
	CU_MEMCPY_PEER_PTDS,
	CU_MEMCPY_PEER_ASYNC,
	CU_MEMCPY_PEER_ASYNC_PTSZ,
	CU_MEMSET_D8,
	CU_MEMSET_D8_PTDS,
	CU_MEMSET_D8_ASYNC,
	CU_MEMSET_D8_ASYNC_PTSZ,
	CU_MEMSET_D32,
	CU_MEMSET_D32_PTDS,
	CU_MEMSET_D32_ASYNC,
	CU_MEMSET_D32_ASYNC_PTSZ,
	CU_STREAM_BEGIN_CAPTURE,
	CU_STREAM_BEGIN_CAPTURE_PTSZ,
	CU_STREAM_END_CAPTURE,
	CU_STREAM_END_CAPTURE_PTSZ,
	CU_STREAM_BEGIN_CAPTURE_V1,
	CU_STREAM_BEGIN_CAPTURE_V1PTSZ,
	CU_STREAM_BEGIN_CAPTURE_TO_GRAPH,
	CU_STREAM_BEGIN_CAPTURE_TO_GRAPH_PTSZ,
	CU_FUNC_MAX,
};

/* A uprobe cookie: the entry point's number in its low 16 bits and, for
 * call shapes whose arguments move between variants, where they are:
 * the byte count's and the stream's argument (1-based; 0: none) and a
 * shift that turns the count into bytes (memset D32 counts words), or for
 * context creation the device's argument. */
#define COOKIE_FUNC(c) ((__u32)(c)&0xffff)
#define COOKIE_BYTES_ARG(c) (((c) >> 16) & 0xf)
#define COOKIE_STREAM_ARG(c) (((c) >> 20) & 0xf)
#define COOKIE_BYTES_SHIFT(c) (((c) >> 24) & 0xf)
#define COOKIE_DEVICE_ARG(c) (((c) >> 16) & 0xf)

/* Device table key: minor 0xffffffff matches the whole major. */
struct dev_key {
	__u32 major;
	__u32 minor;
};

#define DEV_ANY_MINOR 0xffffffff

/* Per-cgroup counters, pinned as gpuarb_cgroups. */
struct cgroup_stats {
	__u64 gpu_ioctls;
	__u64 submissions;
	__u64 launches;
	__u64 syncs;
	__u64 sync_wait_ns;
	__u64 bytes_alloc;
	__u64 bytes_freed;
	__u64 copies;
	__u64 copy_bytes;
	__u64 last_seen_ns;
};

/* Context table key: a GPU object of one process. */
struct ctx_key {
	__u32 tgid;
	__u32 kind; /* dev_kind of the object, or 0 for a CUDA context */
	__u64 handle;
};

/* Context table value. */
struct ctx_info {
	__u64 cgroup_id;
	__u64 created_ns;
	__u32 obj_class;
	__u32 parent;
};

/* Event flags. */
enum event_flags {
	/* The launch gate held the process at this call: a launch runs only
	 * when the process is released; an ioctl submission went through and
	 * the process stopped after it. */
	EVF_HELD = 1,
	/* A wait began: the entry of a synchronizing call, or the first
	 * query of a polling loop that found the work not done. Its end
	 * comes as a record without the flag. */
	EVF_BEGIN = 2,
	/* A device memory allocation that would have taken its tenant past its
	 * GPU memory limit: the allocating process was sent SIGKILL at the
	 * allocation's syscall exit, and the bytes were not charged. */
	EVF_OOM_KILL = 4,
};

/* Launch gates: the arbiter's admission control, inside the launch path.
 * A gate admits launches while admitted < allowed; the launch beyond that
 * stops its process (SIGSTOP before the launch runs) until the daemon
 * releases it. Members map processes or cgroups (and their descendants)
 * to a gate slot. */
enum gate_kind {
	GATE_CGROUP = 1,  /* id is a cgroup v2 id: the cgroup and everything below */
	GATE_PROCESS = 2, /* id is a tgid */
};

struct gate_key {
	__u64 id;
	__u32 kind;
	__u32 pad;
};

/* One gate slot's counters, pinned as gpuarb_gates and written only by the
 * probes; its allowance (admitted may reach it) is in gpuarb_gate_allow,
 * written only by the daemon, so neither side overwrites the other. */
struct gate {
	__u64 admitted;   /* launches let through */
	__u64 holds;      /* processes stopped at this gate so far */
	__u64 unrecorded; /* launches beyond the allowance let through because
			   * gpuarb_held was full: a process that cannot be
			   * recorded is never stopped (nothing would continue it) */
	__u64 escapes;    /* held processes continued by someone else (a
			   * sibling's SIGCONT): their held launch ran, charged
			   * when they next pass the gate */
};

/* held_proc.flags */
#define HELD_UNCOUNTED 1 /* the held launch is not in gate.admitted yet */

/* A process the gate stopped, pinned as gpuarb_held (key: tgid). The first
 * 24 bytes keep their layout across versions: whoever releases what an
 * older daemon held reads them whatever the value's size. */
struct held_proc {
	__u64 since_ns; /* CLOCK_MONOTONIC when it was stopped */
	__u64 start_ns; /* its start time (boot-based), against pid reuse */
	__u32 gate;     /* the gate slot that holds it */
	__u32 flags;    /* HELD_* */
	__u32 waiting;  /* launches of its other threads that wait with it */
	__u32 stopping; /* 1 from the record until its SIGSTOP is queued:
			 * not to be released yet, nor taken for an escape */
	__u64 stop_seq; /* signal_seq of the last SIGSTOP generated for it
			 * since the record; 0: none */
	__u64 cont_seq; /* signal_seq of the last SIGCONT since the record */
};

/* A hold the daemon is ending, pinned as gpuarb_releasing (key: tgid): noted
 * before it forgets the hold, and marked once its SIGCONT has gone out. The
 * first 24 bytes are the hold's, as in held_proc. */
struct release_note {
	__u64 since_ns;
	__u64 start_ns;
	__u32 gate;
	__u32 flags;
	__u64 continued_ns; /* CLOCK_MONOTONIC after gpuarb's SIGCONT; 0: not sent yet */
};

/* The launch gates' lease, pinned as gpuarb_gate_lease (one entry): a gate
 * stops a process only while it is live, and the daemon renews it while it
 * runs. Once the daemon is gone nothing renews it: no gate can stop anyone
 * after it ends, whoever is left to release what it held. The guardian
 * ends it at once. */
struct gate_lease {
	__u64 until_ns; /* CLOCK_MONOTONIC; 0: no lease */
};

/* GPU memory limits. A limited tenant's slot charges the device memory its
 * processes allocate through the driver (RM_ALLOC of a video memory class,
 * RM_VID_HEAP_CONTROL), per GPU, by the size the driver wrote back; an
 * allocation that would take a GPU's charge past the slot's limit kills
 * its process at the syscall exit, before it returns to user space. Members
 * map processes or cgroups to a slot as gate members do (gate_key). */
/* Table sizes the Go side reads (bpf2go exports the enum): memory limit
 * slots; GPUs charged apart (a device id at or past it is charged with the
 * last); launch gate slots. */
enum gpuarb_sizes {
	MEM_SLOTS = 4096,
	MEM_GPUS = 16,
	GATE_SLOTS = 4096,
};
/* The default limit (mem_default_limit) holds every process that no slot
 * holds, charged by its own cgroup (the default tenant's): its usage is in
 * gpuarb_mem_cgroups, by cgroup id. */

/* One slot's charges, pinned as gpuarb_mem_usage and written only by the
 * probes; its limit (bytes per GPU, 0: none) is in gpuarb_mem_limit,
 * written only by the daemon. gen tells a slot's tenants apart: the daemon
 * bumps it when it gives the slot to a new tenant, and what a process of
 * an older generation held is not uncharged from the new one. */
struct mem_usage {
	__u64 charged[MEM_GPUS]; /* bytes held, per GPU */
	__u64 kills[MEM_GPUS];   /* processes killed at an allocation, per GPU */
	__u64 gen;
};

/* What a limited tenant's process holds, pinned as gpuarb_mem_procs (key:
 * tgid); uncharged from its slot when the process exits. */
struct mem_proc {
	__u64 start_ns; /* the process's start time, against pid reuse */
	__u64 gen;      /* its slot's generation when it was charged */
	__u32 slot;     /* MEM_SLOTS: charged to its cgroup under the default limit */
	__u32 pad;
	__u64 cgroup;   /* that cgroup's id */
	__u64 charged[MEM_GPUS];
};

/* A charged allocation of a limited tenant, or a device of a process (key
 * of both: the process and the RM handle): what an RM_FREE of either
 * uncharges. */
struct mem_obj_key {
	__u32 tgid;
	__u32 handle;
};

struct mem_obj {
	__u64 bytes;
	__u64 start_ns; /* its process's start time */
	__u32 gpu;
	__u32 device; /* the device it was allocated under */
	__u64 dev_gen; /* that device's mem_dev.gen when it was charged */
};

/* What a limited tenant's process holds under one of its devices: freeing
 * the device frees it all (the driver frees an object's children). */
struct mem_dev {
	__u64 bytes;
	__u64 start_ns; /* its process's start time */
	__u64 gen;      /* tells this device's charges from an earlier one's of the same handle */
	__u32 gpu;
	__u32 pad;
};

/* Ring-buffer records: a common header, then the body its type names.
 * bpf2go generates their Go layouts (bpf.RecordHeader, bpf.IoctlRecord,
 * bpf.CallRecord, bpf.LaunchRecord), from which ioctlspy takes its
 * offsets. A launch, the most frequent record, carries only what it needs. */
struct record_header {
	__u64 ts_enter;
	__u64 ts_exit;
	__u64 cgroup_id;
	__u32 type;  /* enum event_type: the body that follows */
	__u32 tgid;
	__u32 tid;
	__u32 flags; /* enum event_flags */
	char comm[16];
};

/* EV_IOCTL: an ioctl on a GPU device node, its argument struct and an RM
 * call's parameters as read at exit. */
struct ioctl_record {
	struct record_header h;
	__s64 ret;
	__u32 dev_major;
	__u32 dev_minor;
	__u32 dev_kind;
	__u32 cmd;
	__u32 esc;
	__u16 arg_len;
	__u16 params_len;
	/* [0] the descriptor; a device memory allocation's [1] bytes, [2] GPU
	 * and, for a limited tenant, [3] its GPU's charge before it, [4] the
	 * limit, [5] the limit's slot */
	__u64 args[6];
	__u8 arg[GPUARB_PAYLOAD];
	__u8 params[GPUARB_PAYLOAD];
	__u64 file_ino; /* the ioctl's file: its inode and filesystem (kernel dev_t) */
	__u32 file_dev;
	__u32 pad;
};

/* EV_CUDA: a libcuda call other than a launch; its arguments by the
 * call's class (bpf.EntryPoint.Class), a copy's stream in args[3]. */
struct call_record {
	struct record_header h;
	__s64 ret;
	__u32 func; /* enum cuda_func */
	__u32 pad;
	__u64 args[4];
};

/* EV_LAUNCH: a kernel launch, or a graph launch (function is then its
 * CUgraphExec, grid and block 0). */
struct launch_record {
	struct record_header h;
	__u64 function;
	__u64 stream;
	__u32 func; /* enum cuda_func */
	__u32 grid[3];
	__u32 block[3];
	__u32 pad;
};

/* EV_EXIT: a process that used a GPU exited; the header alone. */

/* EV_MAP: an mmap of a nvidia-uvm file (a managed range: the address space
 * cudaMallocManaged reserves), or an munmap of a process that made one,
 * each as the kernel did it. */
struct map_record {
	struct record_header h;
	__u64 addr;
	__u64 len;
	__u32 unmap; /* 1: an munmap */
	__u32 fd;    /* an mmap's descriptor */
};

#endif
