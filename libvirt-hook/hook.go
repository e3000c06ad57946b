// Package libvirthook attaches libvirt QEMU domains to the gpuarb daemon
// from libvirt's qemu hook (/etc/libvirt/hooks/qemu.d/*, called as
// `HOOK DOMAIN OPERATION SUB-OPERATION EXTRA` with the domain XML on
// stdin): when a domain has started, its QEMU process is found, the VM's
// cgroup (the machine.slice scope, or its cgroupfs equivalent) is
// registered as a tenant with the policy of a <gpuarb:policy> element in
// the domain's metadata; when it stops, the tenant is removed.
//
// A VM's GPU work reaches gpuarb when the host does it on the VM's
// behalf, in processes of the VM's cgroup: API remoting, virtio-gpu
// renderers (virglrenderer, venus) run by QEMU. A GPU passed through
// with VFIO is driven by the guest's own driver and stays invisible.
//
// The hook never holds libvirt up: calls to the daemon are bounded
// (Options.Timeout) and a daemon that is down only yields a warning.
package libvirthook

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/gpuarb/gpuarb/api"
	"github.com/gpuarb/gpuarb/cgroup"
	"github.com/gpuarb/gpuarb/policy"
)

// Namespace is the XML namespace of gpuarb's element in domain metadata:
//
//	<metadata>
//	  <gpuarb:policy xmlns:gpuarb="https://gpuarb.io/libvirt/1" weight="300" limit="30%"/>
//	</metadata>
//
// Attributes: name, weight, limit, priority, slo-p99-ms, slo-fps, memory-limit.
const Namespace = "https://gpuarb.io/libvirt/1"

// Domain is what the hook reads of a domain's XML.
type Domain struct {
	Name string
	UUID string
	// Policy holds the attributes of <gpuarb:policy> (nil without one).
	Policy map[string]string
}

// ErrBadDomain marks domain XML on stdin that cannot be used.
var ErrBadDomain = errors.New("malformed libvirt domain XML on stdin")

// maxDomainXML bounds what is read from stdin.
const maxDomainXML = 4 << 20

type domainXML struct {
	XMLName  xml.Name `xml:"domain"`
	Name     string   `xml:"name"`
	UUID     string   `xml:"uuid"`
	Metadata struct {
		Policy *struct {
			Attrs []xml.Attr `xml:",any,attr"`
		} `xml:"https://gpuarb.io/libvirt/1 policy"`
	} `xml:"metadata"`
}

// ReadDomain reads and checks the domain XML libvirt writes to the hook's
// stdin.
func ReadDomain(r io.Reader) (*Domain, error) {
	data, err := io.ReadAll(io.LimitReader(r, maxDomainXML+1))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadDomain, err)
	}
	if len(data) > maxDomainXML {
		return nil, fmt.Errorf("%w: larger than %d bytes", ErrBadDomain, maxDomainXML)
	}
	var x domainXML
	if err := xml.NewDecoder(bytes.NewReader(data)).Decode(&x); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadDomain, err)
	}
	d := &Domain{Name: strings.TrimSpace(x.Name), UUID: strings.ToLower(strings.TrimSpace(x.UUID))}
	if d.Name == "" {
		return nil, fmt.Errorf("%w: no <name>", ErrBadDomain)
	}
	if p := x.Metadata.Policy; p != nil {
		d.Policy = map[string]string{}
		for _, a := range p.Attrs {
			if a.Name.Space == "xmlns" || a.Name.Local == "xmlns" {
				continue
			}
			d.Policy[a.Name.Local] = a.Value
		}
	}
	return d, nil
}

// PolicyError names the <gpuarb:policy> attribute whose value is invalid.
type PolicyError struct {
	Attr, Value, Msg string
}

func (e *PolicyError) Error() string {
	return fmt.Sprintf("<gpuarb:policy %s=%q>: %s", e.Attr, e.Value, e.Msg)
}

// defaultName is the tenant a domain is registered as when its policy
// names none: "vm-" and the domain name, made a valid tenant name.
func (d *Domain) defaultName() string {
	n := "vm-" + strings.Map(func(r rune) rune {
		if r == '/' || r == ' ' || r == utf8.RuneError || !unicode.IsPrint(r) {
			return '_'
		}
		return r
	}, d.Name)
	for len(n) > 128 {
		_, size := utf8.DecodeLastRuneInString(n)
		n = n[:len(n)-size]
	}
	return n
}

func attach(ctx context.Context, client *api.Client, owner string, t policy.Tenant) (api.AttachResult, error) {
	body, err := json.Marshal(t)
	if err != nil {
		return api.AttachResult{}, err
	}
	return client.Attach(ctx, owner, body)
}

