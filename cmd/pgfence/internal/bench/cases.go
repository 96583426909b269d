package bench

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfence/pgfence/cmd/pgfence/internal/benchrun"
	"github.com/pgfence/pgfence/idempotency"
	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence"
)

// Every statement of the lab names its functions, operators and types with
// their schema (pg_catalog.clock_timestamp(), OPERATOR(pg_catalog.=),
// pg_catalog.text): a session's search_path cannot change what runs, and the
// plans, so the costs, are those of the unqualified SQL.

// benchSchema holds the business tables the cases write to, and the lock table
// of the hand-written floor. It is dropped when the bench ends.
const benchSchema = `
	DROP SCHEMA IF EXISTS pgfence_bench CASCADE;
	CREATE SCHEMA pgfence_bench;
	CREATE TABLE pgfence_bench.stock (id int PRIMARY KEY, qty bigint NOT NULL, fence bigint);
	INSERT INTO pgfence_bench.stock SELECT g, 0 FROM pg_catalog.generate_series(0, 99999) g;
	CREATE TABLE pgfence_bench.orders (id bigserial PRIMARY KEY, item int NOT NULL);
	CREATE TABLE pgfence_bench.locks (key pg_catalog.text PRIMARY KEY, holder pg_catalog.uuid NOT NULL, token bigint NOT NULL,
	    expires_at timestamp with time zone NOT NULL);
	CREATE TABLE pgfence_bench.fences (resource pg_catalog.text PRIMARY KEY, token bigint NOT NULL, op pg_catalog.uuid) WITH (fillfactor = 50);
	CREATE TABLE pgfence_bench.keys (scope pg_catalog.text, key pg_catalog.text, fingerprint pg_catalog.bytea NOT NULL,
	    status pg_catalog.text NOT NULL, result pg_catalog.bytea, expires_at timestamp with time zone, PRIMARY KEY (scope, key));
	CREATE INDEX ON pgfence_bench.keys (expires_at);
	INSERT INTO pgfence_bench.fences SELECT 'bench/' OPERATOR(pg_catalog.||) g, 1 FROM pg_catalog.generate_series(0, 99999) g;
	CREATE TABLE pgfence_bench.curve_fences (LIKE pgfence_bench.fences INCLUDING ALL) WITH (fillfactor = 50);
	ANALYZE pgfence_bench.stock;
	ANALYZE pgfence_bench.fences`

