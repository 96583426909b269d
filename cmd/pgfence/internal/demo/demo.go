// Package demo is `pgfence demo`: the critical experiment of fencing, run
// for real. Worker A, a separate OS process, takes a lease and is frozen
// (SIGSTOP) past its expiry; worker B takes over and writes; A wakes up and
// writes anyway, through the fence and through plain SQL, and the database
// rejects both. A duplicate business request then replays its stored result.
// The report is the timeline by the database clock, the reconciled business
// state, and the guarantees checked.
package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/idempotency"
	"github.com/pgfence/pgfence/internal/pgerr"
	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// The demo's business data: one stock row, fenced per SKU and protected by
// pgfence's trigger. It lives in its own schema, dropped at the end.
const (
	demoSchema   = "pgfence_demo"
	demoSKU      = "sku-42"
	demoPrefix   = "inventory/" // the stock's fence resources: demoPrefix + sku
	demoSetupSQL = `
		DROP SCHEMA IF EXISTS pgfence_demo CASCADE;
		CREATE SCHEMA pgfence_demo;
		CREATE TABLE pgfence_demo.stock (
		    sku         text PRIMARY KEY,
		    quantity    int    NOT NULL CHECK (quantity >= 0),
		    last_token  bigint,
		    last_writer text
		);
		CREATE TABLE pgfence_demo.orders (id text PRIMARY KEY, sku text NOT NULL, quantity int NOT NULL)`
)

// Initial is the stock the demo starts with.
const Initial = 10

// The lease TTL's bounds: worker A is frozen for longer than the TTL, and
// the takeover waits for it.
const (
	MinTTL = 200 * time.Millisecond
	MaxTTL = time.Minute
)

// Event is one line of the timeline.
type Event struct {
	At     time.Time `json:"at"` // database clock, UTC
	Actor  string    `json:"actor"`
	Action string    `json:"action"`
	Token  int64     `json:"token,omitempty"`
	Holder string    `json:"holder,omitempty"`
	Result string    `json:"result"` // ok, accepted, rejected, replayed, ...
	Detail string    `json:"detail,omitempty"`
}

// Check is one guarantee the demo verifies.
type Check struct {
	Guarantee string `json:"guarantee"`
	Held      bool   `json:"held"`
	Detail    string `json:"detail"`
}

// Report is what the demo did and found; its JSON is what `pgfence demo
// --json` prints.
type Report struct {
	// OK is true when every guarantee held.
	OK bool `json:"ok"`
	// Database is "embedded" (a throwaway local cluster) or host:port/name.
	Database string  `json:"database"`
	TTLMS    int64   `json:"ttl_ms"`
	Timeline []Event `json:"timeline"`
	// Final is the business state after the run.
	Final  Final   `json:"final"`
	Checks []Check `json:"checks"`
}

// Final is the stock row and the orders after the run.
type Final struct {
	SKU        string `json:"sku"`
	Quantity   int    `json:"quantity"`
	LastToken  int64  `json:"last_token"`
	LastWriter string `json:"last_writer"`
	Orders     int    `json:"orders"`
}

// Options configure [Run].
type Options struct {
	// TTL is the lease TTL, [MinTTL] to [MaxTTL].
	TTL time.Duration
	// Keep keeps the demo's schema, pgfence_demo, on a database of the
	// caller's; it is dropped otherwise.
	Keep bool
	// Progress receives the narration.
	Progress io.Writer
}

// Run runs the demo on d and reconciles the business state. A report whose
// OK is false means a guarantee did not hold; an error, that the demo could
// not run.
func Run(ctx context.Context, d *pgfencetest.Database, opts Options) (*Report, error) {
	if opts.TTL < MinTTL || opts.TTL > MaxTTL {
		return nil, fmt.Errorf("demo: TTL must be %s to %s, got %s", MinTTL, MaxTTL, opts.TTL)
	}
	progress := opts.Progress
	if progress == nil {
		progress = io.Discard
	}
	rep, err := run(ctx, d, opts.TTL, progress)
	if !opts.Keep || d.Throwaway() {
		_, _ = d.Pool.Exec(context.WithoutCancel(ctx), `DROP SCHEMA IF EXISTS `+demoSchema+` CASCADE`)
	}
	return rep, err
}

// scene is one run of the demo: where it runs, the names it uses, and the
// report it fills in as it goes.
type scene struct {
	db       *pgfencetest.Database
	ttl      time.Duration
	progress io.Writer
	sku, key string // the stock row, and its lease key and fence resource
	rep      *Report
}

