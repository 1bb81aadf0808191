package integration

import (
	"os"
	"testing"

	"github.com/outboxkit/outboxkit/integration/internal/browsertest"
	"github.com/outboxkit/outboxkit/integration/internal/containers"
	"github.com/outboxkit/outboxkit/internal/testenv"
)

// TestMain lets a service whose variable is unset come from a Docker container (testenv's
// fallback, which only this module's packages install: dockertest is a requirement of this
// module, not of the library's), and ends the browser the demo's console test drove.
func TestMain(m *testing.M) {
	testenv.StartContainer = containers.Start
	code := m.Run()
	browsertest.Stop()
	os.Exit(code)
}
