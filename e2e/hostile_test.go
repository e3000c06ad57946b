package e2e

import (
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpuarb/gpuarb/api"
	"github.com/gpuarb/gpuarb/cgroup"
	"github.com/gpuarb/gpuarb/internal/testutil"
	"github.com/gpuarb/gpuarb/lab"
	ocihook "github.com/gpuarb/gpuarb/oci-hook"
	"github.com/gpuarb/gpuarb/policy"
)

// sigcontEnv makes the test binary a hostile sibling: it sends SIGCONT to
// the pid it names every millisecond until that process is gone.
const sigcontEnv = "GPUARB_E2E_SIGCONT_PID"

// openFloodEnv makes the test binary a hostile tenant that opens files
// named libcuda.so.1 in the directory it names (a missing one and one that
// is no libcuda) as fast as it can until killed.
const openFloodEnv = "GPUARB_E2E_OPEN_FLOOD_DIR"

func TestMain(m *testing.M) {
	if dir := os.Getenv(openFloodEnv); dir != "" {
		for {
			for _, p := range []string{filepath.Join(dir, "missing", "libcuda.so.1"), filepath.Join(dir, "libcuda.so.1")} {
				if f, err := os.Open(p); err == nil {
					f.Close()
				}
			}
		}
	}
	if spec := os.Getenv(hostileFilesEnv); spec != "" {
		if err := hostileFiles(spec); err != nil {
			fmt.Fprintln(os.Stderr, "hostile files:", err)
			os.Exit(2)
		}
		os.Exit(0)
	}
	if v := os.Getenv(sigcontEnv); v != "" {
		pid, err := strconv.Atoi(v)
		if err != nil {
			fmt.Fprintln(os.Stderr, "sibling:", err)
			os.Exit(2)
		}
		for syscall.Kill(pid, syscall.SIGCONT) == nil {
			time.Sleep(time.Millisecond)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// Issue 18's first critical finding: a FIFO named libcuda.so.1, opened by
// a tenant and never written, must not stall the daemon (it used to parse
// it as ELF inside the ring-buffer reader, blocking with it). While such
// an open is pending the daemon answers status within a second and keeps
// metering another tenant.
func TestFIFONamedLibcudaDoesNotStallTheDaemon(t *testing.T) {
	gpu := testutil.StartFakeGPU(t)
	d := startDaemon(t, gpu)
	hogCg, hostileCg := testutil.NewCgroup(t, "hog"), testutil.NewCgroup(t, "hostile")
	testutil.Start(t, hogCg, gpu.Workload(t, "hog", "--kernel-ms", "2", "--duration", "20"))
	fifo := filepath.Join(t.TempDir(), "libcuda.so.1")
	if err := unix.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	// A reader that blocks in open(2) until a writer comes, which never does.
	testutil.Start(t, hostileCg, exec.Command("sh", "-c", `exec 3< "$0"`, fifo))
	time.Sleep(500 * time.Millisecond)

	b, _, _ := probesAndShare(t, d, hogCg)
	time.Sleep(2 * time.Second)
	a, share, took := probesAndShare(t, d, hogCg)
	before, after := b.Events, a.Events
	t.Logf("events %d → %d over 2 s with the FIFO open pending; hog's share %.1f%%; status in %v", before, after, 100*share, took)
	if after-before < 100 {
		t.Errorf("%d events in 2 s while a FIFO named libcuda.so.1 is being opened: the reader is stalled", after-before)
	}
	if share < 0.5 {
		t.Errorf("the hog's metered share %.1f%%: metering stalled", 100*share)
	}
	if took > time.Second {
		t.Errorf("status took %v", took)
	}
}

// probesAndShare reads the daemon's status: its probes' figures, the
// metered share of the tenant of cgroup cg, and how long status took.
func probesAndShare(t *testing.T, d runningDaemon, cg *testutil.Cgroup) (api.Probes, float64, time.Duration) {
	t.Helper()
	start := time.Now()
	st, err := d.Status(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var share float64
	for _, tn := range st.Tenants {
		if tn.Cgroup == cg.Rel {
			share = tn.Share
		}
	}
	return st.Probes, share, time.Since(start)
}

// Issue 18, item 6: a tenant that opens files named libcuda.so.1 without
// end (a missing one, one that is no libcuda) cannot flood the probes'
// ring buffer or the daemon: no probe reports opens (libcuda is found by
// what GPU processes map), so no event is lost, the daemon decodes only
// the hog's, answers status within a second and meters the hog. When opens
// were reported, the daemon had to decode 214522 events in the 3 s.
func TestLibcudaOpenFloodDoesNotDrownMetering(t *testing.T) {
	gpu := testutil.StartFakeGPU(t)
	d := startDaemon(t, gpu)
	hogCg := testutil.NewCgroup(t, "hog")
	testutil.Start(t, hogCg, gpu.Workload(t, "hog", "--kernel-ms", "2", "--duration", "20"))
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "libcuda.so.1"), []byte("not an ELF file\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	before, _, _ := probesAndShare(t, d, hogCg)
	flood := exec.Command(os.Args[0])
	flood.Env = append(os.Environ(), openFloodEnv+"="+dir)
	testutil.Start(t, testutil.NewCgroup(t, "flood"), flood)
	var slowest time.Duration
	var after api.Probes
	var shares []float64
	for i := 0; i < 3; i++ {
		time.Sleep(time.Second)
		var share float64
		var took time.Duration
		after, share, took = probesAndShare(t, d, hogCg)
		slowest = max(slowest, took)
		shares = append(shares, share)
	}
	lost := after.LostEvents - before.LostEvents
	t.Logf("3 s of opens: %d events lost, %d decoded; hog's metered share %s; slowest status %v",
		lost, after.Events-before.Events, pcts(shares), slowest)
	if lost != 0 || after.Events-before.Events > 20000 {
		t.Errorf("%d events lost (want 0), %d decoded (want the hog's, < 20000)", lost, after.Events-before.Events)
	}
	if m := median(shares); m < 0.9 {
		t.Errorf("the hog's metered share %.1f%% while alone on the GPU: metering drowned", 100*m)
	}
	if slowest > time.Second {
		t.Errorf("status took %v", slowest)
	}
}

// forkStormSlowdown bounds how much longer a pid tenant's fork storm takes
// with the daemon following its every fork than without the daemon, on the
// same host in the same run; followingCost bounds the daemon's CPU during
// that storm against its CPU during the same storm unfollowed (the daemon
// running, the storm no pid tenant). Following a fork costs the daemon
// nothing per fork (the probes follow it in the kernel) and one read of
// their table per control step: here the storm read 1.1–1.3× its time
// alone and the daemon's CPU 1.0–1.1× that of the unfollowed storm
// (BENCHMARKS.md §8); with each step's following done ten times, /proc's
// tree read each time, 1.5–1.7× and 3.2–3.4×.
const (
	forkStormSlowdown = 1.5
	followingCost     = 2.0
)

// Issue 18's bar as ratios (issue 61): a pid tenant forking as fast as the
// host lets it (every fork followed by the probes) takes at most
// forkStormSlowdown longer than the same storm without the daemon, and
// costs the daemon at most followingCost its CPU during the storm
// unfollowed, all measured in this run; the daemon answers status within a
// second and meters a hog beside it throughout. The storm is sized to the
// host's fork rate (three rounds of about 2 s each alone): hosts differ by
// 5× in what a fork costs.
func TestForkStormLeavesTheDaemonResponsive(t *testing.T) {
	gpu := testutil.StartFakeGPU(t)
	hogCg, stormCg := testutil.NewCgroup(t, "hog"), testutil.NewCgroup(t, "storm")
	testutil.Start(t, hogCg, gpu.Workload(t, "hog", "--kernel-ms", "2", "--duration", "600"))
	bins := filepath.Dir(testutil.Bin(t, "forkstorm"))
	forks, err := lab.ForkStormSize(bins, stormCg.Path, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	alone := forkStorm(t, bins, stormCg, forks, 0, nil, nil)
	d := startDaemon(t, gpu)
	time.Sleep(2 * time.Second) // the hog metered before the storm
	var slowest time.Duration
	var shares []float64
	var last api.Probes
	read := func() {
		probes, share, took := probesAndShare(t, d, hogCg)
		slowest, last = max(slowest, took), probes
		shares = append(shares, share)
	}
	daemonPID := d.Proc.Cmd.Process.Pid
	beside := forkStorm(t, bins, stormCg, forks, daemonPID, nil, read)
	attach := func(pid int) error {
		return d.ApplyPolicy(t.Context(), []byte("tenants:\n  - {name: storm, pid: "+strconv.Itoa(pid)+", limit: 0.5}\n"))
	}
	followed := forkStorm(t, bins, stormCg, forks, daemonPID, attach, read)
	slowdown, cost := float64(followed.Took)/float64(alone.Took), followed.CPU/beside.CPU
	t.Logf("%d forks × 3: %v alone, %v beside the daemon, %v with the daemon following them (%.2f× alone); the daemon's CPU %.1f%% of a core unfollowed, %.1f%% following (%.2f×); slowest status %v, hog's metered share median %.1f%% (lowest %.1f%%) over %d reads; %d forks unfollowed, %d events lost",
		forks, alone.Took, beside.Took, followed.Took, slowdown, 100*beside.CPU, 100*followed.CPU, cost, slowest, 100*median(shares),
		100*slices.Min(append(shares, 1)), len(shares), last.UnfollowedForks, last.LostEvents)
	if slowdown > forkStormSlowdown {
		t.Errorf("the fork storm took %.2f× as long with the daemon following it as without the daemon (%v against %v): want at most %.1f×",
			slowdown, followed.Took, alone.Took, forkStormSlowdown)
	}
	if cost > followingCost {
		t.Errorf("following the fork storm cost the daemon %.2f× its CPU during the storm unfollowed (%.1f%% against %.1f%% of a core): want at most %.1f×",
			cost, 100*followed.CPU, 100*beside.CPU, followingCost)
	}
	if slowest > time.Second {
		t.Errorf("status took %v during the fork storm", slowest)
	}
	if m := median(shares); m < 0.9 {
		t.Errorf("the hog's metered share %.1f%% while alone on the GPU: metering stalled", 100*m)
	}
	if last.UnfollowedForks != 0 {
		t.Errorf("%d forks of the storm went unfollowed", last.UnfollowedForks)
	}
}

// forkStorm runs three rounds of forks forks in cg (lab.RunForkStorm).
func forkStorm(t *testing.T, bins string, cg *testutil.Cgroup, forks, watch int, attach func(pid int) error, every func()) lab.StormRun {
	t.Helper()
	run, err := lab.RunForkStorm(bins, cg.Path, forks, 3, watch, attach, every)
	if err != nil {
		t.Fatal(err)
	}
	return run
}

// Issue 18, item 12: events lost for real (a ring buffer of one page
// beside a storm of launches) leave no meter state behind. Short GPU
// processes start and end one after another while events, their exits
// among them, are dropped; once they are all gone, within two windows
// no tenant counts a process of theirs (one whose exit event was lost is
// ended when /proc says it is gone), and the storm is still metered.
func TestLostEventsLeaveNoProcessBehind(t *testing.T) {
	gpu := testutil.StartFakeGPU(t)
	d := startDaemon(t, gpu, "--ring-size", "4096")
	stormCg, shortCg := testutil.NewCgroup(t, "storm"), testutil.NewCgroup(t, "short")
	testutil.Start(t, stormCg, gpu.Workload(t, "storm", "--rate", "20000", "--duration", "30"))
	for i := 0; i < 15; i++ {
		p := testutil.Start(t, shortCg, gpu.Workload(t, "hog", "--kernel-ms", "1", "--duration", "0.2"))
		if err := p.Wait(t, 20*time.Second); err != nil {
			_, stderr := p.Output()
			t.Fatalf("short process: %v: %s", err, stderr)
		}
	}
	time.Sleep(2500 * time.Millisecond) // two windows and a half
	st, err := d.Status(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var storm, short *api.Tenant
	for i := range st.Tenants {
		switch st.Tenants[i].Cgroup {
		case stormCg.Rel:
			storm = &st.Tenants[i]
		case shortCg.Rel:
			short = &st.Tenants[i]
		}
	}
	t.Logf("%d events lost, %d decoded, %d processes ended as gone from /proc; storm %+v; short %+v",
		st.Probes.LostEvents, st.Probes.Events, st.Probes.ExitsReconciled, storm, short)
	if st.Probes.LostEvents == 0 {
		t.Fatal("no event lost: the test did not overflow the ring buffer")
	}
	if short != nil && short.Processes > 0 {
		t.Errorf("the short processes' tenant counts %d processes 2.5 s after the last one ended", short.Processes)
	}
	if storm == nil || storm.Processes != 1 || storm.Share <= 0 { // its share, half its events lost, is not the point
		t.Errorf("the storm, still running, is not metered: %+v", storm)
	}
}

// Issue 18, item 11, for real: a tenant whose cgroup holds a task no
// freeze reaches (waiting on a userfaultfd fault nobody answers) beside
// its hog, on a GPU the policy runs in timeslice mode (freeze windows).
// Every freeze the kernel does not confirm is undone at once and counted:
// status shows the gate errors and the last one, the cgroup is never left
// frozen, and the hog keeps running.
func TestUnconfirmedFreezeIsUndoneAndShown(t *testing.T) {
	gpu := testutil.StartFakeGPU(t)
	d := startDaemon(t, gpu)
	cgs := map[string]*testutil.Cgroup{"a": testutil.NewCgroup(t, "unfreezable"), "b": testutil.NewCgroup(t, "plain")}
	testutil.Start(t, cgs["a"], gpu.Workload(t, "hog", "--kernel-ms", "2", "--duration", "20"))
	testutil.StartUnfreezable(t, cgs["a"])
	testutil.Start(t, cgs["b"], gpu.Workload(t, "hog", "--kernel-ms", "2", "--duration", "20"))
	pol := "gpus:\n  - {index: 0, mode: windows}\ntenants:\n  - {name: a, cgroup: " + cgs["a"].Rel + "}\n  - {name: b, cgroup: " + cgs["b"].Rel + "}\n"
	if err := d.ApplyPolicy(t.Context(), []byte(pol)); err != nil {
		t.Fatal(err)
	}
	// Never left frozen: sampled every 5 ms for 3 s, a freeze that is not
	// confirmed lasts FreezeTimeout (100 ms) at most.
	var longest time.Duration
	var since time.Time
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		data, _ := os.ReadFile(filepath.Join(cgs["a"].Path, "cgroup.freeze"))
		switch frozen := strings.TrimSpace(string(data)) == "1"; {
		case frozen && since.IsZero():
			since = time.Now()
		case !frozen && !since.IsZero():
			longest, since = max(longest, time.Since(since)), time.Time{}
		}
	}
	if !since.IsZero() {
		longest = max(longest, time.Since(since))
	}
	ws := trueShares(t, gpu, cgs, 0, 2)
	st, err := d.Status(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	row := tenantByName(st, "a")
	if row == nil {
		t.Fatalf("no tenant a: %+v", st.Tenants)
	}
	a := col(ws, func(w map[string]float64) float64 { return w["a"] })
	t.Logf("a: %d gate errors, last %q; longest freeze request %v; true share %s", row.GateErrors, row.LastGateError, longest, pcts(a))
	if row.GateErrors < 3 || !strings.Contains(row.LastGateError, "not confirmed") {
		t.Errorf("gate errors %d, last %q; want at least 3, the freeze not confirmed", row.GateErrors, row.LastGateError)
	}
	if longest > 300*time.Millisecond {
		t.Errorf("a's cgroup.freeze stayed 1 for %v: an unconfirmed freeze was not undone", longest)
	}
	if median(a) < 0.3 {
		t.Errorf("a's hog got %.1f%%: held by a freeze that never took", 100*median(a))
	}
}

// Issue 18's escapes by name (item 7): a tenant that loads libcuda under
// another name — a renamed copy, or one copied into a memfd and loaded
// from /proc/self/fd — is found by what it maps when it sets up its GPU
// channels, probed, and held to its weight: 1:3 against a plain hog, it
// gets 25% ± 3 pp (unprobed, it kept 50%).
func TestLibcudaUnderAnotherNameIsArbitrated(t *testing.T) {
	gpu := testutil.StartFakeGPU(t)
	d := startDaemon(t, gpu)
	lib, err := os.ReadFile(testutil.Bin(t, "libcuda.so.1"))
	if err != nil {
		t.Fatal(err)
	}
	renamed := filepath.Join(t.TempDir(), "libgpu-runtime.so")
	if err := os.WriteFile(renamed, lib, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ name, env string }{{"renamed", renamed}, {"memfd", "memfd:" + renamed}} {
		t.Run(c.name, func(t *testing.T) {
			measureTwice(t, func(t *testing.T, miss missFunc) {
				cgs := map[string]*testutil.Cgroup{"a": testutil.NewCgroup(t, "hidden"), "b": testutil.NewCgroup(t, "plain")}
				hidden := gpu.Workload(t, "hog", "--duration", "20")
				hidden.Env = append(hidden.Env, "GPUWORK_LIBCUDA="+c.env)
				p := testutil.Start(t, cgs["a"], hidden)
				testutil.Start(t, cgs["b"], gpu.Workload(t, "hog", "--duration", "20"))
				pol := "tenants:\n  - {name: a, cgroup: " + cgs["a"].Rel + ", weight: 100}\n  - {name: b, cgroup: " + cgs["b"].Rel + ", weight: 300}\n"
				if err := d.ApplyPolicy(t.Context(), []byte(pol)); err != nil {
					t.Fatal(err)
				}
				ws := trueShares(t, gpu, cgs, 3*time.Second, 3)
				a := col(ws, func(w map[string]float64) float64 { return w["a"] })
				st, err := d.Status(t.Context())
				if err != nil {
					t.Fatal(err)
				}
				t.Logf("a (libcuda as %s) %s for 25%%; probes: %d scans, %d found by mapping, libcudas %q",
					c.env, pcts(a), st.Probes.MappingScans, st.Probes.FoundByMapping, st.Probes.Libcudas)
				found := false
				for _, l := range st.Probes.Libcudas {
					found = found || strings.HasSuffix(l, "(mapped by pid "+strconv.Itoa(p.Cmd.Process.Pid)+")")
				}
				if !found {
					t.Errorf("no libcuda probed as mapped by pid %d: %q", p.Cmd.Process.Pid, st.Probes.Libcudas)
				}
				if m := median(a); math.Abs(m-0.25) > 0.03 {
					miss("a's median %.1f%% at weight 1:3, want 25 ± 3 pp", 100*m)
				}
			})
		})
	}
}

// Issue 18, item 7: a process that sets up GPU channels with a driver of
// its own (gpuwork-static: the simulated libcuda linked in, its symbols
// stripped) maps no libcuda and no uprobe sees its launches. It is metered
// as busy whenever gpuarb lets it run and held by what reaches it without
// its launches: its channel groups paused on a steered GPU, its cgroup
// frozen in windows of a second otherwise. At weight 1:3 against a plain
// hog it gets 25% ± 3 pp where steered, a hog of 20 ms kernels 16 deep;
// by freezing, a hog of 1 ms kernels 8 to 16 deep gets 15 to 28% (its
// share while thawed is not seen, so it may get less). Unseen, both kept
// 50%. A freeze does not reach work queued before it: by freezing alone
// the deep hog keeps 50% (measured; the steered GPU is the answer).
func TestUnprobedGPUProcessIsHeld(t *testing.T) {
	gpu := testutil.StartFakeGPU(t)
	for _, c := range []struct {
		name, actuator string
		args, work     []string
		settle         time.Duration // the freeze's duty rises 0.05 a second from its target
		low            float64
	}{
		{"steered", "gpu scheduler", nil, nil, 3 * time.Second, 0.22},
		{"frozen", "freeze (launches unseen)", []string{"--gpu-scheduler", "off"}, []string{"--kernel-ms", "1"}, 6 * time.Second, 0.15},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := startDaemon(t, gpu, c.args...)
			measureTwice(t, func(t *testing.T, miss missFunc) {
				cgs := map[string]*testutil.Cgroup{"a": testutil.NewCgroup(t, "unprobed"), "b": testutil.NewCgroup(t, "plain")}
				hidden := gpu.Workload(t, append([]string{"hog", "--duration", "20"}, c.work...)...)
				hidden.Path = testutil.Bin(t, "gpuwork-static")
				p := testutil.Start(t, cgs["a"], hidden)
				testutil.Start(t, cgs["b"], gpu.Workload(t, "hog", "--duration", "20"))
				pol := "tenants:\n  - {name: a, cgroup: " + cgs["a"].Rel + ", weight: 100}\n  - {name: b, cgroup: " + cgs["b"].Rel + ", weight: 300}\n"
				if err := d.ApplyPolicy(t.Context(), []byte(pol)); err != nil {
					t.Fatal(err)
				}
				ws := trueShares(t, gpu, cgs, c.settle, 3)
				a := col(ws, func(w map[string]float64) float64 { return w["a"] })
				st, err := d.Status(t.Context())
				if err != nil {
					t.Fatal(err)
				}
				if b := tenantByName(st, "b"); b != nil && len(b.UnprobedPIDs) > 0 {
					t.Errorf("the plain hog's processes %v read as unprobed", b.UnprobedPIDs)
				}
				row := tenantByName(st, "a")
				if row == nil {
					t.Fatalf("the unprobed process's tenant is not in status: %+v", st.Tenants)
				}
				t.Logf("a (pid %d, its own driver) %s for 25%%; status: unprobed %v, actuator %q, state %s, share %.1f%%, target %.1f%%, duty %.2f, %s",
					p.Cmd.Process.Pid, pcts(a), row.UnprobedPIDs, row.Actuator, row.State, 100*row.Share, 100*row.TargetShare, row.Duty, row.Reason)
				if !slices.Contains(row.UnprobedPIDs, p.Cmd.Process.Pid) || row.Actuator != c.actuator {
					t.Errorf("status: unprobed %v, actuator %q; want pid %d and %q", row.UnprobedPIDs, row.Actuator, p.Cmd.Process.Pid, c.actuator)
				}
				if m := median(a); m > 0.28 || m < c.low {
					logStatus(t, d)
					miss("a's median %.1f%% at weight 1:3, want %.0f to 28%%", 100*m, 100*c.low)
				}
			})
		})
	}
}

// Issue 18, item 3: a sibling in the tenant's cgroup that sends SIGCONT to
// its GPU process every millisecond does not escape its 30% limit at the
// launch gate, with a deep queue or a shallow one: each escaped launch is
// charged, and after three the tenant is paced by freezing its cgroup
// (gate_escapes and the actuator in status say so). Charged but not
// escalated it took 84% (deep) and 44% (shallow); unarbitrated, all of
// the GPU. Paced by freezing it lands at 23-33% in most runs, but the
// meter's launch cost learned through the storm is sometimes off, and 42%
// was seen in 2 of 21 runs on this VM: the bar is escalation and at most
// 50%, not the limit's precision. Nothing stays stopped or frozen after.
func TestSIGCONTSiblingDoesNotEscapeTheLaunchGate(t *testing.T) {
	gpu := testutil.StartFakeGPU(t)
	d := startDaemon(t, gpu, "--gpu-scheduler", "off")
	for _, c := range []struct {
		name string
		args []string
	}{
		{"deep queue", []string{"hog", "--kernel-ms", "1", "--depth", "8", "--duration", "20"}},
		{"shallow queue", []string{"loop", "--kernels-ms", "1", "--sync-every", "1", "--sync", "stream", "--duration", "20"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			cg := testutil.NewCgroup(t, "sibling")
			p := testutil.Start(t, cg, gpu.Workload(t, c.args...))
			pid := p.Cmd.Process.Pid
			sibling := exec.Command(os.Args[0])
			sibling.Env = append(os.Environ(), sigcontEnv+"="+strconv.Itoa(pid))
			testutil.Start(t, cg, sibling)
			pol := "tenants:\n  - {name: s, cgroup: " + cg.Rel + ", limit: 0.3}\n"
			if err := d.ApplyPolicy(t.Context(), []byte(pol)); err != nil {
				t.Fatal(err)
			}
			ws := trueShares(t, gpu, map[string]*testutil.Cgroup{"s": cg}, 3*time.Second, 3)
			s := col(ws, func(w map[string]float64) float64 { return w["s"] })
			st, err := d.Status(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			row := tenantByName(st, "s")
			if row == nil {
				t.Fatalf("no tenant s in %+v", st.Tenants)
			}
			t.Logf("limit 30%% with a SIGCONT sibling: %s; actuator %q, %d escapes, state %s", pcts(s), row.Actuator, row.GateEscapes, row.State)
			m := median(s)
			if m > 0.5 {
				t.Errorf("median %.1f%% with a 30%% limit: the sibling's SIGCONTs escape the gate", 100*m)
			}
			if row.GateEscapes < 3 || row.Actuator != "freeze (launch gate escaped)" {
				t.Errorf("escapes %d, actuator %q; want at least 3 and pacing by freezing", row.GateEscapes, row.Actuator)
			}
			if t.Failed() {
				logStatus(t, d)
				_, stderr := d.Proc.Output()
				t.Logf("daemon log:\n%s", stderr[max(0, len(stderr)-3000):])
			}
			if err := d.ApplyPolicy(t.Context(), []byte("tenants: []\n")); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(2 * time.Second)
			for {
				frozen, _ := cgroup.V2Frozen(cg.Path)
				if !frozen && !cgroup.Stopped(pid) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("2 s after the limit was lifted: cgroup frozen %v, process stopped %v", frozen, cgroup.Stopped(pid))
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
}

// Issue 18 item 4: annotations are the pod author's, not the operator's. A
// container asks, through its annotations, for weight 10000, latency
// priority with a 1 ms SLO, and the name of the operator's own tenant,
// against a policy whose admission rule caps weights at 1000 without
// latency. It is registered under its id with weight 1000 and priority
// normal, the operator's tenant keeps its entry and its share (100/1100
// of the GPU, where the request as made would leave it 1%, and an SLO
// it could never meet about 5%), and the container's exit removes only
// its own tenant.
func TestAnnotationsAreBoundedByAdmission(t *testing.T) {
	measureTwice(t, annotationsBoundedByAdmission)
}

func annotationsBoundedByAdmission(t *testing.T, miss missFunc) {
	r := testutil.NewRunc(t)
	gpu := testutil.StartFakeGPU(t)
	parent := testutil.NewCgroup(t, "admit")
	ops := testutil.Sub(t, parent, "ops")
	pol := fmt.Sprintf("tenants: [{name: ops, cgroup: %s}]\nadmission: [{cgroup_prefix: %s, max_weight: 1000}]\n", ops.Rel, parent.Rel)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "policy.yaml"), []byte(pol), 0o644); err != nil {
		t.Fatal(err)
	}
	d := startDaemonIn(t, gpu, dir)
	testutil.Start(t, ops, gpu.Workload(t, "hog", "--duration", "15"))
	const id = "gpuarb-e2e-greedy"
	bundle := r.Bundle(t, lab.ContainerSpec{
		ID: id, Args: []string{"/gpuarb-bin/gpuwork", "hog", "--duration", "10"}, GPU: gpu.FakeGPU,
		CgroupsPath: parent.Rel + "/greedy", Hooks: hooksFor(t, d.Socket, false),
		Annotations: map[string]string{ocihook.AnnotationName: "ops", ocihook.AnnotationWeight: "10000",
			ocihook.AnnotationPriority: "latency", ocihook.AnnotationSLOP99MS: "1"},
	})
	pc := r.Run(t, id, bundle)

	var greedy *api.Tenant
	for deadline := time.Now().Add(5 * time.Second); greedy == nil && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		st, err := d.Status(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		greedy = tenantByName(st, id)
	}
	if greedy == nil {
		t.Fatalf("the container is not registered under its id: runc stderr %s", pc.Stderr)
	}
	if greedy.Cgroup != parent.Rel+"/greedy" || greedy.Weight != 1000 || greedy.Priority != "normal" {
		t.Errorf("the container registered as %s weight %d priority %s, want %s/greedy, 1000, normal",
			greedy.Cgroup, greedy.Weight, greedy.Priority, parent.Rel)
	}
	opsRules := func(when string) {
		t.Helper()
		out, err := d.Policy(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := policy.Parse(out)
		if err != nil {
			t.Fatal(err)
		}
		if o, ok := cfg.Tenant("ops"); !ok || o.Cgroup != ops.Rel || o.Weight != 100 || o.Priority != policy.Normal {
			t.Errorf("%s the operator's ops is %+v (present %v), want its file entry", when, o, ok)
		}
	}
	opsRules("with the container running,")

	cgs := map[string]*testutil.Cgroup{"ops": ops, "greedy": {Rel: parent.Rel + "/greedy"}}
	ws := trueShares(t, gpu, cgs, 3*time.Second, 4)
	o := col(ws, func(w map[string]float64) float64 { return w["ops"] })
	t.Logf("true shares: ops %s, greedy %s; targets 9.1/90.9 (as requested: 1/99)", pcts(o),
		pcts(col(ws, func(w map[string]float64) float64 { return w["greedy"] })))
	if m := median(o); m < 0.07 {
		logStatus(t, d)
		miss("the operator's tenant got %.1f%% beside the bounded container, want its 9.1%% (≥ 7)", 100*m)
	}

	if err := pc.Wait(t, 20*time.Second); err != nil {
		t.Fatalf("container: %v %s", err, pc.Stderr)
	}
	out, err := d.Policy(t.Context())
	if err != nil || strings.Contains(string(out), id) {
		t.Errorf("the container's tenant is still in the policy after its exit: %v\n%s", err, out)
	}
	opsRules("after the container's exit,")
}

// Issue 18 item 9: a pid tenant's shell that double-forks its GPU worker
// (a subshell starts it in the background and exits: the worker is
// reparented, below the tenant's process no more) keeps the worker in the
// tenant. The probes follow every fork below a pid tenant's processes, so
// the worker is metered as the tenant's and held to its 30% limit; had it
// escaped, it would run as its cgroup's own tenant, unlimited (all of the
// GPU).
func TestPIDTenantKeepsDoubleForkedWorker(t *testing.T) {
	gpu := testutil.StartFakeGPU(t)
	d := startDaemon(t, gpu)
	measureTwice(t, func(t *testing.T, miss missFunc) {
		cg := testutil.NewCgroup(t, "doublefork")
		pidFile := filepath.Join(t.TempDir(), "worker")
		hog := gpu.Workload(t, "hog", "--duration", "12")
		shell := exec.Command("sh", append([]string{"-c",
			`sleep 1; ("$@" >/dev/null 2>&1 & echo $! > ` + pidFile + `); exec sleep 14`, "sh", hog.Path}, hog.Args[1:]...)...)
		shell.Env = hog.Env
		root := testutil.Start(t, cg, shell).Cmd.Process.Pid
		pol := fmt.Sprintf("tenants:\n  - {name: p, pid: %d, limit: 0.3}\n", root)
		if err := d.ApplyPolicy(t.Context(), []byte(pol)); err != nil {
			t.Fatal(err)
		}
		worker := testutil.ReadPIDFile(t, pidFile, 5*time.Second)
		workerStart, err := cgroup.StartTime(worker)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { // by pid and start time: ours, double-forked away from the test
			if !cgroup.Exited(worker, workerStart) {
				_ = unix.Kill(worker, syscall.SIGKILL)
			}
		})
		if slices.Contains(cgroup.Descendants(root), worker) {
			t.Fatalf("worker %d is still below the tenant's process %d: no double fork", worker, root)
		}
		ws := trueShares(t, gpu, map[string]*testutil.Cgroup{"p": cg}, 3*time.Second, 4)
		p := col(ws, func(w map[string]float64) float64 { return w["p"] })
		st, err := d.Status(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		row := tenantByName(st, "p")
		t.Logf("double-forked worker of pid tenant p (limit 30%%): %s; status %+v", pcts(p), row)
		if row == nil || row.Processes < 1 || row.Share < 0.2 {
			logStatus(t, d)
			t.Errorf("tenant p does not hold the worker: %+v", row)
		}
		if m := median(p); m > 0.31 {
			miss("the double-forked worker took %.1f%% with its tenant's 30%% limit, want ≤ 31%%", 100*m)
		}
	})
}
