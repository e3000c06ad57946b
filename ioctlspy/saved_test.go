package ioctlspy

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/gpuarb/gpuarb/nvrm"
)

// A table saved and restored holds the same RM objects for the same
// processes; a pid that names another process by then (another start
// time), or none, is not restored, and neither is a process the table
// knows already.
func TestTableSavedAndRestored(t *testing.T) {
	tbl, apply := steerableProcess(t)
	mem := nvIoctl(nvrm.EscRMAlloc, words(1, 2, 20, nvrm.ClassMemoryLocalUser, uint64(0x7000), uint64(0), 0, 0, 0, 0), nil)
	mem.Args[1], mem.Args[2] = 2<<20, 3
	apply(mem)
	apply(Record{Type: recCuda, PID: 42, TID: 42, Func: fn("cuCtxCreate_v2"), Args: [numArgs]uint64{0xc7, 0, 0}})
	apply(Record{Type: recCuda, PID: 42, TID: 45, Func: fn("cuCtxCreate_v2"), Args: [numArgs]uint64{0xc8, 0, 0}})
	other := nvIoctl(nvrm.EscRMAlloc, words(5, 0, 5, nvrm.ClassRoot, uint64(0), 0, 0), nil)
	other.PID = 43
	apply(other)
	v := tbl.Version()

	var buf bytes.Buffer
	starts := map[uint32]uint64{42: 1000, 43: 2000}
	if err := tbl.Save(&buf, func(pid uint32) (uint64, error) {
		if st, ok := starts[pid]; ok {
			return st, nil
		}
		return 0, errors.New("gone")
	}); err != nil {
		t.Fatal(err)
	}
	saved := buf.Bytes()
	// By the restore pid 43 names another process, and pid 44 is known.
	now := map[uint32]uint64{42: 1000, 43: 2001}
	restored := NewTable()
	known := nvIoctl(nvrm.EscRMAlloc, words(9, 0, 9, nvrm.ClassRoot, uint64(0), 0, 0), nil)
	known.PID = 44
	ev, _ := DecodeRecord(known)
	restored.Apply(ev)
	pids, err := restored.Restore(bytes.NewReader(saved), func(pid uint32) (uint64, error) { return now[pid], nil })
	if err != nil || len(pids) != 1 || pids[0] != 42 {
		t.Fatalf("restored %v (%v), want pid 42 alone", pids, err)
	}
	want, _ := tbl.Process(42)
	got, ok := restored.Process(42)
	want.LastSeen, want.Launches = 0, 0
	if !ok || !reflect.DeepEqual(got, want) {
		t.Errorf("restored %+v\nwant %+v", got, want)
	}
	if got.Made != 0xc7 || got.Threads[45] != 0xc8 || got.Threads[42] != 0xc7 {
		t.Errorf("restored routing: made 0x%x, threads %v; want 0xc7 first, thread 45 on 0xc8", got.Made, got.Threads)
	}
	if !reflect.DeepEqual(got.Groups(), want.Groups()) || len(got.Groups()) != 1 {
		t.Errorf("restored groups %+v, want %+v", got.Groups(), want.Groups())
	}
	if _, ok := restored.Process(43); ok {
		t.Error("pid 43, another process by the restore, was restored")
	}
	if v == 0 || restored.Version() == 0 {
		t.Errorf("versions %d, %d: the changes Save writes are not counted", v, restored.Version())
	}
	if _, err := NewTable().Restore(bytes.NewReader([]byte("{not json")), nil); err == nil {
		t.Error("a corrupt saved table was accepted")
	}
}

