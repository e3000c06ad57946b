//go:build ignore

// gpuarb probes: GPU ioctls (syscall tracepoints, fd -> inode -> rdev matched
// against the device table), libcuda entry points (uprobes/uretprobes), openat
// of libcuda copies and process exit. Counters go to pinned per-cgroup maps,
// records to the ring buffer; a failed reserve bumps the lost counter.

#include <linux/types.h>
#include <linux/bpf.h>
#include <asm/ptrace.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

#include "gpuarb.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Minimal CO-RE views of the kernel structures on the fd -> rdev path. */
struct inode {
	__u32 i_rdev;
} __attribute__((preserve_access_index));

struct file {
	struct inode *f_inode;
} __attribute__((preserve_access_index));

struct fdtable {
	unsigned int max_fds;
	struct file **fd;
} __attribute__((preserve_access_index));

struct files_struct {
	struct fdtable *fdt;
} __attribute__((preserve_access_index));

struct task_struct {
	struct files_struct *files;
	struct task_struct *group_leader;
	__u64 start_boottime;
} __attribute__((preserve_access_index));

/* Syscall tracepoint records (stable tracefs format). */
struct sys_enter_ctx {
	__u64 common;
	long id;
	unsigned long args[6];
};

struct sys_exit_ctx {
	__u64 common;
	long id;
	long ret;
};

/* nvidia escapes and classes (DESIGN.md, open-gpu-kernel-modules). */
#define NV_MAGIC 'F'
#define NV_ESC_RM_FREE 0x29
#define NV_ESC_RM_CONTROL 0x2A
#define NV_ESC_RM_ALLOC 0x2B
#define NV_ESC_IOCTL_XFER_CMD 211
#define NV_TSG_CLASS 0xA06C
#define UVM_REGISTER_CHANNEL 27
#define UVM_REGISTER_CHANNEL_SIZE 48

/* nouveau and DRM core ioctl numbers (absolute nr, DRM_COMMAND_BASE added). */
#define DRM_MAGIC 'd'
#define NOUVEAU_CHANNEL_ALLOC 0x42
#define NOUVEAU_CHANNEL_FREE 0x43
#define NOUVEAU_EXEC 0x52
#define NOUVEAU_GEM_PUSHBUF 0x81
#define NOUVEAU_GEM_CPU_PREP 0x82
#define DRM_SYNCOBJ_WAIT 0xC3
#define DRM_SYNCOBJ_TIMELINE_WAIT 0xCA

struct dev_entry {
	__u32 kind;
};

struct proc_info {
	__u64 cgroup_id;
	__u64 first_seen_ns;
};

struct lost_counter {
	__u64 events;
};

struct ioctl_stash {
	__u64 ts;
	__u64 arg;
	__u32 cmd;
	__u32 major;
	__u32 minor;
	__u32 kind;
};

struct cuda_key {
	__u64 pid_tgid;
	__u32 func;
	__u32 pad;
};

struct cuda_stash {
	__u64 ts;
	__u64 args[3];
};

struct alloc_key {
	__u32 tgid;
	__u32 pad;
	__u64 dptr;
};

struct alloc_info {
	__u64 bytes;
};

struct path_buf {
	char path[GPUARB_PATH];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 256);
	__type(key, struct dev_key);
	__type(value, struct dev_entry);
} gpuarb_devices SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64);
	__type(value, struct cgroup_stats);
} gpuarb_cgroups SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct ctx_key);
	__type(value, struct ctx_info);
} gpuarb_ctxs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, struct proc_info);
} gpuarb_procs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 22);
} gpuarb_events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct lost_counter);
} gpuarb_lost SEC(".maps");

/* In-flight calls: removed at syscall exit or uretprobe, so a plain
 * preallocated hash (no LRU list lock on every update). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 8192);
	__type(key, __u64);
	__type(value, struct ioctl_stash);
} gpuarb_pend_io SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 8192);
	__type(key, struct cuda_key);
	__type(value, struct cuda_stash);
} gpuarb_pend_cu SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct alloc_key);
	__type(value, struct alloc_info);
} gpuarb_allocs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct path_buf);
} gpuarb_scratch SEC(".maps");

#define GATE_SLOTS 4096
#define GATE_CGROUP_LEVELS 16
#define SIGSTOP 19

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, struct gate_key);
	__type(value, __u32);
} gpuarb_gate_keys SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, GATE_SLOTS);
	__type(key, __u32);
	__type(value, struct gate);
} gpuarb_gates SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, GATE_SLOTS);
	__type(key, __u32);
	__type(value, __u64);
} gpuarb_gate_allow SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, struct held_proc);
} gpuarb_held SEC(".maps");

/* Number of gate members; 0 skips the lookups on every launch. Set by the
 * daemon. */
