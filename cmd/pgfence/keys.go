package main

import (
	"context"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/idempotency"
)

func runKeys(ctx context.Context, e *env, args []string) error {
	const usageLine = "keys <gc [--batch-size N] [--max-batches N] | show SCOPE [KEY] [--limit N]> [--json]"
	if len(args) == 0 || (args[0] != "gc" && args[0] != "show") {
		fmt.Fprintf(e.stderr, "Usage: pgfence %s\n\n  gc     delete completed idempotency keys whose retention ended, in batches; keys in flight are never touched\n  show   the state of a scope's keys (newest first) or of one key, with the trace id of the claim that owns it\n", usageLine)
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help") {
			return nil
		}
		return usageError("keys needs a subcommand: gc or show")
	}
	if args[0] == "show" {
		return runKeysShow(ctx, e, args[1:])
	}
	fs := newFlags(e, "keys gc", usageLine)
	var db dbFlags
	db.register(fs)
	batch := fs.Int("batch-size", idempotency.GCBatchSizeDefault, "most keys deleted by one statement")
	maxBatches := fs.Int("max-batches", 0, "stop after this many batches (0: until none is left)")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := parse(fs, interspersed(fs, args[1:])); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError("keys gc takes no arguments, got %q", fs.Args())
	}
	if *batch <= 0 {
		return usageError("--batch-size must be positive, got %d", *batch)
	}
	if *maxBatches < 0 {
		return usageError("--max-batches must be >= 0, got %d", *maxBatches)
	}
	pool, err := db.connect(ctx, e)
	if err != nil {
		return err
	}
	defer pool.Close()
	res, err := idempotency.GC(ctx, pool, &idempotency.GCOptions{BatchSize: *batch, MaxBatches: *maxBatches})
	if err != nil {
		return dbError(err)
	}
	if *asJSON {
		return writeJSON(e, map[string]any{"deleted": res.Deleted, "batches": res.Batches})
	}
	fmt.Fprintf(e.stdout, "deleted %d expired key(s) in %d batch(es)\n", res.Deleted, res.Batches)
	return nil
}

// keyRow is one pgfence.idempotency_keys row as `keys show` prints it: its
// state only, never the fingerprint, the result or the recovery data.
type keyRow struct {
	Scope         string     `json:"scope"`
	Key           string     `json:"key"`
	Mode          string     `json:"mode"`
	Status        string     `json:"status"`
	Epoch         int64      `json:"epoch"`
	RecoveryPoint string     `json:"recovery_point,omitempty"`
	FailureCode   *string    `json:"failure_code,omitempty"`
	CreatedAt     time.Time  `json:"created_at"`
	CompletedAt   *time.Time `json:"completed_at,omitempty"`
	ExpiresAt     *time.Time `json:"expires_at,omitempty"`
	LeaseExpires  *time.Time `json:"lease_expires_at,omitempty"`
	TraceID       *string    `json:"trace_id,omitempty"`
}

const sqlKeys = `SELECT scope, key, mode, status, epoch, recovery_point, failure_code, created_at,
       completed_at, expires_at, lease_expires_at, trace_id
  FROM pgfence.idempotency_keys
 WHERE scope = $1 AND ($2::text IS NULL OR key = $2)
 ORDER BY created_at DESC, key LIMIT $3`

func runKeysShow(ctx context.Context, e *env, args []string) error {
	fs := newFlags(e, "keys show", "keys show SCOPE [KEY] [--limit N] [--json]")
	var db dbFlags
	db.register(fs)
	limit := fs.Int("limit", 50, "most keys listed for a scope")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := parse(fs, interspersed(fs, args)); err != nil {
		return err
	}
	if fs.NArg() < 1 || fs.NArg() > 2 {
		return usageError("keys show needs a SCOPE and at most one KEY, got %q", fs.Args())
	}
	if *limit <= 0 || *limit > 10000 {
		return usageError("--limit must be 1 to 10000, got %d", *limit)
	}
	var key any
	if fs.NArg() == 2 {
		key = fs.Arg(1)
	}
	pool, err := db.connect(ctx, e)
	if err != nil {
		return err
	}
	defer pool.Close()
	rows, err := pool.Query(ctx, sqlKeys, fs.Arg(0), key, *limit)
	if err != nil {
		return dbError(err)
	}
	keys, err := pgx.CollectRows(rows, pgx.RowToStructByPos[keyRow])
	if err != nil {
		return dbError(err)
	}
	if key != nil && len(keys) == 0 {
		return &cliError{msg: fmt.Sprintf("no idempotency key %q in scope %q", fs.Arg(1), fs.Arg(0)), hint: "`pgfence keys show SCOPE` lists the scope's keys", code: exitFailure}
	}
	if *asJSON {
		if keys == nil {
			keys = []keyRow{}
		}
		return writeJSON(e, map[string]any{"keys": keys})
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tMODE\tSTATUS\tEPOCH\tCREATED AT\tEXPIRES AT\tTRACE ID")
	for _, k := range keys {
		expires := "-"
		if k.ExpiresAt != nil {
			expires = stamp(*k.ExpiresAt)
		} else if k.LeaseExpires != nil {
			expires = "lease " + stamp(*k.LeaseExpires)
		}
		trace := "-"
		if k.TraceID != nil {
			trace = *k.TraceID
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\n", cell(k.Key), k.Mode, k.Status, k.Epoch, stamp(k.CreatedAt), expires, trace)
	}
	tw.Flush()
	if len(keys) == 0 {
		fmt.Fprintln(e.stdout, "(no keys in this scope)")
	}
	return nil
}
