// Package console_test drives the operator console's pages in headless Chromium. It is the
// console's browser half: its page tests, which need no browser, stay beside the code in console/,
// and both share internal/consoletest. These live in the integration module so that chromedp is
// no requirement of the library's module.
package console_test

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/outboxkit/outboxkit/integration/internal/browsertest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	browsertest.Stop() // the one browser the tests shared, before looking for leaked goroutines
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutines left after the tests:", err)
			code = 1
		}
	}
	os.Exit(code)
}