// The SQL of the raw cases: what a team writes by hand without pgfence.
const (
	// The floor of the lock rows: an inline upsert that takes a free or
	// expired lock (its WHERE runs after the row lock) and a release that only
	// the holder's grant can do. Both commit durably.
	sqlFloorAcquire = `INSERT INTO pgfence_bench.locks AS l (key, holder, token, expires_at)
		VALUES ($1, $2, 1, pg_catalog.clock_timestamp() OPERATOR(pg_catalog.+) interval '30 seconds')
		ON CONFLICT (key) DO UPDATE SET holder = excluded.holder, token = l.token OPERATOR(pg_catalog.+) 1, expires_at = excluded.expires_at
		WHERE l.expires_at OPERATOR(pg_catalog.<=) pg_catalog.clock_timestamp()
		RETURNING token`
	sqlFloorRelease = `UPDATE pgfence_bench.locks SET expires_at = pg_catalog.clock_timestamp()
		WHERE key OPERATOR(pg_catalog.=) $1 AND holder OPERATOR(pg_catalog.=) $2 AND token OPERATOR(pg_catalog.=) $3`
	sqlUpdate = `UPDATE pgfence_bench.stock SET qty = qty OPERATOR(pg_catalog.+) 1 WHERE id OPERATOR(pg_catalog.=) $1`
	// A versioned row write (the SQL pattern of pgfence's README): stock row
	// $1 carries its own token in column fence, and takes qty $3 with token
	// $2 unless its token is newer.
	sqlVersionedUpdate = `UPDATE pgfence_bench.stock SET qty = $3, fence = $2
		WHERE id OPERATOR(pg_catalog.=) $1 AND (fence IS NULL OR fence OPERATOR(pg_catalog.<=) $2)`
	// The floor of a fence that records each write: a hand-written fence row
	// update (token check, operation id), sent with sqlUpdate in one batch.
	sqlFenceRow = `UPDATE pgfence_bench.fences SET token = $2, op = $3
		WHERE resource OPERATOR(pg_catalog.=) $1 AND token OPERATOR(pg_catalog.<=) $2`
	// sqlCurveFenceRow is sqlFenceRow on the fence rows of the curves, which
	// hold only the curve's resources.
	sqlCurveFenceRow = `UPDATE pgfence_bench.curve_fences SET token = $2, op = $3
		WHERE resource OPERATOR(pg_catalog.=) $1 AND token OPERATOR(pg_catalog.<=) $2`
	// The protected table of protected-update: the same rows as stock, keyed
	// by the text of the resource's suffix.
	sqlGuardedTable = `CREATE TABLE pgfence_bench.guarded (sku pg_catalog.text PRIMARY KEY, qty bigint NOT NULL);
	INSERT INTO pgfence_bench.guarded SELECT g::pg_catalog.text, 0 FROM pg_catalog.generate_series(0, 99999) g;
	ANALYZE pgfence_bench.guarded;
	SELECT pgfence.protect('pgfence_bench.guarded', 'sku', 'bench/')`
	sqlGuardedUpdate = `UPDATE pgfence_bench.guarded SET qty = qty OPERATOR(pg_catalog.+) 1 WHERE sku OPERATOR(pg_catalog.=) $1`
	sqlGuardedDrop   = `SELECT pgfence.unprotect('pgfence_bench.guarded'); DROP TABLE pgfence_bench.guarded`
	sqlInsert        = `INSERT INTO pgfence_bench.orders (item) VALUES ($1)`
	// sqlIssueAll records that each bench resource's lease issued token $1, as
	// one long-held grant of it would have: a fenced write presents only
	// tokens its resource's lease issued. The lab writes pgfence.leases
	// directly on purpose, as the curves load their rows.
	sqlIssueAll = `INSERT INTO pgfence.leases AS l (key, holder, token, granted_at, expires_at, released_at)
  SELECT 'bench/' OPERATOR(pg_catalog.||) g, pg_catalog.gen_random_uuid(), $1, t, t, t
    FROM pg_catalog.generate_series(0, 99999) g, (SELECT pg_catalog.clock_timestamp() AS t) c
  ON CONFLICT (key) DO UPDATE SET token = GREATEST(l.token, excluded.token)`
	// sqlFenceAll fences each bench resource that has no fence row yet.
	sqlFenceAll = `SELECT pg_catalog.count(pgfence.fence('bench/' OPERATOR(pg_catalog.||) g, $1))
  FROM pg_catalog.generate_series(0, 99999) g
 WHERE NOT EXISTS (SELECT 1 FROM pgfence.fences f WHERE f.resource OPERATOR(pg_catalog.=) ('bench/' OPERATOR(pg_catalog.||) g))`
	sqlRawAcquire = `SELECT acquired, holder::pg_catalog.text, token FROM pgfence.try_acquire($1, interval '30 seconds')`
	sqlRawRelease = `SELECT pgfence.release($1, $2::pg_catalog.uuid, $3, false)`
	sqlAdvisory   = `SELECT pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtext($1))`
	sqlNextToken  = `SELECT pgfence.next_token(NULL)`
)

// firstWrites is how many never-written resources a first-write case
// prepares per run: more than two cores write in one run.
const firstWrites = 100000

// sqlIssueFirst issues token $2 for $3 fresh lease keys named $1 || n (a
// released grant each, as sqlIssueAll), so that their resources can be fenced.
const sqlIssueFirst = `INSERT INTO pgfence.leases (key, holder, token, granted_at, expires_at, released_at)
  SELECT $1 OPERATOR(pg_catalog.||) g, pg_catalog.gen_random_uuid(), $2, t, t, t
    FROM pg_catalog.generate_series(0, $3::int - 1) g, (SELECT pg_catalog.clock_timestamp() AS t) c`

// sqlFenceFirst is the hand-written floor of a resource's first fenced
// write: the fence row's upsert, refusing a lower token.
const sqlFenceFirst = `INSERT INTO pgfence_bench.fences AS f (resource, token, op) VALUES ($1, $2, $3)
  ON CONFLICT (resource) DO UPDATE SET token = excluded.token, op = excluded.op
  WHERE f.token OPERATOR(pg_catalog.<=) excluded.token`

