package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
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
	limit := fs.Int("limit", idempotency.KeysLimitDefault, fmt.Sprintf("most keys listed (1 to %d)", idempotency.MaxKeysLimit-1))
	return func(ctx context.Context, in *input) error {
		if *limit <= 0 || *limit >= idempotency.MaxKeysLimit {
			return usageError("--limit must be 1 to %d, got %d", idempotency.MaxKeysLimit-1, *limit)
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
	batch := fs.Int("batch-size", idempotency.GCBatchSizeDefault, "most keys deleted by one statement")
	maxBatches := fs.Int("max-batches", 0, "stop after this many batches (0: until none is left)")
	return func(ctx context.Context, in *input) error {
		if *batch <= 0 || *batch > idempotency.MaxGCBatchSize {
			return usageError("--batch-size must be 1 to %d, got %d", idempotency.MaxGCBatchSize, *batch)
		}
		if *maxBatches < 0 {
			return usageError("--max-batches must be >= 0, got %d", *maxBatches)
		}
		pool, err := in.connect(ctx)
		if err != nil {
			return err
		}
		defer pool.Close()
		res, err := idempotency.GC(ctx, pool, &idempotency.GCOptions{BatchSize: *batch, MaxBatches: *maxBatches})
		if err != nil {
			return dbError(err)
		}
		return in.print(keysGCJSON{Deleted: res.Deleted, Batches: res.Batches}, func(w io.Writer) {
			fmt.Fprintf(w, "deleted %d expired key(s) in %d batch(es)\n", res.Deleted, res.Batches)
		})
	}
}
