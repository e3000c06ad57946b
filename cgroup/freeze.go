package cgroup

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/containerd/cgroups/v3/cgroup1"
	"github.com/containerd/cgroups/v3/cgroup2"
)

// FreezeTimeout bounds how long a freeze may take to be confirmed.
const FreezeTimeout = 100 * time.Millisecond

// ErrNotFrozen is returned when the kernel did not confirm a freeze within
// FreezeTimeout (a task in uninterruptible sleep delays it).
var ErrNotFrozen = errors.New("freeze not confirmed")

// Gate stops and resumes a tenant's CPU side: a cgroup v2 or v1 freezer
// cgroup, or a bare process tree.
type Gate interface {
	// Freeze stops the tenant and confirms it stopped.
	Freeze() error
	// Thaw resumes the tenant.
	Thaw() error
	// Target describes the gate for the thaw ledger.
	Target() Target
}

// V2Gate freezes a cgroup v2 through cgroup.freeze.
type V2Gate struct {
	dir string
	m   *cgroup2.Manager
	own ownership
}

// ownership keeps a gate from undoing a freeze or stop it did not make:
// `docker pause`, an operator's freeze, a shell's Ctrl-Z. A gate about to
// freeze what is already frozen by someone else leaves it be, and its
// next thaw leaves it frozen. (A freeze someone makes while the gate
// holds the tenant cannot be told from the gate's own: the thaw ends
// both.) A gate made from the ledger after a crash knows nothing and
// thaws.
type ownership struct {
	mu     sync.Mutex
	held   bool // this gate froze it and has not thawed it
	theirs bool // someone else's freeze was in place when it was to freeze
}

// freeze says whether the gate is to freeze now (it does not hold it and
// alreadyFrozen, asked only then, says no one else does).
func (o *ownership) freeze(alreadyFrozen func() bool) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	switch {
	case o.held:
		return false
	case alreadyFrozen():
		o.theirs = true
		return false
	}
	o.held, o.theirs = true, false
	return true
}

// thaw says whether the gate is to thaw now: not when the freeze in place
// is someone else's.
func (o *ownership) thaw() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	skip := o.theirs && !o.held
	o.held, o.theirs = false, false
	return !skip
}

// NewV2Gate returns the gate of the cgroup at rel ("/a/b") under the v2
// mount, after checking that freezing it is safe.
func NewV2Gate(mount, rel string) (*V2Gate, error) {
	rel = "/" + strings.Trim(rel, "/")
	own, _ := ProcessPath(os.Getpid())
	if err := CheckFreezable(rel, own); err != nil {
		return nil, err
	}
	g, err := newV2GateUnchecked(mount, rel)
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(g.dir, "cgroup.freeze")); err != nil {
		return nil, fmt.Errorf("cgroup %s cannot be frozen: %w", rel, err)
	}
	return g, nil
}

func newV2GateUnchecked(mount, rel string) (*V2Gate, error) {
	m, err := cgroup2.Load(rel, cgroup2.WithMountpoint(mount))
	if err != nil {
		return nil, fmt.Errorf("cgroup %s: %w", rel, err)
	}
	return &V2Gate{dir: filepath.Join(mount, rel), m: m}, nil
}

// Freeze writes cgroup.freeze and waits for "frozen 1" in cgroup.events;
// a cgroup someone else froze is left as it is. A freeze not confirmed
// within FreezeTimeout (a task in uninterruptible sleep) is undone, as
// V1Gate does: the tenant is not left half-frozen.
func (g *V2Gate) Freeze() error {
	if !g.own.freeze(func() bool { return readTrimmed(filepath.Join(g.dir, "cgroup.freeze")) == "1" }) {
		return nil
	}
	if err := g.m.Freeze(); err != nil {
		return errors.Join(fmt.Errorf("freeze %s: %w", g.dir, err), g.Thaw())
	}
	deadline := time.Now().Add(FreezeTimeout)
	for {
		frozen, err := V2Frozen(g.dir)
		if err != nil {
			return errors.Join(err, g.Thaw())
		}
		if frozen {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.Join(fmt.Errorf("freeze %s: %w within %v", g.dir, ErrNotFrozen, FreezeTimeout), g.Thaw())
		}
		time.Sleep(200 * time.Microsecond)
	}
}

// Thaw writes cgroup.freeze 0, unless the freeze is someone else's.
func (g *V2Gate) Thaw() error {
	if !g.own.thaw() {
		return nil
	}
	if err := g.m.Thaw(); err != nil {
		return fmt.Errorf("thaw %s: %w", g.dir, err)
	}
	return nil
}