// The hand-written floor of an atomic idempotency key: a key row claimed in
// the message that begins the transaction (a duplicate waits on the
// primary key, then finds the row), and completed with its result, an
// expiry for retention, in the message that commits.
const (
	sqlKeyClaim = `INSERT INTO pgfence_bench.keys (scope, key, fingerprint, status) VALUES ('bench', $1, $2, 'in_progress')
  ON CONFLICT DO NOTHING`
	sqlKeyComplete = `UPDATE pgfence_bench.keys SET status = 'completed', result = $2,
  expires_at = pg_catalog.clock_timestamp() OPERATOR(pg_catalog.+) interval '1 day'
  WHERE scope OPERATOR(pg_catalog.=) 'bench' AND key OPERATOR(pg_catalog.=) $1`
)

// firstRun numbers the runs of the first-write cases: each run writes
// resources no run wrote before.
var firstRun atomic.Int64

// firstNames returns a prefix no earlier run used and a function handing out
// its resources in turn, each once; it fails when firstWrites are used up.
func firstNames(kind string) (string, func() (string, error)) {
	prefix := fmt.Sprintf("first/%s/%d/", kind, firstRun.Add(1))
	var next atomic.Int64
	return prefix, func() (string, error) {
		n := next.Add(1) - 1
		if n >= firstWrites {
			return "", fmt.Errorf("the run wrote all %d fresh resources it prepared", firstWrites)
		}
		return prefix + strconv.FormatInt(n, 10), nil
	}
}

// prepareProtected protects pgfence_bench.guarded (resource "bench/" || sku)
// and fences each write to it as fenced-update does; the cleanup removes the
// guard and the table.
func prepareProtected(ctx context.Context, lab *Lab, _ int) (benchrun.Op, func(), error) {
	var token int64
	if err := lab.pool.QueryRow(ctx, sqlNextToken).Scan(&token); err != nil {
		return nil, nil, err
	}
	for _, sql := range []string{sqlGuardedTable, sqlIssueAll, sqlFenceAll} {
		var args []any
		if sql != sqlGuardedTable {
			args = append(args, token)
		}
		if _, err := lab.pool.Exec(ctx, sql, args...); err != nil {
			return nil, nil, err
		}
	}
	cleanup := func() {
		ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
		defer cancel()
		_, _ = lab.pool.Exec(ctx, sqlGuardedDrop)
	}
	return func(ctx context.Context, w *benchrun.Worker) (time.Duration, error) {
		id := w.Key()
		_, err := pgfence.Exec(ctx, lab.pool, pgfence.LeaseOf("bench/"+strconv.Itoa(id), "", token), sqlGuardedUpdate, strconv.Itoa(id))
		return 0, err
	}, cleanup, nil
}

// Case is one row of the bench table.
type Case struct {
	// Name names the case in --cases and in the report.
	Name string
	// Group is the kind of work: lock, hot key, fenced write, lease-checked
	// write, idempotency.
	Group string
	// What says what one operation does.
	What string
	// peer, when set, is the Redis peer's mode: the case runs in the peer
	// process, not here.
	peer string
	// prepare returns the operation for one measurement with n workers, and a
	// cleanup to run after it.
	prepare func(ctx context.Context, lab *Lab, n int) (benchrun.Op, func(), error)
}

// simple makes a prepare function of an operation that needs no state per
// measurement.
func simple(op func(ctx context.Context, lab *Lab, w *benchrun.Worker) error) func(context.Context, *Lab, int) (benchrun.Op, func(), error) {
	return func(_ context.Context, lab *Lab, _ int) (benchrun.Op, func(), error) {
		return func(ctx context.Context, w *benchrun.Worker) (time.Duration, error) {
			return 0, op(ctx, lab, w)
		}, func() {}, nil
	}
}

func benchKey(w *benchrun.Worker) string { return "bench/" + strconv.Itoa(w.Key()) }

// randomUUID returns a random UUID (version 4) from the worker's source.
func randomUUID(w *benchrun.Worker) string {
	hi, lo := w.Rand.Uint64(), w.Rand.Uint64()
	hi = hi&^0xf000 | 0x4000
	lo = lo&^(0xc<<60) | 0x8<<60
	return fmt.Sprintf("%08x-%04x-%04x-%04x-%012x", hi>>32, hi>>16&0xffff, hi&0xffff, lo>>48, lo&0xffffffffffff)
}

// Peer tells whether the case runs in the Redis peer, not on PostgreSQL.
func (c *Case) Peer() bool { return c.peer != "" }