volatile __u32 gate_members;

/* Bytes pending on the ring above which a submit wakes the reader; below it
 * the reader finds records on its next poll (see ioctlspy.Spy). Waking the
 * reader for every record costs the submitting process microseconds. Set at
 * load time. A held launch always wakes it: the process is stopped until
 * its gate's pacer, told by the reader, releases it. */
volatile const __u64 wakeup_bytes = 65536;

static __always_inline __u64 wakeup_flag(const struct event *e)
{
	if (e->flags & EVF_HELD)
		return BPF_RB_FORCE_WAKEUP;
	return bpf_ringbuf_query(&gpuarb_events, BPF_RB_AVAIL_DATA) >= wakeup_bytes ? BPF_RB_FORCE_WAKEUP
										    : BPF_RB_NO_WAKEUP;
}

/* Keep the event type in the object's BTF for bpf2go. */
const struct event *unused_event __attribute__((unused));

static __always_inline void count_lost(void)
{
	__u32 zero = 0;
	struct lost_counter *l = bpf_map_lookup_elem(&gpuarb_lost, &zero);

	if (l)
		__sync_fetch_and_add(&l->events, 1);
}

static __always_inline struct cgroup_stats *cgroup_stats_of(__u64 cgid, __u64 now)
{
	struct cgroup_stats *s = bpf_map_lookup_elem(&gpuarb_cgroups, &cgid);

	if (!s) {
		struct cgroup_stats zero;

		__builtin_memset(&zero, 0, sizeof(zero));
		bpf_map_update_elem(&gpuarb_cgroups, &cgid, &zero, BPF_NOEXIST);
		s = bpf_map_lookup_elem(&gpuarb_cgroups, &cgid);
	}
	if (s)
		s->last_seen_ns = now;
	return s;
}

static __always_inline void note_process(__u32 tgid, __u64 cgid, __u64 now)
{
	struct proc_info p = { .cgroup_id = cgid, .first_seen_ns = now };

	/* A lookup is lock-free; an insert attempt takes the bucket lock. */
	if (!bpf_map_lookup_elem(&gpuarb_procs, &tgid))
		bpf_map_update_elem(&gpuarb_procs, &tgid, &p, BPF_NOEXIST);
}

static __always_inline struct event *event_reserve(__u32 type, __u64 pid_tgid, __u64 cgid)
{
	struct event *e = bpf_ringbuf_reserve(&gpuarb_events, sizeof(*e), 0);

	if (!e) {
		count_lost();
		return NULL;
	}
	__builtin_memset(e, 0, sizeof(*e));
	e->type = type;
	e->tgid = pid_tgid >> 32;
	e->tid = (__u32)pid_tgid;
	e->cgroup_id = cgid;
	bpf_get_current_comm(e->comm, sizeof(e->comm));
	return e;
}

/* Copies up to GPUARB_PAYLOAD bytes of user memory; returns the count copied. */
static __always_inline __u16 copy_user(__u8 *dst, __u64 src, __u32 size)
{
	__u32 n = size;

	if (!src || !n)
		return 0;
	if (n > GPUARB_PAYLOAD)
		n = GPUARB_PAYLOAD;
	/* Hide the clamp from clang so the mask below reaches the verifier. */
	asm volatile("" : "+r"(n));
	n &= 2 * GPUARB_PAYLOAD - 1;
	if (bpf_probe_read_user(dst, n, (const void *)src) < 0)
		return 0;
	return n;
}

static __always_inline __u32 fd_rdev(unsigned int fd)
{
	/* BTF-typed task: the walk to the fd array is plain loads, not helpers. */
	struct task_struct *task = bpf_get_current_task_btf();
	struct fdtable *fdt = task->files->fdt;
	struct file *f = NULL;

	if (fd >= fdt->max_fds)
		return 0;
	if (bpf_probe_read_kernel(&f, sizeof(f), &fdt->fd[fd]) < 0 || !f)
		return 0;
	return BPF_CORE_READ(f, f_inode, i_rdev);
}

/* ---- launch gates ---- */

/* The gate slot of the current process: its own entry, else the deepest of
 * its cgroup and the cgroup's ancestors that has one. */
