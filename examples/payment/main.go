// Command payment shows a checkout with an external side effect that no
// crash can make happen twice: it charges a (fake) payment provider over
// HTTP, then records the payment in the database.
//
// Each order is a leased idempotency key with two phases:
//
//  1. charge: POST /charges to the provider with the Idempotency-Key
//     Attempt.DerivedKey("charge"), the same for every attempt at this
//     order, so the provider charges once however often it is asked; then
//     the recovery point "charged" with the charge id (Attempt.AdvanceTx,
//     in a transaction of its own);
//  2. record: the payment row and the key's result (Attempt.CompleteTx)
//     in one transaction, so the payment and the answer to every duplicate
//     commit together.
//
// checkout-1 crashes after the provider charged order-1 but before the
// recovery point; checkout-2 crashes after order-2's recovery point but
// before recording; order-3 goes through. After the crashed workers' leases
// ended, two completers (idempotency.Store.Recover) run at the same time:
// each abandoned order is resumed by one of them from its recovery point —
// order-1 asks the provider again with the same derived key and gets the
// same charge back, order-2 only records. Finally every customer retries
// and gets the stored result.
//
// Run it:
//
//	go run ./examples/payment                      # throwaway local PostgreSQL
//	DATABASE_URL=postgres://… go run ./examples/payment
//
// It exits non-zero unless every order was charged once and recorded once,
// and a retry of each got the stored answer (replayed).
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/idempotency"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// lease is how long a crashed worker keeps its order from the completers.
const lease = 500 * time.Millisecond

func main() {
	// DATABASE_URL, or a throwaway local PostgreSQL removed on exit.
	pgfencetest.Run("payment", func(ctx context.Context, db *pgfencetest.Database) error {
		_, err := run(ctx, db.Pool, os.Stdout)
		return err
	})
}

// provider is a fake payment provider: POST /charges with an
// Idempotency-Key charges once per key; a repeated key gets the first
// charge back, as real providers do.
type provider struct {
	mu      sync.Mutex
	byKey   map[string]charge
	Charges map[string]int // order → charges made
	Calls   map[string]int // order → requests received
}

type charge struct {
	ID     string `json:"id"`
	Order  string `json:"order"`
	Amount int    `json:"amount"`
}

