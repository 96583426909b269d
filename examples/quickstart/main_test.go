package main

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/pgfence/pgfence/pgfence/pgfencetest"
	"github.com/pgfence/pgfence/pgfence/pgfencetest/container"
)

func TestMain(m *testing.M) { container.Main(m) }

// The quickstart runs, twice on one database (as a reader reruns it), and
// does what it says: one unit deducted per run, one order however often it
// is sent.
func TestQuickstart(t *testing.T) {
	db := pgfencetest.NewDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for run := 1; run <= 2; run++ {
		var out bytes.Buffer
		if err := quickstart(ctx, db.URL, &out); err != nil {
			t.Fatalf("run %d: %v\n%s", run, err, out.String())
		}
		want := "order order-1001: replayed true, {\"order\":\"order-1001\"}\n"
		if run == 1 {
			want = "order order-1001: replayed false, {\"order\":\"order-1001\"}\n" + want
		} else {
			want = want + want
		}
		if out.String() != want {
			t.Errorf("run %d printed:\n%s\nwant:\n%s", run, out.String(), want)
		}
	}
	var qty, orders int
	if err := db.Pool.QueryRow(ctx, `SELECT (SELECT qty FROM stock WHERE sku = 'sku-42'), (SELECT count(*) FROM orders)`).Scan(&qty, &orders); err != nil {
		t.Fatal(err)
	}
	if qty != 8 || orders != 1 {
		t.Fatalf("after two runs: qty %d, %d orders; want 8 and 1", qty, orders)
	}

	// A day later the key's retention has ended: the resend is a new intent,
	// and the order, already placed, stays one row.
	if _, err := db.Pool.Exec(ctx, `UPDATE pgfence.idempotency_keys SET created_at = created_at - interval '2 days',
		updated_at = updated_at - interval '2 days', completed_at = completed_at - interval '2 days',
		expires_at = expires_at - interval '2 days'`); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := quickstart(ctx, db.URL, &out); err != nil {
		t.Fatalf("run after the key's retention: %v\n%s", err, out.String())
	}
	if want := "order order-1001: replayed false, {\"order\":\"order-1001\"}\norder order-1001: replayed true, {\"order\":\"order-1001\"}\n"; out.String() != want {
		t.Errorf("run after the key's retention printed:\n%s\nwant:\n%s", out.String(), want)
	}
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM orders`).Scan(&orders); err != nil || orders != 1 {
		t.Fatalf("after the run a day later: %d orders, %v; want 1", orders, err)
	}
}

// The README quotes the quickstart verbatim: what a reader copies is what
// this test runs.
func TestReadmeQuotesTheQuickstart(t *testing.T) {
	src, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	body := string(src)
	begin := strings.Index(body, "// quickstart:begin\n")
	end := strings.Index(body, "\t// quickstart:end")
	if begin < 0 || end < begin {
		t.Fatal("main.go lost its quickstart markers")
	}
	var quoted strings.Builder
	for _, line := range strings.SplitAfter(body[begin+len("// quickstart:begin\n"):end], "\n") {
		quoted.WriteString(strings.TrimPrefix(line, "\t"))
	}
	if !strings.Contains(string(readme), quoted.String()) {
		t.Fatalf("README.md does not quote the quickstart of examples/quickstart/main.go verbatim (one tab less); it should contain:\n%s", quoted.String())
	}
}
