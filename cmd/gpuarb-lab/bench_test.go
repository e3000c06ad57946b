package main

import "testing"

func TestShareList(t *testing.T) {
	got := shareList(" 50.0 49.9100.0  5.3  0.0")
	want := []float64{50, 49.9, 100, 5.3, 0}
	if len(got) != len(want) {
		t.Fatalf("%v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("%v, want %v", got, want)
		}
	}
}
