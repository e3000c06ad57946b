// Package arbiter turns measured GPU time into enforced shares: every
// control period it compares each tenant's share with its target and steers
// a duty cycle (AIMD) that gates the tenant's CPU side through package
// cgroup. It never decodes ioctls and never touches the GPU. Not built yet:
// see issue 5 (the arbiter) and DESIGN.md's data flow.
package arbiter
