//go:build ignore

// gpuarb probes: GPU ioctls (syscall tracepoints, fd -> inode -> rdev matched
// against the device table), libcuda entry points (uprobes/uretprobes), forks
// below pid tenants and process exit. Counters go to pinned per-cgroup maps,
// records to the ring buffer; a failed reserve bumps the lost counter.

#include <linux/types.h>
#include <linux/bpf.h>
#include <asm/ptrace.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

#include "gpuarb.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Minimal CO-RE views of the kernel structures on the fd -> inode path. */
struct super_block {
	__u32 s_dev;
} __attribute__((preserve_access_index));

struct inode {
	__u32 i_rdev;
	unsigned long i_ino;
	struct super_block *i_sb;
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
	int pid;
	int tgid;
	struct files_struct *files;
	struct task_struct *group_leader;
	__u64 start_boottime;
} __attribute__((preserve_access_index));

struct kernel_siginfo;

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

#define ENOTTY 25
#define SIGKILL 9
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
	__u64 ino; /* the file's inode: who steers through it checks it is this one */
	__u32 cmd;
	__u32 major;
	__u32 minor;
	__u32 kind;
	__u32 fd;
	__u32 sdev; /* the inode's filesystem (kernel dev_t) */
	__u64 mem_bytes; /* a device memory allocation's size at entry */
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

/* Processes followed for pid tenants, by tgid; the value is the root's pid
 * (the tenant's). The daemon puts a root and its descendants in; every
 * process forked below one of them is added at fork, so a double fork that
 * reparents it (to init or a subreaper) does not take it out of its
 * tenant; a process leaves at its exit. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, __u32);
} gpuarb_trees SEC(".maps");

/* Forks below a followed process that gpuarb_trees had no room for. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} gpuarb_unfollowed SEC(".maps");

/* In-flight ioctls: removed at syscall exit, which every syscall reaches
 * (a thread killed in one too), so a plain preallocated hash (no LRU list
 * lock on every update). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 8192);
	__type(key, __u64);
	__type(value, struct ioctl_stash);
} gpuarb_pend_io SEC(".maps");

/* An mmap of a nvidia-uvm file, or an munmap of a process with a managed
 * range, from its entry to its exit, by thread. */
struct map_stash {
	__u64 addr; /* an munmap's */
	__u64 len;
	__u32 fd;
	__u32 unmap;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 8192);
	__type(key, __u64);
	__type(value, struct map_stash);
} gpuarb_pend_map SEC(".maps");

/* Processes that mapped a nvidia-uvm file (key: tgid): their munmaps are
 * recorded, everyone else's pay one lookup. Full: a process's munmaps go
 * unrecorded and its managed ranges read high until it exits. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, __u8);
} gpuarb_uvm_procs SEC(".maps");

/* In-flight libcuda calls measured to their return: removed by the
 * uretprobe, which a thread killed inside the call never reaches, so an
 * LRU: what such threads leave is evicted, never fills the table (once
 * full, no sync, context or allocation would be metered host-wide). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
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

/* GPU memory limits (struct mem_usage in gpuarb.h). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, struct gate_key);
	__type(value, __u32);
} gpuarb_mem_keys SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MEM_SLOTS);
	__type(key, __u32);
	__type(value, __u64);
} gpuarb_mem_limit SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MEM_SLOTS);
	__type(key, __u32);
	__type(value, struct mem_usage);
} gpuarb_mem_usage SEC(".maps");

/* A slot's limit as a share of each GPU's memory, in parts per million
 * (0: none); where both it and gpuarb_mem_limit are set, the lower holds.
 * Written only by the daemon. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MEM_SLOTS);
	__type(key, __u32);
	__type(value, __u32);
} gpuarb_mem_share SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, struct mem_proc);
} gpuarb_mem_procs SEC(".maps");

/* An LRU: an allocation evicted before its free stays charged until its
 * process exits (the charge errs high, never low). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct mem_obj_key);
	__type(value, struct mem_obj);
} gpuarb_mem_objs SEC(".maps");

/* The devices of limited tenants' processes with what is charged under
 * them; an LRU, as gpuarb_mem_objs. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct mem_obj_key);
	__type(value, struct mem_dev);
} gpuarb_mem_devs SEC(".maps");

/* Numbers the mem_dev entries made, for mem_dev.gen. */
__u64 mem_dev_seq;

/* Number of gpuarb_mem_keys entries; 0 skips every memory limit lookup. Set
 * by the daemon. */
volatile __u32 mem_members;

/* The GPU memory limit of every process no slot holds, per GPU and per its
 * own cgroup (the default tenant), 0: none. Set by the daemon. */
volatile __u64 mem_default_limit;

/* The default limit as a share of each GPU's memory, in parts per million
 * (0: none); the lower of it and mem_default_limit holds. Set by the
 * daemon. */
volatile __u32 mem_default_share;

/* Each GPU's memory in bytes, by device id, as the daemon read it from the
 * driver (0: not read yet: a share holds nothing there). Set by the
 * daemon, never from a tenant's own replies. */
volatile __u64 mem_gpu_bytes[MEM_GPUS];

/* The generation of gpuarb_mem_cgroups' entries: the daemon bumps it when it
 * empties the table (a default limit set anew), and what a process charged
 * to an older entry is not uncharged from a newer one. */
volatile __u64 mem_cgroup_gen;

/* What the default limit charged, by cgroup id. A plain hash: an entry is
 * removed only by the daemon, once its cgroup is gone. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64);
	__type(value, struct mem_usage);
} gpuarb_mem_cgroups SEC(".maps");

/* Whether any memory limit is in force: else no allocation pays a lookup. */
static __always_inline int memory_limited(void)
{
	return mem_members || mem_default_limit || mem_default_share;
}

#define GATE_CGROUP_LEVELS 16
#define SIGSTOP 19
#define SIGCONT 18

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

/* The holds the daemon ended last, by tgid: noted before it forgets a hold
 * and marked once it has continued the process, so that a daemon killed in
 * between leaves the process to whoever releases what it left, and a hold a
 * sibling thread made just before that continue (which ended it too) is
 * not taken for an escape. Written by the daemon only; cleared at the
 * process's exit. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, struct release_note);
} gpuarb_releasing SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct gate_lease);
} gpuarb_gate_lease SEC(".maps");

/* Number of gate members; 0 skips the lookups on every launch. Set by the
 * daemon. */
volatile __u32 gate_members;

/* Processes whose every record wakes the reader at once, by tgid: those of
 * latency tenants on a GPU whose scheduler the daemon steers, which takes
 * the other tenants off the GPU the moment one of them launches work and
 * puts them back when its wait ends. Set by the daemon. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, __u8);
} gpuarb_urgent SEC(".maps");

/* Number of gpuarb_urgent entries; 0 skips the lookup on every record. */
volatile __u32 urgent_members;

/* Cgroups whose processes' records are all urgent, by cgroup id (with every
 * cgroup below them): the latency tenants' own, so that a process of theirs
 * the daemon has not seen yet (a new worker, a service's first requests)
 * wakes the reader at its first launch. Set by the daemon. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u64);
	__type(value, __u8);
} gpuarb_urgent_cgroups SEC(".maps");

/* Number of gpuarb_urgent_cgroups entries; 0 skips the walk up the current
 * cgroup's ancestors on every record. */
volatile __u32 urgent_cgroup_members;

/* Bytes pending on the ring above which a submit wakes the reader; below it
 * the reader finds records on its next poll (see ioctlspy.Spy). Waking the
 * reader for every record costs the submitting process microseconds. Set at
 * load time. A held launch always wakes it: the process is stopped until
 * its gate's pacer, told by the reader, releases it; so does every record of
 * an urgent process (gpuarb_urgent, gpuarb_urgent_cgroups). */
volatile const __u64 wakeup_bytes = 65536;

/* Reports whether the current process's cgroup, or one of its ancestors, is
 * in gpuarb_urgent_cgroups. */
static __always_inline int urgent_cgroup(void)
{
	for (int level = GATE_CGROUP_LEVELS - 1; level >= 0; level--) {
		__u64 id = bpf_get_current_ancestor_cgroup_id(level);

		if (id && bpf_map_lookup_elem(&gpuarb_urgent_cgroups, &id))
			return 1;
	}
	return 0;
}

