package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence"
)

// leaseJSON is one lease as `leases list --json` and `leases show --json`
// print it: times the database recorded, and no time at all (not a zero one)
// where none was.
type leaseJSON struct {
	Key           string     `json:"key"`
	State         string     `json:"state"` // held, expired or released
	Live          bool       `json:"live"`
	Token         int64      `json:"token"`
	Holder        string     `json:"holder"`
	HolderInfo    string     `json:"holder_info"`
	ClientVersion string     `json:"client_version,omitempty"` // absent for SQL and old clients
	GrantedAt     time.Time  `json:"granted_at"`
	RenewedAt     *time.Time `json:"renewed_at,omitempty"` // absent if never renewed
	ExpiresAt     time.Time  `json:"expires_at"`
	ReleasedAt    *time.Time `json:"released_at,omitempty"` // absent unless released
	RemainingMS   int64      `json:"remaining_ms"`          // 0 unless live, by the database clock
}

func newLeaseJSON(l leases.Status) leaseJSON {
	return leaseJSON{Key: l.Key, State: leaseState(l), Live: l.Live, Token: l.Token, Holder: l.Holder,
		HolderInfo: l.HolderInfo, ClientVersion: l.ClientVersion, GrantedAt: l.GrantedAt.UTC(),
		RenewedAt: optionalTime(l.RenewedAt), ExpiresAt: l.ExpiresAt.UTC(), ReleasedAt: optionalTime(l.ReleasedAt),
		RemainingMS: l.Remaining.Milliseconds()}
}

// pauseJSON is one paused prefix.
type pauseJSON struct {
	Prefix   string    `json:"prefix"`
	PausedBy string    `json:"paused_by"`
	PausedAt time.Time `json:"paused_at"`
	Reason   string    `json:"reason"`
}

// leasesListJSON is what `leases list --json` prints.
type leasesListJSON struct {
	Leases []leaseJSON `json:"leases"`
	Pauses []pauseJSON `json:"pauses"`
}

// historyJSON is one grant-history entry.
type historyJSON struct {
	ID            int64     `json:"id"`
	At            time.Time `json:"at"`
	Event         string    `json:"event"` // acquired, taken_over, released or force_released
	Token         int64     `json:"token"`
	Holder        string    `json:"holder"`
	Reason        string    `json:"reason,omitempty"`
	ClientVersion string    `json:"client_version,omitempty"`
}

// leaseShowJSON is what `leases show --json` prints.
type leaseShowJSON struct {
	Lease   leaseJSON     `json:"lease"`
	History []historyJSON `json:"history"` // newest first
}

// releaseJSON is what `leases release --json` prints.
type releaseJSON struct {
	Key      string `json:"key"`
	Released bool   `json:"released"`
	WasLive  bool   `json:"was_live"`
	Token    int64  `json:"token,omitempty"`  // the grant it ended
	Holder   string `json:"holder,omitempty"` // the grant it ended
}

// pauseResultJSON is what `leases pause --json` and `leases resume --json`
// print.
type pauseResultJSON struct {
	Prefix    string `json:"prefix"`
	Paused    bool   `json:"paused"`     // after the command
	WasPaused bool   `json:"was_paused"` // before it
}

// leasesClient opens the command's database and a lease client on it that
// sends no wake-ups.
func leasesClient(ctx context.Context, in *input) (*leases.Client, func(), error) {
	pool, err := in.connect(ctx)
	if err != nil {
		return nil, nil, err
	}
	client, err := leases.New(pool, &leases.Config{DisableWakeups: true})
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return client, func() { client.Close(); pool.Close() }, nil
}

