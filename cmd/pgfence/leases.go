package main

import (
	"context"
	"errors"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/pgfence/pgfence/leases"
)

const leasesUsage = `leases <list|show|release> [flags]

  list                                   every lease row with its remaining time (database clock)
  show KEY [--history N]                 one lease and its recent grant history
  release KEY --force --reason TEXT      end the current grant whoever holds it (recorded in the history)`

func runLeases(ctx context.Context, e *env, args []string) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprintf(e.stderr, "Usage: pgfence %s\n", leasesUsage)
		if len(args) == 0 {
			return usageError("leases needs a subcommand: list, show or release")
		}
		return nil
	}
	sub, rest := args[0], args[1:]
	fs := newFlags(e, "leases "+sub, "leases "+sub+" [flags]")
	var db dbFlags
	db.register(fs)
	asJSON := fs.Bool("json", false, "print JSON instead of a table")
	history := fs.Int("history", 10, "show: how many history entries (newest first)")
	force := fs.Bool("force", false, "release: required; ending someone else's grant is an operator action")
	reason := fs.String("reason", "", "release: why (recorded in the grant history)")
	switch sub {
	case "list", "show", "release":
	default:
		return usageError("leases: unknown subcommand %q (want list, show or release)", sub)
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
	default:
		if fs.NArg() != 1 {
			return usageError("leases %s needs exactly one KEY, got %d arguments", sub, fs.NArg())
		}
		key = fs.Arg(0)
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
			if ls == nil {
				ls = []leases.Status{}
			}
			return writeJSON(e, ls)
		}
		tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "KEY\tSTATE\tTOKEN\tHOLDER\tREMAINING\tHOLDER INFO")
		for _, l := range ls {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\n", l.Key, leaseState(l), l.Token, l.Holder, remaining(l), l.HolderInfo)
		}
		tw.Flush()
		if len(ls) == 0 {
			fmt.Fprintln(e.stdout, "(no leases)")
		}
		return nil
	case "show":
		l, err := client.Get(ctx, key)
		if errors.Is(err, leases.ErrNotFound) {
			return &cliError{msg: fmt.Sprintf("no lease for key %q", key), hint: "`pgfence leases list` shows every key", code: exitFailure, err: err}
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
			if hist == nil {
				hist = []leases.HistoryEntry{}
			}
			return writeJSON(e, map[string]any{"lease": l, "history": hist})
		}
		tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintf(tw, "key\t%s\n", l.Key)
		fmt.Fprintf(tw, "state\t%s\n", leaseState(l))
		fmt.Fprintf(tw, "token\t%d\n", l.Token)
		fmt.Fprintf(tw, "holder\t%s\n", l.Holder)
		fmt.Fprintf(tw, "holder info\t%s\n", l.HolderInfo)
		fmt.Fprintf(tw, "granted at\t%s\n", stamp(l.GrantedAt))
		fmt.Fprintf(tw, "renewed at\t%s\n", stamp(l.RenewedAt))
		fmt.Fprintf(tw, "expires at\t%s\n", stamp(l.ExpiresAt))
		fmt.Fprintf(tw, "released at\t%s\n", stamp(l.ReleasedAt))
		fmt.Fprintf(tw, "remaining\t%s\n", remaining(l))
		tw.Flush()
		if len(hist) > 0 {
			fmt.Fprintln(e.stdout, "\nhistory (newest first):")
			tw = tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "AT\tEVENT\tTOKEN\tHOLDER\tREASON")
			for _, h := range hist {
				fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", stamp(h.At), h.Event, h.Token, h.Holder, h.Reason)
			}
			tw.Flush()
		}
		return nil
	default: // release
		res, err := client.ForceRelease(ctx, key, *reason)
		if errors.Is(err, leases.ErrInvalid) {
			return &cliError{msg: err.Error(), hint: "the reason must be 1 to 1000 characters", code: exitUsage, err: err}
		}
		if err != nil {
			return dbError(err)
		}
		if *asJSON {
			return writeJSON(e, res)
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
