// Package enforce holds gpuarb's actuators, the mechanisms that hold a
// tenant to what the arbiter decided, and what releases them when the
// daemon is gone:
//
//   - Steering: the GPU's own scheduler, through the driver's controls on
//     each process's channel groups (timeslices, pauses, deschedules),
//     with the steering ledger that lets whoever comes after put every
//     group back;
//   - LatencyHold: a latency tenant's holds, which take the other tenants'
//     groups off a steered GPU while its launched work is pending;
//   - Gater: a tenant's duty applied over time to one gate — admissions
//     paced at the arbiter's rate at the probes' launch gate, or freeze
//     windows of its cgroup or process tree, or pause windows of its
//     channel groups;
//   - Guardian and ThawLeftovers: the process outside the daemon that
//     resumes what the daemon held once it exits in any way, and the
//     resumption itself (ledgers, steering ledger, pinned held table).
//
// The cgroup freeze and the SIGSTOP gate are in package cgroup. The
// daemon decides when each acts; this package does the acting and never
// takes the daemon's lock.
package enforce