func leasesList(*flag.FlagSet) runFunc {
	return func(ctx context.Context, in *input) error {
		client, done, err := leasesClient(ctx, in)
		if err != nil {
			return err
		}
		defer done()
		ls, err := client.List(ctx)
		if err != nil {
			return dbError(err)
		}
		pauses, err := client.Pauses(ctx)
		if err != nil {
			return dbError(err)
		}
		out := leasesListJSON{Leases: make([]leaseJSON, 0, len(ls)), Pauses: make([]pauseJSON, 0, len(pauses))}
		for _, l := range ls {
			out.Leases = append(out.Leases, newLeaseJSON(l))
		}
		for _, p := range pauses {
			out.Pauses = append(out.Pauses, pauseJSON{Prefix: p.Prefix, PausedBy: p.PausedBy, PausedAt: p.PausedAt.UTC(), Reason: p.Reason})
		}
		return in.print(out, func(w io.Writer) {
			tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "KEY\tSTATE\tTOKEN\tHOLDER\tREMAINING\tHOLDER INFO\tCLIENT")
			for _, l := range ls {
				fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\n", cell(l.Key), leaseState(l), l.Token, l.Holder, remaining(l), cell(l.HolderInfo), cell(clientVersion(l.ClientVersion)))
			}
			tw.Flush()
			if len(ls) == 0 {
				fmt.Fprintln(w, "(no leases)")
			}
			if len(pauses) > 0 {
				fmt.Fprintln(w, "\nnew grants paused (pgfence leases resume PREFIX lifts a pause):")
				tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "PREFIX\tPAUSED BY\tSINCE\tREASON")
				for _, p := range pauses {
					fmt.Fprintf(tw, "%q\t%s\t%s\t%s\n", p.Prefix, cell(p.PausedBy), stamp(p.PausedAt), cell(p.Reason))
				}
				tw.Flush()
			}
		})
	}
}

func leasesShow(fs *flag.FlagSet) runFunc {
	history := fs.Int("history", 10, "how many history entries (newest first)")
	return func(ctx context.Context, in *input) error {
		key := in.args[0]
		if *history < 0 {
			return usageError("--history must be >= 0, got %d", *history)
		}
		client, done, err := leasesClient(ctx, in)
		if err != nil {
			return err
		}
		defer done()
		l, err := client.Get(ctx, key)
		if errors.Is(err, pgfence.ErrNotFound) {
			return &cliError{msg: fmt.Sprintf("no lease for key %q", key), hint: "`pgfence leases list` shows every key", code: exitFailure, err: err}
		}
		if errors.Is(err, pgfence.ErrInvalid) {
			return leaseArgError(err)
		}
		if err != nil {
			return dbError(err)
		}
		hist, err := client.History(ctx, key, max(*history, 1))
		if err != nil {
			return dbError(err)
		}
		hist = hist[:min(len(hist), *history)]
		out := leaseShowJSON{Lease: newLeaseJSON(l), History: make([]historyJSON, 0, len(hist))}
		for _, h := range hist {
			out.History = append(out.History, historyJSON{ID: h.ID, At: h.At.UTC(), Event: h.Kind, Token: h.Token, Holder: h.Holder, Reason: h.Reason, ClientVersion: h.ClientVersion})
		}
		return in.print(out, func(w io.Writer) {
			tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
			fmt.Fprintf(tw, "key\t%s\n", cell(l.Key))
			fmt.Fprintf(tw, "state\t%s\n", leaseState(l))
			fmt.Fprintf(tw, "token\t%d\n", l.Token)
			fmt.Fprintf(tw, "holder\t%s\n", l.Holder)
			fmt.Fprintf(tw, "holder info\t%s\n", cell(l.HolderInfo))
			fmt.Fprintf(tw, "client\t%s\n", cell(clientVersion(l.ClientVersion)))
			fmt.Fprintf(tw, "granted at\t%s\n", stamp(l.GrantedAt))
			fmt.Fprintf(tw, "renewed at\t%s\n", stamp(l.RenewedAt))
			fmt.Fprintf(tw, "expires at\t%s\n", stamp(l.ExpiresAt))
			fmt.Fprintf(tw, "released at\t%s\n", stamp(l.ReleasedAt))
			fmt.Fprintf(tw, "remaining\t%s\n", remaining(l))
			tw.Flush()
			if len(hist) == 0 {
				return
			}
			fmt.Fprintln(w, "\nhistory (newest first):")
			tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "AT\tEVENT\tTOKEN\tHOLDER\tCLIENT\tREASON")
			for _, h := range hist {
				client := "-"
				if h.Granted() {
					client = clientVersion(h.ClientVersion)
				}
				fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\n", stamp(h.At), h.Kind, h.Token, h.Holder, cell(client), cell(h.Reason))
			}
			tw.Flush()
		})
	}
}