static __always_inline __u32 *gate_slot(__u32 tgid)
{
	struct gate_key k = { .id = tgid, .kind = GATE_PROCESS };
	__u32 *slot = bpf_map_lookup_elem(&gpuarb_gate_keys, &k);

	if (slot)
		return slot;
	k.kind = GATE_CGROUP;
	for (int level = GATE_CGROUP_LEVELS - 1; level >= 0; level--) {
		k.id = bpf_get_current_ancestor_cgroup_id(level);
		if (!k.id)
			continue; /* deeper than the process's cgroup */
		slot = bpf_map_lookup_elem(&gpuarb_gate_keys, &k);
		if (slot)
			return slot;
	}
	return NULL;
}

/* Passes one launch (or submission) through the process's gate. Beyond the
 * allowance the process is recorded as held and stopped: the signal lands
 * on the way back to user space, before a probed function's body runs (a
 * launch waits; submitted says the work already went through, as with an
 * ioctl, and is then counted). Returns 1 when it held the process. */
static __always_inline int gate_pass(__u64 pid_tgid, __u64 now, int submitted)
{
	__u32 tgid = pid_tgid >> 32;
	struct held_proc h;
	struct task_struct *task;
	struct gate *g;
	__u64 *allowed;
	__u32 *slot;

	if (!gate_members)
		return 0;
	slot = gate_slot(tgid);
	if (!slot)
		return 0;
	g = bpf_map_lookup_elem(&gpuarb_gates, slot);
	allowed = bpf_map_lookup_elem(&gpuarb_gate_allow, slot);
	if (!g || !allowed)
		return 0;
	if (__sync_fetch_and_add(&g->admitted, 1) < *allowed)
		return 0;
	if (!submitted)
		__sync_fetch_and_add(&g->admitted, -1); /* it runs, and is counted, at release */
	__sync_fetch_and_add(&g->holds, 1);
	task = bpf_get_current_task_btf();
	__builtin_memset(&h, 0, sizeof(h));
	h.since_ns = now;
	h.start_ns = task->group_leader->start_boottime;
	h.gate = *slot;
	bpf_map_update_elem(&gpuarb_held, &tgid, &h, BPF_ANY);
	bpf_send_signal(SIGSTOP);
	return 1;
}

SEC("tracepoint/syscalls/sys_enter_ioctl")
int gpuarb_ioctl_enter(struct sys_enter_ctx *ctx)
{
	__u32 rdev = fd_rdev((unsigned int)ctx->args[0]);
	struct dev_key key;
	struct dev_entry *dev;
	struct ioctl_stash st;
	__u64 id;

	if (!rdev)
		return 0;
	key.major = rdev >> 20;
	key.minor = rdev & 0xfffff;
	dev = bpf_map_lookup_elem(&gpuarb_devices, &key);
	if (!dev) {
		key.minor = DEV_ANY_MINOR;
		dev = bpf_map_lookup_elem(&gpuarb_devices, &key);
		if (!dev)
			return 0;
		key.minor = rdev & 0xfffff;
	}
	st.ts = bpf_ktime_get_ns();
	st.arg = ctx->args[2];
	st.cmd = (__u32)ctx->args[1];
	st.major = key.major;
	st.minor = key.minor;
	st.kind = dev->kind;
	id = bpf_get_current_pid_tgid();
	bpf_map_update_elem(&gpuarb_pend_io, &id, &st, BPF_ANY);
	return 0;
}

static __always_inline void track_object(__u32 tgid, __u32 kind, __u64 handle, __u64 cgid,
					 __u64 now, __u32 cls, __u32 parent)
{
	struct ctx_key k = { .tgid = tgid, .kind = kind, .handle = handle };
	struct ctx_info v = { .cgroup_id = cgid, .created_ns = now, .obj_class = cls, .parent = parent };

	bpf_map_update_elem(&gpuarb_ctxs, &k, &v, BPF_ANY);
}

static __always_inline void untrack_object(__u32 tgid, __u32 kind, __u64 handle)
{
	struct ctx_key k = { .tgid = tgid, .kind = kind, .handle = handle };

	bpf_map_delete_elem(&gpuarb_ctxs, &k);
}