// attrName is the attribute that names the tenant.
const attrName = "name"

// Tenant returns the tenant the domain is registered as: named by the
// policy's name attribute, else "vm-" and the domain name; rules from the
// policy's other attributes.
func (d *Domain) Tenant() (policy.Tenant, error) {
	t := policy.Tenant{Name: d.defaultName()}
	kv := map[string]string{}
	for k, v := range d.Policy {
		if k == attrName {
			if err := policy.CheckTenantName(v); err != nil {
				return t, &PolicyError{k, v, "must be 1–128 printable characters without spaces or '/'"}
			}
			t.Name = v
			continue
		}
		kv[k] = v
	}
	rules, err := policy.RulesFromStrings(kv)
	var ve *policy.ValueError
	if errors.As(err, &ve) {
		msg := ve.Msg
		if ve.Unknown {
			msg = "unknown attribute (known: name, weight, limit, priority, slo-p99-ms, slo-fps, memory-limit)"
		}
		return t, &PolicyError{ve.Key, ve.Value, msg}
	}
	t.Rules = rules
	return t, err
}

// Operation is what libvirt tells the hook happened to the domain.
type Operation string

// What the hook does per operation: started, reconnect (libvirtd
// restarted with the domain running) and attach register; stopped and
// release unregister; every other operation (prepare, start, migrate,
// restore) is ignored.
func (op Operation) registers() bool {
	return op == "started" || op == "reconnect" || op == "attach"
}

func (op Operation) unregisters() bool { return op == "stopped" || op == "release" }

// Options configure the hook.
type Options struct {
	// Socket is the daemon's API socket ("" for the default).
	Socket string
	// Timeout bounds the exchange with the daemon (default 800 ms).
	Timeout time.Duration
	// DefaultOnBadPolicy registers a domain whose <gpuarb:policy> is
	// invalid with the default policy (and a warning) instead of failing.
	DefaultOnBadPolicy bool
	// PIDDir is where libvirt writes NAME.pid for QEMU domains (default
	// /run/libvirt/qemu).
	PIDDir string
	// ProcRoot is where /proc is mounted (default "/proc"; tests).
	ProcRoot string
}

// Action is what one hook call did.
type Action struct {
	Operation  Operation
	Tenant     policy.Tenant
	PID        int // the QEMU process (registering operations)
	Registered bool
	Detached   bool
	Warnings   []string
}

// Run handles one hook call for domain name and operation op, with the
// domain XML on stdin.
func Run(ctx context.Context, name string, op Operation, stdin io.Reader, o Options) (Action, error) {
	act := Action{Operation: op}
	if !op.registers() && !op.unregisters() {
		return act, nil
	}
	d, err := ReadDomain(stdin)
	if err != nil {
		return act, err
	}
	if d.Name != name {
		return act, fmt.Errorf("%w: libvirt called the hook for domain %q with the XML of %q", ErrBadDomain, name, d.Name)
	}
	if o.Timeout <= 0 {
		o.Timeout = 800 * time.Millisecond
	}
	if o.PIDDir == "" {
		o.PIDDir = "/run/libvirt/qemu"
	}
	if o.ProcRoot == "" {
		o.ProcRoot = "/proc"
	}
	t, perr := d.Tenant()
	fallback := d.defaultName()
	act.Tenant.Name = t.Name
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	client := api.NewClient(o.Socket)
	spool := api.SpoolBeside(cmp.Or(o.Socket, api.DefaultSocket))
	owner := "vm " + cmp.Or(d.UUID, d.Name)
	if op.unregisters() {
		// A registration spooled while the daemon was away is not to be
		// made any more.
		if err := api.Unspool(spool, owner); err != nil {
			act.Warnings = append(act.Warnings, err.Error())
		}
		err := client.Detach(ctx, owner, t.Name)
		if errors.Is(err, api.ErrNotFound) && t.Name != fallback {
			// Registered under vm-DOMAIN: its name was taken at start.
			err = client.Detach(ctx, owner, fallback)
		}
		switch {
		case err == nil:
			act.Detached = true
		case errors.Is(err, api.ErrNotFound): // never registered, or release after stopped
		default:
			act.Warnings = append(act.Warnings, daemonWarning(err, o.Timeout))
		}
		return act, nil
	}
	if perr != nil {
		if !o.DefaultOnBadPolicy {
			return act, perr
		}
		act.Warnings = append(act.Warnings, perr.Error()+"; using the default policy")
		t.Rules = policy.Rules{}
	}
	pid, err := FindQEMU(d, o.PIDDir, o.ProcRoot)
	if err != nil {
		return act, err
	}
	act.PID = pid
	cg, err := cgroup.GatePath(o.ProcRoot, pid)
	if err != nil {
		return act, err
	}
	t.Cgroup = VMCgroup(cg)
	res, err := attach(ctx, client, owner, t)
	if errors.Is(err, api.ErrConflict) && t.Name != fallback {
		// The metadata names a tenant that is not this VM's: register it
		// as vm-DOMAIN rather than leave it unarbitrated.
		act.Warnings = append(act.Warnings, fmt.Sprintf("%v; registered as %s instead", err, fallback))
		t.Name = fallback
		res, err = attach(ctx, client, owner, t)
	}
	act.Tenant = t
	if err != nil {
		if api.Unreachable(err) {
			// The VM runs: its registration is kept for the daemon to make
			// when it is back (the spool).
			body, merr := json.Marshal(t)
			if serr := errors.Join(merr, api.Spool(spool, api.Spooled{Owner: owner, Tenant: body, Fallback: fallback})); serr != nil {
				act.Warnings = append(act.Warnings, fmt.Sprintf("the registration could not be spooled either: %v", serr))
			} else {
				err = fmt.Errorf("%w; registration spooled for the daemon to make when it is back", err)
			}
		}
		act.Warnings = append(act.Warnings, daemonWarning(err, o.Timeout))
		return act, nil
	}
	// How the policy's admission rules bounded what the metadata asked.
	act.Warnings = append(act.Warnings, res.Adjusted...)
	act.Registered = true
	return act, nil
}

