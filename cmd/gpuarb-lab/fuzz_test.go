package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/gpuarb/gpuarb/lab"
)

// --scenario reads what --json wrote, one scenario or a list of them, and
// refuses a file without scenarios.
func TestReadScenarios(t *testing.T) {
	dir := t.TempDir()
	a, b := lab.DrawScenario(7), lab.DrawScenario(61)
	write := func(name string, v any) string {
		data, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for name, c := range map[string]struct {
		v    any
		want []lab.Scenario
	}{
		"results": {[]lab.ScenarioResult{{Scenario: a}, {Scenario: b}}, []lab.Scenario{a, b}},
		"list":    {[]lab.Scenario{b}, []lab.Scenario{b}},
		"one":     {a, []lab.Scenario{a}},
	} {
		got, err := readScenarios(write(name+".json", c.v))
		if err != nil || !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: %+v, %v; want %+v", name, got, err, c.want)
		}
	}
	for name, v := range map[string]any{"empty list": []lab.Scenario{}, "no tenants": lab.Scenario{Seed: 3, Duration: 1}, "not a scenario": "x"} {
		if _, err := readScenarios(write("bad.json", v)); err == nil || !strings.Contains(err.Error(), "--scenario") {
			t.Errorf("%s: error %v, want one naming --scenario", name, err)
		}
	}
	if _, err := readScenarios(filepath.Join(dir, "missing.json")); err == nil {
		t.Error("a missing file: no error")
	}
}
