package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/idempotency"
	"github.com/pgfence/pgfence/internal/testkit/browser"
	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/leases/tasks"
	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// startUI runs `pgfence ui` in-process on a free loopback port with args and
// returns the console's base URL (no trailing slash). It stops when the test
// ends.
func startUI(t *testing.T, databaseURL string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out, stdout := io.Pipe()
	var stderr strings.Builder
	e := &env{stdout: stdout, stderr: &stderr, getenv: func(k string) string {
		if k == "DATABASE_URL" {
			return databaseURL
		}
		return ""
	}}
	done := make(chan int, 1)
	go func() {
		code := run(ctx, append([]string{"ui", "--addr", "127.0.0.1:0"}, args...), e)
		stdout.Close()
		done <- code
	}()
	t.Cleanup(func() {
		cancel()
		if code := <-done; code != exitOK {
			t.Errorf("pgfence ui exited with %d: %s", code, stderr.String())
		}
	})
	r := bufio.NewReader(out)
	var base string
	if first, err := r.Peek(1); err == nil && first[0] == '{' {
		var j uiJSON
		if err := json.NewDecoder(r).Decode(&j); err != nil {
			t.Fatalf("ui --json: %v", err)
		}
		base = j.URL
	} else {
		line, err := r.ReadString('\n')
		if err != nil {
			cancel()
			<-done
			t.Fatalf("pgfence ui did not start: %v: %s", err, stderr.String())
		}
		_, rest, _ := strings.Cut(line, "serving ")
		base, _, _ = strings.Cut(rest, " ")
	}
	go func() { _, _ = io.Copy(io.Discard, r) }()
	return strings.TrimSuffix(base, "/")
}

// With --json, ui prints one JSON object with its URL once it listens.
func TestUIJSON(t *testing.T) {
	t.Parallel()
	db := pgfencetest.NewDatabase(t)
	base := startUI(t, db.URL, "--json", "--allow-actions")
	if code, _ := get(t, base+"/action/pause"); !strings.HasPrefix(base, "http://127.0.0.1:") || code != http.StatusOK {
		t.Errorf("ui --json: base URL %q, GET /action/pause %d", base, code)
	}
}

// asRole returns a key=value connection string for db as role (trust auth
// in the test cluster; the password is for servers that ask).
func asRole(t *testing.T, databaseURL, role string) string {
	t.Helper()
	cfg, err := pgx.ParseConfig(databaseURL)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("host=%s port=%d dbname=%s user=%s password=not-a-secret", cfg.Host, cfg.Port, cfg.Database, role)
}

func get(t *testing.T, u string) (int, string) {
	t.Helper()
	resp, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// visit loads u in the browser and returns the text of its <main>.
func visit(t *testing.T, ctx context.Context, u string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, chromedp.Navigate(u)); err != nil {
		t.Fatalf("navigate %s: %v", u, err)
	}
	text, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS("main")))
	if err != nil {
		t.Fatalf("text of %s: %v", u, err)
	}
	return text
}

// waitFor evaluates js in the page until it is true, across navigations,
// for at most limit (a bound on a wait, not a measurement).
func waitFor(t *testing.T, ctx context.Context, limit time.Duration, js string) {
	t.Helper()
	deadline := time.Now().Add(limit)
	var last error
	for time.Now().Before(deadline) {
		ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool](js))
		if err == nil && ok {
			return
		}
		last = err
		time.Sleep(50 * time.Millisecond)
	}
	loc, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`location.href + ": " + (document.body ? document.body.innerText : "")`))
	t.Fatalf("waited %s for %s (last error %v); the page is %s", limit, js, last, loc)
}

func eval[T any](t *testing.T, ctx context.Context, js string) T {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](js))
	if err != nil {
		t.Fatalf("evaluate %s: %v", js, err)
	}
	return v
}

