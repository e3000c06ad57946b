// Package arbiter turns measured GPU time into enforced shares. Every
// control period (default 100 ms) Step compares each tenant's measured
// share with its target — weighted max-min fair among tenants with work,
// capped by limits (Targets) — and steers a duty with AIMD.
//
// In share mode (the default) the duty is a submission rate: the Gater
// lets the tenant submit GPU work (as the meter costs its launches) at
// that fraction of the GPU's time, with a burst of one period, and freezes
// it while it is in debt. Freezing stops submission, not work already
// queued on the GPU, so a gate that only freezes part of every period is
// blind to deep queues (a hog with 8 × 20 ms queued per process loses
// nothing to 95 ms freezes); pacing what is admitted holds the long-run
// share whatever the queue depth. The steps: above target, the rate falls
// from what the tenant uses by target/share, at least ×0.8 (Decrease), but
// not below half the target, since the share lags the rate by the queue;
// below target with work it rises by the gap, at most +0.05 (Increase);
// 1 when alone (without a limit) or idle, never below 0.05 (MinDuty).
// Latency tenants are never throttled; while their SLO (p99 sync wait or
// frames/s) is missed, every other tenant's rate falls ×0.8 per period.
//
// A GPU in timeslice mode gives tenants with work exclusive consecutive
// slots sized by weight: there the duty is the part of each period the
// tenant runs, from a staggered offset, frozen for the rest.
//
// The package never decodes ioctls and never touches the GPU; measured
// figures and the bars not met yet are in BENCHMARKS.md §4.
package arbiter
