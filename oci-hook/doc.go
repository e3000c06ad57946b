// Package ocihook is the OCI runtime hook: it reads the container state on
// stdin and registers or unregisters the container as a tenant with the
// daemon, taking its policy from annotations. Not built yet: see issue 6.
package ocihook