static __always_inline __u64 wakeup_flag(const struct record_header *h)
{
	if (h->flags & EVF_HELD)
		return BPF_RB_FORCE_WAKEUP;
	if (urgent_members && bpf_map_lookup_elem(&gpuarb_urgent, &h->tgid))
		return BPF_RB_FORCE_WAKEUP;
	if (urgent_cgroup_members && urgent_cgroup())
		return BPF_RB_FORCE_WAKEUP;
	return bpf_ringbuf_query(&gpuarb_events, BPF_RB_AVAIL_DATA) >= wakeup_bytes ? BPF_RB_FORCE_WAKEUP
										    : BPF_RB_NO_WAKEUP;
}

/* Keep the record types and the enums Go shares in the object's BTF for
 * bpf2go, which generates their Go constants: nothing is mirrored by hand. */
const struct record_header *unused_record_header __attribute__((unused));
const struct ioctl_record *unused_ioctl_record __attribute__((unused));
const struct call_record *unused_call_record __attribute__((unused));
const struct launch_record *unused_launch_record __attribute__((unused));
const struct map_record *unused_map_record __attribute__((unused));
const enum cuda_func *unused_cuda_func __attribute__((unused));
const enum dev_kind *unused_dev_kind __attribute__((unused));
const enum nv_rm *unused_nv_rm __attribute__((unused));
const enum gpuarb_sizes *unused_gpuarb_sizes __attribute__((unused));
const enum event_type *unused_event_type __attribute__((unused));
const enum event_flags *unused_event_flags __attribute__((unused));
const enum gate_kind *unused_gate_kind __attribute__((unused));
const struct gate_lease *unused_gate_lease __attribute__((unused));
const struct release_note *unused_release_note __attribute__((unused));
const struct mem_usage *unused_mem_usage __attribute__((unused));
const struct mem_proc *unused_mem_proc __attribute__((unused));
const struct mem_obj_key *unused_mem_obj_key __attribute__((unused));
const struct mem_obj *unused_mem_obj __attribute__((unused));
const struct mem_dev *unused_mem_dev __attribute__((unused));

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

/* Reserves a record of type T on the ring, zeroed, its header filled; NULL
 * (counted as lost) when the ring is full. */
#define RECORD_RESERVE(T, type, pid_tgid, cgid) ((T *)record_reserve(sizeof(T), type, pid_tgid, cgid))

static __always_inline void *record_reserve(__u32 size, __u32 type, __u64 pid_tgid, __u64 cgid)
{
	struct record_header *h = bpf_ringbuf_reserve(&gpuarb_events, size, 0);

	if (!h) {
		count_lost();
		return NULL;
	}
	__builtin_memset(h, 0, size);
	h->type = type;
	h->tgid = pid_tgid >> 32;
	h->tid = (__u32)pid_tgid;
	h->cgroup_id = cgid;
	bpf_get_current_comm(h->comm, sizeof(h->comm));
	return h;
}

/* Copies up to GPUARB_PAYLOAD bytes of user memory; returns the count copied. */
static __always_inline __u16 copy_user(__u8 *dst, __u64 src, __u32 size)
{
	__u32 n = size;

	if (!src || !n)
		return 0;
	if (n > GPUARB_PAYLOAD)
		n = GPUARB_PAYLOAD;
	/* Hide the clamp from clang so that the mask and the check below reach
	 * the verifier, which bounds the copy by the payload with them. */
	asm volatile("" : "+r"(n));
	n &= 2 * GPUARB_PAYLOAD - 1;
	if (n > GPUARB_PAYLOAD)
		return 0;
	if (bpf_probe_read_user(dst, n, (const void *)src) < 0)
		return 0;
	return n;
}

/* The open file behind the current process's descriptor fd (NULL: none). */
static __always_inline struct file *fd_file(unsigned int fd)
{
	/* BTF-typed task: the walk to the fd array is plain loads, not helpers. */
	struct task_struct *task = bpf_get_current_task_btf();
	struct fdtable *fdt = task->files->fdt;
	struct file *f = NULL;

	if (fd >= fdt->max_fds)
		return NULL;
	if (bpf_probe_read_kernel(&f, sizeof(f), &fdt->fd[fd]) < 0)
		return NULL;
	return f;
}

/* ---- launch gates ---- */

/* The slot of the current process in a member table (gate_key -> slot):
 * its own entry, else the deepest of its cgroup and the cgroup's ancestors
 * that has one. */
static __always_inline __u32 *member_slot(void *keys, __u32 tgid)
{
	struct gate_key k = { .id = tgid, .kind = GATE_PROCESS };
	__u32 *slot = bpf_map_lookup_elem(keys, &k);

	if (slot)
		return slot;
	k.kind = GATE_CGROUP;
	for (int level = GATE_CGROUP_LEVELS - 1; level >= 0; level--) {
		k.id = bpf_get_current_ancestor_cgroup_id(level);
		if (!k.id)
			continue; /* deeper than the process's cgroup */
		slot = bpf_map_lookup_elem(keys, &k);
		if (slot)
			return slot;
	}
	return NULL;
}

/* Numbers the SIGSTOPs and SIGCONTs generated for held processes, in the
 * order the kernel generates them (each under its process's signal lock):
 * a hold's stop_seq above its cont_seq says its stop is still on its way
 * or has taken effect, whatever stage it is at (queued, dequeued by a
 * sibling thread, the group stop under way or done); below, the process was
 * continued since. Read with the atomic add that sets it. */
__u64 signal_seq;

SEC("tp_btf/signal_generate")
int BPF_PROG(gpuarb_signal_generate, int sig, struct kernel_siginfo *info, struct task_struct *task)
{
	__u32 tgid;
	struct held_proc *h;
	__u64 seq;

	if (sig != SIGSTOP && sig != SIGCONT)
		return 0;
	tgid = task->tgid;
	h = bpf_map_lookup_elem(&gpuarb_held, &tgid);
	if (!h)
		return 0;
	seq = __sync_fetch_and_add(&signal_seq, 1) + 1;
	if (sig == SIGSTOP)
		h->stop_seq = seq;
	else
		h->cont_seq = seq;
	return 0;
}

/* Reports whether the gates' lease is live: a live daemon renews it, and
 * nothing that stops a process may happen once it has lapsed. The read is an
 * atomic one, a full barrier: after the hold's record is written, either the
 * lease is still live and whoever ends it reads the record after, or the
 * hold sees it ended. */
static __always_inline int lease_live(__u64 now)
{
	__u32 zero = 0;
	struct gate_lease *l = bpf_map_lookup_elem(&gpuarb_gate_lease, &zero);

	return l && now < __sync_fetch_and_add(&l->until_ns, 0);
}

/* Passes one launch (or submission) through the process's gate. Beyond the
 * allowance the process is recorded as held and stopped: the signal lands
 * on the way back to user space, before a probed function's body runs (a
 * launch waits; submitted says the work already went through, as with an
 * ioctl, and is then counted). Returns 1 when the process is held.
 *
 * A process already in the held table when one of its threads passes is
 * either being stopped (a sibling thread's hold, its stop not out or not
 * taken yet: this launch waits with it, counted in the record) or was
 * continued: by gpuarb's release of an earlier hold, or by someone else (a
 * sibling process's SIGCONT), an escape. No process is stopped without a
 * record the daemon or the guardian will find, nor while the lease has
 * lapsed. */
