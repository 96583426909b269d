package console

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/idempotency"
	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence"
)

// The console's own statements: what the libraries do not read already.
// Every prefix filter is a range on the key, which the key's index serves
// (a LIKE cannot under a collation other than C), and every list pages by
// keyset (the last key shown), never by OFFSET.
const (
	// statusColumns are those of pgfence.lease_status, read from the table
	// (AS l): the view hides the key's order from the planner, so a page of
	// it sorted and filtered every row the role may see.
	statusColumns = `l.key, l.holder::text, l.token, l.granted_at, l.renewed_at, l.expires_at, l.released_at, l.holder_info,
       l.released_at IS NULL AND l.expires_at OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp(),
       CASE WHEN l.released_at IS NULL THEN GREATEST(l.expires_at OPERATOR(pg_catalog.-) pg_catalog.clock_timestamp(), interval '0')
            ELSE interval '0' END`
	sqlNow = `SELECT pg_catalog.clock_timestamp()`
	// sqlHolders reads the live grants at $1 (the database clock), newest
	// first, and how many there are. The time filter is leakproof, so it
	// runs before the row-level security check, which then costs one
	// function call per live grant, not per lease row.
	sqlHolders = `SELECT ` + statusColumns + `, pg_catalog.count(*) OVER ()
  FROM pgfence.leases l WHERE l.released_at IS NULL AND l.expires_at OPERATOR(pg_catalog.>) $1
 ORDER BY l.granted_at DESC LIMIT $2`
	sqlWaiters = `SELECT w.key, pg_catalog.count(*), pg_catalog.min(w.enqueued_at) FROM pgfence.lease_waiters w
 WHERE w.expires_at OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp() GROUP BY w.key ORDER BY 2 DESC, 1 LIMIT $1`
	sqlRecentRejections = `SELECT r.id, r.resource, r.presented_token, coalesce(r.accepted_token, 0), r.reason,
       coalesce(r.lease_reason, ''), coalesce(r.operation, ''), r.at
  FROM pgfence.fence_rejections r ORDER BY r.id DESC LIMIT $1`
	sqlLeases = `SELECT ` + statusColumns + ` FROM pgfence.leases l WHERE %s ORDER BY l.key LIMIT %d`
	sqlFences = `SELECT f.resource, f.token, f.writes, f.accepted_at FROM pgfence.fences f WHERE %s ORDER BY f.resource LIMIT %d`
	sqlKeys   = `SELECT k.scope, k.key, k.mode, k.status, k.epoch, k.created_at, k.completed_at, k.lease_expires_at,
       coalesce(k.failure_code, '') FROM pgfence.idempotency_keys k WHERE %s ORDER BY k.scope, k.key LIMIT %d`
	sqlElections = `SELECT ` + statusColumns + `, h.terms, h.published, h.last_at
  FROM pgfence.leases l
 CROSS JOIN LATERAL (SELECT pg_catalog.count(*) FILTER (WHERE e.event OPERATOR(pg_catalog.=) ANY ('{acquired,taken_over}')) AS terms,
                            pg_catalog.count(*) FILTER (WHERE e.event OPERATOR(pg_catalog.=) 'info_changed') AS published,
                            pg_catalog.max(e.at) AS last_at
                       FROM pgfence.lease_events e WHERE e.key OPERATOR(pg_catalog.=) l.key) h
 WHERE %s ORDER BY l.key LIMIT %d`
	sqlTasks       = `SELECT t.key, t.id, coalesce(t.seq, 0), t.state, t.attempts, t.enqueued_at, coalesce(t.error, '') FROM pgfence.tasks t WHERE %s ORDER BY t.key, t.id LIMIT %d`
	sqlByteOrdered = `SELECT d.datcollate, coalesce(pg_catalog.to_jsonb(d) OPERATOR(pg_catalog.->>) 'datlocprovider', 'c')
  FROM pg_catalog.pg_database d WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database()`
)

// overviewRows is how many rows each overview section shows.
const overviewRows = 20

// section is one part of a page: its rows, or why they are missing.
type section[T any] struct {
	Rows []T
	Err  string
}

func load[T any](rows []T, err error) section[T] {
	if err != nil {
		return section[T]{Err: err.Error()}
	}
	return section[T]{Rows: rows}
}

type waiter struct {
	Key    string
	Count  int64
	Oldest time.Time
}

