// Package bpf holds gpuarb's eBPF programs and their loader: syscall
// tracepoints on GPU ioctls, uprobes on libcuda's submission and sync entry
// points, openat detection of libcuda copies and process exit, feeding pinned
// per-cgroup counters and an event ring buffer.
package bpf

//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -target amd64 -type record_header -type ioctl_record -type call_record -type launch_record -type map_record -type cuda_func -type dev_kind -type nv_rm -type gpuarb_sizes -type event_type -type event_flags -type gate_kind -type cgroup_stats -type dev_key -type ctx_key -type ctx_info -type gate_key -type gate -type held_proc -type gate_lease -type release_note -type mem_usage -type mem_proc -type mem_obj_key -type mem_obj -type mem_dev gpuarb gpuarb.c -- -O2 -g -Wall -Werror -I/usr/include/x86_64-linux-gnu
