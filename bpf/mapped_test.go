package bpf

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
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

// mapAndWait maps the file spec names readable and executable, as the
// dynamic loader maps a library's text, says so on stdout and sleeps.
func mapAndWait(spec string) error {
	path, memfd := strings.CutPrefix(spec, "memfd:")
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
	if _, err := unix.Mmap(fd, 0, len(data), unix.PROT_READ|unix.PROT_EXEC, unix.MAP_PRIVATE); err != nil {
		return err
	}
	fmt.Println("mapped")
	time.Sleep(30 * time.Second)
	return nil
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
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(os.Environ(), mapHelperEnv+"="+spec)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		testutil.Start(t, nil, cmd)
		if _, err := out.Read(make([]byte, 6)); err != nil {
			t.Fatalf("helper mapping %s: %v", spec, err)
		}
		n, probed, err := p.AttachMapped(cmd.Process.Pid)
		if n != 1 || !probed || err != nil {
			t.Errorf("%s: attached %d (maps a probed copy: %v), %v; want the one libcuda it maps", spec, n, probed, err)
		}
		if n, probed, err := p.AttachMapped(cmd.Process.Pid); n != 0 || !probed || err != nil {
			t.Errorf("%s again: attached %d (maps a probed copy: %v), %v; want nothing new, probed", spec, n, probed, err)
		}
	}
	libs := p.Libcudas()
	if len(libs) != 2 {
		t.Errorf("probed %q, want the renamed copy and the memfd", libs)
	}
	if n, probed, err := p.AttachMapped(os.Getpid()); n != 0 || probed || err != nil {
		t.Errorf("a process mapping no libcuda: attached %d (maps a probed copy: %v), %v", n, probed, err)
	}
	if n, probed, err := p.AttachMapped(1 << 30); n != 0 || probed || err != nil {
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
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), mapHelperEnv+"="+renamed)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	testutil.Start(t, nil, cmd)
	if _, err := out.Read(make([]byte, 6)); err != nil {
		t.Fatalf("helper mapping %s: %v", renamed, err)
	}
	if n, probed, err := p.AttachMapped(cmd.Process.Pid); n != 0 || probed || err != nil {
		t.Errorf("a process mapping only the refused copy: attached %d (maps a probed copy: %v), %v; want 0, false, nil", n, probed, err)
	}
	if n := p.RefusedLibcudas(); n != 2 {
		t.Errorf("%d copies refused, want 2 (the open and the mapping)", n)
	}
}
