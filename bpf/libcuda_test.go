package bpf

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gpuarb/gpuarb/internal/testutil"
)

// hostileTree makes, in a new directory, what a tenant may put where the
// daemon looks: a character device node, a FIFO, a symlink to each, a
// symlink out of the tree, a sparse file over maxELFSize and a small
// regular file; it returns the directory and watches the node and the FIFO
// for opens (IN_OPEN), returning a function that counts them so far.
func hostileTree(t testing.TB) (dir string, opens func() int) {
	t.Helper()
	dir = t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(unix.Mknod(filepath.Join(dir, "dev"), unix.S_IFCHR|0o600, int(unix.Mkdev(1, 5))))
	must(unix.Mkfifo(filepath.Join(dir, "fifo"), 0o600))
	must(os.Symlink("dev", filepath.Join(dir, "to-dev")))
	must(os.Symlink("fifo", filepath.Join(dir, "to-fifo")))
	must(os.Symlink("/dev/zero", filepath.Join(dir, "out")))
	big, err := os.Create(filepath.Join(dir, "big"))
	must(err)
	must(big.Truncate(maxELFSize + 1))
	must(big.Close())
	must(os.WriteFile(filepath.Join(dir, "plain"), []byte("not an ELF file\n"), 0o644))
	in, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	must(err)
	t.Cleanup(func() { unix.Close(in) })
	for _, name := range []string{"dev", "fifo"} {
		_, err := unix.InotifyAddWatch(in, filepath.Join(dir, name), unix.IN_OPEN)
		must(err)
	}
	total := 0
	return dir, func() int {
		buf := make([]byte, 4096)
		for {
			n, err := unix.Read(in, buf)
			if n <= 0 || err != nil {
				return total
			}
			total += n / unix.SizeofInotifyEvent // no names: events of the watched files themselves
		}
	}
}

// Issue 56, items 1 and 6: openRegular opens nothing but a regular file of
// at most maxELFSize bytes on a local filesystem for reading: a device
// node, a FIFO and symlinks to them are refused without an open (inotify
// sees none), at once; so are an oversized file and a magic link where
// none is allowed.
func TestOpenRegularActsOnNothingElse(t *testing.T) {
	testutil.Privileged(t)
	dir, opens := hostileTree(t)
	for _, name := range []string{"dev", "fifo", "to-dev", "to-fifo", "out", "big"} {
		f, _, err := openLibcuda(filepath.Join(dir, name))
		if err == nil {
			f.Close()
		}
		if !errors.Is(err, ErrNotLibcuda) {
			t.Errorf("%s: %v, want ErrNotLibcuda", name, err)
		}
	}
	if _, _, err := openLibcuda(fmt.Sprintf("/proc/self/fd/%d", os.Stdout.Fd())); err == nil {
		t.Error("a magic link opened")
	}
	f, st, err := openLibcuda(filepath.Join(dir, "plain"))
	if err != nil {
		t.Fatalf("a regular file: %v", err)
	}
	defer f.Close()
	if st.Size != 16 {
		t.Errorf("size %d, want 16", st.Size)
	}
	if n := opens(); n != 0 {
		t.Errorf("the node or the FIFO was opened %d times", n)
	}
}

// FuzzOpenRegular resolves any path beneath a directory holding a device
// node, a FIFO, symlinks and an oversized file: it opens the one small
// regular file there or nothing, never the node or the FIFO.
func FuzzOpenRegular(f *testing.F) {
	if os.Geteuid() != 0 {
		f.Skip("needs root: device nodes")
	}
	dir, opens := hostileTree(f)
	dirfd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { unix.Close(dirfd) })
	var plain unix.Stat_t
	if err := unix.Stat(filepath.Join(dir, "plain"), &plain); err != nil {
		f.Fatal(err)
	}
	for _, seed := range []string{"plain", "dev", "fifo", "to-dev", "out", "big", "../plain", "plain/..", "./to-fifo",
		"libcuda.so/../dev", "../../../dev/zero", "/proc/self/fd/0"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, path string) {
		if strings.ContainsRune(path, 0) {
			return
		}
		file, st, err := openRegular(dirfd, path, unix.RESOLVE_BENEATH|unix.RESOLVE_NO_MAGICLINKS)
		if err == nil {
			file.Close()
			if st.Ino != plain.Ino || st.Dev != plain.Dev {
				t.Fatalf("%q opened inode %d, want only the regular file %d", path, st.Ino, plain.Ino)
			}
		}
		if n := opens(); n != 0 {
			t.Fatalf("%q: the node or the FIFO was opened (%d)", path, n)
		}
	})
}