type overviewData struct {
	Held       int64 // live grants
	Holders    section[leases.Status]
	Waiters    section[waiter]
	Pauses     section[leases.Pause]
	Rejections section[pgfence.Rejection]
	Abandoned  section[idempotency.KeyState]
	Doctor     bool
	Findings   []Finding
}

func (s *Server) overview(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	var d overviewData
	var now time.Time
	err := s.cfg.Pool.QueryRow(ctx, sqlNow).Scan(&now)
	if err == nil {
		d.Holders = load(collect(ctx, s.cfg.Pool, func(row pgx.CollectableRow) (leases.Status, error) {
			var st statusRow
			err := row.Scan(append(st.dest(), &d.Held)...)
			return st.status(), err
		}, sqlHolders, now, overviewRows))
	} else {
		d.Holders.Err = err.Error()
	}
	d.Waiters = load(collect(ctx, s.cfg.Pool, func(row pgx.CollectableRow) (x waiter, err error) {
		return x, row.Scan(&x.Key, &x.Count, &x.Oldest)
	}, sqlWaiters, overviewRows))
	d.Pauses = load(s.leases.Pauses(ctx))
	d.Rejections = load(collect(ctx, s.cfg.Pool, func(row pgx.CollectableRow) (x pgfence.Rejection, err error) {
		return x, row.Scan(&x.ID, &x.Resource, &x.PresentedToken, &x.AcceptedToken, &x.Reason, &x.LeaseReason, &x.Operation, &x.At)
	}, sqlRecentRejections, overviewRows))
	d.Abandoned = load(s.store.Abandoned(ctx, s.cfg.Pool, &idempotency.RecoverOptions{Limit: overviewRows}))
	if s.cfg.Doctor != nil {
		d.Doctor, d.Findings = true, s.findings(ctx)
	}
	s.render(w, r, http.StatusOK, "overview", "Overview", d)
}

// findings returns the doctor's findings of its last run, nil before the
// first one ended, and starts a run in the background when there is none or
// the last is older than DoctorEvery: its checks read every lease row, and no
// page waits for them (a page's own queries stay short at any table size).
func (s *Server) findings(ctx context.Context) []Finding {
	s.doctor.Lock()
	defer s.doctor.Unlock()
	if !s.doctor.running && (s.doctor.findings == nil || time.Since(s.doctor.at) > s.cfg.DoctorEvery) {
		s.doctor.running = true
		s.doctor.wg.Add(1)
		go func() {
			defer s.doctor.wg.Done()
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
			defer cancel()
			f := s.cfg.Doctor(dctx)
			s.doctor.Lock()
			s.doctor.findings, s.doctor.at, s.doctor.running = f, time.Now(), false
			s.doctor.Unlock()
		}()
	}
	return s.doctor.findings
}

type keyData struct {
	Key        string
	Lease      leases.Status
	LeaseErr   string
	Timeline   timeline
	Events     section[item]
	Fence      *pgfence.FenceRecord
	FenceErr   string
	Rejections int
}

// timelineEvents is how much of a key's history the key page shows: about
// what the database keeps (its newest 100 transitions).
const timelineEvents = 100

func (s *Server) key(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	d := keyData{Key: r.URL.Query().Get("k")}
	if err := checkName("key", d.Key, 1); err != nil {
		s.fail(w, r, http.StatusBadRequest, err)
		return
	}
	l, err := s.leases.Get(ctx, d.Key)
	switch {
	case err == nil:
		d.Lease = l
	case !errors.Is(err, pgfence.ErrNotFound):
		d.LeaseErr = err.Error()
	}
	history, herr := s.leases.History(ctx, d.Key, timelineEvents)
	rejections, rerr := pgfence.Rejections(ctx, s.cfg.Pool, d.Key, timelineEvents)
	d.Events = load(merge(history, rejections), errors.Join(herr, rerr))
	var live int64
	if d.Lease.Live {
		live = d.Lease.Token
	}
	d.Timeline = draw(d.Events.Rows, live)
	d.Rejections = len(rejections)
	f, err := pgfence.LookupFence(ctx, s.cfg.Pool, d.Key)
	switch {
	case err == nil:
		d.Fence = &f
	case !errors.Is(err, pgfence.ErrNotFound):
		d.FenceErr = err.Error()
	}
	status := http.StatusOK
	if d.Lease.Key == "" && d.Fence == nil && len(d.Events.Rows) == 0 && d.LeaseErr == "" && d.Events.Err == "" && d.FenceErr == "" {
		status = http.StatusNotFound // nothing this role may see by that name
	}
	s.render(w, r, status, "key", d.Key, d)
}

