package storetest

import "testing"

// Run runs the whole suite against a driver, every test on a store of its own.
func Run[TTx any](t *testing.T, h Harness[TTx]) {
	groups := []struct {
		name  string
		tests []struct {
			name string
			fn   func(*testing.T, Harness[TTx])
		}
	}{
		{"Migrate", migrateTests[TTx]()},
		{"Publish", publishTests[TTx]()},
		{"Forwarder", forwarderTests[TTx]()},
		{"Run", runTests[TTx]()},
		{"Consumer", consumerTests[TTx]()},
		{"Batch", batchTests[TTx]()},
		{"Idempotency", idempotencyTests[TTx]()},
		{"Console", consoleTests[TTx]()},
		{"Fleet", fleetTests[TTx]()},
	}
	for _, g := range groups {
		t.Run(g.name, func(t *testing.T) {
			t.Parallel()
			for _, c := range g.tests {
				t.Run(c.name, func(t *testing.T) { c.fn(t, h) })
			}
		})
	}
}

type test[TTx any] = struct {
	name string
	fn   func(*testing.T, Harness[TTx])
}
