package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/idempotency"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// The same business intent, requested twice: one charge row, and the
// duplicate gets the stored result. Another payload under the same key is
// refused.
func ExampleStore_Do() {
	db, err := pgfencetest.Open()
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE charges (order_id text, amount int)`); err != nil {
		log.Fatal(err)
	}

	store, err := idempotency.NewStore(nil)
	if err != nil {
		log.Fatal(err)
	}
	req := idempotency.Request{
		Scope:   "charges/tenant-42",
		Key:     "order-1234:charge", // the intent, not the attempt
		Payload: []byte(`{"amount":100}`),
	}
	charge := func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		if _, err := tx.Exec(ctx, `INSERT INTO charges VALUES ('order-1234', 100)`); err != nil {
			return nil, err
		}
		return []byte("charged 100"), nil
	}
	for range 2 {
		out, err := store.Do(ctx, db.Pool, req, charge)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println("replayed:", out.Replayed, string(out.Result))
	}

	req.Payload = []byte(`{"amount":999}`)
	_, err = store.Do(ctx, db.Pool, req, charge)
	fmt.Println(errors.Is(err, idempotency.ErrMismatch))

	var n int
	_ = db.Pool.QueryRow(ctx, `SELECT count(*) FROM charges`).Scan(&n)
	fmt.Println("charge rows:", n)
	// Output:
	// replayed: false charged 100
	// replayed: true charged 100
	// true
	// charge rows: 1
}

// A leased intent with an external side effect: the owner records a recovery
// point after the provider call; an attempt that takes over after a crash
// resumes there, with the same downstream key.
func ExampleStore_Claim() {
	db, err := pgfencetest.Open()
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	store, err := idempotency.NewStore(nil)
	if err != nil {
		log.Fatal(err)
	}
	req := idempotency.Request{Scope: "payments", Key: "order-1234:capture", Payload: []byte(`{"amount":100}`)}

	out, err := store.Claim(ctx, db.Pool, req)
	if err != nil {
		log.Fatal(err)
	}
	a := out.Attempt
	if a.RecoveryPoint() == "" {
		// provider.Capture(a.DerivedKey("capture"), 100) would run here
		fmt.Println("capture with key", a.DerivedKey("capture"))
		if err := a.Advance(ctx, "captured", []byte("ch_1")); err != nil {
			log.Fatal(err)
		}
	}
	if _, err := a.Complete(ctx, []byte("receipt ch_1")); err != nil {
		log.Fatal(err)
	}

	out, err = store.Claim(ctx, db.Pool, req)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("replayed:", out.Replayed, string(out.Result))
	// Output:
	// capture with key 0f5f7a27-3e7f-8430-aea9-46d43435365d
	// replayed: true receipt ch_1
}

// A worker crashed after the provider call and its recovery point; once its
// lease has ended, a completer takes the key over and finishes the intent
// from there. Every duplicate then gets the stored result.
func ExampleStore_Recover() {
	db, err := pgfencetest.Open()
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	store, err := idempotency.NewStore(&idempotency.Config{Lease: 10 * time.Millisecond})
	if err != nil {
		log.Fatal(err)
	}
	req := idempotency.Request{Scope: "payments", Key: "order-7:capture", Payload: []byte(`{"amount":70}`)}
	out, err := store.Claim(ctx, db.Pool, req)
	if err != nil {
		log.Fatal(err)
	}
	if err := out.Attempt.Advance(ctx, "captured", []byte("ch_7")); err != nil {
		log.Fatal(err)
	}
	// The worker crashes here; its lease ends.
	time.Sleep(20 * time.Millisecond)

	res, err := store.Recover(ctx, db.Pool, nil, func(ctx context.Context, a *idempotency.Attempt) error {
		fmt.Printf("resume %s at %q (%s)\n", a.Key(), a.RecoveryPoint(), a.RecoveryData())
		_, err := a.Complete(ctx, []byte("receipt "+string(a.RecoveryData())))
		return err
	})
	fmt.Println("resumed:", res.Resumed, err)

	out, err = store.Claim(ctx, db.Pool, req)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("replayed:", out.Replayed, string(out.Result))
	// Output:
	// resume order-7:capture at "captured" (ch_7)
	// resumed: 1 <nil>
	// replayed: true receipt ch_7
}