// A list is one paginated, prefix-filtered page.
type list struct {
	name, title string
	// fetch returns the rows whose names start with prefix and sort after
	// the cursor in q, and the cursor of the last row.
	fetch func(s *Server, ctx context.Context, prefix string, q map[string]string) (rows any, n int, next map[string]string, err error)
	// cursor names the query parameters of the keyset.
	cursor []string
}

type listData struct {
	Name, Title, Prefix string
	Rows                any
	Next                string // the next page's URL, "" on the last
	Err                 string
	Scan                bool // the prefix filter cannot use an index here
}

type fenceRow struct {
	Resource   string
	Token      int64
	Writes     int64
	AcceptedAt time.Time
}

type keyRow struct {
	Scope, Key, Mode, Status    string
	Epoch                       int64
	CreatedAt                   time.Time
	CompletedAt, LeaseExpiresAt *time.Time
	FailureCode                 string
}

type electionRow struct {
	leases.Status
	Terms, Values int64
	LastAt        *time.Time
}

type taskRow struct {
	Key        string
	ID, Seq    int64
	State      string
	Attempts   int
	EnqueuedAt time.Time
	Error      string
}

var lists = []list{
	{name: "leases", title: "Leases", cursor: []string{"after"}, fetch: func(s *Server, ctx context.Context, prefix string, q map[string]string) (any, int, map[string]string, error) {
		rows, err := fetchPage(s, ctx, sqlLeases, scanStatus, [][2]string{{"l.key", prefix}}, []string{"l.key"}, q["after"])
		return rows, len(rows), cursorOf(rows, func(x leases.Status) []string { return []string{x.Key} }, "after"), err
	}},
	{name: "fences", title: "Fences", cursor: []string{"after"}, fetch: func(s *Server, ctx context.Context, prefix string, q map[string]string) (any, int, map[string]string, error) {
		rows, err := fetchPage(s, ctx, sqlFences, func(row pgx.CollectableRow) (x fenceRow, err error) {
			return x, row.Scan(&x.Resource, &x.Token, &x.Writes, &x.AcceptedAt)
		}, [][2]string{{"f.resource", prefix}}, []string{"f.resource"}, q["after"])
		return rows, len(rows), cursorOf(rows, func(x fenceRow) []string { return []string{x.Resource} }, "after"), err
	}},
	{name: "keys", title: "Idempotency keys", cursor: []string{"after", "after_key"}, fetch: func(s *Server, ctx context.Context, prefix string, q map[string]string) (any, int, map[string]string, error) {
		after := []any{q["after"], q["after_key"]}
		rows, err := fetchPage(s, ctx, sqlKeys, func(row pgx.CollectableRow) (x keyRow, err error) {
			return x, row.Scan(&x.Scope, &x.Key, &x.Mode, &x.Status, &x.Epoch, &x.CreatedAt, &x.CompletedAt, &x.LeaseExpiresAt, &x.FailureCode)
		}, [][2]string{{"k.scope", prefix}}, []string{"k.scope", "k.key"}, after...)
		return rows, len(rows), cursorOf(rows, func(x keyRow) []string { return []string{x.Scope, x.Key} }, "after", "after_key"), err
	}},
	{name: "elections", title: "Elections", cursor: []string{"after"}, fetch: func(s *Server, ctx context.Context, prefix string, q map[string]string) (any, int, map[string]string, error) {
		rows, err := fetchPage(s, ctx, sqlElections, func(row pgx.CollectableRow) (x electionRow, err error) {
			var st statusRow
			err = row.Scan(append(st.dest(), &x.Terms, &x.Values, &x.LastAt)...)
			x.Status = st.status()
			return x, err
		}, [][2]string{{"l.key", prefix}}, []string{"l.key"}, q["after"])
		return rows, len(rows), cursorOf(rows, func(x electionRow) []string { return []string{x.Key} }, "after"), err
	}},
	{name: "tasks", title: "Ordered tasks", cursor: []string{"after", "after_id"}, fetch: func(s *Server, ctx context.Context, prefix string, q map[string]string) (any, int, map[string]string, error) {
		id, err := strconv.ParseInt(cmp.Or(q["after_id"], "0"), 10, 64)
		if err != nil {
			return nil, 0, nil, fmt.Errorf("after_id %q: not a task id", q["after_id"])
		}
		after := []any{q["after"], id}
		rows, err := fetchPage(s, ctx, sqlTasks, func(row pgx.CollectableRow) (x taskRow, err error) {
			return x, row.Scan(&x.Key, &x.ID, &x.Seq, &x.State, &x.Attempts, &x.EnqueuedAt, &x.Error)
		}, [][2]string{{"t.key", prefix}}, []string{"t.key", "t.id"}, after...)
		return rows, len(rows), cursorOf(rows, func(x taskRow) []string { return []string{x.Key, fmt.Sprint(x.ID)} }, "after", "after_id"), err
	}},
}