static __always_inline void decode_nvidia(struct event *e, struct ioctl_stash *st)
{
	__u32 cmd = st->cmd;
	__u32 nr = cmd & 0xff;
	__u32 size = (cmd >> 16) & 0x3fff;
	__u64 argp = st->arg;
	__u64 params = 0;
	__u32 params_size = 0;

	if (((cmd >> 8) & 0xff) != NV_MAGIC) {
		e->esc = nr;
		return;
	}
	if (nr == NV_ESC_IOCTL_XFER_CMD) {
		struct {
			__u32 cmd;
			__u32 size;
			__u64 ptr;
		} x;

		if (bpf_probe_read_user(&x, sizeof(x), (const void *)argp) < 0)
			return;
		nr = x.cmd;
		size = x.size;
		argp = x.ptr;
	}
	e->esc = nr;
	e->arg_len = copy_user(e->arg, argp, size);

	if (nr == NV_ESC_RM_ALLOC && e->arg_len >= 32) {
		__u32 hparent = *(__u32 *)&e->arg[4];
		__u32 hnew = *(__u32 *)&e->arg[8];
		__u32 cls = *(__u32 *)&e->arg[12];

		params = *(__u64 *)&e->arg[16];
		if (e->arg_len >= 48)
			params_size = *(__u32 *)&e->arg[32]; /* NVOS64 */
		else
			params_size = *(__u32 *)&e->arg[24]; /* NVOS21 */
		if (e->ret == 0 && (cls == NV_TSG_CLASS || (cls & 0xff) == 0x6f))
			track_object(e->tgid, DEV_NVIDIA_CTL, hnew, e->cgroup_id, e->ts_exit, cls, hparent);
	} else if (nr == NV_ESC_RM_CONTROL && e->arg_len >= 32) {
		params = *(__u64 *)&e->arg[16];
		params_size = *(__u32 *)&e->arg[24];
	} else if (nr == NV_ESC_RM_FREE && e->arg_len >= 12) {
		untrack_object(e->tgid, DEV_NVIDIA_CTL, *(__u32 *)&e->arg[8]);
	}
	if (params)
		e->params_len = copy_user(e->params, params, params_size);
}

static __always_inline void decode_drm(struct event *e, struct ioctl_stash *st,
				       struct cgroup_stats *s)
{
	__u32 cmd = st->cmd;
	__u32 nr = cmd & 0xff;

	e->esc = nr;
	if (((cmd >> 8) & 0xff) != DRM_MAGIC)
		return;
	e->arg_len = copy_user(e->arg, st->arg, (cmd >> 16) & 0x3fff);
	switch (nr) {
	case NOUVEAU_EXEC:
	case NOUVEAU_GEM_PUSHBUF:
		if (s)
			__sync_fetch_and_add(&s->submissions, 1);
		if (e->ret == 0 && gate_pass(((__u64)e->tgid << 32) | e->tid, e->ts_exit, 1))
			e->flags |= EVF_HELD;
		break;
	case NOUVEAU_GEM_CPU_PREP:
	case DRM_SYNCOBJ_WAIT:
	case DRM_SYNCOBJ_TIMELINE_WAIT:
		if (s) {
			__sync_fetch_and_add(&s->syncs, 1);
			__sync_fetch_and_add(&s->sync_wait_ns, e->ts_exit - e->ts_enter);
		}
		break;
	case NOUVEAU_CHANNEL_ALLOC:
		if (e->ret == 0 && e->arg_len >= 12)
			track_object(e->tgid, DEV_DRM, *(__u32 *)&e->arg[8], e->cgroup_id, e->ts_exit, 0, 0);
		break;
	case NOUVEAU_CHANNEL_FREE:
		if (e->arg_len >= 4)
			untrack_object(e->tgid, DEV_DRM, *(__u32 *)&e->arg[0]);
		break;
	}
}

SEC("tracepoint/syscalls/sys_exit_ioctl")
int gpuarb_ioctl_exit(struct sys_exit_ctx *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	struct ioctl_stash *pending = bpf_map_lookup_elem(&gpuarb_pend_io, &id);
	struct ioctl_stash st;
	struct cgroup_stats *s;
	struct event *e;
	__u64 now, cgid;

	if (!pending)
		return 0;
	st = *pending;
	bpf_map_delete_elem(&gpuarb_pend_io, &id);

	now = bpf_ktime_get_ns();
	cgid = bpf_get_current_cgroup_id();
	s = cgroup_stats_of(cgid, now);
	if (s)
		__sync_fetch_and_add(&s->gpu_ioctls, 1);
	note_process(id >> 32, cgid, now);

	e = event_reserve(EV_IOCTL, id, cgid);
	if (!e)
		return 0;
	e->ts_enter = st.ts;
	e->ts_exit = now;
	e->ret = ctx->ret;
	e->dev_major = st.major;
	e->dev_minor = st.minor;
	e->dev_kind = st.kind;
	e->cmd = st.cmd;

	switch (st.kind) {
	case DEV_NVIDIA_CTL:
	case DEV_NVIDIA_GPU:
		decode_nvidia(e, &st);
		break;
	case DEV_NVIDIA_UVM:
		e->esc = st.cmd;
		if (st.cmd == UVM_REGISTER_CHANNEL)
			e->arg_len = copy_user(e->arg, st.arg, UVM_REGISTER_CHANNEL_SIZE);
		break;
	case DEV_DRM:
		decode_drm(e, &st, s);
		break;
	}
	bpf_ringbuf_submit(e, wakeup_flag(e));
	return 0;
}