// Target implements Gate.
func (g *V2Gate) Target() Target { return Target{Kind: KindV2, Path: g.dir} }

// readTrimmed reads a one-line control file ("" when it cannot).
func readTrimmed(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(data))
}

// V2Frozen reads "frozen" from a cgroup directory's cgroup.events.
func V2Frozen(dir string) (bool, error) {
	data, err := os.ReadFile(filepath.Join(dir, "cgroup.events"))
	if err != nil {
		return false, fmt.Errorf("cgroup events: %w", err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "frozen "); ok {
			return v == "1", nil
		}
	}
	return false, fmt.Errorf("%s/cgroup.events has no frozen key", dir)
}

// V1Gate freezes a cgroup of the v1 freezer hierarchy (legacy and hybrid
// hosts).
type V1Gate struct {
	dir string
	cg  cgroup1.Cgroup
	own ownership
}

// NewV1Gate returns the gate of the freezer cgroup rel ("/a/b").
func NewV1Gate(rel string) (*V1Gate, error) {
	rel = "/" + strings.Trim(rel, "/")
	own, _ := V1ProcessPath(os.Getpid(), "freezer")
	if err := CheckFreezable(rel, own); err != nil {
		return nil, err
	}
	return newV1GateUnchecked(rel)
}

func newV1GateUnchecked(rel string) (*V1Gate, error) {
	cg, err := cgroup1.Load(cgroup1.StaticPath(rel),
		cgroup1.WithHierarchy(cgroup1.SingleSubsystem(cgroup1.Default, cgroup1.Freezer)))
	if errors.Is(err, cgroup1.ErrCgroupDeleted) {
		err = os.ErrNotExist
	}
	if err != nil {
		return nil, fmt.Errorf("freezer cgroup %s: %w", rel, err)
	}
	return &V1Gate{dir: filepath.Join(V1FreezerMount, rel), cg: cg}, nil
}

// Freeze asks for FROZEN and waits at most FreezeTimeout. It writes
// freezer.state itself rather than through cgroup1.Freeze, which retries
// without bound: a gate that cannot freeze in time must thaw again instead
// of holding the tenant half-frozen.
func (g *V1Gate) Freeze() error {
	state := filepath.Join(g.dir, "freezer.state")
	if !g.own.freeze(func() bool { st := readTrimmed(state); return st == "FROZEN" || st == "FREEZING" }) {
		return nil
	}
	deadline := time.Now().Add(FreezeTimeout)
	for {
		if err := os.WriteFile(state, []byte("FROZEN"), 0); err != nil {
			return fmt.Errorf("freeze %s: %w", g.dir, err)
		}
		if g.cg.State() == cgroup1.Frozen {
			return nil
		}
		if time.Now().After(deadline) {
			thawErr := g.Thaw() // and the gate no longer holds it
			return errors.Join(fmt.Errorf("freeze %s: %w within %v", g.dir, ErrNotFrozen, FreezeTimeout), thawErr)
		}
		time.Sleep(200 * time.Microsecond)
	}
}

// Thaw resumes the cgroup (cgroup1 waits until THAWED, which the kernel
// reaches at once), unless the freeze is someone else's.
func (g *V1Gate) Thaw() error {
	if !g.own.thaw() {
		return nil
	}
	if err := g.cg.Thaw(); err != nil {
		return fmt.Errorf("thaw %s: %w", g.dir, err)
	}
	return nil
}

// Target implements Gate.
func (g *V1Gate) Target() Target { return Target{Kind: KindV1, Path: g.dir} }

// ErrHoldsGpuarb marks a cgroup CheckFreezable refuses because gpuarb's
// own processes are in it.
var ErrHoldsGpuarb = errors.New("it contains gpuarb itself")

// CheckFreezable refuses cgroups whose freezing would stop the host or
// gpuarb itself: the root, top-level system slices, and own (gpuarb's
// cgroup in the same hierarchy, "" when unknown) and its ancestors.
func CheckFreezable(rel, own string) error {
	rel = "/" + strings.Trim(rel, "/")
	switch rel {
	case "/", "/system.slice", "/init.scope", "/user.slice", "/machine.slice", "/kubepods", "/kubepods.slice":
		return fmt.Errorf("refusing to freeze %s: a root or system cgroup", rel)
	}
	if own != "" {
		own = "/" + strings.Trim(own, "/")
		if own == rel || strings.HasPrefix(own+"/", rel+"/") {
			return fmt.Errorf("refusing to freeze %s: %w (%s)", rel, ErrHoldsGpuarb, own)
		}
	}
	return nil
}
