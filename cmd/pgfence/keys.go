package main

import (
	"context"
	"fmt"

	"github.com/pgfence/pgfence/idempotency"
)

func runKeys(ctx context.Context, e *env, args []string) error {
	const usageLine = "keys gc [--batch-size N] [--max-batches N] [--json]"
	if len(args) == 0 || args[0] != "gc" {
		fmt.Fprintf(e.stderr, "Usage: pgfence %s\n\n  gc   delete completed idempotency keys whose retention ended, in batches; keys in flight are never touched\n", usageLine)
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help") {
			return nil
		}
		return usageError("keys needs a subcommand: gc")
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