/* ---- libcuda uprobes ---- */

static __always_inline struct event *cuda_event(__u32 func, __u64 now, struct cgroup_stats **sp)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u64 cgid = bpf_get_current_cgroup_id();
	struct event *e;

	*sp = cgroup_stats_of(cgid, now);
	note_process(id >> 32, cgid, now);
	e = event_reserve(EV_CUDA, id, cgid);
	if (!e)
		return NULL;
	e->func = func;
	e->ts_enter = now;
	e->ts_exit = now;
	return e;
}

static __always_inline __u64 stack_arg(struct pt_regs *ctx, int n)
{
	/* x86-64 SysV: argument 7 is at rsp+8 on function entry. */
	__u64 v = 0;

	bpf_probe_read_user(&v, sizeof(v), (const void *)(PT_REGS_SP(ctx) + 8 * (n - 6)));
	return v;
}

static __always_inline void count_launch(struct cgroup_stats *s)
{
	if (s) {
		__sync_fetch_and_add(&s->launches, 1);
		__sync_fetch_and_add(&s->submissions, 1);
	}
}

/* cuLaunchKernel / cuLaunchCooperativeKernel(f, gx, gy, gz, bx, by, bz, shmem, stream, ...) */
static __always_inline int launch_kernel(struct pt_regs *ctx, __u32 func)
{
	__u64 now = bpf_ktime_get_ns();
	int held = gate_pass(bpf_get_current_pid_tgid(), now, 0);
	struct cgroup_stats *s;
	struct event *e = cuda_event(func, now, &s);

	count_launch(s);
	if (!e)
		return 0;
	if (held)
		e->flags |= EVF_HELD;
	e->args[0] = PT_REGS_PARM1(ctx);
	e->args[1] = (__u32)PT_REGS_PARM2(ctx);
	e->args[2] = (__u32)PT_REGS_PARM3(ctx);
	e->args[3] = (__u32)PT_REGS_PARM4(ctx);
	e->args[4] = (__u32)PT_REGS_PARM5(ctx);
	e->args[5] = (__u32)ctx->r9; /* PT_REGS_PARM6, absent from libbpf 1.1 */
	e->args[6] = (__u32)stack_arg(ctx, 7);
	e->args[7] = stack_arg(ctx, 9);
	bpf_ringbuf_submit(e, wakeup_flag(e));
	return 0;
}

SEC("uprobe/cuLaunchKernel")
int gpuarb_cu_launch(struct pt_regs *ctx)
{
	return launch_kernel(ctx, CU_LAUNCH_KERNEL);
}

SEC("uprobe/cuLaunchCooperativeKernel")
int gpuarb_cu_launch_coop(struct pt_regs *ctx)
{
	return launch_kernel(ctx, CU_LAUNCH_COOPERATIVE);
}

/* cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **params, void **extra) */
SEC("uprobe/cuLaunchKernelEx")
int gpuarb_cu_launch_ex(struct pt_regs *ctx)
{
	struct {
		__u32 grid[3];
		__u32 block[3];
		__u32 shmem;
		__u32 pad;
		__u64 stream;
	} cfg;
	__u64 now = bpf_ktime_get_ns();
	int held = gate_pass(bpf_get_current_pid_tgid(), now, 0);
	struct cgroup_stats *s;
	struct event *e = cuda_event(CU_LAUNCH_KERNEL_EX, now, &s);

	count_launch(s);
	if (!e)
		return 0;
	if (held)
		e->flags |= EVF_HELD;
	e->args[0] = PT_REGS_PARM2(ctx);
	if (bpf_probe_read_user(&cfg, sizeof(cfg), (const void *)PT_REGS_PARM1(ctx)) == 0) {
		e->args[1] = cfg.grid[0];
		e->args[2] = cfg.grid[1];
		e->args[3] = cfg.grid[2];
		e->args[4] = cfg.block[0];
		e->args[5] = cfg.block[1];
		e->args[6] = cfg.block[2];
		e->args[7] = cfg.stream;
	}
	bpf_ringbuf_submit(e, wakeup_flag(e));
	return 0;
}