// elfBomb writes a sparse ELF file whose dynamic symbol table claims size
// bytes of zeros, far into the file: it costs its maker no disk.
func elfBomb(t testing.TB, path string, size uint64) {
	t.Helper()
	le := binary.LittleEndian
	var b bytes.Buffer
	hdr := make([]byte, 64)
	copy(hdr, "\x7fELF\x02\x01\x01")
	le.PutUint16(hdr[16:], 3)   // ET_DYN
	le.PutUint16(hdr[18:], 62)  // x86-64
	le.PutUint64(hdr[32:], 64)  // phoff
	le.PutUint64(hdr[40:], 120) // shoff: after one program header
	le.PutUint16(hdr[52:], 64)
	le.PutUint16(hdr[54:], 56)
	le.PutUint16(hdr[56:], 1)
	le.PutUint16(hdr[58:], 64)
	le.PutUint16(hdr[60:], 3)
	b.Write(hdr)
	ph := make([]byte, 56)
	le.PutUint32(ph, ptLoad)
	le.PutUint32(ph[4:], pfX|4)
	le.PutUint64(ph[40:], 1<<30) // memsz
	b.Write(ph)
	sh := make([]byte, 3*64)
	const dataAt = 1 << 20
	le.PutUint32(sh[64+4:], shtDynsym)
	le.PutUint64(sh[64+24:], dataAt)
	le.PutUint64(sh[64+32:], size)
	le.PutUint32(sh[64+40:], 2)
	le.PutUint64(sh[64+56:], symSize)
	le.PutUint32(sh[128+4:], shtStrtab)
	le.PutUint64(sh[128+24:], dataAt)
	le.PutUint64(sh[128+32:], 16)
	b.Write(sh)
	if err := os.WriteFile(path, b.Bytes(), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, int64(dataAt+size)); err != nil {
		t.Fatal(err)
	}
}

// allocated returns the bytes f allocates (runtime.MemStats.TotalAlloc).
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// Issue 56, item 2: a process that maps a sparse file whose .dynsym claims
// 15 MiB of zeros (an ELF bomb) costs the daemon's scan of it under
// 256 KiB: the table is over maxDynsym and is refused unread. debug/elf,
// which read it before, allocated 93 MiB for it.
func TestELFBombCostsTheScanNothing(t *testing.T) {
	p := loadForTest(t, Options{})
	bomb := filepath.Join(t.TempDir(), "libbomb.so")
	elfBomb(t, bomb, 15<<20)
	cmd := startMapper(t, nil, bomb).Cmd
	var n int
	var probed bool
	var err error
	bytes := allocated(func() { n, probed, err = p.AttachMapped(cmd.Process.Pid, 0) })
	t.Logf("scanning the bomb's process allocated %d KiB", bytes>>10)
	if n != 0 || probed || err != nil {
		t.Errorf("attached %d (probed %v), %v: want nothing, no error", n, probed, err)
	}
	if bytes > 256<<10 {
		t.Errorf("the scan allocated %d KiB, want under 256", bytes>>10)
	}
	f, err := os.Open(bomb)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, _ := f.Stat()
	if _, err := readExports(f, st.Size()); !errors.Is(err, errNotELF) || !strings.Contains(err.Error(), "dynamic symbol table") {
		t.Errorf("readExports of the bomb: %v, want its dynamic symbol table refused", err)
	}
}

// countingReader counts the bytes read through it.
type countingReader struct {
	r io.ReaderAt
	n int
}

func (c *countingReader) ReadAt(p []byte, off int64) (int, error) {
	n, err := c.r.ReadAt(p, off)
	c.n += len(p)
	return n, err
}

// FuzzReadExports reads exports from any bytes, as a tenant's file may be:
// never a panic, never more read (and allocated) than the bounds, and only
// names starting with "cu", sorted, with offsets inside the file's
// executable segments.
func FuzzReadExports(f *testing.F) {
	if dir := os.Getenv("GPUARB_BIN"); dir != "" {
		if lib, err := os.ReadFile(filepath.Join(dir, "libcuda.so.1")); err == nil {
			f.Add(lib)
			f.Add(lib[:4096])
		}
	}
	if exe, err := os.ReadFile("/proc/self/exe"); err == nil {
		f.Add(exe[:64])
	}
	f.Add([]byte("\x7fELF"))
	f.Fuzz(func(t *testing.T, b []byte) {
		r := &countingReader{r: bytes.NewReader(b)}
		exports, err := readExports(r, int64(len(b)))
		if r.n > maxELFHeaders+maxDynsym+maxDynstr {
			t.Fatalf("read %d bytes, over the bound %d", r.n, maxELFHeaders+maxDynsym+maxDynstr)
		}
		if err != nil {
			return
		}
		for i, e := range exports {
			if !strings.HasPrefix(e.name, "cu") || len(e.name) > maxSymbolName || i > 0 && exports[i-1].name >= e.name {
				t.Fatalf("export %d %q: want cu* names, sorted, unique", i, e.name)
			}
		}
	})
}
