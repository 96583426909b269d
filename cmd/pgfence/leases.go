package main

import (
	"context"
	"errors"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/pgfence/pgfence/leases"
)

const leasesUsage = `leases <list|show|release|pause|resume> [flags]

  list                                   every lease row with its remaining time (database clock), and the paused prefixes
  show KEY [--history N]                 one lease and its recent grant history
  release KEY --force --reason TEXT      end the current grant whoever holds it (recorded in the history)
  pause PREFIX --reason TEXT             kill switch: refuse new grants of keys starting with PREFIX ('' = every key);
                                         current holders keep renewing, writing and releasing
  resume PREFIX [--reason TEXT]          lift the pause of exactly PREFIX`

func runLeases(ctx context.Context, e *env, args []string) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprintf(e.stderr, "Usage: pgfence %s\n", leasesUsage)
		if len(args) == 0 {
			return usageError("leases needs a subcommand: list, show, release, pause or resume")
		}
		return nil
	}
	sub, rest := args[0], args[1:]
	usageLine, ok := map[string]string{
		"list":    "leases list [--json]",
		"show":    "leases show KEY [--history N] [--json]",
		"release": "leases release KEY --force --reason TEXT [--json]",
		"pause":   "leases pause PREFIX --reason TEXT [--json]",
		"resume":  "leases resume PREFIX [--reason TEXT] [--json]",
	}[sub]
	if !ok {
		return usageError("leases: unknown subcommand %q (want list, show, release, pause or resume)", sub)
	}
	fs := newFlags(e, "leases "+sub, usageLine)
	var db dbFlags
	db.register(fs)
	asJSON := fs.Bool("json", false, "print JSON instead of a table")
	// Each subcommand has the flags it uses, so that -h lists those only.
	history, force, reason := new(int), new(bool), new(string)
	switch sub {
	case "show":
		history = fs.Int("history", 10, "how many history entries (newest first)")
	case "release":
		force = fs.Bool("force", false, "required: ending someone else's grant is an operator action")
		reason = fs.String("reason", "", "why (required; recorded in the grant history)")
	case "pause":
		reason = fs.String("reason", "", "why (required; recorded in the pause history)")
	case "resume":
		reason = fs.String("reason", "", "why (recorded in the pause history)")
	}
	if err := parse(fs, interspersed(fs, rest)); err != nil {
		return err
	}
	var key string
	switch sub {
	case "list":
		if fs.NArg() != 0 {
			return usageError("leases list takes no arguments, got %q", fs.Args())
		}
	case "pause", "resume":
		if fs.NArg() != 1 {
			return usageError("leases %s needs exactly one PREFIX ('' for every key), got %d arguments", sub, fs.NArg())
		}
		key = fs.Arg(0)
	default:
		if fs.NArg() != 1 {
			return usageError("leases %s needs exactly one KEY, got %d arguments", sub, fs.NArg())
		}
		key = fs.Arg(0)
	}
	if sub == "pause" && *reason == "" {
		return usageError("leases pause needs --reason TEXT (it is recorded in the pause history)")
	}
	if sub == "release" && !*force {
		return usageError("leases release ends another process's grant: pass --force (and --reason) to confirm")
	}
	if sub == "release" && *reason == "" {
		return usageError("leases release needs --reason TEXT (it is recorded in the grant history)")
	}
	if *history < 0 {
		return usageError("--history must be >= 0, got %d", *history)
	}
	pool, err := db.connect(ctx, e)
	if err != nil {
		return err
	}
	defer pool.Close()
	client, err := leases.New(pool, &leases.Config{DisableWakeups: true})
	if err != nil {
		return err
	}
	defer client.Close()

	switch sub {
	case "list":
		ls, err := client.List(ctx)
		if err != nil {
			return dbError(err)
		}
		if *asJSON {
			// An array of lease rows; paused prefixes are in
			// `pgfence doctor --json` (check "grant pauses").
			rows := make([]leaseRow, 0, len(ls))
			for _, l := range ls {
				rows = append(rows, newLeaseRow(l))
			}
			return writeJSON(e, rows)
		}
		tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "KEY\tSTATE\tTOKEN\tHOLDER\tREMAINING\tHOLDER INFO\tCLIENT")
		for _, l := range ls {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\n", cell(l.Key), leaseState(l), l.Token, l.Holder, remaining(l), cell(l.HolderInfo), cell(clientVersion(l.ClientVersion)))
		}
		tw.Flush()
		if len(ls) == 0 {
			fmt.Fprintln(e.stdout, "(no leases)")
		}
		pauses, err := client.Pauses(ctx)
		if err != nil {
			return dbError(err)
		}
		if len(pauses) > 0 {
			fmt.Fprintln(e.stdout, "\nnew grants paused (pgfence leases resume PREFIX lifts a pause):")
			tw = tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "PREFIX\tPAUSED BY\tSINCE\tREASON")
			for _, p := range pauses {
				fmt.Fprintf(tw, "%q\t%s\t%s\t%s\n", p.Prefix, cell(p.PausedBy), stamp(p.PausedAt), cell(p.Reason))
			}
			tw.Flush()
		}
		return nil
	case "pause":
		added, err := client.PauseGrants(ctx, key, *reason)
		if errors.Is(err, leases.ErrInvalid) {
			return leaseArgError(err)
		}
		if err != nil {
			return dbError(err)
		}
		if *asJSON {
			return writeJSON(e, map[string]any{"prefix": key, "paused": true, "new": added})
		}
		verb := "paused"
		if !added {
			verb = "still paused (reason replaced)"
		}
		fmt.Fprintf(e.stdout, "new grants of keys starting with %q are %s; current holders keep their leases (`pgfence leases release KEY --force` ends one)\n", key, verb)
		return nil
	case "resume":
		removed, err := client.ResumeGrants(ctx, key, *reason)
		if errors.Is(err, leases.ErrInvalid) {
			return leaseArgError(err)
		}
		if err != nil {
			return dbError(err)
		}
		if *asJSON {
			return writeJSON(e, map[string]any{"prefix": key, "resumed": removed})
		}
		if !removed {
			fmt.Fprintf(e.stdout, "prefix %q was not paused (a pause lifts only with its exact prefix; `pgfence leases list` shows them)\n", key)
			return nil
		}
		fmt.Fprintf(e.stdout, "new grants of keys starting with %q are allowed again\n", key)
		return nil
	case "show":
		l, err := client.Get(ctx, key)
		if errors.Is(err, leases.ErrNotFound) {
			return &cliError{msg: fmt.Sprintf("no lease for key %q", key), hint: "`pgfence leases list` shows every key", code: exitFailure, err: err}
		}
		if errors.Is(err, leases.ErrInvalid) {
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
		if *asJSON {
			rows := make([]historyRow, 0, len(hist))
			for _, h := range hist {
				rows = append(rows, newHistoryRow(h))
			}
			return writeJSON(e, map[string]any{"lease": newLeaseRow(l), "history": rows})
		}
		tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
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
		if len(hist) > 0 {
			fmt.Fprintln(e.stdout, "\nhistory (newest first):")
			tw = tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "AT\tEVENT\tTOKEN\tHOLDER\tCLIENT\tREASON")
			for _, h := range hist {
				client := "-"
				if h.Event == "acquired" || h.Event == "taken_over" {
					client = clientVersion(h.ClientVersion)
				}
				fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\n", stamp(h.At), h.Event, h.Token, h.Holder, cell(client), cell(h.Reason))
			}
			tw.Flush()
		}
		return nil
	default: // release
		res, err := client.ForceRelease(ctx, key, *reason)
		if errors.Is(err, leases.ErrInvalid) {
			return leaseArgError(err)
		}
		if err != nil {
			return dbError(err)
		}
		if *asJSON {
			return writeJSON(e, releaseRow{Key: key, Released: res.Released, WasLive: res.WasLive, Token: res.Token, Holder: res.Holder})
		}
		switch {
		case !res.Released:
			fmt.Fprintf(e.stdout, "nothing to release: key %q has no current grant\n", key)
		case res.WasLive:
			fmt.Fprintf(e.stdout, "released the live grant of %q (token %d, holder %s); its holder finds out at its next renewal, and its token is refused wherever writes are fenced\n", key, res.Token, res.Holder)
		default:
			fmt.Fprintf(e.stdout, "released the expired grant of %q (token %d, holder %s)\n", key, res.Token, res.Holder)
		}
		return nil
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