/* cuGraphLaunch(CUgraphExec exec, CUstream stream) */
SEC("uprobe/cuGraphLaunch")
int gpuarb_cu_graph_launch(struct pt_regs *ctx)
{
	__u64 now = bpf_ktime_get_ns();
	int held = gate_pass(bpf_get_current_pid_tgid(), now, 0);
	struct cgroup_stats *s;
	struct event *e = cuda_event(CU_GRAPH_LAUNCH, now, &s);

	count_launch(s);
	if (!e)
		return 0;
	if (held)
		e->flags |= EVF_HELD;
	e->args[0] = PT_REGS_PARM1(ctx);
	e->args[7] = PT_REGS_PARM2(ctx);
	bpf_ringbuf_submit(e, wakeup_flag(e));
	return 0;
}

/* cuEventRecord(CUevent event, CUstream stream): marks how far a stream's
 * work reaches, so an event synchronize later tells which work drained. */
SEC("uprobe/cuEventRecord")
int gpuarb_cu_event_record(struct pt_regs *ctx)
{
	struct cgroup_stats *s;
	struct event *e = cuda_event(CU_EVENT_RECORD, bpf_ktime_get_ns(), &s);

	if (!e)
		return 0;
	e->args[0] = PT_REGS_PARM1(ctx);
	e->args[7] = PT_REGS_PARM2(ctx);
	bpf_ringbuf_submit(e, wakeup_flag(e));
	return 0;
}

/* Copies and memsets: (dst, src|value, bytes[, stream]). */
static __always_inline int copy_call(struct pt_regs *ctx, __u32 func, int async)
{
	struct cgroup_stats *s;
	struct event *e = cuda_event(func, bpf_ktime_get_ns(), &s);
	__u64 bytes = PT_REGS_PARM3(ctx);

	if (s) {
		__sync_fetch_and_add(&s->copies, 1);
		__sync_fetch_and_add(&s->copy_bytes, bytes);
	}
	if (!e)
		return 0;
	e->args[0] = PT_REGS_PARM1(ctx);
	e->args[1] = PT_REGS_PARM2(ctx);
	e->args[2] = bytes;
	if (async)
		e->args[7] = PT_REGS_PARM4(ctx);
	bpf_ringbuf_submit(e, wakeup_flag(e));
	return 0;
}

SEC("uprobe/cuMemcpyHtoD_v2")
int gpuarb_cu_memcpy_htod(struct pt_regs *ctx)
{
	return copy_call(ctx, CU_MEMCPY_HTOD, 0);
}

SEC("uprobe/cuMemcpyDtoH_v2")
int gpuarb_cu_memcpy_dtoh(struct pt_regs *ctx)
{
	return copy_call(ctx, CU_MEMCPY_DTOH, 0);
}

SEC("uprobe/cuMemcpyHtoDAsync_v2")
int gpuarb_cu_memcpy_htod_async(struct pt_regs *ctx)
{
	return copy_call(ctx, CU_MEMCPY_HTOD_ASYNC, 1);
}

SEC("uprobe/cuMemcpyDtoHAsync_v2")
int gpuarb_cu_memcpy_dtoh_async(struct pt_regs *ctx)
{
	return copy_call(ctx, CU_MEMCPY_DTOH_ASYNC, 1);
}

SEC("uprobe/cuMemsetD8_v2")
int gpuarb_cu_memset(struct pt_regs *ctx)
{
	return copy_call(ctx, CU_MEMSET_D8, 0);
}

SEC("uprobe/cuMemsetD8Async")
int gpuarb_cu_memset_async(struct pt_regs *ctx)
{
	return copy_call(ctx, CU_MEMSET_D8_ASYNC, 1);
}

/* Calls measured from entry to return: the entry stashes, the return emits. */
static __always_inline int stash_entry(__u32 func, __u64 a0, __u64 a1, __u64 a2)
{
	struct cuda_key k = { .pid_tgid = bpf_get_current_pid_tgid(), .func = func };
	struct cuda_stash v = { .ts = bpf_ktime_get_ns(), .args = { a0, a1, a2 } };

	bpf_map_update_elem(&gpuarb_pend_cu, &k, &v, BPF_ANY);
	return 0;
}

static __always_inline struct event *finish_call(struct pt_regs *ctx, __u32 func,
						 struct cuda_stash *out, struct cgroup_stats **sp)
{
	struct cuda_key k = { .pid_tgid = bpf_get_current_pid_tgid(), .func = func };
	struct cuda_stash *st = bpf_map_lookup_elem(&gpuarb_pend_cu, &k);
	__u64 now = bpf_ktime_get_ns();
	struct event *e;

	if (!st)
		return NULL;
	*out = *st;
	bpf_map_delete_elem(&gpuarb_pend_cu, &k);
	e = cuda_event(func, now, sp);
	if (!e)
		return NULL;
	e->ts_enter = out->ts;
	e->ret = (__s32)PT_REGS_RC(ctx);
	return e;
}

