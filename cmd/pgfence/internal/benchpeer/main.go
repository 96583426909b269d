// Command pgfence-benchpeer runs the Redis side of `pgfence bench compare --peers
// redis`: the same lock + unlock work as the pgfence cases, through
// github.com/go-redsync/redsync/v4 (SET NX PX, then a compare-and-delete
// script) on a local redis-server that it starts on a free 127.0.0.1 port in a
// temporary directory and stops afterwards.
//
// It lives in its own Go module so that pgfence users never inherit Redis
// dependencies. It measures with the same code as `pgfence bench`
// (internal/benchrun): random keys out of 100k, the same warm-up, the same
// percentiles. One invocation measures one mode at one concurrency and prints
// one JSON object (a benchrun.Result) on stdout:
//
//	pgfence-benchpeer -mode durable -workers 8 -warmup 1s -duration 3s
//
// -warmup runs the operation that long before the clock starts, as `pgfence
// bench --warmup` does for its own cases.
//
// Modes: durable (appendonly yes, appendfsync always: every acknowledged lock
// survives a crash) and memory (no persistence). When redis-server cannot be
// found (REDIS_SERVER, PATH, /usr/bin, /usr/sbin, /usr/local/bin) the result
// has "skipped" set and the exit status is still 0.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"time"

	"github.com/pgfence/pgfence/cmd/pgfence/internal/benchrun"
)

func main() {
	mode := flag.String("mode", "durable", "durable (appendonly yes, appendfsync always) or memory (no persistence)")
	workers := flag.Int("workers", 1, "concurrent workers")
	duration := flag.Duration("duration", 3*time.Second, "how long to run")
	warmup := flag.Duration("warmup", 0, "how long to run before the clock starts, outcomes discarded")
	flag.Parse()
	if flag.NArg() > 0 || *workers < 1 || *workers > 1024 || *duration <= 0 || *warmup < 0 {
		flag.Usage()
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	r, err := Measure(ctx, Mode(*mode), benchrun.Config{Workers: *workers, Duration: *duration, Warmup: *warmup})
	if err != nil {
		fmt.Fprintln(os.Stderr, "pgfence-benchpeer:", err)
		os.Exit(1)
	}
	if err := json.NewEncoder(os.Stdout).Encode(r); err != nil {
		fmt.Fprintln(os.Stderr, "pgfence-benchpeer:", err)
		os.Exit(1)
	}
}
