package main

import (
	"os"
	"testing"
)

func TestLoadWatchKeepsTheHighestSample(t *testing.T) {
	if _, err := os.Stat("/proc/loadavg"); err != nil {
		t.Skip("no /proc/loadavg on this system: the soak reports no load there")
	}
	var w loadWatch
	w.max = 1e6 // a higher load seen before: a lower sample must not replace it
	if v := w.sample(); v < 0 {
		t.Fatalf("sample() = %v, want the 1-minute load average", v)
	}
	if got := w.highest(); got != 1e6 {
		t.Fatalf("highest() = %v after a lower sample, want 1e6", got)
	}
	w.max = 0
	v := w.sample()
	if got := w.highest(); got != v {
		t.Fatalf("highest() = %v, want the only sample %v", got, v)
	}
}
