package pgsql

import (
	"testing"
)

// A canonical lowercase UUID is stored as itself; every other id — other UUID spellings included,
// which are different message ids to a consumer's inbox — keeps its text beside its md5.
func TestStoredID(t *testing.T) {
	const canon = "0191e3a0-7c1d-7b2e-9f00-000000000001"
	for id, asItself := range map[string]bool{
		canon:                                    true,
		"0191E3A0-7C1D-7B2E-9F00-000000000001":   false,
		"{0191e3a0-7c1d-7b2e-9f00-000000000001}": false,
		"0191e3a07c1d7b2e9f00000000000001":       false,
		"0191e3a0-7c1d-7b2e-9f00-00000000000g":   false,
		"0191e3a0_7c1d-7b2e-9f00-000000000001":   false,
		"order-42/placed":                        false,
	} {
		key, text := StoredID(id)
		if asItself && (key != id || text != nil) {
			t.Errorf("%q stored as (%s, %v), want itself", id, key, text)
		}
		if !asItself && (text != id || key == id || len(key) != 36) {
			t.Errorf("%q stored as (%s, %v), want its md5 and its text", id, key, text)
		}
	}
}