func (s *Server) list(l list) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		prefix := r.URL.Query().Get("prefix")
		q := map[string]string{}
		errs := []error{checkName("prefix", prefix, 0)}
		for _, c := range l.cursor {
			q[c] = r.URL.Query().Get(c)
			errs = append(errs, checkName(c, q[c], 0))
		}
		if err := errors.Join(errs...); err != nil {
			s.fail(w, r, http.StatusBadRequest, err)
			return
		}
		d := listData{Name: l.name, Title: l.title, Prefix: prefix, Scan: !s.byteOrdered && prefix != ""}
		rows, n, next, err := l.fetch(s, ctx, prefix, q)
		if err != nil {
			d.Err = err.Error()
		}
		d.Rows = rows
		if n == s.cfg.PageSize {
			kv := []string{"prefix", prefix}
			for _, c := range l.cursor {
				kv = append(kv, c, next[c])
			}
			d.Next = query("/"+l.name, kv...)
		}
		s.render(w, r, http.StatusOK, l.name, l.title, d)
	}
}

// fetchPage runs one list statement (see listSQL) and collects its rows.
func fetchPage[T any](s *Server, ctx context.Context, format string, scan pgx.RowToFunc[T], ranges [][2]string, keyset []string, after ...any) ([]T, error) {
	sql, args := s.listSQL(format, ranges, keyset, after...)
	return collect(ctx, s.cfg.Pool, scan, sql, args...)
}

// listSQL completes a list statement: format's %s gets the conditions (each
// column of ranges starts with its prefix; the keyset columns sort after
// after), %d the page size.
func (s *Server) listSQL(format string, ranges [][2]string, keyset []string, after ...any) (string, []any) {
	var args []any
	conds := []string{"true"}
	for _, rg := range ranges {
		conds = append(conds, s.prefixRange(rg[0], rg[1], &args)...)
	}
	if len(after) > 0 && after[0] != "" {
		var cols, params []string
		for i, col := range keyset {
			args = append(args, after[i])
			cols = append(cols, s.collate(col))
			params = append(params, fmt.Sprintf("$%d", len(args)))
		}
		conds = append(conds, fmt.Sprintf("(%s) OPERATOR(pg_catalog.>) (%s)", strings.Join(cols, ", "), strings.Join(params, ", ")))
	}
	return fmt.Sprintf(format, strings.Join(conds, " AND "), s.cfg.PageSize), args
}

// prefixRange returns the conditions that col starts with prefix, as a
// range: col >= prefix AND col < the least string above every string that
// starts with prefix. Under a byte-ordered default collation the column's
// index serves it; under another the range is taken in the C collation
// (correct, but the index does not serve it).
func (s *Server) prefixRange(col, prefix string, args *[]any) []string {
	if prefix == "" {
		return nil
	}
	*args = append(*args, prefix)
	out := []string{fmt.Sprintf("%s OPERATOR(pg_catalog.>=) $%d::text", s.collate(col), len(*args))}
	if up, ok := upper(prefix); ok {
		*args = append(*args, up)
		out = append(out, fmt.Sprintf("%s OPERATOR(pg_catalog.<) $%d::text", s.collate(col), len(*args)))
	}
	return out
}

func (s *Server) collate(col string) string {
	if s.byteOrdered {
		return col
	}
	return col + ` COLLATE pg_catalog."C"`
}

