package libvirthook

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpuarb/gpuarb/api"
	"github.com/gpuarb/gpuarb/policy"
)

const domainXMLWithPolicy = `<domain type='kvm' id='7'>
  <name>train-vm</name>
  <uuid>4DEA22B3-1D52-D8F3-2516-782E98AB3FA0</uuid>
  <metadata>
    <other:thing xmlns:other="https://example.com/x" weight="1"/>
    <gpuarb:policy xmlns:gpuarb="https://gpuarb.io/libvirt/1" weight="300" limit="30%"/>
  </metadata>
  <memory unit='KiB'>65536</memory>
  <devices><emulator>/usr/bin/qemu-system-x86_64</emulator></devices>
</domain>`

func TestReadDomain(t *testing.T) {
	d, err := ReadDomain(strings.NewReader(domainXMLWithPolicy))
	if err != nil {
		t.Fatal(err)
	}
	if d.Name != "train-vm" || d.UUID != "4dea22b3-1d52-d8f3-2516-782e98ab3fa0" || len(d.Policy) != 2 ||
		d.Policy["weight"] != "300" || d.Policy["limit"] != "30%" {
		t.Errorf("%+v", d)
	}
	tn, err := d.Tenant()
	if err != nil || tn.Name != "vm-train-vm" || tn.Weight != 300 || tn.Limit != 0.3 {
		t.Errorf("tenant %+v %v", tn, err)
	}
	// No metadata: the default policy, named after the domain.
	d, err = ReadDomain(strings.NewReader(`<domain type='qemu'><name>my vm</name></domain>`))
	if err != nil || d.Policy != nil {
		t.Fatalf("%+v %v", d, err)
	}
	if tn, err := d.Tenant(); err != nil || tn.Name != "vm-my_vm" || tn.Rules != (policy.Rules{}) {
		t.Errorf("tenant %+v %v", tn, err)
	}
	for _, bad := range []string{"", "<domain>", "not xml", "<domain><uuid>x</uuid></domain>", "<network><name>x</name></network>"} {
		if _, err := ReadDomain(strings.NewReader(bad)); !errors.Is(err, ErrBadDomain) {
			t.Errorf("%q: %v", bad, err)
		}
	}
}

func TestDomainPolicyErrors(t *testing.T) {
	for _, tc := range []struct {
		attrs map[string]string
		want  policy.Rules
		name  string
		err   string // the attribute the error must name
	}{
		{map[string]string{"priority": "latency", "slo-p99-ms": "20", "name": "infer"},
			policy.Rules{Priority: policy.Latency, SLO: policy.SLO{P99SyncMS: 20}}, "infer", ""},
		{map[string]string{"slo-fps": "60"}, policy.Rules{Priority: policy.Latency, SLO: policy.SLO{FPS: 60}}, "vm-d", ""},
		{map[string]string{"memory-limit": "16GiB"}, policy.Rules{MemoryLimit: policy.MemoryLimit{Bytes: 16 << 30}}, "vm-d", ""},
		{map[string]string{"memory-limit": "16 parsecs"}, policy.Rules{}, "", "memory-limit"},
		{map[string]string{"weight": "0"}, policy.Rules{}, "", "weight"},
		{map[string]string{"limit": "2"}, policy.Rules{}, "", "limit"},
		{map[string]string{"wieght": "3"}, policy.Rules{}, "", "wieght"},
		{map[string]string{"name": "a/b"}, policy.Rules{}, "", "name"},
	} {
		tn, err := (&Domain{Name: "d", Policy: tc.attrs}).Tenant()
		if tc.err != "" {
			var pe *PolicyError
			if !errors.As(err, &pe) || pe.Attr != tc.err || !strings.Contains(err.Error(), "<gpuarb:policy "+tc.err+"=") {
				t.Errorf("%v: %v, want an error naming %s", tc.attrs, err, tc.err)
			}
			continue
		}
		if err != nil || tn.Rules != tc.want || tn.Name != tc.name {
			t.Errorf("%v: %+v %v", tc.attrs, tn, err)
		}
	}
}

func FuzzReadDomain(f *testing.F) {
	f.Add([]byte(domainXMLWithPolicy))
	f.Add([]byte(`<domain><name>x</name><metadata><gpuarb:policy xmlns:gpuarb="https://gpuarb.io/libvirt/1" name="x y"/></metadata></domain>`))
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := ReadDomain(strings.NewReader(string(b)))
		if err != nil {
			if !errors.Is(err, ErrBadDomain) {
				t.Fatalf("unmarked error %v", err)
			}
			return
		}
		if d.Name == "" {
			t.Fatal("accepted a domain without a name")
		}
		if tn, err := d.Tenant(); err == nil {
			if policy.CheckTenantName(tn.Name) != nil {
				t.Fatalf("tenant name %q", tn.Name)
			}
		}
	})
}