static __always_inline int gate_pass(__u64 pid_tgid, __u64 now, int submitted)
{
	__u32 tgid = pid_tgid >> 32;
	struct held_proc h, *prev;
	struct release_note *note;
	struct task_struct *task;
	struct gate *g;
	__u64 *allowed;
	__u32 *slot;

	if (!gate_members)
		return 0;
	slot = member_slot(&gpuarb_gate_keys, tgid);
	if (!slot)
		return 0;
	g = bpf_map_lookup_elem(&gpuarb_gates, slot);
	allowed = bpf_map_lookup_elem(&gpuarb_gate_allow, slot);
	if (!g || !allowed)
		return 0;
	task = bpf_get_current_task_btf();
	prev = bpf_map_lookup_elem(&gpuarb_held, &tgid);
	if (prev && prev->gate == *slot) {
		if (prev->stopping || prev->stop_seq > prev->cont_seq) {
			__sync_fetch_and_add(&prev->waiting, 1);
			return 1;
		}
		/* It runs: its held launch ran, and is counted now. The daemon's
		 * own continue ended it if it came after the hold was made (a
		 * sibling thread's hold just before the release of the last one)
		 * or is on its way (the release noted, its continue not yet
		 * marked: the threads it woke may launch before the mark);
		 * otherwise someone else's did: an escape. */
		note = bpf_map_lookup_elem(&gpuarb_releasing, &tgid);
		if (prev->flags & HELD_UNCOUNTED)
			__sync_fetch_and_add(&g->admitted, 1);
		if (!note || (note->continued_ns && note->continued_ns < prev->since_ns))
			__sync_fetch_and_add(&g->escapes, 1);
		bpf_map_delete_elem(&gpuarb_held, &tgid);
	}
	if (__sync_fetch_and_add(&g->admitted, 1) < *allowed || !lease_live(now))
		return 0;
	__builtin_memset(&h, 0, sizeof(h));
	h.since_ns = now;
	h.start_ns = task->group_leader->start_boottime;
	h.gate = *slot;
	h.flags = submitted ? 0 : HELD_UNCOUNTED;
	h.stopping = 1;
	if (bpf_map_update_elem(&gpuarb_held, &tgid, &h, BPF_ANY)) {
		/* gpuarb_held is full: a process not recorded there would never
		 * be continued (neither by the daemon nor by the guardian), so
		 * it is not stopped; the launch runs, counted. */
		__sync_fetch_and_add(&g->unrecorded, 1);
		return 0;
	}
	if (!lease_live(now)) {
		/* Ended since the check above: whoever ended it may have read the
		 * table already. */
		bpf_map_delete_elem(&gpuarb_held, &tgid);
		return 0;
	}
	if (!submitted)
		__sync_fetch_and_add(&g->admitted, -1); /* it runs, and is counted, at release */
	if (bpf_send_signal(SIGSTOP)) {
		/* Not sent (the process is exiting): nothing is held. */
		bpf_map_delete_elem(&gpuarb_held, &tgid);
		if (!submitted)
			__sync_fetch_and_add(&g->admitted, 1);
		return 0;
	}
	__sync_fetch_and_add(&g->holds, 1);
	prev = bpf_map_lookup_elem(&gpuarb_held, &tgid);
	if (prev && prev->since_ns == now)
		prev->stopping = 0;
	return 1;
}

/* ---- GPU memory ---- */

/* A device memory allocation an nvidia ioctl makes, as read from the
 * caller's memory. */
struct mem_req {
	__u64 bytes;
	__u32 parent; /* the device or subdevice it is allocated under */
	__u32 handle;
	__u32 status;
	__u32 host; /* pinned host memory, not device memory */
};

/* Reads the memory allocation the nvidia ioctl (cmd, argp) makes, directly
 * or wrapped in IOCTL_XFER_CMD: RM_ALLOC of a video memory class or of
 * pinned host memory, or RM_VID_HEAP_CONTROL's ALLOC_SIZE(_RANGE). Returns
 * 0 for any other ioctl. Read at entry the size is the request; at exit, what the driver
 * wrote back (the size is IN/OUT, the status set). */
static __always_inline int mem_request(__u32 cmd, __u64 argp, struct mem_req *m)
{
	__u32 nr = cmd & 0xff, size = (cmd >> 16) & 0x3fff;
	__u32 hdr[4];

	if (((cmd >> 8) & 0xff) != NV_MAGIC)
		return 0;
	if (nr == NV_ESC_IOCTL_XFER_CMD) {
		struct {
			__u32 cmd;
			__u32 size;
			__u64 ptr;
		} x;

		if (bpf_probe_read_user(&x, sizeof(x), (const void *)argp) < 0)
			return 0;
		nr = x.cmd;
		size = x.size;
		argp = x.ptr;
	}
	if (nr == NV_ESC_RM_ALLOC) {
		__u64 params;

		if (size != 32 && size != NVOS64_SIZE) /* NVOS21, NVOS64 */
			return 0;
		if (bpf_probe_read_user(hdr, sizeof(hdr), (const void *)argp) < 0)
			return 0;
		if (hdr[3] != NV_MEM_LOCAL_USER && hdr[3] != NV_MEM_LOCAL_PRIVILEGED && hdr[3] != NV_MEM_SYSTEM)
			return 0;
		m->host = hdr[3] == NV_MEM_SYSTEM;
		if (bpf_probe_read_user(&params, sizeof(params), (const void *)(argp + NV_ALLOC_PARAMS_OFFSET)) < 0 ||
		    bpf_probe_read_user(&m->status, sizeof(m->status),
					(const void *)(argp + (size == NVOS64_SIZE ? NVOS64_STATUS_OFFSET : NVOS21_STATUS_OFFSET))) < 0 ||
		    bpf_probe_read_user(&m->bytes, sizeof(m->bytes), (const void *)(params + NV_MEM_SIZE_OFFSET)) < 0)
			return 0;
		m->parent = hdr[1];
		m->handle = hdr[2];
		return 1;
	}
	if (nr == NV_ESC_RM_VID_HEAP_CONTROL) {
		__u32 off;

		if (size < NVOS32_MIN_SIZE)
			return 0;
		if (bpf_probe_read_user(hdr, sizeof(hdr), (const void *)argp) < 0)
			return 0;
		if (hdr[NVOS32_FUNCTION_OFFSET / 4] == NVOS32_FUNCTION_ALLOC_SIZE)
			off = NVOS32_SIZE_OFFSET;
		else if (hdr[NVOS32_FUNCTION_OFFSET / 4] == NVOS32_FUNCTION_ALLOC_SIZE_RANGE)
			off = NVOS32_RANGE_SIZE_OFFSET;
		else
			return 0;
		if (bpf_probe_read_user(&m->status, sizeof(m->status), (const void *)(argp + NVOS32_STATUS_OFFSET)) < 0 ||
		    bpf_probe_read_user(&m->handle, sizeof(m->handle), (const void *)(argp + NVOS32_HMEMORY_OFFSET)) < 0 ||
		    bpf_probe_read_user(&m->bytes, sizeof(m->bytes), (const void *)(argp + off)) < 0)
			return 0;
		m->parent = hdr[1];
		return 1;
	}
	return 0;
}

/* The GPU an object allocated under parent (a device, or a subdevice of
 * one) is on: the device's deviceId, the last charged GPU (MEM_GPUS - 1)
 * for one at or past it, and for a parent the probes never saw made. The
 * device's handle goes to *device (parent itself when not seen). */
static __always_inline __u32 gpu_of(__u32 tgid, __u32 parent, __u32 *device)
{
	struct ctx_key k = { .tgid = tgid, .kind = DEV_NVIDIA_CTL, .handle = parent };
	struct ctx_info *o = bpf_map_lookup_elem(&gpuarb_ctxs, &k);

	*device = parent;
	if (o && o->obj_class == NV_SUBDEVICE_CLASS) {
		*device = o->parent;
		k.handle = o->parent;
		o = bpf_map_lookup_elem(&gpuarb_ctxs, &k);
	}
	if (o && o->obj_class == NV_DEVICE_CLASS && o->parent < MEM_GPUS)
		return o->parent;
	return MEM_GPUS - 1;
}

/* The limit on gpu of a slot whose limit is bytes and share (parts per
 * million of the GPU's memory): the lower of those set; 0: none. */
static __always_inline __u64 limit_on(__u32 gpu, __u64 bytes, __u32 share)
{
	__u64 size, of_share;

	if (!share || gpu >= MEM_GPUS)
		return bytes;
	size = mem_gpu_bytes[gpu];
	if (!size)
		return bytes;
	/* At most 16 TiB * 10^6 < 2^64. */
	of_share = size * share / 1000000;
	if (!of_share)
		of_share = 1;
	return bytes && bytes < of_share ? bytes : of_share;
}

static __always_inline __u64 current_start_ns(void)
{
	return bpf_get_current_task_btf()->group_leader->start_boottime;
}

