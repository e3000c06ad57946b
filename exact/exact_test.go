package exact

import "testing"

func TestDRMFdinfo(t *testing.T) {
	src := DRMFdinfo{Proc: "testdata/proc"}
	s, err := src.Sample()
	if err != nil {
		t.Fatal(err)
	}
	// pid 101: client 7 through two fds counts once (gr + copy); pid 202:
	// client 8, gr only (a counter not in ns is ignored); fd 0 is no DRM client.
	if len(s) != 2 || s[101] != 10_000_000 || s[202] != 4_000_000 {
		t.Errorf("sample %v", s)
	}
	if !src.Available() || src.Name() != "drm-fdinfo" {
		t.Error("fixture source not available")
	}
	if (DRMFdinfo{Proc: t.TempDir()}).Available() {
		t.Error("empty proc reports a source")
	}
	if _, err := (DRMFdinfo{Proc: "testdata/none"}).Sample(); err == nil {
		t.Error("missing proc root: no error")
	}
}

func TestShares(t *testing.T) {
	prev := Sample{1: 1e9, 2: 5e8, 3: 7e8}
	cur := Sample{1: 1.5e9, 2: 6e8, 3: 1e8, 4: 9e8}
	groups := map[uint32]string{1: "/a", 2: "/a", 3: "/b", 4: "/c"}
	got := Shares(prev, cur, 1e9, func(pid uint32) string { return groups[pid] })
	// pid 3 went backwards (PID reuse) and pid 4 is new: neither counts.
	if len(got) != 1 || got["/a"] < 0.5999 || got["/a"] > 0.6001 {
		t.Errorf("shares %v", got)
	}
	if len(Shares(prev, cur, 0, func(uint32) string { return "/a" })) != 0 {
		t.Error("zero interval gave shares")
	}
}
