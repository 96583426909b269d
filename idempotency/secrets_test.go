package idempotency_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/idempotency"
	"github.com/pgfence/pgfence/idempotency/idemhttp"
	"github.com/pgfence/pgfence/internal/testkit/telemetrytest"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// TestBodiesStayOutOfTelemetry runs requests whose bodies and results carry
// secrets through every mode with in-memory OpenTelemetry exporters and a
// debug logger, and checks that no span, event, metric, log record or error
// contains them, and that request bodies are stored nowhere in the schema
// (only their SHA-256; results are stored by design, in the result column).
func TestBodiesStayOutOfTelemetry(t *testing.T) {
	t.Parallel()
	const (
		body     = "SECRET-BODY-123"
		result   = "SECRET-RESULT-456"
		recovery = "SECRET-RECOVERY-789"
	)
	secrets := []string{body, result, recovery}
	pool := pgfencetest.NewPool(t)
	ctx := context.Background()
	p := telemetrytest.New(t)
	var logs bytes.Buffer
	logger := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	store := newStore(t, &idempotency.Config{MeterProvider: p.Meter, TracerProvider: p.Tracer, Logger: logger})
	var errs []error
	record := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}

	// Atomic: new, replayed, mismatch, a stored failure, an oversized result.
	req := idempotency.Request{Scope: "orders", Key: "o-1", Payload: []byte(`{"card":"` + body + `"}`)}
	work := func(context.Context, pgx.Tx) ([]byte, error) { return []byte(result), nil }
	for range 2 {
		_, err := store.Do(ctx, pool, req, work)
		record(err)
	}
	other := req
	other.Payload = []byte(`{"card":"` + body + `-2"}`)
	_, err := store.Do(ctx, pool, other, work)
	if !errors.Is(err, idempotency.ErrMismatch) {
		t.Fatalf("mismatch: %v", err)
	}
	record(err)
	_, err = store.Do(ctx, pool, idempotency.Request{Scope: "orders", Key: "o-2", Payload: []byte(body)},
		func(context.Context, pgx.Tx) ([]byte, error) {
			return nil, &idempotency.Failure{Code: "declined", Data: []byte(result)}
		})
	record(err)
	_, err = store.Do(ctx, pool, idempotency.Request{Scope: "orders", Key: "o-3", Payload: []byte(body)},
		func(context.Context, pgx.Tx) ([]byte, error) {
			return append([]byte(result), make([]byte, idempotency.MaxResultBytes)...), nil
		})
	if !errors.Is(err, idempotency.ErrInvalid) {
		t.Fatalf("oversized result: %v", err)
	}
	record(err)

	// Leased: claim, recovery point, completion, replay, in progress.
	lreq := idempotency.Request{Scope: "mail", Key: "m-1", Payload: []byte(body)}
	out, err := store.Claim(ctx, pool, lreq)
	if err != nil {
		t.Fatal(err)
	}
	_, err = store.Claim(ctx, pool, lreq)
	record(err)
	record(out.Attempt.Advance(ctx, "sent", []byte(recovery)))
	_, err = out.Attempt.Complete(ctx, []byte(result))
	record(err)
	_, err = store.Claim(ctx, pool, lreq)
	record(err)

	// HTTP, in both modes: a first request, its replay, and the same key
	// with another body.
	var problems strings.Builder
	for _, mode := range []idemhttp.Mode{idemhttp.ModeAtomic, idemhttp.ModeLeased} {
		mw, err := idemhttp.New(store, pool, &idemhttp.Config{Mode: mode, KeysSharedByAllCallers: true, Logger: logger})
		if err != nil {
			t.Fatal(err)
		}
		h := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "text/plain")
			fmt.Fprint(w, result)
		}))
		before := problems.Len()
		for _, b := range []string{body, body, body + "-other"} {
			r := httptest.NewRequest(http.MethodPost, fmt.Sprintf("/pay/%d", mode), strings.NewReader(b))
			r.Header.Set(idemhttp.HeaderKey, `"k-1"`)
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code >= 400 {
				problems.WriteString(w.Body.String())
			}
		}
		if !strings.Contains(problems.String()[before:], "Idempotency-Key reused") {
			t.Fatalf("%v: the third request was not refused as a reused key: %q", mode, problems.String()[before:])
		}
	}

	// Everything the exporters saw, as text.
	var seen strings.Builder
	spans := p.Spans.Ended()
	for _, s := range spans {
		fmt.Fprintf(&seen, "span %s %v %s\n", s.Name(), s.Attributes(), s.Status().Description)
		for _, e := range s.Events() {
			fmt.Fprintf(&seen, "  event %s %v\n", e.Name, e.Attributes)
		}
	}
	fmt.Fprintf(&seen, "metrics %+v\n", p.Metrics(t).RM)
	for _, e := range errs {
		fmt.Fprintf(&seen, "error %v\n", e)
	}
	seen.WriteString(logs.String())
	seen.WriteString(problems.String())
	// The dump must show what was recorded, or the test proves nothing.
	for _, want := range []string{"pgfence.idempotency.scope", "replayed", "mismatch", `"msg":"idempotency:`, "o-1"} {
		if !strings.Contains(seen.String(), want) {
			t.Fatalf("the telemetry dump lacks %q: the test would not see a leak", want)
		}
	}
	for _, s := range secrets {
		if i := strings.Index(seen.String(), s); i >= 0 {
			t.Errorf("%s leaked into telemetry, logs or errors: …%s…", s, seen.String()[max(0, i-200):min(len(seen.String()), i+100)])
		}
	}

	// Request bodies are stored nowhere (text or bytea) in the schema.
	rows, err := pool.Query(ctx, `SELECT format('%I.%I', schemaname, relname) FROM pg_stat_user_tables WHERE schemaname = 'pgfence'`)
	if err != nil {
		t.Fatal(err)
	}
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(tables) < 4 {
		t.Fatalf("pgfence tables: %v, %v", tables, err)
	}
	for _, table := range tables {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+table+` t WHERE t::text LIKE '%' || $1 || '%' OR t::text LIKE '%' || encode($1::bytea, 'hex') || '%'`, body).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			t.Errorf("%s: %d rows contain the request body", table, n)
		}
	}
	// The result is stored where documented, so the probe above can see bytea.
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pgfence.idempotency_keys t WHERE t::text LIKE '%' || encode($1::bytea, 'hex') || '%'`, result).Scan(&n); err != nil || n == 0 {
		t.Fatalf("the stored result was not found by the probe (%d, %v): it would miss a stored body too", n, err)
	}
}