/* Charges a made allocation of bytes on gpu to the current process's
 * memory limit slot, if its tenant has one. One that would take the GPU's
 * charge past the limit is not charged: the process is sent SIGKILL (it
 * dies before it returns to user space, and its exit frees what the driver
 * allocated) and the record says so. The check and the charge are one
 * atomic add, so racing allocations of a tenant never both pass. */
static __always_inline void charge_memory(struct ioctl_record *e, __u32 handle, __u64 bytes, __u32 gpu, __u32 device)
{
	struct mem_obj_key ok = { .tgid = e->h.tgid, .handle = handle };
	struct mem_obj_key dk = { .tgid = e->h.tgid, .handle = device };
	struct mem_obj obj = { .bytes = bytes, .gpu = gpu, .device = device };
	struct mem_dev dfresh, *dev;
	struct mem_proc fresh, *p;
	struct mem_usage *u;
	__u64 *limit, held, lim;
	__u32 *slot, *share;

	__u32 default_slot = MEM_SLOTS;

	slot = mem_members ? member_slot(&gpuarb_mem_keys, e->h.tgid) : NULL;
	if (slot) {
		limit = bpf_map_lookup_elem(&gpuarb_mem_limit, slot);
		share = bpf_map_lookup_elem(&gpuarb_mem_share, slot);
		if (!limit || !share)
			return;
		lim = limit_on(gpu, *limit, *share);
		u = bpf_map_lookup_elem(&gpuarb_mem_usage, slot);
	} else if (mem_default_limit || mem_default_share) {
		struct mem_usage zero;

		slot = &default_slot;
		lim = limit_on(gpu, mem_default_limit, mem_default_share);
		u = bpf_map_lookup_elem(&gpuarb_mem_cgroups, &e->h.cgroup_id);
		if (!u) {
			__builtin_memset(&zero, 0, sizeof(zero));
			zero.gen = mem_cgroup_gen;
			/* Full: this cgroup is not held (counted below). */
			bpf_map_update_elem(&gpuarb_mem_cgroups, &e->h.cgroup_id, &zero, BPF_NOEXIST);
			u = bpf_map_lookup_elem(&gpuarb_mem_cgroups, &e->h.cgroup_id);
		}
	} else {
		return;
	}
	if (!u || gpu >= MEM_GPUS)
		return;
	held = __sync_fetch_and_add(&u->charged[gpu], bytes);
	e->args[3] = held;
	e->args[4] = lim;
	e->args[5] = *slot;
	if (lim && held + bytes > lim) {
		__sync_fetch_and_add(&u->charged[gpu], -bytes);
		if (!bpf_send_signal(SIGKILL)) {
			__sync_fetch_and_add(&u->kills[gpu], 1);
			e->h.flags |= EVF_OOM_KILL;
		}
		return;
	}
	obj.start_ns = current_start_ns();
	p = bpf_map_lookup_elem(&gpuarb_mem_procs, &e->h.tgid);
	if (!p || p->start_ns != obj.start_ns || p->slot != *slot || p->gen != u->gen ||
	    (*slot == MEM_SLOTS && p->cgroup != e->h.cgroup_id)) {
		__builtin_memset(&fresh, 0, sizeof(fresh));
		fresh.start_ns = obj.start_ns;
		fresh.slot = *slot;
		fresh.gen = u->gen;
		fresh.cgroup = e->h.cgroup_id;
		/* Full: the charge stays with the slot until the daemon resets it. */
		bpf_map_update_elem(&gpuarb_mem_procs, &e->h.tgid, &fresh, BPF_ANY);
		p = bpf_map_lookup_elem(&gpuarb_mem_procs, &e->h.tgid);
	}
	if (p)
		__sync_fetch_and_add(&p->charged[gpu], bytes);
	dev = bpf_map_lookup_elem(&gpuarb_mem_devs, &dk);
	if (!dev || dev->start_ns != obj.start_ns) {
		__builtin_memset(&dfresh, 0, sizeof(dfresh));
		dfresh.start_ns = obj.start_ns;
		dfresh.gen = __sync_fetch_and_add(&mem_dev_seq, 1) + 1;
		dfresh.gpu = gpu;
		bpf_map_update_elem(&gpuarb_mem_devs, &dk, &dfresh, BPF_ANY);
		dev = bpf_map_lookup_elem(&gpuarb_mem_devs, &dk);
	}
	if (dev) {
		__sync_fetch_and_add(&dev->bytes, bytes);
		obj.dev_gen = dev->gen;
	}
	bpf_map_update_elem(&gpuarb_mem_objs, &ok, &obj, BPF_ANY);
}

/* Uncharges bytes on gpu held by the process p from its slot (or its
 * cgroup's default usage), unless the slot has been given to another
 * tenant since. */
static __always_inline void uncharge_proc(struct mem_proc *p, __u32 gpu, __u64 bytes)
{
	__u32 slot = p->slot;
	__u64 cgroup = p->cgroup;
	struct mem_usage *u = slot == MEM_SLOTS ? bpf_map_lookup_elem(&gpuarb_mem_cgroups, &cgroup)
						: bpf_map_lookup_elem(&gpuarb_mem_usage, &slot);

	if (!u || u->gen != p->gen || gpu >= MEM_GPUS)
		return;
	__sync_fetch_and_add(&u->charged[gpu], -bytes);
	__sync_fetch_and_add(&p->charged[gpu], -bytes);
}

/* An RM_FREE of a charged allocation uncharges it, unless its device was
 * freed before it (which uncharged it); one of a device uncharges all that
 * is charged under it. */
static __always_inline void free_memory(__u32 tgid, __u32 handle)
{
	struct mem_obj_key ok = { .tgid = tgid, .handle = handle };
	struct mem_obj *o = bpf_map_lookup_elem(&gpuarb_mem_objs, &ok);
	struct mem_proc *p = bpf_map_lookup_elem(&gpuarb_mem_procs, &tgid);
	struct mem_dev *dev;

	if (o) {
		ok.handle = o->device;
		dev = bpf_map_lookup_elem(&gpuarb_mem_devs, &ok);
		if (dev && dev->gen == o->dev_gen) {
			if (p && p->start_ns == o->start_ns)
				uncharge_proc(p, o->gpu, o->bytes);
			__sync_fetch_and_add(&dev->bytes, -o->bytes);
		}
		ok.handle = handle;
		bpf_map_delete_elem(&gpuarb_mem_objs, &ok);
		return;
	}
	dev = bpf_map_lookup_elem(&gpuarb_mem_devs, &ok);
	if (!dev)
		return;
	if (p && p->start_ns == dev->start_ns)
		uncharge_proc(p, dev->gpu, dev->bytes);
	bpf_map_delete_elem(&gpuarb_mem_devs, &ok);
}

/* An exiting process's charges go: the driver frees its memory with its
 * files. */
static __always_inline void exit_memory(__u32 tgid)
{
	struct mem_proc *p = bpf_map_lookup_elem(&gpuarb_mem_procs, &tgid);

	if (!p)
		return;
	for (__u32 g = 0; g < MEM_GPUS; g++)
		if (p->charged[g])
			uncharge_proc(p, g, p->charged[g]);
	bpf_map_delete_elem(&gpuarb_mem_procs, &tgid);
}

/* Records a device memory allocation in e (args[1] bytes, args[2] its GPU)
 * and, for a limited tenant, charges or refuses it (args[3] what the GPU's
 * charge was, args[4] the limit, args[5] the slot). The size charged is the
 * larger of the request read at entry and the driver's at exit: a thread
 * that rewrites the parameters in between does not shrink it. */
static __always_inline void note_memory(struct ioctl_record *e, struct ioctl_stash *st)
{
	struct mem_req m = {};
	__u32 gpu, device;
	__u64 bytes;

	if (!mem_request(st->cmd, st->arg, &m))
		return;
	bytes = m.bytes > st->mem_bytes ? m.bytes : st->mem_bytes;
	gpu = gpu_of(e->h.tgid, m.parent, &device);
	e->args[1] = bytes;
	e->args[2] = gpu;
	if (m.status || (e->ret && e->ret != -ENOTTY) || m.host) /* not made (ENOTTY: the simulator's node), or host memory */
		return;
	if (memory_limited())
		charge_memory(e, m.handle, bytes, gpu, device);
}

