package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/pgfence/pgfence/pgfence"
)

// fenceJSON is one fenced resource.
type fenceJSON struct {
	Resource   string    `json:"resource"`
	Token      int64     `json:"token"` // the highest accepted
	Writes     int64     `json:"writes"`
	AcceptedAt time.Time `json:"accepted_at"`  // of the last accepted write
	Op         string    `json:"op,omitempty"` // the last accepted write's operation id
}

func newFenceJSON(f pgfence.FenceRecord) fenceJSON {
	out := fenceJSON{Resource: f.Resource, Token: f.Token, Writes: f.Writes, AcceptedAt: f.AcceptedAt.UTC()}
	if f.Op != (pgfence.OpID{}) {
		out.Op = f.Op.String()
	}
	return out
}

// fencesListJSON is what `fences list --json` prints.
type fencesListJSON struct {
	Fences []fenceJSON `json:"fences"`
	// Truncated is true when more resources match than --limit shows.
	Truncated bool `json:"truncated"`
}

// rejectionJSON is one rejected write.
type rejectionJSON struct {
	At             time.Time `json:"at"`
	Reason         string    `json:"reason"` // stale_token or lease_not_held
	LeaseReason    string    `json:"lease_reason,omitempty"`
	PresentedToken int64     `json:"presented_token"`
	AcceptedToken  int64     `json:"accepted_token,omitempty"`
	Operation      string    `json:"operation,omitempty"`
	Op             string    `json:"op,omitempty"`
	TraceID        string    `json:"trace_id,omitempty"`
}

func newRejectionJSON(r pgfence.Rejection) rejectionJSON {
	out := rejectionJSON{At: r.At.UTC(), Reason: r.Reason, LeaseReason: r.LeaseReason, PresentedToken: r.PresentedToken,
		AcceptedToken: r.AcceptedToken, Operation: r.Operation, TraceID: r.TraceID}
	if r.Op != (pgfence.OpID{}) {
		out.Op = r.Op.String()
	}
	return out
}

// fenceShowJSON is what `fences show --json` prints.
type fenceShowJSON struct {
	// Fence is absent when no token was ever accepted for the resource (its
	// rejections are still listed).
	Fence      *fenceJSON      `json:"fence,omitempty"`
	Rejections []rejectionJSON `json:"rejections"` // newest first
}

func fencesList(fs *flag.FlagSet) runFunc {
	prefix := fs.String("prefix", "", "only the resources whose name starts with this")
	limit := fs.Int("limit", 1000, "most resources listed (1 to 99999)")
	return func(ctx context.Context, in *input) error {
		if *limit < 1 || *limit > 99_999 { // Fences returns at most 100,000: one more tells whether others exist
			return usageError("--limit must be 1 to 99999, got %d", *limit)
		}
		pool, err := in.connect(ctx)
		if err != nil {
			return err
		}
		defer pool.Close()
		fences, err := pgfence.Fences(ctx, pool, *prefix, *limit+1) // one more: are there others?
		if errors.Is(err, pgfence.ErrInvalid) {
			return &cliError{msg: err.Error(), hint: "a prefix is at most 512 bytes of UTF-8 without NUL", code: exitUsage, err: err}
		}
		if err != nil {
			return dbError(err)
		}
		out := fencesListJSON{Fences: make([]fenceJSON, 0, len(fences)), Truncated: len(fences) > *limit}
		fences = fences[:min(len(fences), *limit)]
		for _, f := range fences {
			out.Fences = append(out.Fences, newFenceJSON(f))
		}
		return in.print(out, func(w io.Writer) {
			tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "RESOURCE\tACCEPTED TOKEN\tWRITES\tLAST ACCEPTED AT")
			for _, f := range fences {
				fmt.Fprintf(tw, "%s\t%d\t%d\t%s\n", cell(f.Resource), f.Token, f.Writes, stamp(f.AcceptedAt))
			}
			tw.Flush()
			switch {
			case len(fences) == 0:
				fmt.Fprintln(w, "(no fenced resources)")
			case out.Truncated:
				fmt.Fprintf(w, "(the first %d; --prefix or --limit shows others)\n", len(fences))
			}
		})
	}
}

func fencesShow(fs *flag.FlagSet) runFunc {
	nRejections := fs.Int("rejections", 20, "how many recent rejected writes to list (0 to 1000)")
	return func(ctx context.Context, in *input) error {
		resource := in.args[0]
		if *nRejections < 0 || *nRejections > 1000 {
			return usageError("--rejections must be 0 to 1000, got %d", *nRejections)
		}
		pool, err := in.connect(ctx)
		if err != nil {
			return err
		}
		defer pool.Close()
		out := fenceShowJSON{Rejections: []rejectionJSON{}}
		f, err := pgfence.LookupFence(ctx, pool, resource)
		switch {
		case err == nil:
			j := newFenceJSON(f)
			out.Fence = &j
		case errors.Is(err, pgfence.ErrInvalid):
			return &cliError{msg: err.Error(), hint: "a resource is 1 to 512 bytes of UTF-8 without NUL", code: exitUsage, err: err}
		case !errors.Is(err, pgfence.ErrNotFound):
			return dbError(err)
		}
		var rejections []pgfence.Rejection
		if *nRejections > 0 {
			if rejections, err = pgfence.Rejections(ctx, pool, resource, *nRejections); err != nil {
				return dbError(err)
			}
		}
		if out.Fence == nil && len(rejections) == 0 {
			return &cliError{msg: fmt.Sprintf("no token was ever accepted for resource %q", resource), hint: "`pgfence fences list` lists every fenced resource", code: exitFailure}
		}
		for _, r := range rejections {
			out.Rejections = append(out.Rejections, newRejectionJSON(r))
		}
		return in.print(out, func(w io.Writer) {
			tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "RESOURCE\tACCEPTED TOKEN\tWRITES\tLAST ACCEPTED AT")
			if out.Fence != nil {
				fmt.Fprintf(tw, "%s\t%d\t%d\t%s\n", cell(f.Resource), f.Token, f.Writes, stamp(f.AcceptedAt))
			} else {
				fmt.Fprintf(tw, "%s\t-\t0\t-\n", cell(resource))
			}
			tw.Flush()
			if *nRejections > 0 {
				printRejections(w, rejections)
			}
		})
	}
}

func printRejections(w io.Writer, rejections []pgfence.Rejection) {
	fmt.Fprintf(w, "\nrecent rejected writes (newest first, kept 7 days):\n")
	if len(rejections) == 0 {
		fmt.Fprintln(w, "(none recorded)")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "AT\tREASON\tPRESENTED\tACCEPTED\tOPERATION\tTRACE ID")
	for _, r := range rejections {
		reason := r.Reason
		if r.LeaseReason != "" {
			reason += " (" + r.LeaseReason + ")"
		}
		accepted := "-"
		if r.AcceptedToken != 0 {
			accepted = strconv.FormatInt(r.AcceptedToken, 10)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\n", stamp(r.At), reason, r.PresentedToken, accepted, cell(dash(r.Operation)), dash(r.TraceID))
	}
	tw.Flush()
}