// upper returns the least string greater than every string that starts with
// p, in code point (UTF-8 byte) order, and false when there is none.
func upper(p string) (string, bool) {
	r := []rune(p)
	for i := len(r) - 1; i >= 0; i-- {
		if r[i] < utf8.MaxRune {
			n := r[i] + 1
			if n >= 0xD800 && n <= 0xDFFF { // surrogates are not characters
				n = 0xE000
			}
			return string(r[:i]) + string(n), true
		}
	}
	return "", false
}

// cursorOf returns the keyset cursor of the last row.
func cursorOf[T any](rows []T, key func(T) []string, names ...string) map[string]string {
	out := map[string]string{}
	if len(rows) == 0 {
		return out
	}
	for i, v := range key(rows[len(rows)-1]) {
		out[names[i]] = v
	}
	return out
}

// checkName refuses a name no key, scope or prefix can have.
func checkName(what, s string, min int) error {
	if len(s) < min || len(s) > leases.MaxKeyBytes || !utf8.ValidString(s) || strings.IndexByte(s, 0) >= 0 {
		return fmt.Errorf("%s %q: must be %d to %d bytes of UTF-8 without NUL", what, s, min, leases.MaxKeyBytes)
	}
	return nil
}

func collect[T any](ctx context.Context, pool *pgxpool.Pool, scan pgx.RowToFunc[T], sql string, args ...any) ([]T, error) {
	rows, _ := pool.Query(ctx, sql, args...)
	return pgx.CollectRows(rows, scan)
}

// byteOrdered reports whether the database's default collation sorts by
// code point (C, POSIX, C.UTF-8 of libc), so that a range on a key is a
// prefix filter its index can serve.
func byteOrdered(ctx context.Context, pool *pgxpool.Pool) (bool, error) {
	var collate, provider string
	if err := pool.QueryRow(ctx, sqlByteOrdered).Scan(&collate, &provider); err != nil {
		return false, err
	}
	c := strings.ToLower(strings.ReplaceAll(collate, "-", ""))
	return provider == "c" && (c == "c" || c == "posix" || c == "c.utf8"), nil
}

// statusRow scans statusColumns into a leases.Status.
type statusRow struct {
	leases.Status
	renewed, released *time.Time
}

func (r *statusRow) dest() []any {
	return []any{&r.Key, &r.Holder, &r.Token, &r.GrantedAt, &r.renewed, &r.ExpiresAt, &r.released, &r.HolderInfo, &r.Live, &r.Remaining}
}

func (r *statusRow) status() leases.Status {
	st := r.Status
	if r.renewed != nil {
		st.RenewedAt = *r.renewed
	}
	if r.released != nil {
		st.ReleasedAt = *r.released
	}
	return st
}

func scanStatus(row pgx.CollectableRow) (leases.Status, error) {
	var r statusRow
	err := row.Scan(r.dest()...)
	return r.status(), err
}

// item is one entry of a key's timeline: a lease event or a rejected write.
type item struct {
	Seq      int // its place in the timeline, from 1
	At       time.Time
	Kind     string // the event, or "rejected"
	Token    int64
	Holder   string
	Detail   string
	Rejected bool
}

// merge orders a key's events and rejections by database time.
func merge(history []leases.Event, rejections []pgfence.Rejection) []item {
	var out []item
	for i := len(history) - 1; i >= 0; i-- { // oldest first
		e := history[i]
		var parts []string
		if e.HolderInfo != "" {
			parts = append(parts, "holder info: "+e.HolderInfo)
		}
		if e.Reason != "" {
			parts = append(parts, "reason: "+e.Reason)
		}
		detail := strings.Join(parts, "; ")
		out = append(out, item{At: e.At, Kind: e.Kind, Token: e.Token, Holder: e.Holder, Detail: detail})
	}
	for _, r := range rejections {
		detail := r.Reason
		if r.LeaseReason != "" {
			detail += " (" + r.LeaseReason + ")"
		}
		if r.AcceptedToken != 0 {
			detail += fmt.Sprintf(", accepted token %d", r.AcceptedToken)
		}
		if r.Operation != "" {
			detail += ", " + r.Operation
		}
		out = append(out, item{At: r.At, Kind: "rejected", Token: r.PresentedToken, Detail: detail, Rejected: true})
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].At.Before(out[j].At) })
	for i := range out {
		out[i].Seq = i + 1
	}
	return out
}