// Every page renders what the database holds, in a real browser; a lease
// granted while the overview is open appears on it at its next refresh,
// without a reload.
func TestUIPagesShowLiveData(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgfencetest.NewDatabase(t)
	client, err := leases.New(db.Pool, &leases.Config{DisableWakeups: true})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	held, err := client.TryAcquire(ctx, "orders:1", time.Minute, &leases.AcquireOptions{HolderInfo: "worker-7 on host-a"})
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE stock (sku text PRIMARY KEY, n int)`); err != nil {
		t.Fatal(err)
	}
	if _, err := pgfence.Exec(ctx, db.Pool, held, `INSERT INTO stock VALUES ('orders:1', 5)`); err != nil {
		t.Fatal(err)
	}
	// A write with an older token than the accepted one is refused and recorded.
	if _, err := pgfence.Exec(ctx, db.Pool, pgfence.LeaseOf("orders:1", held.Holder(), held.Token()-1), `UPDATE stock SET n = 0`); err == nil {
		t.Fatal("a write with an older token was accepted")
	}
	store, err := idempotency.NewStore(nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Claim(ctx, db.Pool, idempotency.Request{Scope: "payments/", Key: "order-9:capture"}); err != nil {
		t.Fatal(err)
	}
	// Its owner vanished a minute ago.
	if _, err := db.Pool.Exec(ctx, `UPDATE pgfence.idempotency_keys SET created_at = created_at - interval '2 minutes',
		updated_at = updated_at - interval '2 minutes', lease_expires_at = clock_timestamp() - interval '1 minute'`); err != nil {
		t.Fatal(err)
	}
	if _, err := client.PauseGrants(ctx, "billing/", "rollout of billing v2"); err != nil {
		t.Fatal(err)
	}

	base := startUI(t, db.URL, "--refresh", "1s")
	b := browser.New(t)
	for _, p := range []struct{ path, want string }{
		{"/", "worker-7 on host-a"},
		{"/", "rollout of billing v2"},
		{"/", "order-9:capture"},
		{"/", "stale_token"},
		{"/leases", "orders:1"},
		{"/leases?prefix=orders%3A", "worker-7 on host-a"},
		{"/fences", "orders:1"},
		{"/keys", "order-9:capture"},
		{"/keys?prefix=payments%2F", "in_progress"},
		{"/elections", "worker-7 on host-a"},
		{"/key?k=orders%3A1", "worker-7 on host-a"},
	} {
		if text := visit(t, b, base+p.path); !strings.Contains(text, p.want) {
			t.Errorf("%s does not show %q:\n%s", p.path, p.want, text)
		}
	}
	// The doctor runs in the background: its findings show at a refresh.
	visit(t, b, base+"/")
	waitFor(t, b, 30*time.Second, `document.querySelector("main").innerText.includes("schema version")`)
	if text := visit(t, b, base+"/leases?prefix=stock"); strings.Contains(text, "orders:1") {
		t.Errorf("/leases?prefix=stock shows orders:1:\n%s", text)
	}

	// The overview refreshes in place: a mark set on the page survives.
	visit(t, b, base+"/")
	eval[bool](t, b, `window.notReloaded = true`)
	fresh, err := client.TryAcquire(ctx, "orders:fresh", time.Minute, &leases.AcquireOptions{HolderInfo: "granted while watched"})
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Release(ctx)
	// Refresh 1s; the bound leaves room for a loaded machine.
	waitFor(t, b, 10*time.Second, `document.querySelector('#holders').innerText.includes('granted while watched') && window.notReloaded === true`)
	browser.Screenshot(t, b, "console-overview")
}

// A key's timeline shows its grant, the takeover and the stale holder's
// rejected write, in the order the database recorded them.
func TestUIKeyTimeline(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgfencetest.NewDatabase(t)
	client, err := leases.New(db.Pool, &leases.Config{DisableWakeups: true})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE report (id int PRIMARY KEY, body text)`); err != nil {
		t.Fatal(err)
	}
	const key = "reports/2026-12"
	a, err := client.TryAcquire(ctx, key, time.Minute, &leases.AcquireOptions{HolderInfo: "worker A", NoKeepAlive: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pgfence.Exec(ctx, db.Pool, a, `INSERT INTO report VALUES (1, 'by A')`); err != nil {
		t.Fatal(err)
	}
	// A pauses past its lease: backdate the grant instead of sleeping.
	if _, err := db.Pool.Exec(ctx, `UPDATE pgfence.leases SET granted_at = granted_at - interval '2 minutes',
		expires_at = clock_timestamp() - interval '1 second' WHERE key = $1`, key); err != nil {
		t.Fatal(err)
	}
	b2, err := client.TryAcquire(ctx, key, time.Minute, &leases.AcquireOptions{HolderInfo: "worker B"})
	if err != nil {
		t.Fatal(err)
	}
	defer b2.Release(ctx)
	if _, err := pgfence.Exec(ctx, db.Pool, b2, `UPDATE report SET body = 'by B' WHERE id = 1`); err != nil {
		t.Fatal(err)
	}
	if _, err := pgfence.Exec(ctx, db.Pool, a, `UPDATE report SET body = 'late A' WHERE id = 1`); err == nil {
		t.Fatal("the stale holder's write was accepted")
	}

	base := startUI(t, db.URL)
	br := browser.New(t)
	text := visit(t, br, base+"/key?"+url.Values{"k": {key}}.Encode())
	for _, want := range []string{"worker B", "by the database clock", "accepted token"} {
		if !strings.Contains(text, want) {
			t.Errorf("key page lacks %q:\n%s", want, text)
		}
	}
	kinds := eval[[]string](t, br, `[...document.querySelectorAll('svg g.mark')].map(g => g.dataset.kind)`)
	xs := eval[[]float64](t, br, `[...document.querySelectorAll('svg g.mark')].map(g => g.getBBox().x)`)
	order := []string{"acquired", "taken_over", "rejected"}
	next := 0
	for _, k := range kinds {
		if next < len(order) && k == order[next] {
			next++
		}
	}
	if next != len(order) {
		t.Errorf("timeline marks %v do not show %v in that order", kinds, order)
	}
	for i := 1; i < len(xs); i++ {
		if xs[i] <= xs[i-1] {
			t.Errorf("timeline marks are not drawn left to right: %v", xs)
		}
	}
	browser.Screenshot(t, br, "console-timeline")

	// As an election: two terms (the grant and the takeover), B leads.
	visit(t, br, base+"/elections?prefix=reports%2F")
	if row := eval[[]string](t, br, `[...document.querySelectorAll('main table tr')[1].cells].map(c => c.innerText)`); len(row) != 8 || row[3] != "worker B" || row[5] != "2" {
		t.Errorf("elections row of %s = %q, want leader value worker B and 2 terms", key, row)
	}
}

// Keys, holder info and reasons are user input: the console renders them as
// text, and no script of theirs runs.
func TestUIEscapesDatabaseValues(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgfencetest.NewDatabase(t)
	client, err := leases.New(db.Pool, &leases.Config{DisableWakeups: true})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	const key, info = `<script>alert(1)</script>`, `<img src=x onerror="alert(2)"><b>bold</b>`
	l, err := client.TryAcquire(ctx, key, time.Minute, &leases.AcquireOptions{HolderInfo: info})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	if _, err := client.PauseGrants(ctx, `"><script>alert(3)</script>`, `<script>alert(4)</script>`); err != nil {
		t.Fatal(err)
	}
	base := startUI(t, db.URL)
	br := browser.New(t)
	var mu sync.Mutex
	var dialogs []string
	if err := chromedp.Listen(br, func(ev any) {
		if d, ok := ev.(*page.EventJavascriptDialogOpening); ok {
			mu.Lock()
			dialogs = append(dialogs, d.Message)
			mu.Unlock()
			go func() {
				_, _ = chromedp.Call(br, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: true})
			}()
		}
	}); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/", "/leases", "/elections", "/key?" + url.Values{"k": {key}}.Encode()} {
		text := visit(t, br, base+path)
		if !strings.Contains(text, key) || !strings.Contains(text, info) {
			t.Errorf("%s does not show the key and holder info as text:\n%s", path, text)
		}
		if n := eval[int](t, br, `document.querySelectorAll('main script, main img, main b').length`); n != 0 {
			t.Errorf("%s: database values became %d element(s)", path, n)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(dialogs) > 0 {
		t.Errorf("dialogs opened: %q", dialogs)
	}
}

// The console reads with the role of its URL: a role granted only orders:
// sees only leases, fences and events under orders:.
func TestUIRoleSeesItsPrefixOnly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgfencetest.NewDatabase(t)
	role := fmt.Sprintf("ui_orders_%d", time.Now().UnixNano())
	for _, sql := range []string{
		`CREATE ROLE ` + role + ` LOGIN PASSWORD 'not-a-secret' IN ROLE pgfence_app`,
		`SELECT pgfence.grant_prefix('` + role + `', 'orders:')`,
	} {
		if _, err := db.Pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	t.Cleanup(func() {
		_, _ = db.Pool.Exec(context.Background(), `SELECT pgfence.revoke_prefix('`+role+`', 'orders:')`)
		_, _ = db.Pool.Exec(context.Background(), `DROP ROLE `+role)
	})
	client, err := leases.New(db.Pool, &leases.Config{DisableWakeups: true})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	for _, k := range []string{"orders:1", "stock:1"} {
		l, err := client.TryAcquire(ctx, k, time.Minute, &leases.AcquireOptions{HolderInfo: "holder of " + k})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Release(ctx)
		if _, err := db.Pool.Exec(ctx, `SELECT pgfence.fence($1, $2)`, k, l.Token()); err != nil {
			t.Fatal(err)
		}
	}
	base := startUI(t, asRole(t, db.URL, role))
	br := browser.New(t)
	for _, path := range []string{"/", "/leases", "/fences", "/elections", "/leases?prefix=s"} {
		text := visit(t, br, base+path)
		if strings.Contains(text, "stock:1") {
			t.Errorf("%s shows stock:1 to a role granted orders: only:\n%s", path, text)
		}
		if path != "/leases?prefix=s" && !strings.Contains(text, "orders:1") {
			t.Errorf("%s does not show orders:1 to its role:\n%s", path, text)
		}
	}
	if code, body := get(t, base+"/key?k=stock%3A1"); code != http.StatusNotFound || strings.Contains(body, "holder of stock:1") {
		t.Errorf("key page of stock:1 as the orders: role: %d\n%s", code, body)
	}
}

// Without --allow-actions no action route exists; with it, a POST from
// another origin or without the console's token is refused, and one from
// the console's own confirmation page runs and is recorded.
func TestUIActions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgfencetest.NewDatabase(t)
	client, err := leases.New(db.Pool, &leases.Config{DisableWakeups: true})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	l, err := client.TryAcquire(ctx, "ops/1", time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)

	readOnly := startUI(t, db.URL)
	for _, path := range []string{"/action/release", "/action/pause", "/action/resume", "/action/fail-abandoned"} {
		resp, err := http.PostForm(readOnly+path, url.Values{"key": {"ops/1"}, "reason": {"x"}})
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound && resp.StatusCode != http.StatusMethodNotAllowed {
			t.Errorf("POST %s without --allow-actions: %d, want 404 or 405", path, resp.StatusCode)
		}
		if code, _ := get(t, readOnly+path+"?key=ops%2F1"); code != http.StatusNotFound {
			t.Errorf("GET %s without --allow-actions: %d, want 404", path, code)
		}
	}

	base := startUI(t, db.URL, "--allow-actions")
	// A page of another origin posts a form to the console.
	forged := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprintf(w, `<!doctype html><form id=f method=post action="%s/action/release"><input name=key value="ops/1"><input name=reason value=forged><input name=csrf value=guess></form><script>document.getElementById('f').submit()</script>`, base)
	}))
	defer forged.Close()
	br := browser.New(t)
	visit(t, br, base+"/") // the console's cookie is set, as for an operator who opened it
	if err := chromedp.Do(br, chromedp.Navigate(forged.URL)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, br, 15*time.Second, `location.href.includes('/action/release') && document.body.innerText.includes('refused')`)
	// The right token from the wrong origin is refused too.
	resp, err := http.Get(base + "/action/release?key=ops%2F1")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	var cookie *http.Cookie
	for _, c := range resp.Cookies() {
		if c.Name == "pgfence_csrf" {
			cookie = c
		}
	}
	if cookie == nil {
		t.Fatal("the confirmation page set no token cookie")
	}
	req, _ := http.NewRequest(http.MethodPost, base+"/action/release", strings.NewReader(url.Values{"key": {"ops/1"}, "reason": {"x"}, "csrf": {cookie.Value}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", "http://evil.example")
	req.AddCookie(cookie)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("POST with the token from another origin: %d, want 403", resp.StatusCode)
	}
	if st, err := client.Get(ctx, "ops/1"); err != nil || !st.Live {
		t.Fatalf("after the refused POSTs the lease is %+v, %v; want it still held", st, err)
	}

	// The operator's own confirmation releases it, recorded with the reason.
	visit(t, br, base+"/action/release?key=ops%2F1")
	if err := chromedp.Do(br, chromedp.SendKeys(chromedp.CSS(`input[name=reason]`), "stuck since the deploy")); err != nil {
		t.Fatal(err)
	}
	eval[bool](t, br, `(document.getElementById('confirm').click(), true)`)
	waitFor(t, br, 15*time.Second, `!!document.querySelector('#result') && document.querySelector('#result').innerText.includes('Released the live grant')`)
	var reason string
	if err := db.Pool.QueryRow(ctx, `SELECT reason FROM pgfence.lease_events WHERE key = 'ops/1' AND event = 'force_released'`).Scan(&reason); err != nil || reason != "stuck since the deploy" {
		t.Errorf("force release recorded with reason %q, %v", reason, err)
	}

	// The other actions, posted as the console's own form would be, leave
	// the CLI's records: who, what, when, why.
	post := func(action string, form url.Values) string {
		t.Helper()
		form.Set("csrf", cookie.Value)
		req, _ := http.NewRequest(http.MethodPost, base+"/action/"+action, strings.NewReader(form.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Origin", base)
		req.AddCookie(cookie)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("POST /action/%s: %d\n%s", action, resp.StatusCode, b)
		}
		return string(b)
	}
	post("pause", url.Values{"prefix": {"deploy/"}, "reason": {"rollout 7"}})
	post("resume", url.Values{"prefix": {"deploy/"}, "reason": {"rollout done"}})
	var me string
	if err := db.Pool.QueryRow(ctx, `SELECT session_user`).Scan(&me); err != nil {
		t.Fatal(err)
	}
	rows, _ := db.Pool.Query(ctx, `SELECT action || ' by ' || actor || ': ' || coalesce(reason, '') FROM pgfence.grant_pause_events WHERE prefix = 'deploy/' ORDER BY id`)
	events, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(events) != 2 || events[0] != "paused by "+me+": rollout 7" || events[1] != "resumed by "+me+": rollout done" {
		t.Errorf("pause and resume recorded %q, %v", events, err)
	}
	store, err := idempotency.NewStore(nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Claim(ctx, db.Pool, idempotency.Request{Scope: "payments/", Key: "order-9:capture"}); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `UPDATE pgfence.idempotency_keys SET lease_expires_at = clock_timestamp() - interval '1 minute'`); err != nil {
		t.Fatal(err)
	}
	if _, body := get(t, base+"/action/fail-abandoned?scope_prefix=payments%2F"); !strings.Contains(body, "order-9:capture") {
		t.Errorf("the fail-abandoned confirmation does not list the key it would take:\n%s", body)
	}
	if body := post("fail-abandoned", url.Values{"scope_prefix": {"payments/"}}); !strings.Contains(body, "Marked 1 abandoned key(s) failed") {
		t.Errorf("fail-abandoned: %s", body)
	}
	if k, ok, err := idempotency.LookupKey(ctx, db.Pool, "payments/", "order-9:capture"); err != nil || !ok || k.Status != "failed" || k.FailureCode != "abandoned" || k.Epoch != 2 {
		t.Errorf("after fail-abandoned the key is %+v, %v, %v", k, ok, err)
	}
}

// A console reachable from other hosts needs an access token; with one,
// every request must present it.
func TestUIAccessToken(t *testing.T) {
	t.Parallel()
	environ := map[string]string{"DATABASE_URL": "postgres://pgfence@127.0.0.1:1/none"}
	for _, addr := range []string{"0.0.0.0:0", ":0", "[::]:0", "example.com:8089"} {
		code, _, errOut := cli(t, environ, "ui", "--addr", addr)
		if code != exitUsage || !strings.Contains(errOut, "needs an access token") {
			t.Errorf("ui --addr %s without a token: code %d, %s", addr, code, errOut)
		}
	}

	db := pgfencetest.NewDatabase(t)
	// Without a token, only loopback names are answered (DNS rebinding), and
	// bad input is a 400 that says why.
	open := startUI(t, db.URL)
	req, _ := http.NewRequest(http.MethodGet, open+"/leases", nil)
	req.Host = "rebound.example:8089"
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusMisdirectedRequest {
		t.Errorf("a request for Host rebound.example: %v, %v; want 421", resp, err)
	} else {
		resp.Body.Close()
	}
	req.Host = strings.Replace(strings.TrimPrefix(open, "http://"), "127.0.0.1", "localhost", 1)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("a request for Host localhost: %v, %v; want 200", resp, err)
	} else {
		resp.Body.Close()
	}
	for _, path := range []string{"/key", "/key?k=a%00b", "/key?k=" + strings.Repeat("k", 513), "/leases?prefix=%ff", "/fences?prefix=" + strings.Repeat("p", 513)} {
		if code, body := get(t, open+path); code != http.StatusBadRequest || !strings.Contains(body, "bytes of UTF-8 without NUL") {
			t.Errorf("%.40s: %d, want 400 saying why:\n%s", path, code, body)
		}
	}

	base := startUI(t, db.URL, "--access-token", "s3cret")
	if code, _ := get(t, base+"/"); code != http.StatusUnauthorized {
		t.Errorf("without the token: %d, want 401", code)
	}
	if code, _ := get(t, base+"/?access_token=wrong"); code != http.StatusUnauthorized {
		t.Errorf("with a wrong token: %d, want 401", code)
	}
	req, _ = http.NewRequest(http.MethodGet, base+"/leases", nil)
	req.Header.Set("Authorization", "Bearer s3cret")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("with the bearer token: %d, want 200", resp.StatusCode)
	}
	br := browser.New(t)
	if text := visit(t, br, base+"/?access_token=s3cret"); !strings.Contains(text, "Holders") {
		t.Errorf("with ?access_token the overview does not open:\n%s", text)
	}
	if loc := eval[string](t, br, `location.href`); strings.Contains(loc, "s3cret") {
		t.Errorf("the token stays in the URL: %s", loc)
	}
}