func TestVMCgroup(t *testing.T) {
	for in, want := range map[string]string{
		`/machine.slice/machine-qemu\x2d1\x2dvm.scope/libvirt/emulator`: `/machine.slice/machine-qemu\x2d1\x2dvm.scope`,
		`/machine.slice/machine-qemu\x2d1\x2dvm.scope/libvirt`:          `/machine.slice/machine-qemu\x2d1\x2dvm.scope`,
		`/machine.slice/machine-qemu\x2d1\x2dvm.scope/emulator`:         `/machine.slice/machine-qemu\x2d1\x2dvm.scope`,
		`/machine/qemu-1-vm.libvirt-qemu/vcpu0`:                         `/machine/qemu-1-vm.libvirt-qemu`,
		`/machine.slice/machine-qemu\x2d1\x2dvm.scope`:                  `/machine.slice/machine-qemu\x2d1\x2dvm.scope`,
		`/gpuarb-test/vm`: `/gpuarb-test/vm`,
		`/emulator`:       `/emulator`,
	} {
		if got := VMCgroup(in); got != want {
			t.Errorf("%s: %s, want %s", in, got, want)
		}
	}
}

// fakeProc makes procRoot/PID/{cmdline,cgroup}.
func fakeProc(t *testing.T, root string, pid int, args []string, cg string) {
	t.Helper()
	dir := filepath.Join(root, strconv.Itoa(pid))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	must(t, os.WriteFile(filepath.Join(dir, "cmdline"), []byte(strings.Join(args, "\x00")+"\x00"), 0o644))
	must(t, os.WriteFile(filepath.Join(dir, "cgroup"), []byte("0::"+cg+"\n"), 0o644))
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestFindQEMU(t *testing.T) {
	proc, pids := t.TempDir(), t.TempDir()
	uuid := "4dea22b3-1d52-d8f3-2516-782e98ab3fa0"
	fakeProc(t, proc, 100, []string{"/usr/bin/qemu-system-x86_64", "-name", "guest=other,debug-threads=on", "-uuid", "11111111-1d52-d8f3-2516-782e98ab3fa0"}, "/x")
	fakeProc(t, proc, 200, []string{"/usr/bin/qemu-system-x86_64", "-name", "guest=train-vm,debug-threads=on", "-uuid", strings.ToUpper(uuid)}, "/y")
	fakeProc(t, proc, 300, []string{"/bin/sleep", "-uuid", uuid}, "/z")
	d := &Domain{Name: "train-vm", UUID: uuid}
	// No pid file: found by its -uuid; the non-QEMU process is not taken.
	if pid, err := FindQEMU(d, pids, proc); err != nil || pid != 200 {
		t.Errorf("scan: %d %v", pid, err)
	}
	// A stale pid file (another domain's QEMU) is not believed.
	must(t, os.WriteFile(filepath.Join(pids, "train-vm.pid"), []byte("100\n"), 0o644))
	if pid, err := FindQEMU(d, pids, proc); err != nil || pid != 200 {
		t.Errorf("stale pid file: %d %v", pid, err)
	}
	must(t, os.WriteFile(filepath.Join(pids, "train-vm.pid"), []byte("200"), 0o644))
	if pid, err := FindQEMU(d, pids, proc); err != nil || pid != 200 {
		t.Errorf("pid file: %d %v", pid, err)
	}
	// Without a UUID, -name guest=NAME decides.
	if pid, err := FindQEMU(&Domain{Name: "other"}, pids, proc); err != nil || pid != 100 {
		t.Errorf("by name: %d %v", pid, err)
	}
	if _, err := FindQEMU(&Domain{Name: "gone", UUID: "22222222-1d52-d8f3-2516-782e98ab3fa0"}, pids, proc); err == nil ||
		!strings.Contains(err.Error(), "no QEMU process runs domain gone") {
		t.Errorf("missing domain: %v", err)
	}
}

func TestRunOperations(t *testing.T) {
	proc := t.TempDir()
	fakeProc(t, proc, 200, []string{"qemu-system-x86_64", "-uuid", "4dea22b3-1d52-d8f3-2516-782e98ab3fa0"},
		`/machine.slice/machine-qemu\x2d7\x2dtrain\x2dvm.scope/libvirt/emulator`)
	o := Options{Socket: filepath.Join(t.TempDir(), "none.sock"), PIDDir: t.TempDir(), ProcRoot: proc, Timeout: 200 * time.Millisecond}
	ctx := context.Background()
	// Operations the hook ignores read nothing, not even stdin.
	for _, op := range []Operation{"prepare", "start", "migrate", "restore"} {
		if act, err := Run(ctx, "train-vm", op, strings.NewReader("garbage"), o); err != nil || act.Registered || len(act.Warnings) > 0 {
			t.Errorf("%s: %+v %v", op, act, err)
		}
	}
	// started with the daemon down: the VM's scope found, a warning, no error.
	act, err := Run(ctx, "train-vm", "started", strings.NewReader(domainXMLWithPolicy), o)
	if err != nil || act.Registered || act.PID != 200 || len(act.Warnings) != 1 ||
		!strings.Contains(act.Warnings[0], "not running") ||
		act.Tenant.Cgroup != `/machine.slice/machine-qemu\x2d7\x2dtrain\x2dvm.scope` || act.Tenant.Weight != 300 {
		t.Errorf("started, daemon down: %+v %v", act, err)
	}
	// ... its registration spooled for the daemon, until the VM stops.
	spooled := func() []string {
		files, _ := filepath.Glob(filepath.Join(api.SpoolBeside(o.Socket), "*.json"))
		return files
	}
	if !strings.Contains(act.Warnings[0], "spooled") || len(spooled()) != 1 {
		t.Errorf("spooled %v, warned %q: want the VM's registration", spooled(), act.Warnings)
	}
	if act, err := Run(ctx, "train-vm", "stopped", strings.NewReader(domainXMLWithPolicy), o); err != nil || len(act.Warnings) != 1 {
		t.Errorf("stopped, daemon down: %+v %v", act, err)
	}
	if len(spooled()) != 0 {
		t.Errorf("spooled %v after the VM stopped", spooled())
	}
	// XML of another domain, a bad policy: errors.
	if _, err := Run(ctx, "other", "started", strings.NewReader(domainXMLWithPolicy), o); !errors.Is(err, ErrBadDomain) {
		t.Errorf("wrong domain: %v", err)
	}
	bad := strings.Replace(domainXMLWithPolicy, `weight="300"`, `weight="heavy"`, 1)
	var pe *PolicyError
	if _, err := Run(ctx, "train-vm", "started", strings.NewReader(bad), o); !errors.As(err, &pe) || pe.Attr != "weight" {
		t.Errorf("bad policy: %v", err)
	}
	o.DefaultOnBadPolicy = true
	if act, err := Run(ctx, "train-vm", "started", strings.NewReader(bad), o); err != nil || act.Tenant.Weight != 0 ||
		!strings.Contains(strings.Join(act.Warnings, ";"), "default policy") {
		t.Errorf("bad policy, default: %+v %v", act, err)
	}
}

func TestInstallScript(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "qemu.d")
	if _, err := InstallScript(dir, "bin/gpuarb", ""); err == nil {
		t.Error("relative binary accepted")
	}
	// The script passes libvirt's arguments and stdin through: a fake
	// binary records them.
	bin := filepath.Join(t.TempDir(), "it's gpuarb")
	out := filepath.Join(t.TempDir(), "args")
	must(t, os.WriteFile(bin, []byte("#!/bin/sh\necho \"$@\" > '"+out+"'\ncat >> '"+out+"'\n"), 0o755))
	path, err := InstallScript(dir, bin, "/run/x/gpuarb.sock")
	if err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o755 {
		t.Fatalf("%s: %v %v", path, st, err)
	}
	cmd := exec.Command(path, "vm1", "started", "begin", "-")
	cmd.Stdin = strings.NewReader("<domain/>")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, b)
	}
	got, _ := os.ReadFile(out)
	if want := "libvirt-hook --socket /run/x/gpuarb.sock vm1 started begin -\n<domain/>"; string(got) != want {
		t.Errorf("the hook ran with %q, want %q", got, want)
	}
	if removed, err := UninstallScript(dir); !removed || err != nil {
		t.Errorf("uninstall: %v %v", removed, err)
	}
	if removed, err := UninstallScript(dir); removed || err != nil {
		t.Errorf("uninstall again: %v %v", removed, err)
	}
	// Somebody else's script is left alone.
	must(t, os.WriteFile(filepath.Join(dir, scriptName), []byte("#!/bin/sh\n"), 0o755))
	if removed, err := UninstallScript(dir); removed || err == nil {
		t.Errorf("foreign script: %v %v", removed, err)
	}
}
