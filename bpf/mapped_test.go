package bpf

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpuarb/gpuarb/internal/testutil"
)

// mapHelperEnv makes the test binary a process that maps a file
// executable ("memfd:PATH": a copy of it in a memfd) and waits.
const mapHelperEnv = "GPUARB_MAP_HELPER"

func TestMain(m *testing.M) {
	if spec := os.Getenv(mapHelperEnv); spec != "" {
		if err := mapAndWait(spec); err != nil {
			fmt.Fprintln(os.Stderr, "map helper:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// mapAndWait maps the files spec names (comma-separated) readable and
// executable, as the dynamic loader maps a library's text ("memfd:PATH":
// a copy of it in a memfd), says so on stdout and sleeps.
func mapAndWait(spec string) error {
	for _, one := range strings.Split(spec, ",") {
		path, memfd := strings.CutPrefix(one, "memfd:")
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		var fd int
		if memfd {
			if fd, err = unix.MemfdCreate("hidden", 0); err != nil {
				return err
			}
			if _, err := unix.Write(fd, data); err != nil {
				return err
			}
		} else if fd, err = unix.Open(path, unix.O_RDONLY, 0); err != nil {
			return err
		}
		if _, err := unix.Mmap(fd, 0, max(len(data), 4096), unix.PROT_READ|unix.PROT_EXEC, unix.MAP_PRIVATE); err != nil {
			return err
		}
	}
	fmt.Println("mapped")
	time.Sleep(30 * time.Second)
	return nil
}

// startMapper starts a process, in cg when not nil, that maps the files
// spec names (mapAndWait) and returns once they are mapped.
func startMapper(t *testing.T, cg *testutil.Cgroup, spec string) *testutil.Proc {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), mapHelperEnv+"="+spec)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := testutil.Start(t, cg, cmd)
	if _, err := out.Read(make([]byte, 6)); err != nil {
		_, stderr := p.Output()
		t.Fatalf("helper mapping %s: %v: %s", spec, err, stderr)
	}
	return p
}

func TestParseMaps(t *testing.T) {
	maps := `55d0c0a00000-55d0c0a21000 r--p 00000000 fd:01 1311 /usr/bin/gpuwork
55d0c0a21000-55d0c0a40000 r-xp 00021000 fd:01 1311 /usr/bin/gpuwork
7f11c0000000-7f11c0021000 rw-p 00000000 00:00 0 
7f11c2000000-7f11c2080000 r-xp 00000000 00:01 4097 /memfd:hidden (deleted)
7f11c3000000-7f11c3080000 r-xp 00100000 00:01 4097 /memfd:hidden (deleted)
7f11c4000000-7f11c4001000 rw-s 00000000 00:05 88 /dev/nvidiactl
7ffd1c1f0000-7ffd1c1f2000 r-xp 00000000 00:00 0 [vdso]
`
	got := parseMaps([]byte(maps))
	want := []mapping{
		{addr: "55d0c0a21000-55d0c0a40000", id: fileID{dev: unix.Mkdev(0xfd, 1), ino: 1311}, path: "/usr/bin/gpuwork"},
		{addr: "7f11c2000000-7f11c2080000", id: fileID{dev: unix.Mkdev(0, 1), ino: 4097}, path: "/memfd:hidden (deleted)"},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("parseMaps:\n got %v\nwant %v (executable file mappings, one per file)", got, want)
	}
}

// Issue 18, item 7: libcuda is found by what a process maps, whatever
// its name — a renamed copy, a memfd — and only a libcuda is probed.
func TestAttachMappedFindsLibcudaUnderAnyName(t *testing.T) {
	p := loadForTest(t, Options{})
	renamed := t.TempDir() + "/libgpu-runtime.so"
	copyFile(t, testutil.Bin(t, "libcuda.so.1"), renamed, 0o755)
	for _, spec := range []string{renamed, "memfd:" + renamed} {
		cmd := startMapper(t, nil, spec).Cmd
		n, probed, err := p.AttachMapped(cmd.Process.Pid, 0)
		if n != 1 || !probed || err != nil {
			t.Errorf("%s: attached %d (maps a probed copy: %v), %v; want the one libcuda it maps", spec, n, probed, err)
		}
		if n, probed, err := p.AttachMapped(cmd.Process.Pid, 0); n != 0 || !probed || err != nil {
			t.Errorf("%s again: attached %d (maps a probed copy: %v), %v; want nothing new, probed", spec, n, probed, err)
		}
	}
	libs := p.Libcudas()
	if len(libs) != 2 {
		t.Errorf("probed %q, want the renamed copy and the memfd", libs)
	}
	if n, probed, err := p.AttachMapped(os.Getpid(), 0); n != 0 || probed || err != nil {
		t.Errorf("a process mapping no libcuda: attached %d (maps a probed copy: %v), %v", n, probed, err)
	}
	if n, probed, err := p.AttachMapped(1<<30, 0); n != 0 || probed || err != nil {
		t.Errorf("a process that is gone: attached %d (maps a probed copy: %v), %v; want nothing, no error", n, probed, err)
	}
}

// Issue 18, item 6: the libcuda copies probed are bounded. A copy beyond
// MaxLibcudas is refused and counted, and a process that maps only such a
// copy reads as mapping no probed libcuda (it is then held as unprobed).
func TestLibcudaCopiesAreBounded(t *testing.T) {
	p := loadForTest(t, Options{MaxLibcudas: 1})
	if ok, err := p.AttachLibcuda(testutil.Bin(t, "libcuda.so.1")); !ok || err != nil {
		t.Fatalf("first copy: %v, %v", ok, err)
	}
	renamed := t.TempDir() + "/libgpu-runtime.so"
	copyFile(t, testutil.Bin(t, "libcuda.so.1"), renamed, 0o755)
	if ok, err := p.AttachLibcuda(renamed); ok || !errors.Is(err, ErrTooManyLibcudas) {
		t.Errorf("a second copy beyond the bound: %v, %v; want ErrTooManyLibcudas", ok, err)
	}
	mapper := startMapper(t, nil, renamed)
	if n, probed, err := p.AttachMapped(mapper.Cmd.Process.Pid, 0); n != 0 || probed || err != nil {
		t.Errorf("a process mapping only the refused copy: attached %d (maps a probed copy: %v), %v; want 0, false, nil", n, probed, err)
	}
	if n := p.RefusedLibcudas(); n != 2 {
		t.Errorf("%d copies refused, want 2 (the operator's and the mapping)", n)
	}
}

// Issue 56, item 7: a tenant that maps copy after copy of a libcuda (tiny
// fakes would do: each exports a launch entry point) gets at most
// maxLibcudasPerCgroup of them probed, so it cannot fill the host's bound
// and keep another tenant's genuine copy unprobed; and once its processes
// are gone, the copies nothing maps make way for new ones at the bound.
func TestLibcudaCopiesAreBudgetedPerCgroup(t *testing.T) {
	p := loadForTest(t, Options{MaxLibcudas: maxLibcudasPerCgroup + 1})
	lib := testutil.Bin(t, "libcuda.so.1")
	dir := t.TempDir()
	var copies []string
	for i := range maxLibcudasPerCgroup + 4 {
		c := filepath.Join(dir, fmt.Sprintf("libfake%02d.so", i))
		copyFile(t, lib, c, 0o755) // another inode each
		copies = append(copies, c)
	}
	hostile := testutil.NewCgroup(t, "copies")
	mapper := startMapper(t, hostile, strings.Join(copies, ","))
	n, probed, err := p.AttachMapped(mapper.Cmd.Process.Pid, hostile.ID)
	if n != maxLibcudasPerCgroup || !probed || err != nil {
		t.Errorf("a tenant mapping %d copies: %d attached (probed %v), %v; want its budget of %d", len(copies), n, probed, err,
			maxLibcudasPerCgroup)
	}
	genuine := filepath.Join(t.TempDir(), "libcuda.so.1")
	copyFile(t, lib, genuine, 0o755)
	other := testutil.NewCgroup(t, "genuine")
	if n, probed, err := p.AttachMapped(startMapper(t, other, genuine).Cmd.Process.Pid, other.ID); n != 1 || !probed || err != nil {
		t.Errorf("another tenant's copy: %d attached (probed %v), %v; want it probed", n, probed, err)
	}
	mapper.Stop()
	third := testutil.NewCgroup(t, "third")
	late := filepath.Join(t.TempDir(), "libcuda.so.1")
	copyFile(t, lib, late, 0o755)
	if n, _, err := p.AttachMapped(startMapper(t, third, late).Cmd.Process.Pid, third.ID); n != 1 || err != nil {
		t.Errorf("a copy at the host's bound once the mapper is gone: %d attached, %v; want the unmapped copies pruned", n, err)
	}
	if got := len(p.Libcudas()); got != 2 {
		t.Errorf("%d copies probed, want 2 (the genuine and the late one)", got)
	}
}

// Issue 56, item 6: a copy that is slow to read delays no one but its own
// attach. While one tenant's copy is being read (held here until
// released), the calls status, metrics and the control loop make answer
// at once and another tenant's copy is probed.
func TestASlowLibcudaDelaysNoOne(t *testing.T) {
	p := loadForTest(t, Options{})
	lib := testutil.Bin(t, "libcuda.so.1")
	slow, other := filepath.Join(t.TempDir(), "libcuda.so.1"), filepath.Join(t.TempDir(), "libcuda.so.1")
	copyFile(t, lib, slow, 0o755)
	copyFile(t, lib, other, 0o755)
	slowCg, otherCg := testutil.NewCgroup(t, "slow"), testutil.NewCgroup(t, "other")
	slowPid, otherPid := startMapper(t, slowCg, slow).Cmd.Process.Pid, startMapper(t, otherCg, other).Cmd.Process.Pid

	var slowSt unix.Stat_t
	if err := unix.Stat(slow, &slowSt); err != nil {
		t.Fatal(err)
	}
	started, release := make(chan struct{}), make(chan struct{})
	p.readExports = func(r io.ReaderAt, size int64) ([]export, error) {
		var st unix.Stat_t
		if f, ok := r.(*os.File); ok && unix.Fstat(int(f.Fd()), &st) == nil && st.Ino == slowSt.Ino && st.Dev == slowSt.Dev {
			close(started)
			<-release
		}
		return readExports(r, size)
	}
	done := make(chan error, 1)
	go func() {
		n, _, err := p.AttachMapped(slowPid, slowCg.ID)
		if err == nil && n != 1 {
			err = fmt.Errorf("%d copies attached, want 1", n)
		}
		done <- err
	}()
	<-started
	for _, c := range []struct {
		what string
		call func() error
	}{
		{"Libcudas", func() error { _ = p.Libcudas(); return nil }},
		{"RefusedLibcudas", func() error { _ = p.RefusedLibcudas(); return nil }},
		{"SetUrgent", func() error { return p.SetUrgent([]uint32{uint32(otherPid)}, []uint64{otherCg.ID}) }},
		{"SetUrgent off", func() error { return p.SetUrgent(nil, nil) }},
		{"another tenant's attach", func() error {
			if n, _, err := p.AttachMapped(otherPid, otherCg.ID); n != 1 || err != nil {
				return fmt.Errorf("%d attached: %v", n, err)
			}
			return nil
		}},
	} {
		res := make(chan error, 1)
		start := time.Now()
		go func() { res <- c.call() }()
		select {
		case err := <-res:
			if err != nil {
				t.Errorf("%s while a copy is read: %v", c.what, err)
			}
			t.Logf("%s answered in %v while a copy is read", c.what, time.Since(start).Round(time.Microsecond))
		case <-time.After(2 * time.Second):
			t.Errorf("%s waited on a copy being read", c.what)
		}
	}
	close(release)
	if err := <-done; err != nil {
		t.Errorf("the slow copy: %v", err)
	}
	if got := len(p.Libcudas()); got != 2 {
		t.Errorf("%d copies probed, want both", got)
	}
}
