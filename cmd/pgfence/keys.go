package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/pgfence/pgfence/idempotency"
)

// keyJSON is one idempotency key: its state only, never the fingerprint, the
// result or the recovery data.
type keyJSON struct {
	Scope          string     `json:"scope"`
	Key            string     `json:"key"`
	Mode           string     `json:"mode"`   // atomic or leased
	Status         string     `json:"status"` // in_progress, succeeded or failed
	Epoch          int64      `json:"epoch"`
	RecoveryPoint  string     `json:"recovery_point,omitempty"`
	FailureCode    string     `json:"failure_code,omitempty"`
	CreatedAt      time.Time  `json:"created_at"`
	CompletedAt    *time.Time `json:"completed_at,omitempty"`
	ExpiresAt      *time.Time `json:"expires_at,omitempty"`
	LeaseExpiresAt *time.Time `json:"lease_expires_at,omitempty"`
	TraceID        string     `json:"trace_id,omitempty"`
}

func newKeyJSON(k idempotency.KeyState) keyJSON {
	return keyJSON{Scope: k.Scope, Key: k.Key, Mode: k.Mode, Status: k.Status, Epoch: k.Epoch, RecoveryPoint: k.RecoveryPoint,
		FailureCode: k.FailureCode, CreatedAt: k.CreatedAt.UTC(), CompletedAt: optionalTime(k.CompletedAt),
		ExpiresAt: optionalTime(k.ExpiresAt), LeaseExpiresAt: optionalTime(k.LeaseExpiresAt), TraceID: k.TraceID}
}

// keysListJSON is what `keys list --json` prints.
type keysListJSON struct {
	Keys []keyJSON `json:"keys"` // newest first
	// Truncated is true when the scope has more keys than --limit shows.
	Truncated bool `json:"truncated"`
}

// keyShowJSON is what `keys show --json` prints.
type keyShowJSON struct {
	Key keyJSON `json:"key"`
}

// keysGCJSON is what `keys gc --json` prints.
type keysGCJSON struct {
	Deleted int64 `json:"deleted"`
	Batches int   `json:"batches"`
}

// checkKeyArgs refuses a scope or key no key could have, before connecting.
func checkKeyArgs(scope, key string) error {
	for _, a := range []struct {
		what, s string
		max     int
	}{{"scope", scope, idempotency.MaxScopeBytes}, {"key", key, idempotency.MaxKeyBytes}} {
		if len(a.s) == 0 || len(a.s) > a.max || !utf8.ValidString(a.s) || strings.IndexByte(a.s, 0) >= 0 {
			return keyArgError(fmt.Errorf("%w: %s %q must be 1 to %d bytes of UTF-8 without NUL", idempotency.ErrInvalid, a.what, a.s, a.max))
		}
	}
	return nil
}

// keyArgError explains a scope or key the idempotency package refused.
func keyArgError(err error) error {
	return &cliError{msg: err.Error(), hint: fmt.Sprintf("a scope is 1 to %d bytes and a key 1 to %d bytes, of UTF-8 without NUL", idempotency.MaxScopeBytes, idempotency.MaxKeyBytes), code: exitUsage, err: err}
}

func keysList(fs *flag.FlagSet) runFunc {
	// idempotency.Keys returns at most 10,000 keys, and one more than
	// --limit is asked for.
	const maxLimit = 9_999
	limit := fs.Int("limit", 50, fmt.Sprintf("most keys listed (1 to %d)", maxLimit))
	return func(ctx context.Context, in *input) error {
		if *limit <= 0 || *limit > maxLimit {
			return usageError("--limit must be 1 to %d, got %d", maxLimit, *limit)
		}
		pool, err := in.connect(ctx)
		if err != nil {
			return err
		}
		defer pool.Close()
		keys, err := idempotency.Keys(ctx, pool, in.args[0], *limit+1) // one more: are there others?
		if errors.Is(err, idempotency.ErrInvalid) {
			return keyArgError(err)
		}
		if err != nil {
			return dbError(err)
		}
		out := keysListJSON{Keys: make([]keyJSON, 0, len(keys)), Truncated: len(keys) > *limit}
		keys = keys[:min(len(keys), *limit)]
		for _, k := range keys {
			out.Keys = append(out.Keys, newKeyJSON(k))
		}
		return in.print(out, func(w io.Writer) {
			printKeys(w, keys)
			switch {
			case len(keys) == 0:
				fmt.Fprintln(w, "(no keys in this scope)")
			case out.Truncated:
				fmt.Fprintf(w, "(the newest %d; --limit shows more)\n", len(keys))
			}
		})
	}
}