// Cases returns every case, in the order of the table: lock + unlock
// (pgfence, raw SQL, advisory locks, Redis), the hot key, fenced and
// lease-checked writes, idempotency, and the fenced write on database/sql.
func Cases() []*Case {
	return slices.Concat(baseCases(), httpCases(), []*Case{
		{Name: "replay", Group: "idempotency", What: "idempotency.Store.Do with a key already done (random out of 1000): the stored result, nothing executed",
			prepare: prepareReplay},
	}, sqlCases())
}

// fenceAll draws one token and makes it the accepted token of every bench
// resource: the token of a single long-held grant per resource, which never
// goes backwards (equal tokens pass). Every resource is fenced before the
// clock starts, as every stock row was written before: both sides of a
// comparison update a row that exists. (A resource's first fenced write
// inserts its fence row; the fenced-write-vs-resources curve measures that.)
func fenceAll(ctx context.Context, lab *Lab) (int64, error) {
	var token int64
	if err := lab.pool.QueryRow(ctx, sqlNextToken).Scan(&token); err != nil {
		return 0, err
	}
	if _, err := lab.pool.Exec(ctx, sqlIssueAll, token); err != nil {
		return 0, err
	}
	if _, err := lab.pool.Exec(ctx, sqlFenceAll, token); err != nil {
		return 0, err
	}
	return token, nil
}