func run(ctx context.Context, d *pgfencetest.Database, ttl time.Duration, progress io.Writer) (*Report, error) {
	s := &scene{db: d, ttl: ttl, progress: progress, sku: demoSKU, rep: &Report{Database: "embedded", TTLMS: ttl.Milliseconds()}}
	if !d.Throwaway() {
		cfg := d.Pool.Config().ConnConfig
		s.rep.Database = fmt.Sprintf("%s:%d/%s", cfg.Host, cfg.Port, cfg.Database)
		// Accepted tokens, lease rows and idempotency keys outlive the demo's
		// schema, so on a user's database every run uses a SKU of its own: a
		// rerun must not meet the tokens and keys of the run before.
		s.sku = demoSKU + "-" + demoRunID()
	}
	s.key = demoPrefix + s.sku
	if err := s.setup(ctx); err != nil {
		return nil, err
	}
	// Worker A: an OS process that takes the lease, then is frozen.
	a, err := startWorker(ctx, d.URL, ttl, s.sku)
	if err != nil {
		return nil, err
	}
	defer a.kill()
	client, err := leases.New(d.Pool, nil)
	if err != nil {
		return nil, err
	}
	defer client.Close()
	tokenA, lb, err := s.takeover(ctx, a, client)
	if err != nil {
		return nil, err
	}
	if err := s.lateWrites(ctx, a, client, tokenA, lb); err != nil {
		return nil, err
	}
	if err := s.duplicateOrder(ctx, lb); err != nil {
		return nil, err
	}
	if err := lb.Release(ctx); err != nil {
		return nil, fmt.Errorf("worker B's release: %w", err)
	}
	s.add(Event{Actor: "B", Action: "release lease", Token: lb.Token(), Result: "released"})
	if err := s.reconcile(ctx, lb); err != nil {
		return nil, err
	}
	s.rep.OK = true
	for _, c := range s.rep.Checks {
		s.rep.OK = s.rep.OK && c.Held
	}
	return s.rep, nil
}

// add appends ev to the timeline, at the database clock's now unless it
// has a time.
func (s *scene) add(ev Event) {
	if ev.At.IsZero() {
		if err := s.db.Pool.QueryRow(context.Background(), `SELECT pg_catalog.clock_timestamp()`).Scan(&ev.At); err != nil {
			ev.At = time.Now()
		}
	}
	ev.At = ev.At.UTC()
	s.rep.Timeline = append(s.rep.Timeline, ev)
}

// check records whether a guarantee held.
func (s *scene) check(guarantee string, held bool, format string, args ...any) {
	s.rep.Checks = append(s.rep.Checks, Check{Guarantee: guarantee, Held: held, Detail: fmt.Sprintf(format, args...)})
}

// setup creates the business table, closes its unchecked doors and stocks it.
func (s *scene) setup(ctx context.Context) error {
	pool := s.db.Pool
	if _, err := pool.Exec(ctx, demoSetupSQL); err != nil {
		return fmt.Errorf("demo setup: %w", err)
	}
	// The stock exists before the table is protected: from then on every
	// write needs the SKU's lease.
	if _, err := pool.Exec(ctx, `INSERT INTO pgfence_demo.stock VALUES ($1, $2, NULL, 'setup')`, s.sku, Initial); err != nil {
		return fmt.Errorf("demo setup: initial stock: %w", err)
	}
	if err := pgfence.Protect(ctx, pool, pgx.Identifier{demoSchema, "stock"}, "sku", demoPrefix); err != nil {
		return fmt.Errorf("demo setup: protect: %w", err)
	}
	fmt.Fprintf(s.progress, "demo: stock %s = %d; lease TTL %s; worker A is a separate OS process\n", s.sku, Initial, s.ttl)
	return nil
}

// takeover: A takes the lease and is frozen; B waits for the lease, which
// the database grants only after A's expired by the database clock, and
// writes through the fence. It returns A's token and B's lease.
func (s *scene) takeover(ctx context.Context, a *worker, client *leases.Client) (int64, *leases.Lease, error) {
	got, err := a.next()
	if err != nil || got.Result != "ok" {
		return 0, nil, fmt.Errorf("worker A could not take the lease: %v %s", err, got.Detail)
	}
	tokenA := got.Token
	s.add(Event{Actor: "A", Action: "acquire lease " + s.key, Token: tokenA, Holder: got.Holder, Result: "granted", Detail: "TTL " + s.ttl.String()})
	if err := a.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		return 0, nil, fmt.Errorf("freeze worker A: %w", err)
	}
	s.add(Event{Actor: "A", Action: "frozen (SIGSTOP), as by a GC pause or VM migration", Result: "paused"})
	fmt.Fprintf(s.progress, "demo: A (token %d) is frozen; B waits for A's lease to expire by the database clock...\n", tokenA)

	actx, cancel := context.WithTimeout(ctx, 10*s.ttl+5*time.Second)
	lb, err := client.Acquire(actx, s.key, s.ttl*5, &leases.AcquireOptions{HolderInfo: "demo worker B"})
	cancel()
	if err != nil {
		return 0, nil, fmt.Errorf("worker B could not take over: %w", err)
	}
	s.add(Event{Actor: "B", Action: "acquire lease " + s.key, Token: lb.Token(), Holder: lb.Holder(), Result: "granted (A's lease expired: taken over)"})
	s.check("fencing tokens strictly increase across grants", lb.Token() > tokenA, "A got %d, B got %d", tokenA, lb.Token())

	if _, err := pgfence.Exec(ctx, s.db.Pool, lb,
		`UPDATE pgfence_demo.stock SET quantity = quantity - 1, last_token = $2, last_writer = 'B' WHERE sku = $1`, s.sku, lb.Token()); err != nil {
		return 0, nil, fmt.Errorf("worker B's fenced write failed: %w", err)
	}
	s.add(Event{Actor: "B", Action: "fenced write: stock - 1", Token: lb.Token(), Result: "accepted"})
	return tokenA, lb, nil
}