func keysShow(*flag.FlagSet) runFunc {
	return func(ctx context.Context, in *input) error {
		scope, key := in.args[0], in.args[1]
		if err := checkKeyArgs(scope, key); err != nil {
			return err
		}
		pool, err := in.connect(ctx)
		if err != nil {
			return err
		}
		defer pool.Close()
		k, ok, err := idempotency.LookupKey(ctx, pool, scope, key)
		if errors.Is(err, idempotency.ErrInvalid) {
			return keyArgError(err)
		}
		if err != nil {
			return dbError(err)
		}
		if !ok {
			return &cliError{msg: fmt.Sprintf("no idempotency key %q in scope %q", key, scope), hint: "`pgfence keys list SCOPE` lists the scope's keys", code: exitFailure}
		}
		return in.print(keyShowJSON{Key: newKeyJSON(k)}, func(w io.Writer) {
			printKeys(w, []idempotency.KeyState{k})
		})
	}
}

func printKeys(w io.Writer, keys []idempotency.KeyState) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tMODE\tSTATUS\tEPOCH\tCREATED AT\tEXPIRES AT\tTRACE ID")
	for _, k := range keys {
		expires := "-"
		if !k.ExpiresAt.IsZero() {
			expires = stamp(k.ExpiresAt)
		} else if !k.LeaseExpiresAt.IsZero() {
			expires = "lease " + stamp(k.LeaseExpiresAt)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\n", cell(k.Key), k.Mode, k.Status, k.Epoch, stamp(k.CreatedAt), expires, dash(k.TraceID))
	}
	tw.Flush()
}

func keysGC(fs *flag.FlagSet) runFunc {
	batch := fs.Int("batch-size", 1000, "most keys deleted by one statement")
	maxBatches := fs.Int("max-batches", 0, "stop after this many batches (0: until none is left)")
	return func(ctx context.Context, in *input) error {
		if *batch <= 0 || *batch > math.MaxInt32 {
			return usageError("--batch-size must be 1 to %d, got %d", math.MaxInt32, *batch)
		}
		if *maxBatches < 0 {
			return usageError("--max-batches must be >= 0, got %d", *maxBatches)
		}
		pool, err := in.connect(ctx)
		if err != nil {
			return err
		}
		defer pool.Close()
		store, err := idempotency.NewStore(nil)
		if err != nil {
			return err
		}
		res, err := store.GC(ctx, pool, &idempotency.GCOptions{BatchSize: *batch, MaxBatches: *maxBatches})
		if err != nil {
			return dbError(err)
		}
		return in.print(keysGCJSON{Deleted: res.Deleted, Batches: res.Batches}, func(w io.Writer) {
			fmt.Fprintf(w, "deleted %d expired key(s) in %d batch(es)\n", res.Deleted, res.Batches)
		})
	}
}

// abandonedKeyJSON is one leased key left in progress after its lease ended.
type abandonedKeyJSON struct {
	Scope         string    `json:"scope"`
	Key           string    `json:"key"`
	Epoch         int64     `json:"epoch"`
	RecoveryPoint string    `json:"recovery_point,omitempty"`
	Released      bool      `json:"released"` // the owner gave it up itself, rather than vanishing
	LeaseEnded    time.Time `json:"lease_ended_at"`
	CreatedAt     time.Time `json:"created_at"`
	TraceID       string    `json:"trace_id,omitempty"`
}

// keysAbandonedJSON is what `keys abandoned --json` prints.
type keysAbandonedJSON struct {
	Keys []abandonedKeyJSON `json:"keys"` // oldest lease end first
	// Truncated is true when more keys are abandoned than --limit shows.
	Truncated bool `json:"truncated"`
}

// keysFailAbandonedJSON is what `keys fail-abandoned --json` prints.
type keysFailAbandonedJSON struct {
	Found   int `json:"found"`
	Failed  int `json:"failed"`  // marked failed with failure code "abandoned"
	Skipped int `json:"skipped"` // a retry or another completer took them first
}

