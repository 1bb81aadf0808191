package main

import (
	"strings"
	"testing"
)

func TestParseVMRSS(t *testing.T) {
	status := "Name:\tbench\nVmPeak:\t  812344 kB\nVmRSS:\t   31640 kB\nRssAnon:\t   20000 kB\n"
	if kb, ok := parseVMRSS(status); !ok || kb != 31640 {
		t.Fatalf("parseVMRSS = %d, %v; want 31640 (VmRSS, not VmPeak or RssAnon)", kb, ok)
	}
	for _, bad := range []string{"Name:\tbench\n", "VmRSS:\t31640 MB\n", "VmRSS:\tmany kB\n"} {
		if kb, ok := parseVMRSS(bad); ok {
			t.Fatalf("parseVMRSS(%q) = %d, ok; want not ok", bad, kb)
		}
	}
}

func TestParseFleetParts(t *testing.T) {
	p, err := parseFleetParts(" idle, drain ,")
	if err != nil || len(p) != 2 || !p["idle"] || !p["drain"] || p["join"] {
		t.Fatalf("parseFleetParts = %v, %v; want idle and drain", p, err)
	}
	if _, err := parseFleetParts("idle,warm"); err == nil || !strings.Contains(err.Error(), `"warm"`) {
		t.Fatalf("an unknown part: err = %v, want one naming it", err)
	}
	if _, err := parseFleetParts(" , "); err == nil {
		t.Fatal("no part at all: want an error")
	}
}

func TestFleetURLs(t *testing.T) {
	u, err := withDatabase("postgres://postgres:secret@127.0.0.1:5432/test?sslmode=disable", "bench_db")
	if err != nil || u != "postgres://postgres:secret@127.0.0.1:5432/bench_db?sslmode=disable" {
		t.Fatalf("withDatabase = %q, %v", u, err)
	}
	if _, err := withDatabase("host=127.0.0.1 dbname=test", "bench_db"); err == nil || strings.Contains(err.Error(), "secret") {
		t.Fatalf("a key=value DSN: err = %v, want a refusal", err)
	}
	b := &fleetBench{dbURL: "postgres://postgres@127.0.0.1/bench_db?sslmode=disable"}
	q := b.catalogQuery(20, "member'a")
	if !strings.Contains(q, "'postgres://postgres@127.0.0.1/bench_db?application_name=member%27a&sslmode=disable' AS url") ||
		!strings.Contains(q, "idx < 20 OR joiner") {
		t.Fatalf("catalogQuery = %s: want the URL with the application name, as a literal, and the first 20 tenants", q)
	}
}
