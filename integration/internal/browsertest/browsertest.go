// Package browsertest drives the headless Chromium the console's tests run against (Debian's
// chromium; scripts/browser.sh installs it): one browser per test binary, a fresh browser context
// (its own cookies) per test, steps bounded by a deadline, screenshots kept as artifacts.
//
// A missing browser skips the test with the command that installs it, and fails it under CI=true
// or OUTBOXKIT_REQUIRE_SERVICES: a skipped browser test never passes for a green run.
//
// It is a package of the integration module, as are the tests that use it, so that chromedp and
// the Chrome DevTools protocol it brings are no requirement of the library's module.
package browsertest

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
)

// ErrNoBrowser means that neither $OUTBOXKIT_CHROMIUM nor chromium is on PATH.
var ErrNoBrowser = errors.New("no chromium found: run scripts/browser.sh (or set OUTBOXKIT_CHROMIUM)")

// Path finds the browser as scripts/browser.sh does.
func Path() (string, error) {
	name := os.Getenv("OUTBOXKIT_CHROMIUM")
	if name == "" {
		name = "chromium"
	}
	p, err := exec.LookPath(name)
	if err != nil {
		return "", ErrNoBrowser
	}
	return p, nil
}

var (
	once       sync.Once
	browserCtx context.Context
	stopAll    context.CancelFunc
	startErr   error
	profile    string
)

// start launches the binary's one browser. The flags: no sandbox (root in CI containers), no GPU,
// no QUIC, no first run, no background networking, component updates or sync: the browser talks
// to nothing but the test's servers.
func start() {
	path, err := Path()
	if err != nil {
		startErr = err
		return
	}
	profile, startErr = os.MkdirTemp("", "outboxkit-chromium-")
	if startErr != nil {
		return
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path), chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true), chromedp.Flag("no-first-run", true),
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.Flag("hide-scrollbars", true),
		chromedp.UserDataDir(profile), chromedp.WindowSize(1440, 900))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelBrowser := chromedp.NewContext(actx)
	stopAll = func() { cancelBrowser(); cancelAlloc(); _ = os.RemoveAll(profile) }
	// Started here, with no deadline: the context of the first Run would bound the browser's life.
	if err := chromedp.Do(ctx); err != nil {
		stopAll()
		startErr = err
		return
	}
	browserCtx = ctx
}

// Stop ends the browser; call it from TestMain after the tests (before a goroutine leak check).
func Stop() {
	if stopAll != nil {
		stopAll()
	}
}

// Tab is one test's browser context: its own cookies, its own tab.
type Tab struct {
	T   testing.TB
	Ctx context.Context
	dir string
}

// NewTab opens a tab in a browser context of its own, closed when the test ends.
func NewTab(t testing.TB) *Tab {
	t.Helper()
	once.Do(start)
	if startErr != nil {
		if os.Getenv("CI") == "true" || os.Getenv("OUTBOXKIT_REQUIRE_SERVICES") != "" {
			t.Fatalf("a missing browser is a failure here, not a skip (CI=true or OUTBOXKIT_REQUIRE_SERVICES): %v", startErr)
		}
		t.Skip(startErr)
	}
	ctx, cancel := chromedp.NewContext(browserCtx, chromedp.WithNewBrowserContext())
	if err := chromedp.Do(ctx); err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(cancel)
	tab := &Tab{T: t, Ctx: ctx, dir: ArtifactDir(t)}
	tab.acceptDialogs()
	return tab
}

// ArtifactDir is where a test keeps its screenshots: $OUTBOXKIT_ARTIFACTS/<package>/<test>, by
// default .cache/screens/ at the repository's root (ignored by git). It survives the test.
func ArtifactDir(t testing.TB) string {
	root := os.Getenv("OUTBOXKIT_ARTIFACTS")
	if root == "" {
		_, file, _, _ := runtime.Caller(0)
		root = filepath.Join(filepath.Dir(file), "..", "..", "..", ".cache", "screens") // from integration/internal/browsertest
	}
	wd, _ := os.Getwd()
	dir := filepath.Join(root, filepath.Base(wd), strings.NewReplacer("/", "-", " ", "_").Replace(t.Name()))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

func (b *Tab) step() (context.Context, context.CancelFunc) {
	return context.WithTimeout(b.Ctx, 20*time.Second)
}

// Do runs steps, failing the test on error.
func (b *Tab) Do(steps ...chromedp.Action[chromedp.Void]) {
	b.T.Helper()
	ctx, cancel := b.step()
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		b.T.Fatal(err)
	}
}

