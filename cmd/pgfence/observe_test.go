package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/idempotency"
	"github.com/pgfence/pgfence/internal/testkit/telemetrytest"
	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// TestFencesShowRejections: `fences show RESOURCE` lists the recorded
// rejected writes, newest first, with their trace ids.
func TestFencesShowRejections(t *testing.T) {
	t.Parallel()
	db := pgfencetest.NewDatabase(t)
	environ := map[string]string{"DATABASE_URL": db.URL}
	const traceID = "0123456789abcdef0123456789abcdef"
	ctx := telemetrytest.RemoteTrace(t, context.Background(), traceID)
	pgfencetest.IssueToken(t, db.Pool, "stock/apple", 9)
	if _, err := pgfence.Exec(ctx, db.Pool, pgfence.LeaseOf("stock/apple", "", 9), `SELECT 1`); err != nil {
		t.Fatal(err)
	}
	for _, token := range []int64{7, 8} {
		if _, err := pgfence.Exec(ctx, db.Pool, pgfence.LeaseOf("stock/apple", "", token), `SELECT 1`); err == nil {
			t.Fatalf("token %d accepted after 9", token)
		}
	}
	code, out, errOut := cli(t, environ, "fences", "show", "stock/apple")
	if code != exitOK || !strings.Contains(out, "recent rejected writes") || strings.Count(out, traceID) != 2 ||
		!strings.Contains(out, "stale_token  8") || strings.Index(out, "stale_token  8") > strings.Index(out, "stale_token  7") {
		t.Fatalf("fences show stock/apple: code %d\n%s%s", code, out, errOut)
	}
	code, out, _ = cli(t, environ, "fences", "show", "stock/apple", "--rejections", "1", "--json")
	var shown fenceShowJSON
	if code != exitOK || json.Unmarshal([]byte(out), &shown) != nil || len(shown.Rejections) != 1 ||
		shown.Rejections[0].PresentedToken != 8 || shown.Rejections[0].AcceptedToken != 9 ||
		shown.Rejections[0].TraceID != traceID || shown.Rejections[0].Operation != "exec" || shown.Rejections[0].Op == "" {
		t.Fatalf("fences show --rejections 1 --json: code %d\n%s", code, out)
	}
	if code, _, _ := cli(t, environ, "fences", "show", "stock/apple", "--rejections", "-1"); code != exitUsage {
		t.Fatalf("--rejections -1: code %d, want usage error", code)
	}
}

// TestKeysShow: `keys list` prints a scope's keys and `keys show` one key,
// with the trace id of the claim, never the stored result.
func TestKeysShow(t *testing.T) {
	t.Parallel()
	db := pgfencetest.NewDatabase(t)
	environ := map[string]string{"DATABASE_URL": db.URL}
	store, err := idempotency.NewStore(nil)
	if err != nil {
		t.Fatal(err)
	}
	const traceID = "fedcba9876543210fedcba9876543210"
	if _, err := store.Do(telemetrytest.RemoteTrace(t, context.Background(), traceID), db.Pool, idempotency.Request{Scope: "orders", Key: "o-1"},
		func(context.Context, pgx.Tx) ([]byte, error) { return []byte("secret-result"), nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Claim(context.Background(), db.Pool, idempotency.Request{Scope: "orders", Key: "o-2"}); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := cli(t, environ, "keys", "list", "orders")
	if code != exitOK || !strings.Contains(out, "o-1") || !strings.Contains(out, "o-2") || !strings.Contains(out, traceID) ||
		!strings.Contains(out, "in_progress") || strings.Contains(out, "secret-result") {
		t.Fatalf("keys list orders: code %d\n%s%s", code, out, errOut)
	}
	code, out, _ = cli(t, environ, "keys", "show", "orders", "o-1", "--json")
	var shown keyShowJSON
	if code != exitOK || json.Unmarshal([]byte(out), &shown) != nil || shown.Key.Key != "o-1" ||
		shown.Key.Status != "succeeded" || shown.Key.TraceID != traceID {
		t.Fatalf("keys show orders o-1 --json: code %d\n%s", code, out)
	}
	if code, _, errOut := cli(t, environ, "keys", "show", "orders", "nope"); code != exitFailure || !strings.Contains(errOut, "no idempotency key") {
		t.Fatalf("keys show of a missing key: code %d, %s", code, errOut)
	}
	for _, args := range [][]string{{"keys", "list"}, {"keys", "show", "orders"}} {
		if code, _, _ := cli(t, environ, args...); code != exitUsage {
			t.Fatalf("%q: code %d, want usage error", args, code)
		}
	}
}