// lateWrites: A wakes up believing it still holds the lease, and writes
// through the fence, then through plain SQL, then releases its old lease.
func (s *scene) lateWrites(ctx context.Context, a *worker, client *leases.Client, tokenA int64, lb *leases.Lease) error {
	if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		return fmt.Errorf("resume worker A: %w", err)
	}
	s.add(Event{Actor: "A", Action: "resumed (SIGCONT); still believes it holds the lease", Result: "running"})
	if err := a.send("write"); err != nil {
		return err
	}
	lateFenced, err := a.next()
	if err != nil {
		return err
	}
	s.add(Event{Actor: "A", Action: "late fenced write: stock - 1", Token: tokenA, Result: lateFenced.Result, Detail: lateFenced.Detail})
	s.check("the database rejects a stale token atomically with the write (PF001)", lateFenced.Result == "rejected" && lateFenced.Code == pgerr.CodeStaleToken,
		"A's write with token %d: %s %s", tokenA, lateFenced.Result, lateFenced.Code)

	bypass, err := a.next()
	if err != nil {
		return err
	}
	s.add(Event{Actor: "A", Action: "late write through plain SQL, bypassing the helpers", Token: tokenA, Result: bypass.Result, Detail: bypass.Detail})
	s.check("no unchecked door: a plain UPDATE of a protected table is rejected (PF006)", bypass.Result == "rejected" && bypass.Code == pgerr.CodeUnfencedWrite,
		"plain UPDATE: %s %s", bypass.Result, bypass.Code)

	release, err := a.next()
	if err != nil {
		return err
	}
	s.add(Event{Actor: "A", Action: "release its (old) lease", Token: tokenA, Result: release.Result, Detail: release.Detail})
	st, err := client.Get(ctx, s.key)
	if err != nil {
		return err
	}
	s.check("a stale release cannot free the new holder's lease", release.Result == "lost" && st.Live && st.Token == lb.Token(),
		"A's release: %s; lease now held with token %d (B's is %d)", release.Result, st.Token, lb.Token())
	_ = a.wait()
	return nil
}

// duplicateOrder: a business request under an idempotency key, written
// under B's lease; its duplicate replays the stored result, and the key
// reused with another payload is refused.
func (s *scene) duplicateOrder(ctx context.Context, lb *leases.Lease) error {
	store, err := idempotency.NewStore(nil)
	if err != nil {
		return err
	}
	order := idempotency.Request{Scope: "demo.orders/" + s.sku, Key: "order-1001:deduct", Payload: []byte(`{"qty":2,"sku":"sku-42"}`)}
	placeOrder := func(actor string) (*idempotency.Outcome, error) {
		return store.Do(ctx, s.db.Pool, order, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
			// The order is written under B's lease token, fenced like any write.
			if _, err := pgfence.Write(ctx, tx, lb, func(ctx context.Context, tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, `UPDATE pgfence_demo.stock SET quantity = quantity - 2, last_token = $2, last_writer = $3 WHERE sku = $1`, s.sku, lb.Token(), "B/"+actor); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, `INSERT INTO pgfence_demo.orders VALUES ('order-1001', $1, 2)`, s.sku)
				return err
			}); err != nil {
				return nil, err
			}
			return []byte(`{"order":"order-1001","status":"confirmed"}`), nil
		})
	}
	first, err := placeOrder("request")
	if err != nil {
		return fmt.Errorf("order request: %w", err)
	}
	outcome := func(o *idempotency.Outcome) string {
		if o.Replayed {
			return "replayed"
		}
		return "new"
	}
	s.add(Event{Actor: "C", Action: "order-1001: deduct 2 (idempotency key order-1001:deduct)", Result: outcome(first), Detail: string(first.Result)})
	dup, err := placeOrder("retry")
	if err != nil {
		return fmt.Errorf("duplicate order request: %w", err)
	}
	s.add(Event{Actor: "C", Action: "order-1001: same request again (a client retry)", Result: outcome(dup), Detail: string(dup.Result)})
	s.check("a duplicate request gets the stored result, not a second effect", dup.Replayed && string(dup.Result) == string(first.Result),
		"first %s, duplicate %s", outcome(first), outcome(dup))

	changed := order
	changed.Payload = []byte(`{"qty":5,"sku":"sku-42"}`)
	_, mismatchErr := store.Do(ctx, s.db.Pool, changed, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		return nil, errors.New("must not run")
	})
	s.add(Event{Actor: "C", Action: "order-1001:deduct reused with another payload", Result: resultOf(mismatchErr, idempotency.ErrMismatch)})
	s.check("a reused key with another payload is refused", errors.Is(mismatchErr, idempotency.ErrMismatch), "%v", mismatchErr)
	return nil
}