func baseCases() []*Case {
	return []*Case{
		{Name: "raw-lock-upsert", Group: "lock", What: "the floor: a hand-written inline-upsert acquire + conditional release over pgx (2 durable commits)",
			prepare: simple(func(ctx context.Context, lab *Lab, w *benchrun.Worker) error {
				return floorLockCycle(ctx, lab, benchKey(w), randomUUID(w))
			})},
		{Name: "raw-lease", Group: "lock", What: "pgfence.try_acquire + pgfence.release sent as raw SQL over pgx (the SQL API without the Go client)",
			prepare: simple(func(ctx context.Context, lab *Lab, w *benchrun.Worker) error {
				k := benchKey(w)
				var ok bool
				var holder *string // NULL when the key is held
				var tok *int64
				if err := lab.pool.QueryRow(ctx, sqlRawAcquire, k).Scan(&ok, &holder, &tok); err != nil {
					return err
				}
				if !ok {
					return benchrun.ErrHeld
				}
				_, err := lab.pool.Exec(ctx, sqlRawRelease, k, holder, tok)
				return err
			})},
		{Name: "leases", Group: "lock", What: "leases.Client TryAcquire + Lease.Release (the library; the release commits with synchronous_commit=off by default)",
			prepare: prepareLeases(leases.Config{DisableWakeups: true})},
		{Name: "leases-service", Group: "lock", What: "the leases case as a service role (pgfence_app, granted the prefix bench/): what checking the prefix grants costs",
			prepare: prepareService},
		{Name: "advisory-lock", Group: "lock", What: "pg_advisory_xact_lock in a transaction: what teams use today (not durable, no token, no expiry)",
			prepare: simple(func(ctx context.Context, lab *Lab, w *benchrun.Worker) error {
				return pgx.BeginFunc(ctx, lab.pool, func(tx pgx.Tx) error {
					_, err := tx.Exec(ctx, sqlAdvisory, benchKey(w))
					return err
				})
			})},
		{Name: "redis-durable", Group: "lock", peer: "durable", What: "Redis peer: redsync SET NX PX + compare-and-delete script, appendonly yes + appendfsync always"},
		{Name: "redis-memory", Group: "lock", peer: "memory", What: "Redis peer: redsync SET NX PX + compare-and-delete script, no persistence"},
		{Name: "hot-key", Group: "hot key", What: "N waiters (one leases.Client each, wake-ups on) take turns on one key; latency = hand-off, from Release called to the next grant",
			prepare: prepareHotKey},
		{Name: "notify-floor", Group: "hot key", What: "the floor of any LISTEN wake-up: N idle sessions LISTEN (one per hot-key waiter) and one NOTIFY at a time goes to a channel none of them listens to; latency = that NOTIFY",
			prepare: prepareNotifyFloor},
		{Name: "raw-update", Group: "fenced write", What: "UPDATE of one row, unfenced (1 statement, 1 commit)",
			prepare: simple(func(ctx context.Context, lab *Lab, w *benchrun.Worker) error {
				_, err := lab.pool.Exec(ctx, sqlUpdate, w.Key())
				return err
			})},
		{Name: "raw-fence-row", Group: "fenced write", What: "the same UPDATE plus a hand-written fence row UPDATE (token check, operation id) in one batch: the floor of any fence that records its writes",
			prepare: simple(func(ctx context.Context, lab *Lab, w *benchrun.Worker) error {
				id := w.Key()
				return floorFencedWrite(ctx, lab, sqlFenceRow, "bench/"+strconv.Itoa(id), id, randomUUID(w))
			})},
		{Name: "fenced-update", Group: "fenced write", What: "pgfence.Exec: the same UPDATE fenced by a token, one round trip",
			prepare: func(ctx context.Context, lab *Lab, _ int) (benchrun.Op, func(), error) {
				token, err := fenceAll(ctx, lab)
				if err != nil {
					return nil, nil, err
				}
				return func(ctx context.Context, w *benchrun.Worker) (time.Duration, error) {
					id := w.Key()
					_, err := pgfence.Exec(ctx, lab.pool, pgfence.LeaseOf("bench/"+strconv.Itoa(id), "", token), sqlUpdate, id)
					return 0, err
				}, func() {}, nil
			}},
		{Name: "raw-fence-first", Group: "first fenced write", What: "the floor of a resource's first fenced write: a hand-written fence row INSERT … ON CONFLICT plus the same UPDATE, in one batch",
			prepare: func(ctx context.Context, lab *Lab, _ int) (benchrun.Op, func(), error) {
				_, next := firstNames("raw")
				return func(ctx context.Context, w *benchrun.Worker) (time.Duration, error) {
					resource, err := next()
					if err != nil {
						return 0, err
					}
					batch := &pgx.Batch{}
					batch.Queue(sqlFenceFirst, resource, 2, randomUUID(w))
					batch.Queue(sqlUpdate, w.Key())
					br := lab.pool.SendBatch(ctx, batch)
					tag, err := br.Exec()
					if err == nil && tag.RowsAffected() != 1 {
						err = fmt.Errorf("the first fence row of %s was refused", resource)
					}
					if cerr := br.Close(); err == nil {
						err = cerr
					}
					return 0, err
				}, func() {}, nil
			}},
		{Name: "fenced-first", Group: "first fenced write", What: "pgfence.Exec of the same UPDATE on a resource never fenced before: its fence row is inserted",
			prepare: func(ctx context.Context, lab *Lab, _ int) (benchrun.Op, func(), error) {
				var token int64
				if err := lab.pool.QueryRow(ctx, sqlNextToken).Scan(&token); err != nil {
					return nil, nil, err
				}
				prefix, next := firstNames("pgfence")
				if _, err := lab.pool.Exec(ctx, sqlIssueFirst, prefix, token, firstWrites); err != nil {
					return nil, nil, err
				}
				return func(ctx context.Context, w *benchrun.Worker) (time.Duration, error) {
					resource, err := next()
					if err != nil {
						return 0, err
					}
					_, err = pgfence.Exec(ctx, lab.pool, pgfence.LeaseOf(resource, "", token), sqlUpdate, w.Key())
					return 0, err
				}, func() {}, nil
			}},
		{Name: "protected-update", Group: "fenced write", What: "pgfence.Exec of the same UPDATE on a table protected by pgfence.protect: its trigger checks the fence of the row's resource",
			prepare: prepareProtected},
		{Name: "versioned-update", Group: "fenced write", What: "a versioned row, written by hand: the row carries its own token (column fence); one UPDATE sets qty where the row's token is not newer",
			prepare: func(ctx context.Context, lab *Lab, _ int) (benchrun.Op, func(), error) {
				var token int64
				if err := lab.pool.QueryRow(ctx, sqlNextToken).Scan(&token); err != nil {
					return nil, nil, err
				}
				return func(ctx context.Context, w *benchrun.Worker) (time.Duration, error) {
					tag, err := lab.pool.Exec(ctx, sqlVersionedUpdate, w.Key(), token, w.Rand.Int64())
					if err == nil && tag.RowsAffected() != 1 {
						err = fmt.Errorf("the versioned write of stock row %d was refused", w.Key())
					}
					return 0, err
				}, func() {}, nil
			}},
		{Name: "leased-exec", Group: "lease-checked write", What: "pgfence.Exec of pgfence.Checked(lease): the same UPDATE checked against the worker's live lease, one round trip",
			prepare: prepareLeased(func(ctx context.Context, lab *Lab, l pgfence.Lease, id int) error {
				_, err := pgfence.Exec(ctx, lab.pool, pgfence.Checked(l), sqlUpdate, id)
				return err
			})},
		{Name: "leased-write", Group: "lease-checked write", What: "pgfence.Write of pgfence.Checked(lease): a transaction that checks the lease, runs the same UPDATE and commits",
			prepare: prepareLeased(func(ctx context.Context, lab *Lab, l pgfence.Lease, id int) error {
				_, err := pgfence.Write(ctx, lab.pool, pgfence.Checked(l), func(ctx context.Context, tx pgx.Tx) error {
					_, err := tx.Exec(ctx, sqlUpdate, id)
					return err
				})
				return err
			})},
		{Name: "raw-insert-tx", Group: "idempotency", What: "a transaction inserting one order row (1 commit)",
			prepare: simple(func(ctx context.Context, lab *Lab, w *benchrun.Worker) error {
				return pgx.BeginFunc(ctx, lab.pool, func(tx pgx.Tx) error {
					_, err := tx.Exec(ctx, sqlInsert, w.Key())
					return err
				})
			})},
		{Name: "raw-idempotent-tx", Group: "idempotency", What: "the same insert under a new key, hand-written: key row claimed with BEGIN, completed with COMMIT (3 round trips)",
			prepare: func(_ context.Context, lab *Lab, _ int) (benchrun.Op, func(), error) {
				var seq atomic.Int64
				run := strconv.FormatInt(time.Now().UnixNano(), 36)
				return func(ctx context.Context, w *benchrun.Worker) (time.Duration, error) {
					return 0, rawInsertOnce(ctx, lab, run+"/"+strconv.FormatInt(seq.Add(1), 10), w.Key())
				}, func() {}, nil
			}},
		{Name: "idempotent-tx", Group: "idempotency", What: "idempotency.Store.Do: the same insert under a new key, result stored atomically",
			prepare: func(_ context.Context, lab *Lab, _ int) (benchrun.Op, func(), error) {
				store, err := idempotency.NewStore(nil)
				if err != nil {
					return nil, nil, err
				}
				var seq atomic.Int64
				run := strconv.FormatInt(time.Now().UnixNano(), 36) // new keys in every run and measurement
				return func(ctx context.Context, w *benchrun.Worker) (time.Duration, error) {
					_, err := insertOnce(ctx, lab, store, run+"/"+strconv.FormatInt(seq.Add(1), 10), w.Key())
					return 0, err
				}, func() {}, nil
			}},
	}
}