/* The GPU device entry of file f's device node, its numbers in *key; NULL
 * for a file that is no GPU node. */
static __always_inline struct dev_entry *gpu_device(struct file *f, struct dev_key *key)
{
	struct dev_entry *dev;
	__u32 rdev;

	if (!f)
		return NULL;
	rdev = BPF_CORE_READ(f, f_inode, i_rdev);
	if (!rdev)
		return NULL;
	key->major = rdev >> 20;
	key->minor = rdev & 0xfffff;
	dev = bpf_map_lookup_elem(&gpuarb_devices, key);
	if (!dev) {
		key->minor = DEV_ANY_MINOR;
		dev = bpf_map_lookup_elem(&gpuarb_devices, key);
		key->minor = rdev & 0xfffff;
	}
	return dev;
}

SEC("tracepoint/syscalls/sys_enter_ioctl")
int gpuarb_ioctl_enter(struct sys_enter_ctx *ctx)
{
	struct file *f = fd_file((unsigned int)ctx->args[0]);
	struct dev_key key;
	struct dev_entry *dev = gpu_device(f, &key);
	struct ioctl_stash st;
	__u64 id;

	if (!dev)
		return 0;
	st.ts = bpf_ktime_get_ns();
	st.arg = ctx->args[2];
	st.cmd = (__u32)ctx->args[1];
	st.fd = (__u32)ctx->args[0];
	st.ino = BPF_CORE_READ(f, f_inode, i_ino);
	st.sdev = BPF_CORE_READ(f, f_inode, i_sb, s_dev);
	st.major = key.major;
	st.minor = key.minor;
	st.kind = dev->kind;
	st.mem_bytes = 0;
	if (dev->kind == DEV_NVIDIA_CTL || dev->kind == DEV_NVIDIA_GPU) {
		struct mem_req m = {};

		if (mem_request(st.cmd, st.arg, &m))
			st.mem_bytes = m.bytes;
	}
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

static __always_inline void decode_nvidia(struct ioctl_record *e, struct ioctl_stash *st)
{
	__u32 cmd = st->cmd;
	__u32 nr = cmd & 0xff;
	__u32 size = (cmd >> 16) & 0x3fff;
	__u64 argp = st->arg;
	__u64 params = 0;
	__u32 params_size = 0;
	int devices = 0;

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
		__u32 hparent = *(__u32 *)&e->arg[NV_ALLOC_PARENT_OFFSET];
		__u32 hnew = *(__u32 *)&e->arg[NV_ALLOC_OBJECT_OFFSET];
		__u32 cls = *(__u32 *)&e->arg[NV_ALLOC_CLASS_OFFSET];

		params = *(__u64 *)&e->arg[NV_ALLOC_PARAMS_OFFSET];
		if (e->arg_len >= NVOS64_SIZE)
			params_size = *(__u32 *)&e->arg[NVOS64_PARAMS_SIZE_OFFSET];
		else
			params_size = *(__u32 *)&e->arg[NVOS21_PARAMS_SIZE_OFFSET];
		/* The driver sizes a fixed-size class's parameters from its
		 * class table (rmapiGetClassAllocParamSize), and the real
		 * libcuda leaves paramsSize 0 (real-GPU check, driver 580):
		 * read the prefix the decoder needs. */
		if (!params_size)
			params_size = cls == NV_TSG_CLASS ? NV_TSG_PARAMS_SIZE : GPUARB_PAYLOAD;
		if (e->ret == 0 && (cls == NV_TSG_CLASS || (cls & NV_CHANNEL_CLASS_MASK) == NV_CHANNEL_CLASS_LOW))
			track_object(e->h.tgid, DEV_NVIDIA_CTL, hnew, e->h.cgroup_id, e->h.ts_exit, cls, hparent);
		devices = cls == NV_DEVICE_CLASS || cls == NV_SUBDEVICE_CLASS;
	} else if (nr == NV_ESC_RM_CONTROL && e->arg_len >= 32) {
		params = *(__u64 *)&e->arg[NV_CONTROL_PARAMS_OFFSET];
		params_size = *(__u32 *)&e->arg[NV_CONTROL_PARAMS_SIZE_OFFSET];
	} else if (nr == NV_ESC_RM_FREE && e->arg_len >= 16) {
		untrack_object(e->h.tgid, DEV_NVIDIA_CTL, *(__u32 *)&e->arg[NV_FREE_OBJECT_OFFSET]);
		if (memory_limited() && *(__u32 *)&e->arg[NV_FREE_STATUS_OFFSET] == 0)
			free_memory(e->h.tgid, *(__u32 *)&e->arg[NV_FREE_OBJECT_OFFSET]);
	}
	if (params)
		e->params_len = copy_user(e->params, params, params_size);
	/* Devices and their subdevices, made: the GPU a memory allocation under
	 * them is on (gpu_of). A device's parameters begin with its deviceId. */
	if (devices && e->arg_len >= 32 && (e->ret == 0 || e->ret == -ENOTTY) &&
	    *(__u32 *)&e->arg[e->arg_len >= NVOS64_SIZE ? NVOS64_STATUS_OFFSET : NVOS21_STATUS_OFFSET] == 0) {
		__u32 cls = *(__u32 *)&e->arg[NV_ALLOC_CLASS_OFFSET];
		__u32 parent = *(__u32 *)&e->arg[NV_ALLOC_PARENT_OFFSET];

		if (cls == NV_DEVICE_CLASS) {
			if (e->params_len < 4)
				return;
			parent = *(__u32 *)&e->params[0];
		}
		track_object(e->h.tgid, DEV_NVIDIA_CTL, *(__u32 *)&e->arg[NV_ALLOC_OBJECT_OFFSET], e->h.cgroup_id, e->h.ts_exit, cls,
			     parent);
	}
}

static __always_inline void decode_drm(struct ioctl_record *e, struct ioctl_stash *st,
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
		if (e->ret == 0 && gate_pass(((__u64)e->h.tgid << 32) | e->h.tid, e->h.ts_exit, 1))
			e->h.flags |= EVF_HELD;
		break;
	case NOUVEAU_GEM_CPU_PREP:
	case DRM_SYNCOBJ_WAIT:
	case DRM_SYNCOBJ_TIMELINE_WAIT:
		if (s) {
			__sync_fetch_and_add(&s->syncs, 1);
			__sync_fetch_and_add(&s->sync_wait_ns, e->h.ts_exit - e->h.ts_enter);
		}
		break;
	case NOUVEAU_CHANNEL_ALLOC:
		if (e->ret == 0 && e->arg_len >= 12)
			track_object(e->h.tgid, DEV_DRM, *(__u32 *)&e->arg[8], e->h.cgroup_id, e->h.ts_exit, 0, 0);
		break;
	case NOUVEAU_CHANNEL_FREE:
		if (e->arg_len >= 4)
			untrack_object(e->h.tgid, DEV_DRM, *(__u32 *)&e->arg[0]);
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
	struct ioctl_record *e;
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

	e = RECORD_RESERVE(struct ioctl_record, EV_IOCTL, id, cgid);
	if (!e)
		return 0;
	e->h.ts_enter = st.ts;
	e->h.ts_exit = now;
	e->ret = ctx->ret;
	e->dev_major = st.major;
	e->dev_minor = st.minor;
	e->dev_kind = st.kind;
	e->cmd = st.cmd;
	e->args[0] = st.fd; /* the descriptor: an RM client is bound to its open file */
	e->file_ino = st.ino;
	e->file_dev = st.sdev;

	switch (st.kind) {
	case DEV_NVIDIA_CTL:
	case DEV_NVIDIA_GPU:
		decode_nvidia(e, &st);
		note_memory(e, &st);
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
	bpf_ringbuf_submit(e, wakeup_flag(&e->h));
	return 0;
}

/* ---- libcuda uprobes ----
 *
 * One program per call shape, attached to every exported variant of it
 * (plain, _ptsz, _ptds, _v2 ...) with the variant's enum cuda_func as the
 * cookie. Launches trap once: no uretprobe on a launch path. */

/* Counts a libcuda call of the current process: its cgroup's statistics
 * (returned in *sp) and the process. */
static __always_inline __u64 note_call(__u64 id, __u64 now, struct cgroup_stats **sp)
{
	__u64 cgid = bpf_get_current_cgroup_id();

	*sp = cgroup_stats_of(cgid, now);
	note_process(id >> 32, cgid, now);
	return cgid;
}

/* A record of a libcuda call at now. */
static __always_inline struct call_record *call_event(__u32 func, __u64 now, struct cgroup_stats **sp)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u64 cgid = note_call(id, now, sp);
	struct call_record *e = RECORD_RESERVE(struct call_record, EV_CUDA, id, cgid);

	if (!e)
		return NULL;
	e->func = func;
	e->h.ts_enter = now;
	e->h.ts_exit = now;
	return e;
}

