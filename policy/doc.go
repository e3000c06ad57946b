// Package policy holds tenants and their rules — weight, limit, priority and
// SLO — the per-GPU facts and sharing mode, and the admission rules that
// bound what workloads may request for themselves, loaded from YAML (the
// daemon's --policy file) or changed through the daemon's API (gpuarb
// attach, policy apply, the OCI and libvirt hooks), and validated with the
// offending field's name. It neither measures nor enforces.
package policy
