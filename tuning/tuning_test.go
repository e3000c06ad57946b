package tuning

import (
	"os"
	"strings"
	"testing"
	"time"
)

// Unset tunables take their defaults; Set takes a name and a duration in
// bounds and refuses anything else with the name in the error.
func TestSetWithinBounds(t *testing.T) {
	d := Defaults()
	if d.MinControlWindow != 300*time.Millisecond || d.UngroupedGrace != time.Second || d.UnprobedPeriod != 500*time.Millisecond ||
		d.MeterLag != 20*time.Millisecond || d.MaxHold != 20*time.Millisecond || d.SteerReprobe != 10*time.Second {
		t.Fatalf("defaults %+v", d)
	}
	var tn Tunables
	if err := tn.Set("max-hold=35ms"); err != nil {
		t.Fatal(err)
	}
	if got := tn.Filled(); got.MaxHold != 35*time.Millisecond || got.MeterLag != 20*time.Millisecond {
		t.Errorf("after max-hold=35ms: %+v", got)
	}
	for spec, want := range map[string]string{
		"max-hold=2s":         "out of range",
		"max-hold=5":          "missing unit",
		"max-hold":            "NAME=DURATION",
		"window=1s":           "no such tunable",
		"steer-reprobe=-1s":   "out of range",
		"meter-lag=500µs":     "out of range",
		"min-control-window=": "invalid duration",
	} {
		if err := tn.Set(spec); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Set(%q) = %v, want an error saying %q", spec, err, want)
		}
	}
	if tn.MaxHold != 35*time.Millisecond {
		t.Errorf("a refused Set changed MaxHold to %v", tn.MaxHold)
	}
}

// Every tunable's default is within its bounds, help lists each, and the
// operator's documentation names each.
func TestEveryTunableIsListedAndDocumented(t *testing.T) {
	doc, err := os.ReadFile("../docs/tuning.md")
	if err != nil {
		t.Fatal(err)
	}
	help := Help()
	for _, tn := range All {
		if tn.Default < tn.Min || tn.Default > tn.Max {
			t.Errorf("%s: default %v out of %v–%v", tn.Name, tn.Default, tn.Min, tn.Max)
		}
		if !strings.Contains(help, tn.Name) || !strings.Contains(string(doc), "`"+tn.Name+"`") {
			t.Errorf("%s: missing from --tune help or docs/tuning.md", tn.Name)
		}
	}
}
