// Package policy holds tenants and their rules — weight, limit, priority and
// SLO — and the per-GPU sharing mode, loaded from YAML and changed through
// the daemon's API. Not built yet: see issue 5 and DESIGN.md's data flow.
package policy
