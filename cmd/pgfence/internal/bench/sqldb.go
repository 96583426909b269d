package bench

import (
	"context"
	"database/sql"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgfence/pgfence/cmd/pgfence/internal/benchrun"
	"github.com/pgfence/pgfence/pgfence/sqlfence"
)

// sqlCases are the fenced write on database/sql (package sqlfence, over
// pgx's stdlib driver) and the same unfenced UPDATE through the same
// driver: their ratio is the cost of the fence for a service whose handle is
// a *sql.DB, to set beside fenced-update / raw-update on pgx.
func sqlCases() []*Case {
	return []*Case{
		{Name: "sql-raw-update", Group: "database/sql", What: "the UPDATE of raw-update on a *sql.DB (pgx's stdlib driver), unfenced (1 statement, 1 commit)",
			prepare: prepareSQL(func(ctx context.Context, db *sql.DB, _ int64, id int) error {
				_, err := db.ExecContext(ctx, sqlUpdate, id)
				return err
			})},
		{Name: "sql-fenced-update", Group: "database/sql", What: "sqlfence.ExecToken on the same *sql.DB: the same UPDATE fenced by a token, one pipeline (one round trip)",
			prepare: prepareSQL(func(ctx context.Context, db *sql.DB, token int64, id int) error {
				_, err := sqlfence.ExecToken(ctx, db, "bench/"+strconv.Itoa(id), token, sqlUpdate, id)
				return err
			})},
	}
}

// prepareSQL opens a *sql.DB on the lab's database through pgx's stdlib
// driver, with as many connections as workers (idle ones kept, as a
// service's pool keeps them) and the lab's statement counter, fences every
// bench resource (fenceAll: both cases run on the same state), and measures
// write on a random row.
func prepareSQL(write func(ctx context.Context, db *sql.DB, token int64, id int) error) func(context.Context, *Lab, int) (benchrun.Op, func(), error) {
	return func(ctx context.Context, lab *Lab, n int) (benchrun.Op, func(), error) {
		cfg, err := pgx.ParseConfig(lab.db.URL)
		if err != nil {
			return nil, nil, err
		}
		cfg.Tracer = lab.stmts
		db := stdlib.OpenDB(*cfg)
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
