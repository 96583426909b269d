// Package browser starts headless Chromium for tests and drives it with
// chromedp.
//
//	ctx := browser.New(t)                // skips without Chromium (fails under CI=true)
//	err := chromedp.Do(ctx, chromedp.Navigate(url))
//	text, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS("h1")))
//	browser.Screenshot(t, ctx, "overview") // into $PGFENCE_SCREENSHOTS, when set
//
// Chromium is looked up as PGFENCE_CHROMIUM, then chromium, chromium-browser,
// google-chrome and google-chrome-stable on PATH. It runs headless with a
// fresh profile, without its sandbox when the test runs as root (the sandbox
// refuses root), and is stopped when the test ends.
package browser

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/chromedp/chromedp"
)

// ScreenshotsEnv names the environment variable with the directory that
// [Screenshot] writes to; unset, it writes nothing.
const ScreenshotsEnv = "PGFENCE_SCREENSHOTS"

// Path returns the Chromium executable, or "" when none is installed.
func Path() string {
	if p := os.Getenv("PGFENCE_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// New starts a headless Chromium for t and returns a chromedp context on a
// new tab of it, 1280x900. Without Chromium the test is skipped, or fails
// when CI=true. The browser is stopped when t ends.
func New(t testing.TB) context.Context {
	t.Helper()
	path := Path()
	if path == "" {
		msg := "browser: no Chromium found (set PGFENCE_CHROMIUM, or install it: apt-get install chromium)"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.WindowSize(1280, 900),
		chromedp.UserDataDir(t.TempDir()),
	)
	if os.Geteuid() == 0 {
		opts = append(opts, chromedp.NoSandbox)
	}
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(alloc)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	if err := chromedp.Do(ctx); err != nil { // starts the browser
		t.Fatalf("browser: start %s: %v", path, err)
	}
	return ctx
}

// Screenshot writes a full-page PNG of ctx's page as name.png into the
// directory named by $PGFENCE_SCREENSHOTS, when it is set, and returns its
// path ("" when unset). A failure fails the test.
func Screenshot(t testing.TB, ctx context.Context, name string) string {
	t.Helper()
	dir := os.Getenv(ScreenshotsEnv)
	if dir == "" {
		return ""
	}
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("browser: screenshot %s: %v", name, err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, name+".png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}
