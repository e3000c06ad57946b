// Package meter turns ioctlspy events into GPU time per process and per
// tenant (cgroup) per GPU, over a sliding window (default 1 s) and as an
// exponentially decayed long-run figure, with launches/s, syncs/s, GPU
// memory held, the time each process wanted the GPU and how much work it
// brings to one turn on it.
//
// The package is split by job: meter.go takes events and keeps contexts
// (one CUDA context of a process, on one GPU), process.go routes each
// thread's events to the context its cuCtxCreate made current (a process
// of four contexts takes four turns of the GPU's round robin), context.go
// models a context's streams and costs, replay.go re-enacts the GPU's
// time-slicing, learn.go corrects
// costs from what syncs prove, report.go answers with figures, record.go
// records every input (Config.Record) and plays a recording back (Play),
// so that a misreading seen once replays the same every time.
//
// # The estimator (kernel-bypass path)
//
// Launches never enter the kernel, so GPU time cannot be read off the
// driver: it is estimated from the libcuda calls the uprobes see, by
// re-enacting what the GPU does. Each context has a modeled work queue per
// stream; a launch adds the cost of what it runs: a kernel function (its
// CUfunction handle) costs ns per block of its grid, an instantiated graph
// ns per launch, each learned apart (costKey). Launches on a stream being
// captured (cuStreamBeginCapture to cuStreamEndCapture, and streams that
// joined the capture by waiting on an event recorded in it) build a graph
// and add nothing (capture.go). Per GPU the meter replays round-robin
// time-slicing over those queues, as the hardware schedules
// channel groups: the holder keeps the GPU until its timeslice ends and
// another context has work, or until its queue empties; the contexts take
// turns in the order their channel groups were allocated (the probes see
// the RM_ALLOC), as the runlist holds them. Within a context
// the streams take turns kernel by kernel, one kernel running at a time,
// as the GPU runs one group's channels. Each context's
// timeslice is its own where one was set (its own SET_TIMESLICE the
// probes saw, or the TimesliceSet gpuarb observes when it steers), else the GPU's; a
// context gpuarb paused (GroupPaused) takes no turn. The time each context
// holds the GPU in the replay is its GPU time.
//
// # Learning costs
//
// Costs are learned from syncs. A stream or context synchronize that
// returns at t proves the synced streams drained at t: if the replay still
// has work queued then, the costs of the work that ran since the last
// proof are scaled down by the share of it that did run; if the replay
// drained the queue well before t while the sync really waited, they are
// scaled up (at most 2× a step). A cuEventSynchronize (or an event query
// that finds the event complete) teaches the same through the
// cuEventRecord before it: the record marks how far the stream's modeled
// work reached and what it was made of. A polling loop's work completed
// between its last query that found it not done and the one that found it
// done (the probes send when both returned): the replay's drain is
// measured against the middle of that interval, and teaches late or early
// alike.
//
// Each proof covers a burst of work of known composition (how much of it
// each costKey made, tracked per stream). A correction goes to the keys
// that made the burst: keys not yet learned take all of it when learned
// ones are in the burst too (the learned ones are assumed right), so a
// new kernel or a change of kernel mix is learned from its first sync,
// without moving what the other kernels cost. The first correction of a
// key is taken whole (and never more than the sync's wait), later ones
// smoothed (learnRate) and bounded (maxStep). Until its first proof a
// key's cost is a large guess and its context counts as backlogged, right
// for training jobs that never drain; a first proof of work the replay
// gave no turn yet (another context's slice still runs there) teaches
// nothing, for scaled by what the replay ran the costs would collapse.
// Persistent kernels (a fixed grid that loops) cost per block like any
// other: their blocks are long.
//
// The replay's slice phase is not the GPU's: beside others, a burst waits
// up to a rotation for its turn on either, at unrelated phases, so one
// proof's drain is early or late by up to that much. A learned cost moves
// only on the sum of its proofs (evidenceWork, evidenceProofs), where the
// phases cancel; a drain late against the replay's counts what the
// context would have received meanwhile, its part of the round robin: its
// timeslice over those of the contexts with work (turnPart). Where a
// context's bursts are much shorter than the others' rotation they do
// not quite cancel: a drain can be early by up to a rotation but late
// by no more than the burst, and such a context reads high (a
// poller of two 0.1 ms kernels beside a closed loop of 0.3 ms kernels
// read 20% for 12%, with the loop under-read as much). So a proof that
// finds the replay out of phase (it drained the proven work more than a
// timeslice before the GPU did, or had not begun it: outOfPhase; a drain
// early by less is a slice's part or the host's latency in waking the
// thread, which the sums cancel) also puts the rotation back in step:
// the GPU ran the context until then, so where the context has nothing
// left, the next context with work after it holds the GPU from then, for
// a whole slice (anchor).
//
// A GPU the policy declares non-preemptive runs each kernel to its end:
// the replay keeps where each queued kernel ends and switches contexts only
// there once a slice is over (a kernel of still-guessed cost is cut at the
// slice, or the guess would hold the GPU). Its phase may then be off by a
// whole kernel of another context, so a late drain teaches only while no
// other context has work. Two tenants that start together and never run
// alone are not identifiable there: each finishes a batch at the same rate
// whether their kernels take 20 and 2 ms or 11 ms each.
//
// A launch the arbiter's launch gate held (its process stopped before the
// launch ran) enters the replay when the process is released (HoldReleased),
// or at its next event; HoldReleased and CgroupFrozen also mark
// the stop, so syncs across it teach nothing (they return at the resume).
// A channel group paused (GroupPaused) is no stop: the replay keeps it off
// the GPU as the GPU does, and syncs across the pause teach as any other.
// One descheduled (GroupDescheduled) while the replay runs it keeps the GPU
// to the end of its slice first, as the driver lets it.
//
// # Demand evidence
//
// What a process wants does not rest on the modeled queue alone
// (ContextStats.WantNS): it wanted the GPU while the replay had its work
// queued, while it waited in a synchronizing call or a polling loop of
// queries that found work not done (the probes mark a wait's begin; a
// wait ends when the completion woke its thread, the rest of the call is
// host time, or where the replay ran the waited-for work dry less than
// realWait before that, at the replay's drain: the completion's and the
// launch's latencies are host time a loop spends alone too), and while
// gpuarb kept it from the GPU (held at the launch gate, paused, its
// cgroup frozen). ContextStats.Drains counts the times its modeled work
// ran out; its GPU time over them is the work it brings to one turn, a
// closed loop's work between syncs; ContextStats.RecentBurstNS is the
// mean of its last few such bursts, and ContextStats.RunNS its GPU time
// since the last drain, the turn in progress.
//
// Assumptions and error sources (measured figures in BENCHMARKS.md):
//   - Completion is known only at syncs and completed queries; an event
//     never seen recorded teaches nothing.
//   - When costs are corrected, work still queued is rescaled with them.
//   - Short bursts (inference requests of ~1 ms) learn from noisy evidence
//     beside a hog.
//   - A sync returns after the work drained plus the waiting thread's
//     wake-up (≈0.1–0.25 ms measured on the simulated GPU in a VM). Where
//     the thread slept in the call, the probes record when it was woken
//     (sched_waking), which bounds the completion without its wait for a
//     CPU and its return path (completedBy); what remains (the waker's own
//     delay, and the launch uprobe's trap before the doorbell) still
//     counts as GPU time: closed loops of 24–200 µs kernels alone read
//     21–29 pp above the truth on this VM (36–43 pp before the bound).
//   - Copies run on a separate engine and are not charged as GPU time.
//   - Events of different CPUs can arrive slightly out of order: the replay
//     runs Config.Lag behind the clock and applies late events at once. A
//     release the arbiter reports at the clock's present, ahead of events
//     still in the ring buffer, waits until the replay reaches its time.
//
// On the submission-ioctl path (nouveau) the same model runs on
// submissions and waits from ioctls.
package meter