// Go opens url and waits until sel is visible.
func (b *Tab) Go(url, sel string) {
	b.T.Helper()
	b.Do(chromedp.Navigate(url), chromedp.WaitVisible(sel))
}

// Text is the text of the first element sel matches.
func (b *Tab) Text(sel string) string {
	b.T.Helper()
	ctx, cancel := b.step()
	defer cancel()
	s, err := chromedp.Run(ctx, chromedp.Text(sel))
	if err != nil {
		b.T.Fatalf("text of %s: %v", sel, err)
	}
	return s
}

// Eval evaluates a JavaScript expression (awaiting a promise) and returns its value.
func Eval[T any](b *Tab, js string) T {
	b.T.Helper()
	ctx, cancel := b.step()
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](js, chromedp.EvalAwaitPromise))
	if err != nil {
		b.T.Fatalf("evaluate %q: %v", js, err)
	}
	return v
}

// Click clicks sel and waits until the page it leads to has loaded: subscribe, click, then read
// the event, so a fast load is never missed and nothing sleeps.
func (b *Tab) Click(sel string) {
	b.T.Helper()
	ctx, cancel := b.step()
	defer cancel()
	loaded := chromedp.Events(ctx, page.LoadEventFired)
	if err := chromedp.Do(ctx, chromedp.Click(sel)); err != nil {
		b.T.Fatalf("click %s: %v", sel, err)
	}
	for _, err := range loaded {
		if err != nil {
			b.T.Fatalf("click %s: %v", sel, err)
		}
		return
	}
	b.T.Fatalf("click %s: no page loaded: %v", sel, ctx.Err())
}

// WaitFor polls a JavaScript condition until it holds, within d: for the live regions the page
// refreshes itself.
func (b *Tab) WaitFor(js string, d time.Duration) {
	b.T.Helper()
	ctx, cancel := context.WithTimeout(b.Ctx, d)
	defer cancel()
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](js, chromedp.WithPollingInterval(100*time.Millisecond))); err != nil {
		b.T.Fatalf("waiting for %s: %v", js, err)
	}
}

// Dark makes the page see prefers-color-scheme: dark (light when false).
func (b *Tab) Dark(on bool) {
	b.T.Helper()
	scheme := "light"
	if on {
		scheme = "dark"
	}
	b.Do(func(ctx context.Context, t *chromedp.Target) (chromedp.Void, error) {
		_, err := cdp.Call(ctx, t, emulation.SetEmulatedMedia, emulation.SetEmulatedMediaParams{
			Features: []*emulation.MediaFeature{{Name: "prefers-color-scheme", Value: scheme}}})
		return chromedp.Void{}, err
	})
}

// Shot saves a full-page PNG of the current page as name.png in the test's artifact folder.
func (b *Tab) Shot(name string) {
	b.T.Helper()
	ctx, cancel := b.step()
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		b.T.Fatalf("screenshot %s: %v", name, err)
	}
	if err := os.WriteFile(filepath.Join(b.dir, name+".png"), png, 0o644); err != nil {
		b.T.Fatal(err)
	}
}

// acceptDialogs answers every confirm() the page opens with OK.
func (b *Tab) acceptDialogs() {
	dialogs := chromedp.Events(b.Ctx, page.JavascriptDialogOpening)
	go func() {
		for _, err := range dialogs {
			if err != nil {
				return
			}
			_, _ = chromedp.Run(b.Ctx, func(ctx context.Context, t *chromedp.Target) (cdp.Empty, error) {
				return cdp.Call(ctx, t, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: true})
			})
		}
	}()
}
