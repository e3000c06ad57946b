// Package arbiter turns measured GPU time into enforced shares. Every
// control period (default 100 ms) Step compares each tenant's measured
// share with its target — weighted max-min fair among tenants with work,
// capped by limits (Targets) — and steers a duty per tenant.
//
// # Share mode: admission pacing
//
// Freezing stops submission, not work already queued on the GPU: a hog
// keeps 160–320 ms queued per process, so a gate that freezes part of
// every period loses nothing, and one that freezes when a budget runs out
// lands after a whole batch of launches. In share mode (the default) the
// duty is therefore a submission rate, and enforce.Gater paces admissions:
// credit accrues at the rate (GPU ns per ns, a burst of one period), each
// launch is charged the meter's modeled cost, and with a LaunchGate (the
// probes' launch gate) the launch that the balance cannot pay for stops
// its process before it reaches the GPU, until credit comes in. Queued
// work then stays shallow and a paced tenant's long-run share is its rate,
// whatever its queue depth or number of processes. Without a launch gate
// the tenant's cgroup is frozen while its account is in debt.
//
// Because the rate is the share, the duty of a tenant that must be paced
// starts at its target (feed-forward) and AIMD only corrects what the
// cost model gets wrong:
//   - a tenant that wants more than its target is paced at the target;
//   - a tenant entering pacing with work queued from before admits
//     nothing (MinDuty) until that has run, then runs at its target;
//   - once its queue has stayed drained for a whole settled window
//     (Settle periods, the meter's 1 s window), its settled share steers
//     the rate: above target + Tolerance (default 1 pp) it falls
//     multiplicatively by what the excess needs, at most ×Decrease (0.8)
//     per window, never below half the target; below target − Tolerance it
//     rises additively by the gap, at most Increase (0.05) per window. Each
//     correction is spread over the Settle periods of the window it was
//     measured on: applied whole every period, it would act on the same
//     lagging error ten times and oscillate;
//   - one competing tenant per GPU runs unpaced and takes the slack (the
//     largest target, then the fewest contexts, since the GPU time-slices
//     per context): what paced tenants leave unused is not lost. It stays
//     the taker while it competes and no other is clearly better (not
//     costed where it is, a target larger by Tolerance, or fewer
//     contexts): flipping
//     between equals on noise would re-pace both every period. It is
//     paced too when a paced tenant is crowded out (paced at or above its
//     target, drained, and still below it);
//   - a tenant alone (without a limit), idle, or wanting no more than its
//     target runs free (the last grows back additively); rates never go
//     below MinDuty (0.05): a tenant is slowed, never starved.
//
// A tenant paced on several GPUs is held by one gate, process-wide: its
// per-GPU decisions combine into one rate (Spanning), the paced GPUs'
// duties plus what it uses, with room to grow, where it runs freely.
//
// A tenant's demand, for Targets, is the whole GPU when it is backlogged
// (work queued or running nearly all the window) or paced and held back
// by its rate (held at its gate, work waiting, or using half its rate or
// more). A latency tenant wants its share of the control window × 1.2 +
// 2 pp. Any other light tenant wants what it would take alone (control's
// demand model; at least its share over the settled window) plus 0.2 pp,
// at most 2 pp among all of a GPU's light tenants: a host of bursty,
// mostly idle tenants does not take the GPU from the backlogged ones. A
// tenant paced once and idle since is light again, and grows back to
// running free.
//
// Latency tenants are never throttled; while one's SLO (p99 sync wait or
// frames/s, over the meter's 1 s window) is missed, every other tenant's
// rate falls ×Decrease per period from what it uses, and recovers
// additively once the SLO holds, by Increase per window.
//
// # Timeslice mode
//
// A GPU in timeslice mode gives tenants with work exclusive consecutive
// slots sized by weight: there the duty is the part of each period the
// tenant runs, from a staggered offset, frozen for the rest.
//
// The package never decodes ioctls and never touches the GPU; measured
// figures are in BENCHMARKS.md.
package arbiter