func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04:05.000Z")
}

// leaseArgError explains a key, prefix or reason the leases package refused;
// its message names which and why.
func leaseArgError(err error) error {
	return &cliError{msg: err.Error(), hint: "a key or prefix is 1 to 512 bytes of UTF-8 without NUL; a reason 1 to 1000 characters", code: exitUsage, err: err}
}

// leaseRow is one lease as `leases list --json` and `leases show --json`
// print it: snake_case keys like every other --json output, times the
// database recorded, and no time at all (not a zero one) where none was.
type leaseRow struct {
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

func newLeaseRow(l leases.Status) leaseRow {
	return leaseRow{Key: l.Key, State: leaseState(l), Live: l.Live, Token: l.Token, Holder: l.Holder,
		HolderInfo: l.HolderInfo, ClientVersion: l.ClientVersion, GrantedAt: l.GrantedAt,
		RenewedAt: optionalTime(l.RenewedAt), ExpiresAt: l.ExpiresAt, ReleasedAt: optionalTime(l.ReleasedAt),
		RemainingMS: l.Remaining.Milliseconds()}
}

// historyRow is one grant-history entry as `leases show --json` prints it.
type historyRow struct {
	ID            int64     `json:"id"`
	At            time.Time `json:"at"`
	Event         string    `json:"event"` // acquired, taken_over, released or force_released
	Token         int64     `json:"token"`
	Holder        string    `json:"holder"`
	Reason        string    `json:"reason,omitempty"`
	ClientVersion string    `json:"client_version,omitempty"`
}

func newHistoryRow(h leases.HistoryEntry) historyRow {
	return historyRow{ID: h.ID, At: h.At, Event: h.Event, Token: h.Token, Holder: h.Holder, Reason: h.Reason, ClientVersion: h.ClientVersion}
}

// releaseRow is what `leases release --json` prints.
type releaseRow struct {
	Key      string `json:"key"`
	Released bool   `json:"released"`
	WasLive  bool   `json:"was_live"`
	Token    int64  `json:"token,omitempty"`  // the grant it ended
	Holder   string `json:"holder,omitempty"` // the grant it ended
}

func optionalTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}