func daemonWarning(err error, timeout time.Duration) string {
	if errors.Is(err, context.DeadlineExceeded) {
		err = fmt.Errorf("gpuarb daemon did not answer within %v: %w", timeout, err)
	}
	return err.Error() + " (the VM runs unarbitrated)"
}

// FindQEMU returns the pid of the domain's QEMU process: the one in
// libvirt's pid file when its command line carries the domain's UUID (or
// name), else the process whose command line does.
func FindQEMU(d *Domain, pidDir, procRoot string) (int, error) {
	if b, err := os.ReadFile(filepath.Join(pidDir, d.Name+".pid")); err == nil {
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 0 && runsDomain(procRoot, pid, d) {
			return pid, nil
		}
	}
	entries, err := os.ReadDir(procRoot)
	if err != nil {
		return 0, fmt.Errorf("find the QEMU of domain %s: %w", d.Name, err)
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 0 {
			continue
		}
		if runsDomain(procRoot, pid, d) {
			return pid, nil
		}
	}
	return 0, fmt.Errorf("no QEMU process runs domain %s (uuid %s): no %s/%s.pid naming one and no process with -uuid %[2]s",
		d.Name, d.UUID, pidDir, d.Name)
}

// runsDomain reports whether pid is a QEMU whose command line names the
// domain: `-uuid UUID`, or without a UUID `-name guest=NAME,...`.
func runsDomain(procRoot string, pid int, d *Domain) bool {
	b, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(pid), "cmdline"))
	if err != nil || !bytes.Contains(b, []byte("qemu")) {
		return false
	}
	args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
	for i := 0; i+1 < len(args); i++ {
		switch args[i] {
		case "-uuid":
			if d.UUID != "" {
				return strings.EqualFold(args[i+1], d.UUID)
			}
		case "-name":
			if d.UUID == "" {
				for _, kv := range strings.Split(args[i+1], ",") {
					if kv == "guest="+d.Name || kv == d.Name {
						return true
					}
				}
			}
		}
	}
	return false
}

// libvirtInner matches the cgroups libvirt makes inside a VM's cgroup for
// QEMU's threads.
var libvirtInner = regexp.MustCompile(`^(libvirt|emulator|vcpu[0-9]+|iothread[0-9]+)$`)

// VMCgroup returns the VM's own cgroup from the cgroup of its QEMU
// process: libvirt puts QEMU's threads in sub-cgroups (cgroup v2:
// SCOPE/libvirt/emulator, SCOPE/libvirt/vcpuN; v1: SCOPE/emulator), and
// freezing the VM means freezing the scope with all of them.
func VMCgroup(path string) string {
	parts := strings.Split(strings.TrimSuffix(path, "/"), "/")
	for len(parts) > 2 && libvirtInner.MatchString(parts[len(parts)-1]) {
		parts = parts[:len(parts)-1]
	}
	if len(parts) == 1 {
		return "/"
	}
	return strings.Join(parts, "/")
}