// SaveFile replaces its file whole and leaves no temporary beside it;
// RestoreFile of a missing file restores nothing, without an error.
func TestTableSavedToAFile(t *testing.T) {
	tbl, _ := steerableProcess(t)
	path := filepath.Join(t.TempDir(), "objects.json")
	start := func(uint32) (uint64, error) { return 1000, nil }
	if err := os.WriteFile(path, []byte("an older, longer file than the table's"+strings.Repeat(" ", 4096)), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := tbl.SaveFile(path, start); err != nil {
		t.Fatal(err)
	}
	if entries, err := os.ReadDir(filepath.Dir(path)); err != nil || len(entries) != 1 {
		t.Errorf("%s holds %v (%v), want the table's file alone", filepath.Dir(path), entries, err)
	}
	pids, err := NewTable().RestoreFile(path, start)
	if err != nil || len(pids) != 1 || pids[0] != 42 {
		t.Errorf("restored %v (%v), want pid 42", pids, err)
	}
	if pids, err := NewTable().RestoreFile(path+".missing", start); err != nil || len(pids) != 0 {
		t.Errorf("a missing file restored %v (%v)", pids, err)
	}
}

// A restored process's context creations route its threads as its calls
// did, the first context's threads first, each context on its GPU; a
// process of primary contexts alone retains them.
func TestContextsMadeRouteAsTheCallsDid(t *testing.T) {
	threads := Process{PID: 5, CgroupID: 9, Made: 0xb, Contexts: map[uint64]int32{0xa: 1, 0xb: 3},
		Threads: map[uint32]uint64{7: 0xa, 8: 0xb, 6: 0xa}}
	type call struct {
		tid uint32
		fn  string
		ctx uint64
		gpu int32
	}
	calls := func(evs []*ContextCreated) (out []call) {
		for _, e := range evs {
			if e.PID != 5 || e.CgroupID != 9 || e.Start != 100 {
				t.Errorf("%+v: want pid 5 of cgroup 9 at 100", e.Header)
			}
			out = append(out, call{e.TID, e.Func, e.Ctx, e.Device})
		}
		return out
	}
	if got, want := calls(threads.ContextsMade(100)), []call{{8, "cuCtxCreate_v2", 0xb, 3}, {6, "cuCtxCreate_v2", 0xa, 1},
		{7, "cuCtxCreate_v2", 0xa, 1}}; !reflect.DeepEqual(got, want) {
		t.Errorf("threads routed by %v, want %v", got, want)
	}
	primary := Process{PID: 5, CgroupID: 9, Contexts: map[uint64]int32{0xc: 2}, Threads: map[uint32]uint64{}}
	if got, want := calls(primary.ContextsMade(100)), []call{{5, "cuDevicePrimaryCtxRetain", 0xc, 2}}; !reflect.DeepEqual(got, want) {
		t.Errorf("primary context retained by %v, want %v", got, want)
	}
	// A thread per GPU: the first primary context (0xd, retained first,
	// though its handle sorts after 0xc) first, then the thread on GPU 1's.
	perGPU := Process{PID: 5, CgroupID: 9, Contexts: map[uint64]int32{0xc: 1, 0xd: 0}, Threads: map[uint32]uint64{},
		Primary: 0xd, PrimaryThreads: map[uint32]uint64{12: 0xc}}
	if got, want := calls(perGPU.ContextsMade(100)), []call{{5, "cuDevicePrimaryCtxRetain", 0xd, 0},
		{12, "cuDevicePrimaryCtxRetain", 0xc, 1}}; !reflect.DeepEqual(got, want) {
		t.Errorf("primary contexts per GPU retained by %v, want %v", got, want)
	}
}

// The table routes a runtime-API process's threads as the meter does: the
// first primary context retained is the process's, a thread that retains
// another GPU's is on that one until it retains the first again; saved and
// restored, the routing is kept.
func TestPrimaryContextsPerGPURouted(t *testing.T) {
	tbl := NewTable()
	retain := func(tid uint32, ctx uint64, dev int32) {
		tbl.Apply(&ContextCreated{Header: Header{PID: 5, TID: tid}, Func: "cuDevicePrimaryCtxRetain", Ctx: ctx, Device: dev})
	}
	retain(5, 0xd, 0)
	retain(12, 0xc, 1)
	retain(13, 0xc, 1)
	retain(13, 0xd, 0)
	p, _ := tbl.Process(5)
	if p.Primary != 0xd || !reflect.DeepEqual(p.PrimaryThreads, map[uint32]uint64{12: 0xc}) {
		t.Fatalf("primary 0x%x, threads %v; want 0xd and thread 12 on 0xc", p.Primary, p.PrimaryThreads)
	}
	var buf bytes.Buffer
	start := func(uint32) (uint64, error) { return 7, nil }
	if err := tbl.Save(&buf, start); err != nil {
		t.Fatal(err)
	}
	again := NewTable()
	if _, err := again.Restore(&buf, start); err != nil {
		t.Fatal(err)
	}
	if q, _ := again.Process(5); q.Primary != 0xd || !reflect.DeepEqual(q.PrimaryThreads, p.PrimaryThreads) {
		t.Errorf("restored: primary 0x%x, threads %v; want those saved", q.Primary, q.PrimaryThreads)
	}
}