static __always_inline int sync_return(struct pt_regs *ctx, __u32 func)
{
	struct cuda_stash st;
	struct cgroup_stats *s = NULL;
	struct event *e = finish_call(ctx, func, &st, &s);

	if (s) {
		__sync_fetch_and_add(&s->syncs, 1);
		__sync_fetch_and_add(&s->sync_wait_ns, bpf_ktime_get_ns() - st.ts);
	}
	if (!e)
		return 0;
	e->args[0] = st.args[0];
	bpf_ringbuf_submit(e, wakeup_flag(e));
	return 0;
}

SEC("uprobe/cuStreamSynchronize")
int gpuarb_cu_stream_sync(struct pt_regs *ctx)
{
	return stash_entry(CU_STREAM_SYNC, PT_REGS_PARM1(ctx), 0, 0);
}

SEC("uretprobe/cuStreamSynchronize")
int gpuarb_cu_stream_sync_ret(struct pt_regs *ctx)
{
	return sync_return(ctx, CU_STREAM_SYNC);
}

SEC("uprobe/cuCtxSynchronize")
int gpuarb_cu_ctx_sync(struct pt_regs *ctx)
{
	return stash_entry(CU_CTX_SYNC, 0, 0, 0);
}

SEC("uretprobe/cuCtxSynchronize")
int gpuarb_cu_ctx_sync_ret(struct pt_regs *ctx)
{
	return sync_return(ctx, CU_CTX_SYNC);
}

SEC("uprobe/cuEventSynchronize")
int gpuarb_cu_event_sync(struct pt_regs *ctx)
{
	return stash_entry(CU_EVENT_SYNC, PT_REGS_PARM1(ctx), 0, 0);
}

SEC("uretprobe/cuEventSynchronize")
int gpuarb_cu_event_sync_ret(struct pt_regs *ctx)
{
	return sync_return(ctx, CU_EVENT_SYNC);
}

/* cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev) */
SEC("uprobe/cuCtxCreate_v2")
int gpuarb_cu_ctx_create(struct pt_regs *ctx)
{
	return stash_entry(CU_CTX_CREATE, PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx), PT_REGS_PARM3(ctx));
}

SEC("uretprobe/cuCtxCreate_v2")
int gpuarb_cu_ctx_create_ret(struct pt_regs *ctx)
{
	struct cuda_stash st;
	struct cgroup_stats *s;
	struct event *e = finish_call(ctx, CU_CTX_CREATE, &st, &s);
	__u64 handle = 0;

	if (!e)
		return 0;
	bpf_probe_read_user(&handle, sizeof(handle), (const void *)st.args[0]);
	e->args[0] = handle;
	e->args[1] = st.args[1];
	e->args[2] = (__u32)st.args[2];
	if (e->ret == 0)
		track_object(e->tgid, 0, handle, e->cgroup_id, e->ts_exit, 0, (__u32)st.args[2]);
	bpf_ringbuf_submit(e, wakeup_flag(e));
	return 0;
}

/* cuCtxDestroy_v2(CUcontext ctx) */
SEC("uprobe/cuCtxDestroy_v2")
int gpuarb_cu_ctx_destroy(struct pt_regs *ctx)
{
	struct cgroup_stats *s;
	struct event *e = cuda_event(CU_CTX_DESTROY, bpf_ktime_get_ns(), &s);
	__u64 handle = PT_REGS_PARM1(ctx);

	untrack_object(bpf_get_current_pid_tgid() >> 32, 0, handle);
	if (!e)
		return 0;
	e->args[0] = handle;
	bpf_ringbuf_submit(e, wakeup_flag(e));
	return 0;
}

/* cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes) */
SEC("uprobe/cuMemAlloc_v2")
int gpuarb_cu_mem_alloc(struct pt_regs *ctx)
{
	return stash_entry(CU_MEM_ALLOC, PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx), 0);
}

SEC("uretprobe/cuMemAlloc_v2")
int gpuarb_cu_mem_alloc_ret(struct pt_regs *ctx)
{
	struct cuda_stash st;
	struct cgroup_stats *s = NULL;
	struct event *e = finish_call(ctx, CU_MEM_ALLOC, &st, &s);
	struct alloc_key k = {};
	struct alloc_info v = { .bytes = st.args[1] };
	__u64 dptr = 0;

	if (!e)
		return 0;
	bpf_probe_read_user(&dptr, sizeof(dptr), (const void *)st.args[0]);
	e->args[0] = dptr;
	e->args[2] = st.args[1];
	if (e->ret == 0 && dptr) {
		k.tgid = e->tgid;
		k.dptr = dptr;
		bpf_map_update_elem(&gpuarb_allocs, &k, &v, BPF_ANY);
		if (s)
			__sync_fetch_and_add(&s->bytes_alloc, st.args[1]);
	}
	bpf_ringbuf_submit(e, wakeup_flag(e));
	return 0;
}