// insertOnce inserts one order under the idempotency key (scope "bench").
func insertOnce(ctx context.Context, lab *Lab, store *idempotency.Store, key string, item int) (*idempotency.Outcome, error) {
	return store.Do(ctx, lab.pool, idempotency.Request{Scope: "bench", Key: key}, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		_, err := tx.Exec(ctx, sqlInsert, item)
		return []byte("ok"), err
	})
}

// prepareLeases is the leases cases: a leases.Client with cfg, shared by the
// workers, takes and releases each worker's key.
func prepareLeases(cfg leases.Config) func(context.Context, *Lab, int) (benchrun.Op, func(), error) {
	return func(_ context.Context, lab *Lab, _ int) (benchrun.Op, func(), error) {
		client, err := leases.New(lab.pool, &cfg)
		if err != nil {
			return nil, nil, err
		}
		return leaseCycle(client), func() { client.Close() }, nil
	}
}

// leaseCycle is one operation of the leases cases: client takes the
// worker's key and releases it.
func leaseCycle(client *leases.Client) benchrun.Op {
	return func(ctx context.Context, w *benchrun.Worker) (time.Duration, error) {
		l, err := client.TryAcquire(ctx, benchKey(w), 30*time.Second, nil)
		if errors.Is(err, pgfence.ErrLeaseHeld) {
			return 0, benchrun.ErrHeld
		}
		if err != nil {
			return 0, err
		}
		return 0, l.Release(ctx)
	}
}