// Lists page by keyset: each page links the next by its last key, pages
// together list every row once; the ordered tasks list by prefix.
func TestUIListsPageByKeyset(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgfencetest.NewDatabase(t)
	if _, err := db.Pool.Exec(ctx, `INSERT INTO pgfence.leases (key, holder, token, granted_at, expires_at, released_at)
		SELECT 'page/' || lpad(g::text, 3, '0'), gen_random_uuid(), 1, t, t, t
		  FROM generate_series(1, 120) g, (SELECT clock_timestamp() AS t) c;
		INSERT INTO pgfence.leases (key, holder, token, granted_at, expires_at, released_at)
		SELECT 'pagf/1', gen_random_uuid(), 1, t, t, t FROM (SELECT clock_timestamp() AS t) c`); err != nil {
		t.Fatal(err)
	}
	base := startUI(t, db.URL)
	next := base + "/leases?prefix=page%2F"
	var seen []string
	for pages := 0; next != ""; pages++ {
		if pages > 3 {
			t.Fatal("more pages than rows allow")
		}
		code, body := get(t, next)
		if code != http.StatusOK {
			t.Fatalf("%s: %d\n%s", next, code, body)
		}
		for _, part := range strings.Split(body, `href="/key?k=`)[1:] {
			k, _, _ := strings.Cut(part, `"`)
			k, _ = url.QueryUnescape(k)
			seen = append(seen, k)
		}
		next = ""
		if _, rest, ok := strings.Cut(body, `<p class="more"><a href="`); ok {
			link, _, _ := strings.Cut(rest, `"`)
			next = base + strings.ReplaceAll(link, "&amp;", "&")
		}
	}
	if len(seen) != 120 || seen[0] != "page/001" || seen[119] != "page/120" {
		t.Errorf("pages listed %d keys (%v ... ), want page/001 to page/120 once each", len(seen), seen[:min(len(seen), 3)])
	}
	for i := 1; i < len(seen); i++ {
		if seen[i] <= seen[i-1] {
			t.Errorf("key %q after %q", seen[i], seen[i-1])
		}
	}

	for _, key := range []string{"orders:1", "orders:1", "stock:9"} {
		if _, err := tasks.Enqueue(ctx, db.Pool, key, []byte(`{}`), nil); err != nil {
			t.Fatal(err)
		}
	}
	if code, body := get(t, base+"/tasks?prefix=orders%3A"); code != http.StatusOK || strings.Count(body, "<td>pending</td>") != 2 || strings.Contains(body, "stock:9") {
		t.Errorf("/tasks?prefix=orders: %d, want the two pending tasks of orders:1 only\n%s", code, body)
	}
	if _, body := get(t, base+"/"); !strings.Contains(body, `href="/tasks"`) {
		t.Error("the overview does not link the tasks")
	}
}