/* A record of a launch at now, passed through the process's launch gate
 * first (EVF_HELD where it holds the process), and counted. */
static __always_inline struct launch_record *launch_event(struct pt_regs *ctx)
{
	__u64 id = bpf_get_current_pid_tgid(), now = bpf_ktime_get_ns();
	int held = gate_pass(id, now, 0);
	struct cgroup_stats *s;
	__u64 cgid = note_call(id, now, &s);
	struct launch_record *e;

	if (s) {
		__sync_fetch_and_add(&s->launches, 1);
		__sync_fetch_and_add(&s->submissions, 1);
	}
	e = RECORD_RESERVE(struct launch_record, EV_LAUNCH, id, cgid);
	if (!e)
		return NULL;
	e->func = COOKIE_FUNC(bpf_get_attach_cookie(ctx));
	e->h.ts_enter = now;
	e->h.ts_exit = now;
	if (held)
		e->h.flags |= EVF_HELD;
	return e;
}

/* The n-th argument (1-based) of a function entered at ctx (x86-64 SysV:
 * six in registers, the rest above the return address). The registers
 * are read first, each at its constant offset: a load through a ctx
 * pointer the compiler offset and merged across branches is refused. */
static __always_inline __u64 arg_n(struct pt_regs *ctx, __u32 n)
{
	__u64 a1 = PT_REGS_PARM1(ctx), a2 = PT_REGS_PARM2(ctx), a3 = PT_REGS_PARM3(ctx);
	__u64 a4 = PT_REGS_PARM4(ctx), a5 = PT_REGS_PARM5(ctx), a6 = ctx->r9; /* PT_REGS_PARM6, absent from libbpf 1.1 */
	__u64 v = 0;

	asm volatile("" : "+r"(a1), "+r"(a2), "+r"(a3), "+r"(a4), "+r"(a5), "+r"(a6));
	switch (n) {
	case 1: return a1;
	case 2: return a2;
	case 3: return a3;
	case 4: return a4;
	case 5: return a5;
	case 6: return a6;
	}
	if (n > 6 && n < 16)
		bpf_probe_read_user(&v, sizeof(v), (const void *)(PT_REGS_SP(ctx) + 8 * (n - 6)));
	return v;
}

/* cuLaunchKernel / cuLaunchCooperativeKernel (and _ptsz): (f, gx, gy, gz,
 * bx, by, bz, shmem, stream, ...); bz, shmem and stream, above the return
 * address, are read in one copy. */
SEC("uprobe/cuLaunchKernel")
int gpuarb_cu_launch(struct pt_regs *ctx)
{
	struct launch_record *e = launch_event(ctx);
	__u64 stacked[3]; /* bz, shmem, stream */

	if (!e)
		return 0;
	e->function = PT_REGS_PARM1(ctx);
	e->grid[0] = (__u32)PT_REGS_PARM2(ctx);
	e->grid[1] = (__u32)PT_REGS_PARM3(ctx);
	e->grid[2] = (__u32)PT_REGS_PARM4(ctx);
	e->block[0] = (__u32)PT_REGS_PARM5(ctx);
	e->block[1] = (__u32)ctx->r9;
	if (bpf_probe_read_user(stacked, sizeof(stacked), (const void *)(PT_REGS_SP(ctx) + 8)) == 0) {
		e->block[2] = (__u32)stacked[0];
		e->stream = stacked[2];
	}
	bpf_ringbuf_submit(e, wakeup_flag(&e->h));
	return 0;
}

/* cuLaunchKernelEx (and _ptsz): (const CUlaunchConfig *config, CUfunction f,
 * void **params, void **extra) */
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
	struct launch_record *e = launch_event(ctx);

	if (!e)
		return 0;
	e->function = PT_REGS_PARM2(ctx);
	if (bpf_probe_read_user(&cfg, sizeof(cfg), (const void *)PT_REGS_PARM1(ctx)) == 0) {
		e->grid[0] = cfg.grid[0];
		e->grid[1] = cfg.grid[1];
		e->grid[2] = cfg.grid[2];
		e->block[0] = cfg.block[0];
		e->block[1] = cfg.block[1];
		e->block[2] = cfg.block[2];
		e->stream = cfg.stream;
	}
	bpf_ringbuf_submit(e, wakeup_flag(&e->h));
	return 0;
}

/* cuGraphLaunch (and _ptsz): (CUgraphExec exec, CUstream stream) */
SEC("uprobe/cuGraphLaunch")
int gpuarb_cu_graph_launch(struct pt_regs *ctx)
{
	struct launch_record *e = launch_event(ctx);

	if (!e)
		return 0;
	e->function = PT_REGS_PARM1(ctx);
	e->stream = PT_REGS_PARM2(ctx);
	bpf_ringbuf_submit(e, wakeup_flag(&e->h));
	return 0;
}

/* Calls whose first two arguments are all the meter needs: cuEventRecord
 * (event, stream) and its variants marks how far a stream's work reaches,
 * so a later event synchronize or query tells which work drained;
 * cuStreamWaitEvent (stream, event, flags) makes a stream wait for
 * another's record; cuStreamBeginCapture_v2 (stream, mode) and
 * cuStreamEndCapture (stream, graph out) bracket launches that build a
 * graph instead of running; cuCtxDestroy (ctx), cuDevicePrimaryCtxRelease
 * and Reset (dev) end a context. */
SEC("uprobe/cuEventRecord")
int gpuarb_cu_two_args(struct pt_regs *ctx)
{
	struct cgroup_stats *s;
	struct call_record *e = call_event(COOKIE_FUNC(bpf_get_attach_cookie(ctx)), bpf_ktime_get_ns(), &s);

	if (!e)
		return 0;
	e->args[0] = PT_REGS_PARM1(ctx);
	e->args[1] = PT_REGS_PARM2(ctx);
	if (e->func == CU_CTX_DESTROY)
		untrack_object(e->h.tgid, 0, e->args[0]);
	bpf_ringbuf_submit(e, wakeup_flag(&e->h));
	return 0;
}

/* Copies and memsets: the cookie says where the byte count and the stream
 * are; (dst, src|value, ...) first. */
SEC("uprobe/cuMemcpy")
int gpuarb_cu_copy(struct pt_regs *ctx)
{
	__u64 cookie = bpf_get_attach_cookie(ctx);
	struct cgroup_stats *s;
	struct call_record *e = call_event(COOKIE_FUNC(cookie), bpf_ktime_get_ns(), &s);
	__u64 bytes = arg_n(ctx, COOKIE_BYTES_ARG(cookie)) << COOKIE_BYTES_SHIFT(cookie);

	if (s) {
		__sync_fetch_and_add(&s->copies, 1);
		__sync_fetch_and_add(&s->copy_bytes, bytes);
	}
	if (!e)
		return 0;
	e->args[0] = PT_REGS_PARM1(ctx);
	e->args[1] = PT_REGS_PARM2(ctx);
	e->args[2] = bytes;
	if (COOKIE_STREAM_ARG(cookie))
		e->args[3] = arg_n(ctx, COOKIE_STREAM_ARG(cookie));
	bpf_ringbuf_submit(e, wakeup_flag(&e->h));
	return 0;
}

/* Calls measured from entry to return: the entry stashes, the return emits. */
static __always_inline void stash_entry(__u32 func, __u64 now, __u64 a0, __u64 a1, __u64 a2)
{
	struct cuda_key k = { .pid_tgid = bpf_get_current_pid_tgid(), .func = func };
	struct cuda_stash v = { .ts = now, .args = { a0, a1, a2 } };

	bpf_map_update_elem(&gpuarb_pend_cu, &k, &v, BPF_ANY);
}