/* cuMemFree_v2(CUdeviceptr dptr): the size comes from the allocation table. */
SEC("uprobe/cuMemFree_v2")
int gpuarb_cu_mem_free(struct pt_regs *ctx)
{
	struct cgroup_stats *s;
	struct event *e = cuda_event(CU_MEM_FREE, bpf_ktime_get_ns(), &s);
	struct alloc_key k = { .tgid = bpf_get_current_pid_tgid() >> 32, .dptr = PT_REGS_PARM1(ctx) };
	struct alloc_info *a = bpf_map_lookup_elem(&gpuarb_allocs, &k);
	__u64 bytes = 0;

	if (a) {
		bytes = a->bytes;
		bpf_map_delete_elem(&gpuarb_allocs, &k);
		if (s)
			__sync_fetch_and_add(&s->bytes_freed, bytes);
	}
	if (!e)
		return 0;
	e->args[0] = k.dptr;
	e->args[2] = bytes;
	bpf_ringbuf_submit(e, wakeup_flag(e));
	return 0;
}

/* ---- process lifecycle and libcuda discovery ---- */

SEC("tracepoint/sched/sched_process_exit")
int gpuarb_process_exit(void *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32;
	struct proc_info *p;
	struct event *e;

	if (tgid != (__u32)id)
		return 0;
	bpf_map_delete_elem(&gpuarb_held, &tgid); /* a held process that dies is released */
	p = bpf_map_lookup_elem(&gpuarb_procs, &tgid);
	if (!p)
		return 0;
	e = event_reserve(EV_EXIT, id, p->cgroup_id);
	bpf_map_delete_elem(&gpuarb_procs, &tgid);
	if (!e)
		return 0;
	e->ts_enter = e->ts_exit = bpf_ktime_get_ns();
	bpf_ringbuf_submit(e, wakeup_flag(e));
	return 0;
}

#define LIBCUDA_LEN 10 /* "libcuda.so" */

/* Reports whether "libcuda.so" starts a path component at offset i. */
static __always_inline int libcuda_at(const char *p, __u32 i)
{
	if (i > 0 && p[(i - 1) & (GPUARB_PATH - 1)] != '/')
		return 0;
	return p[i & (GPUARB_PATH - 1)] == 'l' && p[(i + 1) & (GPUARB_PATH - 1)] == 'i' &&
	       p[(i + 2) & (GPUARB_PATH - 1)] == 'b' && p[(i + 3) & (GPUARB_PATH - 1)] == 'c' &&
	       p[(i + 4) & (GPUARB_PATH - 1)] == 'u' && p[(i + 5) & (GPUARB_PATH - 1)] == 'd' &&
	       p[(i + 6) & (GPUARB_PATH - 1)] == 'a' && p[(i + 7) & (GPUARB_PATH - 1)] == '.' &&
	       p[(i + 8) & (GPUARB_PATH - 1)] == 's' && p[(i + 9) & (GPUARB_PATH - 1)] == 'o';
}

SEC("tracepoint/syscalls/sys_enter_openat")
int gpuarb_openat(struct sys_enter_ctx *ctx)
{
	__u32 zero = 0;
	struct path_buf *buf = bpf_map_lookup_elem(&gpuarb_scratch, &zero);
	struct event *e;
	long n;
	int found = 0;

	if (!buf)
		return 0;
	n = bpf_probe_read_user_str(buf->path, sizeof(buf->path), (const void *)ctx->args[1]);
	if (n <= LIBCUDA_LEN)
		return 0;
	/* The index is the loop's only state, so the verifier prunes well. */
	for (__u32 i = 0; i + LIBCUDA_LEN < GPUARB_PATH; i++) {
		if (i + LIBCUDA_LEN >= n)
			break;
		if (libcuda_at(buf->path, i)) {
			found = 1;
			break;
		}
	}
	if (!found)
		return 0;
	e = event_reserve(EV_LIBCUDA_OPEN, bpf_get_current_pid_tgid(), bpf_get_current_cgroup_id());
	if (!e)
		return 0;
	e->ts_enter = e->ts_exit = bpf_ktime_get_ns();
	e->args[0] = ctx->args[0]; /* dirfd */
	bpf_probe_read_kernel_str(e->path, sizeof(e->path), buf->path);
	bpf_ringbuf_submit(e, wakeup_flag(e));
	return 0;
}
