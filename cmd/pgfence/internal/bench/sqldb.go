package bench

import (
	"context"
	"database/sql"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/lib/pq"

	"github.com/pgfence/pgfence/cmd/pgfence/internal/benchrun"
	"github.com/pgfence/pgfence/pgfence"
)

// sqlCases are the fenced write on database/sql (pgfence.ExecSQL) and the
// same unfenced UPDATE through the same driver, on pgx's stdlib driver and on
// lib/pq: their ratio is the cost of the fence for a service whose handle is
// a *sql.DB, to set beside fenced-update / raw-update on pgx.
func sqlCases() []*Case {
	unfenced := func(ctx context.Context, db *sql.DB, _ int64, id int) error {
		_, err := db.ExecContext(ctx, sqlUpdate, id)
		return err
	}
	fenced := func(ctx context.Context, db *sql.DB, token int64, id int) error {
		_, err := pgfence.ExecSQL(ctx, db, pgfence.LeaseOf("bench/"+strconv.Itoa(id), "", token), sqlUpdate, id)
		return err
	}
	return []*Case{
		{Name: "sql-raw-update", Group: "database/sql", What: "the UPDATE of raw-update on a *sql.DB (pgx's stdlib driver), unfenced (1 statement, 1 commit)",
			prepare: prepareSQL(openStdlib, unfenced)},
		{Name: "sql-fenced-update", Group: "database/sql", What: "pgfence.ExecSQL on the same *sql.DB: the same UPDATE fenced by a token, one pipeline (one round trip)",
			prepare: prepareSQL(openStdlib, fenced)},
		{Name: "pq-raw-update", Group: "database/sql", What: "the UPDATE of raw-update on a *sql.DB of lib/pq, unfenced (prepared and run: two round trips)",
			prepare: prepareSQL(openLibPQ, unfenced)},
		{Name: "pq-fenced-update", Group: "database/sql", What: "pgfence.ExecSQL on the same lib/pq *sql.DB: BEGIN, the fence, the UPDATE, COMMIT (lib/pq cannot pipeline)",
			prepare: prepareSQL(openLibPQ, fenced)},
	}
}

// openStdlib opens a *sql.DB on the lab's database through pgx's stdlib
// driver, its statements counted by the lab's tracer.
func openStdlib(lab *Lab) (*sql.DB, error) {
	cfg, err := pgx.ParseConfig(lab.url)
	if err != nil {
		return nil, err
	}
	cfg.Tracer = lab.stmts
	return stdlib.OpenDB(*cfg), nil
}

// openLibPQ opens a *sql.DB on the lab's database through lib/pq, its
// statements counted by a dialer that reads what the connections send.
func openLibPQ(lab *Lab) (*sql.DB, error) {
	c, err := pq.NewConnector(lab.url)
	if err != nil {
		return nil, err
	}
	c.Dialer(pqCounter{n: lab.stmts})
	return sql.OpenDB(c), nil
}

// prepareSQL opens a *sql.DB with open, with as many connections as workers
// (idle ones kept, as a service's pool keeps them), fences every bench
// resource (fenceAll: both cases of a pair run on the same state), and
// measures write on a random row.
func prepareSQL(open func(*Lab) (*sql.DB, error), write func(ctx context.Context, db *sql.DB, token int64, id int) error) func(context.Context, *Lab, int) (benchrun.Op, func(), error) {
	return func(ctx context.Context, lab *Lab, n int) (benchrun.Op, func(), error) {
		db, err := open(lab)
		if err != nil {
			return nil, nil, err
		}
		db.SetMaxOpenConns(n)
		db.SetMaxIdleConns(n)
		token, err := fenceAll(ctx, lab)
		if err != nil {
			_ = db.Close()
			return nil, nil, err
		}
		return func(ctx context.Context, w *benchrun.Worker) (time.Duration, error) {
			return 0, write(ctx, db, token, w.Key())
		}, func() { _ = db.Close() }, nil
	}
}