static __always_inline struct call_record *finish_call(struct pt_regs *ctx, __u32 func, struct cuda_stash *out,
						 struct cgroup_stats **sp)
{
	struct cuda_key k = { .pid_tgid = bpf_get_current_pid_tgid(), .func = func };
	struct cuda_stash *st = bpf_map_lookup_elem(&gpuarb_pend_cu, &k);
	__u64 now = bpf_ktime_get_ns();
	struct call_record *e;

	if (!st)
		return NULL;
	*out = *st;
	bpf_map_delete_elem(&gpuarb_pend_cu, &k);
	e = call_event(func, now, sp);
	if (!e)
		return NULL;
	e->h.ts_enter = out->ts;
	e->ret = (__s32)PT_REGS_RC(ctx);
	return e;
}

/* Threads inside a synchronizing call, by thread id, with when each was
 * last woken there (0: not yet): a thread that sleeps until the GPU is
 * done is woken by the completion (the driver's interrupt, the simulated
 * GPU's futex wake), before it runs again and returns. Created at the
 * call's entry, read and removed at its return; LRU, so a thread killed
 * mid-call does not hold an entry. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 8192);
	__type(key, __u32);
	__type(value, __u64);
} gpuarb_sync_wakes SEC(".maps");

/* sched_waking runs in the waker's context as it wakes a task: for a
 * thread in a synchronizing call, that is when the GPU's completion
 * reached it, without the scheduling delay and return path that follow. */
SEC("tp_btf/sched_waking")
int BPF_PROG(gpuarb_sched_waking, struct task_struct *p)
{
	__u32 tid = p->pid;
	__u64 *woken = bpf_map_lookup_elem(&gpuarb_sync_wakes, &tid);

	if (woken)
		*woken = bpf_ktime_get_ns();
	return 0;
}

/* Synchronizing calls: cuStreamSynchronize (and _ptsz), cuCtxSynchronize,
 * cuCtxSynchronize_v2, cuEventSynchronize; (handle) or none. The entry
 * tells that the process now waits for the GPU (it has work outstanding),
 * the return how long it waited and when it was last woken (args[1]). */
SEC("uprobe/cuStreamSynchronize")
int gpuarb_cu_sync(struct pt_regs *ctx)
{
	__u32 func = COOKIE_FUNC(bpf_get_attach_cookie(ctx));
	__u64 now = bpf_ktime_get_ns(), zero = 0;
	__u64 handle = func == CU_CTX_SYNC ? 0 : PT_REGS_PARM1(ctx);
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct cgroup_stats *s;
	struct call_record *e;

	stash_entry(func, now, handle, 0, 0);
	bpf_map_update_elem(&gpuarb_sync_wakes, &tid, &zero, BPF_ANY);
	e = call_event(func, now, &s);
	if (!e)
		return 0;
	e->h.flags |= EVF_BEGIN;
	e->args[0] = handle;
	bpf_ringbuf_submit(e, wakeup_flag(&e->h));
	return 0;
}

SEC("uretprobe/cuStreamSynchronize")
int gpuarb_cu_sync_ret(struct pt_regs *ctx)
{
	__u32 func = COOKIE_FUNC(bpf_get_attach_cookie(ctx));
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	__u64 *wp = bpf_map_lookup_elem(&gpuarb_sync_wakes, &tid), woken = wp ? *wp : 0;
	struct cuda_stash st;
	struct cgroup_stats *s = NULL;
	struct call_record *e;

	if (wp)
		bpf_map_delete_elem(&gpuarb_sync_wakes, &tid);
	e = finish_call(ctx, func, &st, &s);
	if (s) {
		__sync_fetch_and_add(&s->syncs, 1);
		__sync_fetch_and_add(&s->sync_wait_ns, bpf_ktime_get_ns() - st.ts);
	}
	if (!e)
		return 0;
	e->args[0] = st.args[0];
	e->args[1] = woken;
	bpf_ringbuf_submit(e, wakeup_flag(&e->h));
	return 0;
}

/* Completion queries: cuEventQuery (event), cuStreamQuery (and _ptsz)
 * (stream). A polling loop queries until the work is done; per queried
 * handle only its first NOT_READY (a wait began: EVF_BEGIN) and the
 * success that ends it (ts_enter: when the wait began; args[1]: when the
 * last NOT_READY returned, so the work completed between it and the
 * success) reach the ring, so a poll reads as a sync. A success without a
 * wait proves the work done; repeated ones within POLL_QUIET_NS are not
 * sent again. */
#define CUDA_ERROR_NOT_READY 600
#define POLL_QUIET_NS 1000000

struct poll_key {
	__u32 tgid;
	__u32 tid; /* for a NULL stream, whose meaning is per thread */
	__u64 handle;
};

struct poll_state {
	__u64 since;    /* the first NOT_READY of this wait, or the last success sent */
	__u64 not_done; /* the last NOT_READY of this wait */
	__s32 last;     /* the last result */
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct poll_key);
	__type(value, struct poll_state);
} gpuarb_polls SEC(".maps");

SEC("uprobe/cuEventQuery")
int gpuarb_cu_query(struct pt_regs *ctx)
{
	stash_entry(COOKIE_FUNC(bpf_get_attach_cookie(ctx)), bpf_ktime_get_ns(), PT_REGS_PARM1(ctx), 0, 0);
	return 0;
}

SEC("uretprobe/cuEventQuery")
int gpuarb_cu_query_ret(struct pt_regs *ctx)
{
	__u32 func = COOKIE_FUNC(bpf_get_attach_cookie(ctx));
	__u64 id = bpf_get_current_pid_tgid(), now = bpf_ktime_get_ns();
	struct cuda_key ck = { .pid_tgid = id, .func = func };
	struct cuda_stash *st = bpf_map_lookup_elem(&gpuarb_pend_cu, &ck);
	struct poll_key k = { .tgid = id >> 32 };
	struct poll_state *ps, fresh = {};
	struct cgroup_stats *s;
	struct call_record *e;
	__s32 ret = (__s32)PT_REGS_RC(ctx);
	__u64 begin = now, not_done = 0;
	__u32 flags = 0;

	if (!st)
		return 0;
	k.handle = st->args[0];
	if (!k.handle)
		k.tid = (__u32)id;
	bpf_map_delete_elem(&gpuarb_pend_cu, &ck);
	ps = bpf_map_lookup_elem(&gpuarb_polls, &k);
	if (ret == CUDA_ERROR_NOT_READY) {
		if (ps && ps->last == CUDA_ERROR_NOT_READY) {
			ps->not_done = now; /* the wait goes on */
			return 0;
		}
		fresh.since = now;
		fresh.not_done = now;
		fresh.last = ret;
		bpf_map_update_elem(&gpuarb_polls, &k, &fresh, BPF_ANY);
		flags = EVF_BEGIN;
	} else if (ret == 0) {
		if (ps && ps->last == 0 && now - ps->since < POLL_QUIET_NS)
			return 0;
		if (ps && ps->last == CUDA_ERROR_NOT_READY) {
			begin = ps->since;
			not_done = ps->not_done;
		}
		fresh.since = now;
		bpf_map_update_elem(&gpuarb_polls, &k, &fresh, BPF_ANY);
	} else {
		return 0; /* an error: no evidence */
	}
	e = call_event(func, now, &s);
	if (!e)
		return 0;
	e->h.flags |= flags;
	e->h.ts_enter = begin;
	e->ret = ret;
	e->args[0] = k.handle;
	e->args[1] = not_done;
	bpf_ringbuf_submit(e, wakeup_flag(&e->h));
	return 0;
}

/* Context creation: cuCtxCreate_v2 (pctx, flags, dev), _v3 (pctx, params,
 * n, flags, dev), _v4 (pctx, params, flags, dev), cuDevicePrimaryCtxRetain
 * (pctx, dev); the cookie says where the device is. */
SEC("uprobe/cuCtxCreate_v2")
int gpuarb_cu_ctx_create(struct pt_regs *ctx)
{
	__u64 cookie = bpf_get_attach_cookie(ctx);

	stash_entry(COOKIE_FUNC(cookie), bpf_ktime_get_ns(), PT_REGS_PARM1(ctx), 0,
		    arg_n(ctx, COOKIE_DEVICE_ARG(cookie)));
	return 0;
}