// reconcile reads the business state back: it must be the writes of the
// highest accepted token, each once.
func (s *scene) reconcile(ctx context.Context, lb *leases.Lease) error {
	f := &s.rep.Final
	if err := s.db.Pool.QueryRow(ctx, `SELECT sku, quantity, last_token, last_writer, (SELECT pg_catalog.count(*) FROM pgfence_demo.orders) FROM pgfence_demo.stock`).
		Scan(&f.SKU, &f.Quantity, &f.LastToken, &f.LastWriter, &f.Orders); err != nil {
		return err
	}
	want := Initial - 1 - 2
	s.check("final state = the writes of the highest accepted token, each once", f.Quantity == want && f.LastToken == lb.Token() && f.Orders == 1 && strings.HasPrefix(f.LastWriter, "B"),
		"stock %d (want %d: B's -1 and one order's -2), last token %d, %d order row(s)", f.Quantity, want, f.LastToken, f.Orders)
	return nil
}

func resultOf(err, want error) string {
	switch {
	case err == nil:
		return "accepted"
	case errors.Is(err, want):
		return "rejected: " + err.Error()
	default:
		return "error: " + err.Error()
	}
}

// demoDetailWidth is where a timeline entry's detail line is cut.
const demoDetailWidth = 140

// WriteText prints the report: the timeline, the final state and the checks.
func (rep *Report) WriteText(w io.Writer) {
	fmt.Fprintf(w, "\npgfence demo on %s: a paused lock holder wakes up and writes\n\n", rep.Database)
	// Columns by hand: a detail line goes under WHAT without widening it
	// (text/tabwriter would size the column to the longest detail).
	rows := [][5]string{{"DB TIME", "WHO", "WHAT", "TOKEN", "RESULT"}}
	for _, ev := range rep.Timeline {
		tok := "-"
		if ev.Token != 0 {
			tok = fmt.Sprint(ev.Token)
		}
		rows = append(rows, [5]string{ev.At.UTC().Format("15:04:05.000"), ev.Actor, ev.Action, tok, ev.Result})
	}
	var width [4]int
	for _, r := range rows {
		for i := range width {
			width[i] = max(width[i], utf8.RuneCountInString(r[i]))
		}
	}
	line := func(r [5]string) {
		var b strings.Builder
		for i := range width {
			b.WriteString(r[i])
			b.WriteString(strings.Repeat(" ", width[i]-utf8.RuneCountInString(r[i])+2))
		}
		b.WriteString(r[4])
		fmt.Fprintln(w, strings.TrimRight(b.String(), " "))
	}
	line(rows[0])
	indent := strings.Repeat(" ", width[0]+2+width[1]+2+2)
	for i, ev := range rep.Timeline {
		line(rows[i+1])
		if ev.Detail != "" {
			detail := ev.Detail
			if n := utf8.RuneCountInString(detail); n > demoDetailWidth {
				detail = string([]rune(detail)[:demoDetailWidth-3]) + "..."
			}
			fmt.Fprintf(w, "%s%s\n", indent, detail)
		}
	}
	f := rep.Final
	fmt.Fprintf(w, "\nfinal state: stock %s = %d (started at %d), last written with token %d by %s; %d order(s)\n\n", f.SKU, f.Quantity, Initial, f.LastToken, f.LastWriter, f.Orders)
	for _, c := range rep.Checks {
		mark := "HELD  "
		if !c.Held {
			mark = "BROKEN"
		}
		fmt.Fprintf(w, "  [%s] %s  (%s)\n", mark, c.Guarantee, c.Detail)
	}
	if rep.OK {
		fmt.Fprintln(w, "\nevery guarantee held: the database, not the lock, stopped the stale holder.")
	}
}