// recoverFlags are the selection flags of `keys abandoned` and
// `keys fail-abandoned`.
func recoverFlags(fs *flag.FlagSet) func() (*idempotency.RecoverOptions, error) {
	prefix := fs.String("scope-prefix", "", "only keys whose scope starts with this ('' = every scope)")
	expired := fs.Duration("expired-for", 0, "only keys whose lease ended at least this long ago (database clock)")
	limit := fs.Int("limit", 100, "most keys handled, oldest lease end first")
	return func() (*idempotency.RecoverOptions, error) {
		if *limit <= 0 || *limit >= math.MaxInt32 {
			return nil, usageError("--limit must be 1 to %d, got %d", math.MaxInt32-1, *limit)
		}
		o := &idempotency.RecoverOptions{ScopePrefix: *prefix, ExpiredFor: *expired, Limit: *limit}
		if *expired < 0 {
			return nil, usageError("--expired-for must not be negative, got %v", *expired)
		}
		if len(*prefix) > idempotency.MaxScopeBytes || !utf8.ValidString(*prefix) || strings.IndexByte(*prefix, 0) >= 0 {
			return nil, usageError("--scope-prefix must be at most %d bytes of UTF-8 without NUL", idempotency.MaxScopeBytes)
		}
		return o, nil
	}
}

// completerStore is the Store of the completer commands: the defaults, which
// NewStore never refuses.
func completerStore() *idempotency.Store {
	store, err := idempotency.NewStore(nil)
	if err != nil {
		panic(err)
	}
	return store
}

func keysAbandoned(fs *flag.FlagSet) runFunc {
	options := recoverFlags(fs)
	return func(ctx context.Context, in *input) error {
		o, err := options()
		if err != nil {
			return err
		}
		pool, err := in.connect(ctx)
		if err != nil {
			return err
		}
		defer pool.Close()
		store := completerStore()
		shown := o.Limit
		o.Limit++ // one more: are there others?
		keys, err := store.Abandoned(ctx, pool, o)
		if err != nil {
			return dbError(err)
		}
		out := keysAbandonedJSON{Keys: make([]abandonedKeyJSON, 0, len(keys)), Truncated: len(keys) > shown}
		keys = keys[:min(len(keys), shown)]
		for _, k := range keys {
			out.Keys = append(out.Keys, abandonedKeyJSON{Scope: k.Scope, Key: k.Key, Epoch: k.Epoch, RecoveryPoint: k.RecoveryPoint,
				Released: k.Released, LeaseEnded: k.LeaseExpiresAt.UTC(), CreatedAt: k.CreatedAt.UTC(), TraceID: k.TraceID})
		}
		return in.print(out, func(w io.Writer) {
			tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "SCOPE\tKEY\tEPOCH\tRECOVERY POINT\tLEASE ENDED\tHOW\tTRACE ID")
			for _, k := range keys {
				how := "owner vanished"
				if k.Released {
					how = "released"
				}
				fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\n", cell(k.Scope), cell(k.Key), k.Epoch, dash(cell(k.RecoveryPoint)), stamp(k.LeaseExpiresAt), how, dash(k.TraceID))
			}
			tw.Flush()
			switch {
			case len(keys) == 0:
				fmt.Fprintln(w, "(no abandoned keys)")
			case out.Truncated:
				fmt.Fprintf(w, "(the oldest %d; --limit shows more)\n", len(keys))
			}
		})
	}
}

func keysFailAbandoned(fs *flag.FlagSet) runFunc {
	options := recoverFlags(fs)
	return func(ctx context.Context, in *input) error {
		o, err := options()
		if err != nil {
			return err
		}
		pool, err := in.connect(ctx)
		if err != nil {
			return err
		}
		defer pool.Close()
		store := completerStore()
		res, err := store.Recover(ctx, pool, o, nil)
		if err != nil {
			return dbError(err)
		}
		return in.print(keysFailAbandonedJSON{Found: res.Found, Failed: res.Failed, Skipped: res.Skipped}, func(w io.Writer) {
			fmt.Fprintf(w, "marked %d abandoned key(s) failed with code \"abandoned\" (%d found, %d taken first by a retry or another completer)\n",
				res.Failed, res.Found, res.Skipped)
		})
	}
}