// floorLockCycle takes and releases key's lock row the hand-written way (the
// raw-lock-upsert floor): benchrun.ErrHeld when another holder has it.
func floorLockCycle(ctx context.Context, lab *Lab, key, holder string) error {
	var token int64
	err := lab.pool.QueryRow(ctx, sqlFloorAcquire, key, holder).Scan(&token)
	if errors.Is(err, pgx.ErrNoRows) {
		return benchrun.ErrHeld
	}
	if err != nil {
		return err
	}
	tag, err := lab.pool.Exec(ctx, sqlFloorRelease, key, holder, token)
	if err == nil && tag.RowsAffected() != 1 {
		err = fmt.Errorf("release of %s by its holder changed %d rows", key, tag.RowsAffected())
	}
	return err
}

// floorFencedWrite is the raw-fence-row floor: resource's fence row takes
// token 2 (refusing a higher one already there) with fenceRow, in one batch
// with the UPDATE of stock row id.
func floorFencedWrite(ctx context.Context, lab *Lab, fenceRow, resource string, id int, op string) error {
	batch := &pgx.Batch{}
	batch.Queue(fenceRow, resource, 2, op)
	batch.Queue(sqlUpdate, id)
	br := lab.pool.SendBatch(ctx, batch)
	tag, err := br.Exec()
	if err == nil && tag.RowsAffected() != 1 {
		err = fmt.Errorf("the fence row of %s refused token 2", resource)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return err
}

// rawInsertOnce is insertOnce written by hand, in as few round trips as
// the library takes: BEGIN with the claim, the insert, the completion with
// COMMIT. A key someone else holds is an error here: every key is new.
func rawInsertOnce(ctx context.Context, lab *Lab, key string, item int) error {
	conn, err := lab.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release() // the pool closes a connection left in a transaction
	committed := false
	defer func() {
		if !committed {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			_, _ = conn.Exec(rctx, "rollback")
		}
	}()
	fp := sha256.Sum256([]byte(key))
	b := &pgx.Batch{}
	b.Queue("begin")
	claim := b.Queue(sqlKeyClaim, key, fp[:])
	var claimed pgconn.CommandTag
	claim.Exec(func(tag pgconn.CommandTag) error { claimed = tag; return nil })
	if err := conn.SendBatch(ctx, b).Close(); err != nil {
		return err
	}
	if claimed.RowsAffected() != 1 {
		return fmt.Errorf("bench: key %s already claimed", key)
	}
	if _, err := conn.Exec(ctx, sqlInsert, item); err != nil {
		return err
	}
	b = &pgx.Batch{}
	var done, tag pgconn.CommandTag
	b.Queue(sqlKeyComplete, key, []byte("ok")).Exec(func(t pgconn.CommandTag) error { done = t; return nil })
	b.Queue("commit").Exec(func(t pgconn.CommandTag) error { tag = t; return nil })
	if err := conn.SendBatch(ctx, b).Close(); err != nil {
		return err
	}
	if done.RowsAffected() != 1 || tag.String() != "COMMIT" {
		return fmt.Errorf("bench: key %s: completion %q, %q", key, done, tag)
	}
	committed = true
	return nil
}

// replayKeys is how many completed keys the replay case draws from.
const replayKeys = 1000

// prepareReplay completes replayKeys keys once, then measures duplicates: each
// must come back Replayed with the stored result, never run again.
func prepareReplay(ctx context.Context, lab *Lab, _ int) (benchrun.Op, func(), error) {
	store, err := idempotency.NewStore(nil)
	if err != nil {
		return nil, nil, err
	}
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	key := func(i int) string { return run + "/replay/" + strconv.Itoa(i) }
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		loadErr error
	)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; i < replayKeys; i += 8 {
				if _, err := insertOnce(ctx, lab, store, key(i), i); err != nil {
					mu.Lock()
					loadErr = errors.Join(loadErr, err)
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	if loadErr != nil {
		return nil, nil, fmt.Errorf("store the keys to replay: %w", loadErr)
	}
	return func(ctx context.Context, w *benchrun.Worker) (time.Duration, error) {
		o, err := insertOnce(ctx, lab, store, key(w.Rand.IntN(replayKeys)), -1)
		if err != nil {
			return 0, err
		}
		if !o.Replayed || string(o.Result) != "ok" {
			return 0, fmt.Errorf("replay: replayed %v, result %q: not the stored result", o.Replayed, o.Result)
		}
		return 0, nil
	}, func() {}, nil
}

// prepareLeased gives every worker its own lease (taken in the warm-up, long
// enough for the longest --duration) and measures write, on a random row,
// checked against it.
func prepareLeased(write func(ctx context.Context, lab *Lab, l pgfence.Lease, id int) error) func(context.Context, *Lab, int) (benchrun.Op, func(), error) {
	return func(_ context.Context, lab *Lab, n int) (benchrun.Op, func(), error) {
		client, err := leases.New(lab.pool, &leases.Config{DisableWakeups: true})
		if err != nil {
			return nil, nil, err
		}
		held := make([]*leases.Lease, n)
		run := strconv.FormatInt(time.Now().UnixNano(), 36)
		cleanup := func() {
			ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
			defer cancel()
			for _, l := range held {
				if l != nil {
					_ = l.Release(ctx)
				}
			}
			client.Close()
		}
		return func(ctx context.Context, w *benchrun.Worker) (time.Duration, error) {
			l := held[w.ID] // only worker w.ID touches this slot
			if l == nil {
				var err error
				if l, err = client.TryAcquire(ctx, "bench/leased/"+run+"/"+strconv.Itoa(w.ID), 2*MaxDuration, nil); err != nil {
					return 0, err
				}
				held[w.ID] = l
			}
			return 0, write(ctx, lab, l, w.Key())
		}, cleanup, nil
	}
}

// prepareNotifyFloor opens n sessions that LISTEN, as the n clients of
// hot-key do, on a channel nothing is sent to; the workers take turns
// sending a NOTIFY on another channel, and each reports how long its NOTIFY
// took. PostgreSQL up to version 18 signals every session that listens in
// the database on every NOTIFY, whatever the channel: this is what one
// wake-up costs the server before any waiter is told anything.
func prepareNotifyFloor(ctx context.Context, lab *Lab, n int) (benchrun.Op, func(), error) {
	if lab.pooled {
		return nil, nil, fmt.Errorf("%w: LISTEN does not work through a transaction pooler", errSkip)
	}
	conns := make([]*pgx.Conn, 0, n)
	cleanup := func() {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		for _, c := range conns {
			_ = c.Close(cctx)
		}
	}
	for range n {
		c, err := pgx.Connect(ctx, lab.url)
		if err == nil {
			conns = append(conns, c)
			_, err = c.Exec(ctx, `LISTEN pgfence_bench_idle`)
		}
		if err != nil {
			cleanup()
			return nil, nil, err
		}
	}
	var mu sync.Mutex
	return func(ctx context.Context, w *benchrun.Worker) (time.Duration, error) {
		mu.Lock()
		defer mu.Unlock()
		start := time.Now()
		_, err := lab.pool.Exec(ctx, `SELECT pg_catalog.pg_notify('pgfence_bench_wake', '')`)
		return time.Since(start), err
	}, cleanup, nil
}

// prepareHotKey gives each of the n waiters its own client (as n processes
// would have), wake-ups on, and a fresh key. Each grant records the time since
// the previous holder called Release: the hand-off latency.
func prepareHotKey(_ context.Context, lab *Lab, n int) (benchrun.Op, func(), error) {
	clients := make([]*leases.Client, n)
	cleanup := func() {
		for _, c := range clients {
			if c != nil {
				c.Close()
			}
		}
	}
	for i := range clients {
		c, err := leases.New(lab.pool, lab.leasesConfig(nil))
		if err != nil {
			cleanup()
			return nil, nil, err
		}
		clients[i] = c
	}
	key := "bench/hot/" + strconv.FormatInt(time.Now().UnixNano(), 36)
	base := time.Now()
	var released atomic.Int64 // when the last holder called Release, since base; 0: nobody yet
	return func(ctx context.Context, w *benchrun.Worker) (time.Duration, error) {
		l, err := clients[w.ID].Acquire(ctx, key, 30*time.Second, nil)
		if err != nil {
			return 0, err
		}
		now := time.Since(base)
		var handoff time.Duration
		if prev := released.Load(); prev > 0 {
			handoff = now - time.Duration(prev)
		}
		released.Store(int64(time.Since(base)))
		// Released even if the caller's context ends (a grant left behind
		// would block the key for its TTL), but not waited for forever.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), leases.ReleaseTimeoutDefault)
		err = l.Release(rctx)
		cancel()
		if err != nil {
			return 0, err
		}
		return handoff, nil // 0 for the very first grant: its own latency
	}, cleanup, nil
}
