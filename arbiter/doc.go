// Package arbiter turns measured GPU time into enforced shares. Every
// control period (default 100 ms) Step compares each tenant's measured
// share with its target — weighted max-min fair among tenants with work,
// capped by limits (Targets) — and steers a duty cycle with AIMD: ×0.8 when
// above target, +0.05 when below with work, 1 when alone (without a limit)
// or idle, never below 0.05 so a throttled tenant still drains its queue.
// Latency tenants are never throttled; while their SLO (p99 sync wait or
// frames/s) is missed, every other tenant's duty falls ×0.8 per period.
// A GPU in timeslice mode gives tenants with work exclusive consecutive
// slots sized by weight. A Gater applies a duty to a cgroup.Gate, frozen
// for the rest of each period from a staggered offset. The package never
// decodes ioctls and never touches the GPU.
//
// Known limit (BENCHMARKS.md §4): freezing stops submission, not queued
// GPU work, so a tenant whose queue holds more work than one period's
// frozen time (a hog with 8 × 20 ms queued) cannot be held far below its
// unthrottled share by 100 ms periods.
package arbiter