SEC("uretprobe/cuCtxCreate_v2")
int gpuarb_cu_ctx_create_ret(struct pt_regs *ctx)
{
	struct cuda_stash st;
	struct cgroup_stats *s;
	struct call_record *e = finish_call(ctx, COOKIE_FUNC(bpf_get_attach_cookie(ctx)), &st, &s);
	__u64 handle = 0;

	if (!e)
		return 0;
	bpf_probe_read_user(&handle, sizeof(handle), (const void *)st.args[0]);
	e->args[0] = handle;
	e->args[2] = (__u32)st.args[2];
	if (e->ret == 0)
		track_object(e->h.tgid, 0, handle, e->h.cgroup_id, e->h.ts_exit, 0, (__u32)st.args[2]);
	bpf_ringbuf_submit(e, wakeup_flag(&e->h));
	return 0;
}

/* cuMemAlloc_v2 (CUdeviceptr *dptr, size_t bytes) and cuMemAllocAsync (and
 * _ptsz) (dptr, bytes, stream). */
SEC("uprobe/cuMemAlloc_v2")
int gpuarb_cu_mem_alloc(struct pt_regs *ctx)
{
	stash_entry(COOKIE_FUNC(bpf_get_attach_cookie(ctx)), bpf_ktime_get_ns(), PT_REGS_PARM1(ctx),
		    PT_REGS_PARM2(ctx), 0);
	return 0;
}

SEC("uretprobe/cuMemAlloc_v2")
int gpuarb_cu_mem_alloc_ret(struct pt_regs *ctx)
{
	struct cuda_stash st;
	struct cgroup_stats *s = NULL;
	struct call_record *e = finish_call(ctx, COOKIE_FUNC(bpf_get_attach_cookie(ctx)), &st, &s);
	struct alloc_key k = {};
	struct alloc_info v = { .bytes = st.args[1] };
	__u64 dptr = 0;

	if (!e)
		return 0;
	bpf_probe_read_user(&dptr, sizeof(dptr), (const void *)st.args[0]);
	e->args[0] = dptr;
	e->args[2] = st.args[1];
	if (e->ret == 0 && dptr) {
		k.tgid = e->h.tgid;
		k.dptr = dptr;
		bpf_map_update_elem(&gpuarb_allocs, &k, &v, BPF_ANY);
		if (s)
			__sync_fetch_and_add(&s->bytes_alloc, st.args[1]);
	}
	bpf_ringbuf_submit(e, wakeup_flag(&e->h));
	return 0;
}

/* cuMemFree_v2 (dptr) and cuMemFreeAsync (and _ptsz) (dptr, stream): the
 * size comes from the allocation table. */
SEC("uprobe/cuMemFree_v2")
int gpuarb_cu_mem_free(struct pt_regs *ctx)
{
	struct cgroup_stats *s;
	struct call_record *e = call_event(COOKIE_FUNC(bpf_get_attach_cookie(ctx)), bpf_ktime_get_ns(), &s);
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
	bpf_ringbuf_submit(e, wakeup_flag(&e->h));
	return 0;
}

/* ---- process lifecycle and libcuda discovery ---- */

/* ---- managed memory: mmaps of nvidia-uvm ---- */

/* An mmap of a nvidia-uvm file is stashed until its exit. */
SEC("tracepoint/syscalls/sys_enter_mmap")
int gpuarb_mmap_enter(struct sys_enter_ctx *ctx)
{
	__s32 fd = (__s32)ctx->args[4];
	struct dev_key key;
	struct dev_entry *dev;
	struct map_stash st = {};
	__u64 id;

	if (fd < 0) /* anonymous */
		return 0;
	dev = gpu_device(fd_file((unsigned int)fd), &key);
	if (!dev || dev->kind != DEV_NVIDIA_UVM)
		return 0;
	st.len = ctx->args[1];
	st.fd = fd;
	id = bpf_get_current_pid_tgid();
	bpf_map_update_elem(&gpuarb_pend_map, &id, &st, BPF_ANY);
	return 0;
}

/* An munmap of a process with a managed range is stashed until its exit. */
SEC("tracepoint/syscalls/sys_enter_munmap")
int gpuarb_munmap_enter(struct sys_enter_ctx *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32;
	struct map_stash st = {};

	if (!bpf_map_lookup_elem(&gpuarb_uvm_procs, &tgid))
		return 0;
	st.addr = ctx->args[0];
	st.len = ctx->args[1];
	st.unmap = 1;
	bpf_map_update_elem(&gpuarb_pend_map, &id, &st, BPF_ANY);
	return 0;
}

/* Records a stashed mmap or munmap the kernel made. */
static __always_inline int map_exit(struct sys_exit_ctx *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	struct map_stash *pending = bpf_map_lookup_elem(&gpuarb_pend_map, &id);
	struct map_record *e;
	struct map_stash st;
	__u32 tgid = id >> 32;
	__u8 one = 1;

	if (!pending)
		return 0;
	st = *pending;
	bpf_map_delete_elem(&gpuarb_pend_map, &id);
	if (st.unmap ? ctx->ret != 0 : (ctx->ret < 0 && ctx->ret > -4096))
		return 0; /* refused: nothing changed */
	if (!st.unmap)
		bpf_map_update_elem(&gpuarb_uvm_procs, &tgid, &one, BPF_ANY);
	e = RECORD_RESERVE(struct map_record, EV_MAP, id, bpf_get_current_cgroup_id());
	if (!e)
		return 0;
	e->h.ts_enter = e->h.ts_exit = bpf_ktime_get_ns();
	e->addr = st.unmap ? st.addr : (__u64)ctx->ret;
	e->len = st.len;
	e->unmap = st.unmap;
	e->fd = st.fd;
	bpf_ringbuf_submit(e, wakeup_flag(&e->h));
	return 0;
}

SEC("tracepoint/syscalls/sys_exit_mmap")
int gpuarb_mmap_exit(struct sys_exit_ctx *ctx)
{
	return map_exit(ctx);
}

SEC("tracepoint/syscalls/sys_exit_munmap")
int gpuarb_munmap_exit(struct sys_exit_ctx *ctx)
{
	return map_exit(ctx);
}

SEC("tracepoint/sched/sched_process_exit")
int gpuarb_process_exit(void *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32;
	struct proc_info *p;
	struct record_header *e;

	if (tgid != (__u32)id)
		return 0;
	bpf_map_delete_elem(&gpuarb_held, &tgid); /* a held process that dies is released */
	bpf_map_delete_elem(&gpuarb_releasing, &tgid);
	bpf_map_delete_elem(&gpuarb_trees, &tgid); /* its pid may name another process next */
	bpf_map_delete_elem(&gpuarb_uvm_procs, &tgid);
	exit_memory(tgid); /* one lookup: its charges may outlive the limits */
	p = bpf_map_lookup_elem(&gpuarb_procs, &tgid);
	if (!p)
		return 0;
	e = RECORD_RESERVE(struct record_header, EV_EXIT, id, p->cgroup_id);
	bpf_map_delete_elem(&gpuarb_procs, &tgid);
	if (!e)
		return 0;
	e->ts_enter = e->ts_exit = bpf_ktime_get_ns();
	bpf_ringbuf_submit(e, wakeup_flag(e));
	return 0;
}

/* A new process (not a thread) forked by a followed one is followed, for the
 * same root. */
SEC("tp_btf/sched_process_fork")
int BPF_PROG(gpuarb_process_fork, struct task_struct *parent, struct task_struct *child)
{
	__u32 ptgid = parent->tgid, ctgid = child->tgid, zero = 0;
	__u32 *root;
	__u64 *full;

	if (child->pid != child->tgid)
		return 0;
	root = bpf_map_lookup_elem(&gpuarb_trees, &ptgid);
	if (!root)
		return 0;
	if (bpf_map_update_elem(&gpuarb_trees, &ctgid, root, BPF_ANY)) {
		full = bpf_map_lookup_elem(&gpuarb_unfollowed, &zero);
		if (full)
			__sync_fetch_and_add(full, 1);
	}
	return 0;
}
