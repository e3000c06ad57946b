// Package meter turns ioctlspy events into GPU time per tenant (cgroup) per
// GPU, over a sliding window (default 1 s) and as an exponentially decayed
// long-run figure, with launches/s, syncs/s and GPU memory held.
//
// # The estimator (kernel-bypass path)
//
// Launches never enter the kernel, so GPU time cannot be read off the
// driver: it is estimated from the libcuda calls the uprobes see, by
// re-enacting what the GPU does. Each context (one process on one GPU) has
// a modeled work queue per stream; a launch adds blocks × the context's
// learned ns per block (a graph launch its learned cost). Per GPU the meter
// replays round-robin time-slicing over those queues, as the hardware
// schedules channel groups: the holder keeps the GPU until its slice ends
// (Config.Timeslice) and another context has work, or until its queue
// empties. The time each context holds the GPU in the replay is its GPU
// time.
//
// Costs are learned from syncs. A stream or context synchronize that
// returns at t proves the synced streams drained at t: if the replay still
// has work queued then, the context's costs are scaled down by the share of
// the burst that did run; if the replay drained the queue well before t
// while the sync really waited, they are scaled up (at most 2× a step).
// Until its first draining sync a context counts as backlogged — right for
// training jobs that never drain; the first correction is taken whole and
// is never more than the first sync's wait, later ones are smoothed.
//
// The replay's slice phase is not the GPU's: a context of tiny kernels
// beside a hog waits at every sync for the rest of the hog's slice on the
// real GPU, whatever its own work. Taken as evidence, those waits would
// inflate it to its round-robin share (v2 read 40–48% for a true 2%), so
// a drain up to 3/4 of a slice late is not counted while others are busy
// (phaseAllowance, chosen between the two failure modes it names).
//
// A GPU the policy declares non-preemptive runs each kernel to its end:
// the replay keeps where each queued kernel ends and switches contexts only
// there once a slice is over (a kernel of still-guessed cost is cut at the
// slice, or the guess would hold the GPU). Its phase may then be off by a
// whole kernel of another context, so a late drain teaches only while no
// other context has work; fitting whole kernels into slices, the replay
// would otherwise push a cost just under a slice above it. Two tenants
// that start together and never run alone are not identifiable there:
// each finishes a batch at the same rate whether their kernels take 20 and
// 2 ms or 11 ms each (TestHogsOnEitherScheduler starts one late).
//
// A launch the arbiter's launch gate held (its process stopped before the
// launch ran) enters the replay when the process is released (Released),
// or at its next event; Released also marks the stop, so syncs across it
// teach nothing.
//
// Learning is guarded: a context whose costs are still a guess learns only
// from a sync that waited (one that returns at once proves the work done,
// not how long it took: a paced tenant's kernels finish between its spaced
// launches), and one sync moves learned costs by at most a factor of two
// before smoothing.
//
// Assumptions and error sources (measured figures in BENCHMARKS.md):
//   - Completion is known only at syncs. A cuEventSynchronize teaches
//     through the cuEventRecord that preceded it: the record marks how far
//     the stream's modeled work reached, the sync's return proves that
//     much ran (work still queued before the mark is dropped and costs
//     scaled down; a mark the replay passed well before the wait ended
//     scales them up). An event never seen recorded teaches nothing.
//   - When costs are corrected, work still queued is rescaled with them.
//   - Time-slicing is round robin with the configured timeslice; a GPU
//     with another policy or slice skews short bursts beside long ones.
//   - Short bursts (inference requests of ~1 ms) learn from noisy evidence:
//     about 2–3 pp of error beside a hog; tiny kernels read within 1–2 pp.
//   - A sync returns after the work drained plus the waiting thread's
//     wake-up (≈0.1–0.25 ms measured on the simulated GPU in a VM).
//   - Copies run on a separate engine and are not charged as GPU time.
//   - Events of different CPUs can arrive slightly out of order: the replay
//     runs Config.Lag behind the clock and applies late events at once.
//
// On the submission-ioctl path (nouveau) the same model runs on
// submissions and waits from ioctls.
package meter
