// Package meter turns ioctlspy events into GPU time per tenant (cgroup) per
// GPU, over a sliding window (default 1 s) and as an exponentially decayed
// long-run figure, with launches/s, syncs/s and GPU memory held.
//
// # The estimator (kernel-bypass path)
//
// Launches never enter the kernel, so GPU time cannot be read off the
// driver: it is estimated from the libcuda calls the uprobes see. A context
// (one process on one GPU) is *busy* from its first launch after it was
// drained until a stream or context synchronize that drains it returns;
// event syncs and syncs of other streams only prove the context still had
// work until they returned. GPUs time-slice contexts with work round robin,
// so wall time is divided equally among the busy contexts of a GPU at every
// instant (processor sharing), and the GPU is assumed busy whenever a
// context is.
//
// Assumptions and error sources:
//   - Completion is known only at syncs. A context that keeps tiny work
//     outstanding between rare syncs (thousands of 1 µs kernels, one sync
//     every 100 ms) counts as busy the whole time and is overcharged against
//     a backlogged neighbour; learning per-kernel costs from sync timing is
//     the planned remedy.
//   - A sync returns after the work drained plus the wake-up of the waiting
//     thread (≈0.1–0.25 ms measured on the simulated GPU in a VM), which
//     lengthens busy intervals by that much.
//   - Several streams of one context are tracked apart: a context is busy
//     while any of its streams is.
//   - Copies run on a separate engine and are not charged as GPU time.
//   - Events of different CPUs can arrive slightly out of order; intervals
//     are built per context from that context's own events, which one
//     thread issues in order in the common case.
//
// On the submission-ioctl path (nouveau) the same model runs on
// submissions and waits from ioctls.
package meter