func leasesRelease(fs *flag.FlagSet) runFunc {
	force := fs.Bool("force", false, "required: ending someone else's grant is an operator action")
	reason := fs.String("reason", "", "why (required; recorded in the grant history)")
	return func(ctx context.Context, in *input) error {
		key := in.args[0]
		if !*force {
			return usageError("leases release ends another process's grant: pass --force (and --reason) to confirm")
		}
		if *reason == "" {
			return usageError("leases release needs --reason TEXT (it is recorded in the grant history)")
		}
		client, done, err := leasesClient(ctx, in)
		if err != nil {
			return err
		}
		defer done()
		res, err := client.ForceRelease(ctx, key, *reason)
		if errors.Is(err, pgfence.ErrInvalid) {
			return leaseArgError(err)
		}
		if err != nil {
			return dbError(err)
		}
		out := releaseJSON{Key: key, Released: res.Released, WasLive: res.WasLive, Token: res.Token, Holder: res.Holder}
		return in.print(out, func(w io.Writer) {
			switch {
			case !res.Released:
				fmt.Fprintf(w, "nothing to release: key %q has no current grant\n", key)
			case res.WasLive:
				fmt.Fprintf(w, "released the live grant of %q (token %d, holder %s); its holder finds out at its next renewal; its lease-checked writes are refused from now on, its fenced writes once the key's next holder has written\n", key, res.Token, res.Holder)
			default:
				fmt.Fprintf(w, "released the expired grant of %q (token %d, holder %s)\n", key, res.Token, res.Holder)
			}
		})
	}
}

func leasesPause(fs *flag.FlagSet) runFunc {
	reason := fs.String("reason", "", "why (required; recorded in the pause history)")
	return func(ctx context.Context, in *input) error {
		prefix := in.args[0]
		if *reason == "" {
			return usageError("leases pause needs --reason TEXT (it is recorded in the pause history)")
		}
		client, done, err := leasesClient(ctx, in)
		if err != nil {
			return err
		}
		defer done()
		added, err := client.PauseGrants(ctx, prefix, *reason)
		if errors.Is(err, pgfence.ErrInvalid) {
			return leaseArgError(err)
		}
		if err != nil {
			return dbError(err)
		}
		return in.print(pauseResultJSON{Prefix: prefix, Paused: true, WasPaused: !added}, func(w io.Writer) {
			state := "paused"
			if !added {
				state = "still paused (reason replaced)"
			}
			fmt.Fprintf(w, "new grants of keys starting with %q are %s; current holders keep their leases (`pgfence leases release KEY --force --reason TEXT` ends one)\n", prefix, state)
		})
	}
}

func leasesResume(fs *flag.FlagSet) runFunc {
	reason := fs.String("reason", "", "why (recorded in the pause history)")
	return func(ctx context.Context, in *input) error {
		prefix := in.args[0]
		client, done, err := leasesClient(ctx, in)
		if err != nil {
			return err
		}
		defer done()
		removed, err := client.ResumeGrants(ctx, prefix, *reason)
		if errors.Is(err, pgfence.ErrInvalid) {
			return leaseArgError(err)
		}
		if err != nil {
			return dbError(err)
		}
		return in.print(pauseResultJSON{Prefix: prefix, Paused: false, WasPaused: removed}, func(w io.Writer) {
			if !removed {
				fmt.Fprintf(w, "prefix %q was not paused (a pause lifts only with its exact prefix; `pgfence leases list` shows them)\n", prefix)
				return
			}
			fmt.Fprintf(w, "new grants of keys starting with %q are allowed again\n", prefix)
		})
	}
}

// clientVersion shows a grant's client version; grants by plain SQL clients
// and by clients older than the version column have none.
func clientVersion(v string) string {
	if v == "" {
		return "(unknown: SQL or old client)"
	}
	return v
}

func leaseState(l leases.Status) string {
	switch {
	case l.Live:
		return "held"
	case !l.ReleasedAt.IsZero():
		return "released"
	default:
		return "expired"
	}
}

func remaining(l leases.Status) string {
	if !l.Live {
		return "-"
	}
	return l.Remaining.Round(time.Millisecond).String()
}

// leaseArgError explains a key, prefix or reason the leases package refused;
// its message names which and why.
func leaseArgError(err error) error {
	return &cliError{msg: err.Error(), hint: "a key is 1 to 512 bytes and a prefix at most 512, of UTF-8 without NUL; a reason 1 to 1000 characters", code: exitUsage, err: err}
}
