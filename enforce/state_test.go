package enforce

import "testing"

// Without a running actuator a tenant shows the step's state, "steered"
// only when its GPU's scheduler runs its groups other than the driver
// would and enforcement is on; it is paced at the launch gate unless its
// launches are unseen.
func TestLiveStateWithoutActuators(t *testing.T) {
	tn := NewTenant("a", nil)
	for _, c := range []struct {
		s    Shown
		want string
	}{
		{Shown{State: "running"}, "running"},
		{Shown{State: "running", OnScheduler: true, SteeredAway: true, Enforcing: true}, "steered"},
		{Shown{State: "running", OnScheduler: true, SteeredAway: true}, "running"},
		{Shown{State: "running", OnScheduler: true, Enforcing: true}, "running"},
		{Shown{State: "idle", OnScheduler: true, SteeredAway: true, Enforcing: true}, "idle"},
	} {
		if got, held := tn.LiveState(c.s); got != c.want || held != 0 {
			t.Errorf("%+v: %q held %d ns, want %q and 0", c.s, got, held, c.want)
		}
	}
	if got := tn.PacedBy(false); got != "launch gate" {
		t.Errorf("paced by %q, want the launch gate", got)
	}
	if got := tn.PacedBy(true); got != "freeze (launches unseen)" {
		t.Errorf("unprobed: paced by %q", got)
	}
}