func (p *provider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var in charge
	key := r.Header.Get("Idempotency-Key")
	if r.Method != http.MethodPost || r.URL.Path != "/charges" || key == "" || json.NewDecoder(r.Body).Decode(&in) != nil {
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.Calls[in.Order]++
	c, seen := p.byKey[key]
	if !seen {
		p.Charges[in.Order]++
		c = charge{ID: fmt.Sprintf("ch_%d", len(p.byKey)+1), Order: in.Order, Amount: in.Amount}
		p.byKey[key] = c
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(c)
}

// result is the business outcome, checked by main_test.go.
type result struct {
	Charges, Calls map[string]int    // per order, at the provider
	Payments       map[string]int    // per order, rows in the database
	Results        map[string]string // per order, what every retry got
	Recovered      idempotency.RecoverResult
	Resumed        map[string]string // per order, the completer that resumed it and from where
}

var errCrash = errors.New("crashed")

func run(ctx context.Context, pool *pgxpool.Pool, out io.Writer) (result, error) {
	p := &provider{byKey: map[string]charge{}, Charges: map[string]int{}, Calls: map[string]int{}}
	res := result{Payments: map[string]int{}, Results: map[string]string{}, Resumed: map[string]string{}}
	var mu sync.Mutex // serialises output and res
	say := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(out, "  "+format+"\n", args...)
	}

	if _, err := pool.Exec(ctx, `
		DROP TABLE IF EXISTS example_payments;
		CREATE TABLE example_payments (order_id text NOT NULL, charge_id text NOT NULL, amount int NOT NULL)`); err != nil {
		return res, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return res, err
	}
	srv := &http.Server{Handler: p, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln) //nolint:errcheck // returns ErrServerClosed on Shutdown
	defer srv.Shutdown(context.Background())
	providerURL := "http://" + ln.Addr().String() + "/charges"

	store, err := idempotency.NewStore(&idempotency.Config{Lease: lease})
	if err != nil {
		return res, err
	}
	// The scope names the operation; a run id keeps reruns on the same
	// database apart. The key names the business intent: the order.
	runID := make([]byte, 4)
	rand.Read(runID)
	scope := "checkout/run-" + hex.EncodeToString(runID)
	request := func(order string) idempotency.Request {
		return idempotency.Request{Scope: scope, Key: order + ":pay", Payload: []byte(`{"amount":30,"order":"` + order + `"}`)}
	}

	// pay runs an order's phases from the attempt's recovery point on;
	// crashAt stops it (without releasing the key) at a point of the way.
	pay := func(a *idempotency.Attempt, order, crashAt string) error {
		chargeID := string(a.RecoveryData())
		if a.RecoveryPoint() == "" {
			// Phase 1: the charge, deduplicated by the provider on the
			// derived key; then its recovery point.
			c, err := postCharge(ctx, providerURL, a.DerivedKey("charge"), charge{Order: order, Amount: 30})
			if err != nil {
				return err
			}
			say("%s: provider answered with charge %s (Idempotency-Key %s)", order, c.ID, a.DerivedKey("charge"))
			if crashAt == "after-charge" {
				return errCrash
			}
			if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				return a.AdvanceTx(ctx, tx, "charged", []byte(c.ID))
			}); err != nil {
				return err
			}
			if crashAt == "after-advance" {
				return errCrash
			}
			chargeID = c.ID
		}
		// Phase 2: the payment row and the key's result, in one transaction.
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO example_payments VALUES ($1, $2, 30)`, order, chargeID); err != nil {
				return err
			}
			_, err := a.CompleteTx(ctx, tx, []byte(order+" paid with "+chargeID))
			return err
		})
	}

	fmt.Fprintf(out, "payment: 3 orders, each charged at a provider over HTTP and then recorded; two checkout workers crash mid-way\n")
	for _, c := range []struct{ order, crashAt string }{
		{"order-1", "after-charge"}, {"order-2", "after-advance"}, {"order-3", ""},
	} {
		o, err := store.Claim(ctx, pool, request(c.order))
		if err != nil {
			return res, err
		}
		err = pay(o.Attempt, c.order, c.crashAt)
		switch {
		case c.crashAt != "" && errors.Is(err, errCrash):
			say("%s: checkout worker CRASHED %s (no release: the key stays in progress until its lease ends)", c.order, c.crashAt)
		case err != nil:
			return res, fmt.Errorf("%s: %w", c.order, err)
		default:
			say("%s: paid and recorded", c.order)
		}
	}

	// The crashed workers' leases end (database clock); then two completers
	// run at once. Each abandoned order is taken over by exactly one of them.
	time.Sleep(lease + 50*time.Millisecond)
	var wg sync.WaitGroup
	results := make([]idempotency.RecoverResult, 2)
	errs := make([]error, 2)
	for i, name := range []string{"completer-a", "completer-b"} {
		wg.Go(func() {
			results[i], errs[i] = store.Recover(ctx, pool, &idempotency.RecoverOptions{ScopePrefix: scope},
				func(ctx context.Context, a *idempotency.Attempt) error {
					order := a.Key()[:len(a.Key())-len(":pay")]
					mu.Lock()
					res.Resumed[order] = fmt.Sprintf("%s from %q", name, a.RecoveryPoint())
					mu.Unlock()
					say("%s: resumes %s from recovery point %q", name, order, a.RecoveryPoint())
					return pay(a, order, "")
				})
		})
	}
	wg.Wait()
	for i := range results {
		if errs[i] != nil {
			return res, errs[i]
		}
		res.Recovered.Found += results[i].Found
		res.Recovered.Resumed += results[i].Resumed
		res.Recovered.Skipped += results[i].Skipped
		res.Recovered.Released += results[i].Released
	}

	// Every customer retries: the stored result, nothing executed.
	for _, order := range []string{"order-1", "order-2", "order-3"} {
		o, err := store.Claim(ctx, pool, request(order))
		if err != nil {
			return res, err
		}
		if !o.Replayed {
			return res, fmt.Errorf("%s: a retry ran again, want the stored result", order)
		}
		res.Results[order] = string(o.Result)
		say("%s: a retry gets %q", order, o.Result)
	}

	// Check the business state: the provider's charges and the payments.
	p.mu.Lock()
	res.Charges, res.Calls = maps.Clone(p.Charges), maps.Clone(p.Calls)
	p.mu.Unlock()
	rows, err := pool.Query(ctx, `SELECT order_id, count(*) FROM example_payments GROUP BY order_id`)
	if err != nil {
		return res, err
	}
	var order string
	var n int
	if _, err := pgx.ForEachRow(rows, []any{&order, &n}, func() error { res.Payments[order] = n; return nil }); err != nil {
		return res, err
	}
	fmt.Fprintf(out, "result: charges %v (provider calls %v), payment rows %v\n", res.Charges, res.Calls, res.Payments)
	for _, order := range []string{"order-1", "order-2", "order-3"} {
		if res.Charges[order] != 1 || res.Payments[order] != 1 {
			return res, fmt.Errorf("%s charged %d times and recorded %d times", order, res.Charges[order], res.Payments[order])
		}
	}
	fmt.Fprintln(out, "OK: every order charged once and recorded once")
	return res, nil
}

// postCharge asks the provider for a charge under an idempotency key.
func postCharge(ctx context.Context, url, key string, c charge) (charge, error) {
	body, _ := json.Marshal(c)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return charge{}, err
	}
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return charge{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return charge{}, fmt.Errorf("provider: %s", resp.Status)
	}
	var out charge
	return out, json.NewDecoder(resp.Body).Decode(&out)
}
