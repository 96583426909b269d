package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/pgfence/pgfence/internal/pgerr"
	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence"
)

// watchEventJSON is one line of `leases watch --json`: one transition of the
// key. id and at are absent where the database recorded none (a gap; id for
// an expiry the watcher observed).
type watchEventJSON struct {
	ID         int64      `json:"id,omitempty"` // absent for expired and gap
	At         *time.Time `json:"at,omitempty"` // absent for gap
	Event      string     `json:"event"`        // acquired, taken_over, released, force_released, info_changed, expired, gap
	Key        string     `json:"key"`
	Token      int64      `json:"token,omitempty"`       // absent for gap
	Holder     string     `json:"holder,omitempty"`      // absent for gap
	HolderInfo string     `json:"holder_info,omitempty"` // absent when empty
	Reason     string     `json:"reason,omitempty"`
}

func leasesWatch(fs *flag.FlagSet) runFunc {
	history := fs.Int("history", 0, "replay this many of the key's newest events first (default: from the current grant)")
	count := fs.Int("count", 0, "exit after this many events (default: until interrupted)")
	poll := fs.Duration("poll", 0, "while the key is free and notifications arrive, read it at least this often (a held key is read at its expiry) (default 5s)")
	noWakeups := fs.Bool("no-wakeups", false, "do not LISTEN (behind PgBouncer in transaction mode): poll only, every second")
	return func(ctx context.Context, in *input) error {
		key := in.args[0]
		switch {
		case *history < 0:
			return usageError("--history must be >= 0, got %d", *history)
		case *count < 0:
			return usageError("--count must be >= 0, got %d", *count)
		case *poll < 0 || *poll > leases.MaxTTLLimit:
			return usageError("--poll must be 0 (the default) to %s, got %s", leases.MaxTTLLimit, *poll)
		}
		pool, err := in.connect(ctx)
		if err != nil {
			return err
		}
		defer pool.Close()
		client, err := leases.New(pool, &leases.Config{DisableWakeups: *noWakeups})
		if err != nil {
			return err
		}
		defer client.Close()
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		w, err := client.Watch(wctx, key, &leases.WatchOptions{History: *history, PollInterval: *poll})
		if errors.Is(err, pgfence.ErrInvalid) {
			return leaseArgError(err)
		}
		if err != nil {
			return dbError(err)
		}
		defer func() {
			cancel()
			for range w.Events() {
			}
		}()
		if !in.json {
			fmt.Fprintf(in.stderr, "watching lease %s (Ctrl-C to stop)\n", cell(key))
		}
		// The first read: a database that refuses it (schema missing, no
		// privilege) ends the command; one that cannot be reached is
		// retried, and said so.
		for reported := false; ; {
			st := w.State()
			if !st.ReadAt.IsZero() {
				break
			}
			if st.Err != nil {
				if pgerr.PgError(st.Err) != nil {
					return dbError(st.Err)
				}
				if !reported {
					reported = true
					fmt.Fprintf(in.stderr, "pgfence: %s (retrying)\n", oneLine(redact(st.Err.Error())))
				}
			}
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(10 * time.Millisecond):
			}
		}
		enc := json.NewEncoder(in.stdout)
		for n := 0; *count == 0 || n < *count; {
			select {
			case <-ctx.Done():
				return nil // interrupted: the normal end
			case e, ok := <-w.Events():
				if !ok {
					return nil
				}
				n++
				if in.json {
					if err := enc.Encode(newWatchEventJSON(e)); err != nil {
						return err
					}
					continue
				}
				printWatchEvent(in, e)
			}
		}
		return nil
	}
}

func newWatchEventJSON(e leases.Event) watchEventJSON {
	return watchEventJSON{ID: e.ID, At: optionalTime(e.At), Event: e.Kind, Key: e.Key, Token: e.Token,
		Holder: e.Holder, HolderInfo: e.HolderInfo, Reason: e.Reason}
}

// printWatchEvent prints one event as a line of text.
func printWatchEvent(in *input, e leases.Event) {
	if e.Kind == "gap" {
		fmt.Fprintf(in.stdout, "%-24s %-14s (the database pruned events this watch had not read)\n", "-", e.Kind)
		return
	}
	line := fmt.Sprintf("%-24s %-14s token %d  holder %s", stamp(e.At), e.Kind, e.Token, e.Holder)
	if e.HolderInfo != "" {
		line += "  info " + cell(e.HolderInfo)
	}
	if e.Reason != "" {
		line += "  (" + cell(e.Reason) + ")"
	}
	fmt.Fprintln(in.stdout, line)
}
