// Package vocabulary checks that pgfence has one error vocabulary: every
// SQLSTATE pgfence's SQL raises, and the PostgreSQL ones it maps, reach the
// caller as the same errors.Is target whichever package returned them,
// through every path that can return them; so do the client-side failures.
package vocabulary

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib"
	_ "github.com/lib/pq"

	"github.com/pgfence/pgfence/idempotency"
	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/leases/job"
	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
	"github.com/pgfence/pgfence/pgfence/pgfencetest/container"
)

func TestMain(m *testing.M) { container.Main(m) }

// targets are the errors.Is target of each SQLSTATE.
var targets = map[string]error{
	"PF001": pgfence.ErrStaleToken,
	"PF002": pgfence.ErrLeaseLost,
	"PF003": pgfence.ErrLeaseHeld,
	"PF004": idempotency.ErrMismatch,
	"PF005": pgfence.ErrNotPrimary,
	"PF006": pgfence.ErrUnfencedWrite,
	"PF007": idempotency.ErrInProgress,
	"PF008": pgfence.ErrInvalid,
	"PF009": pgfence.ErrFloorLowered,
	"PF010": pgfence.ErrIsolation,
	"PF011": pgfence.ErrGrantsPaused,
	"PF012": pgfence.ErrTokenNotIssued,
	"PF013": pgfence.ErrAbandoned,
	"PF014": pgfence.ErrNotGranted,
	"40001": pgfence.ErrIsolation,
	"25006": pgfence.ErrNotPrimary,
	"55P03": pgfence.ErrLockTimeout,
	"57014": pgfence.ErrStatementTimeout,
	"25P03": pgfence.ErrIdleInTransactionTimeout,
}

// The faults: raise_code raises a SQLSTATE in a statement of the caller's;
// inject makes the next write of a pgfence table raise one, inside
// pgfence's own statements (a trigger on the table). It fires once: the
// writes are counted by a sequence, which a rollback does not undo.
const faults = `
CREATE FUNCTION public.raise_code(code text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'injected %', code USING ERRCODE = code; END $$;
CREATE SEQUENCE public.writes;
CREATE TABLE public.injected (code text, at bigint);
CREATE FUNCTION public.raise_injected() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE c text;
BEGIN
    SELECT i.code INTO c FROM public.injected i WHERE i.at = nextval('public.writes');
    IF c IS NOT NULL THEN RAISE EXCEPTION 'injected %', c USING ERRCODE = c; END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER injected BEFORE INSERT OR UPDATE ON pgfence.leases FOR EACH ROW EXECUTE FUNCTION public.raise_injected();
CREATE TRIGGER injected BEFORE INSERT OR UPDATE ON pgfence.fences FOR EACH ROW EXECUTE FUNCTION public.raise_injected();
CREATE TRIGGER injected BEFORE INSERT OR UPDATE ON pgfence.idempotency_keys FOR EACH ROW EXECUTE FUNCTION public.raise_injected();
CREATE TRIGGER injected BEFORE INSERT OR UPDATE ON pgfence.job_slots FOR EACH ROW EXECUTE FUNCTION public.raise_injected();`

func TestOneVocabulary(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	db := pgfencetest.NewDatabase(t)
	if _, err := db.Pool.Exec(ctx, faults); err != nil {
		t.Fatal(err)
	}
	client, err := leases.New(db.Pool, &leases.Config{DisableWakeups: true})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	store, err := idempotency.NewStore(nil)
	if err != nil {
		t.Fatal(err)
	}
	runner, err := job.New(client, "vocabulary/job", &job.Config{AcquireOptions: leases.AcquireOptions{TryOnce: true}})
	if err != nil {
		t.Fatal(err)
	}
	pq, err := sql.Open("postgres", db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer pq.Close()
	std, err := sql.Open("pgx", db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer std.Close()
	pgfencetest.IssueToken(t, db.Pool, "vocabulary/r", 1)
	lease := pgfence.LeaseOf("vocabulary/r", "", 1)
	inject := func(code string) {
		t.Helper()
		if _, err := db.Pool.Exec(ctx, `INSERT INTO public.injected SELECT $1, CASE WHEN is_called THEN last_value + 1 ELSE last_value END FROM public.writes`, code); err != nil {
			t.Fatal(err)
		}
	}
	raise := func(code string) string { return fmt.Sprintf(`SELECT public.raise_code('%s')`, code) }
	n := 0
	key := func() string { n++; return fmt.Sprintf("k%d", n) }

	// Every path that can return a server's error: the caller's own
	// statements inside a helper, and pgfence's statements.
	paths := map[string]func(code string) error{
		"pgfence.MapError": func(c string) error { _, err := db.Pool.Exec(ctx, raise(c)); return pgfence.MapError(err) },
		"pgfence.Exec":     func(c string) error { _, err := pgfence.Exec(ctx, db.Pool, lease, raise(c)); return err },
		"pgfence.Write": func(c string) error {
			_, err := pgfence.Write(ctx, db.Pool, lease, func(ctx context.Context, tx pgx.Tx) error { _, err := tx.Exec(ctx, raise(c)); return err })
			return err
		},
		"pgfence.WriteSQL/lib/pq": func(c string) error {
			_, err := pgfence.WriteSQL(ctx, pq, lease, func(ctx context.Context, tx *sql.Tx) error { _, err := tx.ExecContext(ctx, raise(c)); return err })
			return err
		},
		"pgfence.ExecSQL/stdlib": func(c string) error { _, err := pgfence.ExecSQL(ctx, std, lease, raise(c)); return err },
		"pgfence.Exec (fence)":   func(c string) error { inject(c); _, err := pgfence.Exec(ctx, db.Pool, lease, `SELECT 1`); return err },
		"idempotency.Do": func(c string) error {
			_, err := store.Do(ctx, db.Pool, idempotency.Request{Scope: "v", Key: key()}, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
				_, err := tx.Exec(ctx, raise(c))
				return nil, err
			})
			return err
		},
		"idempotency.DoSQL/lib/pq": func(c string) error {
			_, err := store.DoSQL(ctx, pq, idempotency.Request{Scope: "v", Key: key()}, func(ctx context.Context, tx *sql.Tx) ([]byte, error) {
				_, err := tx.ExecContext(ctx, raise(c))
				return nil, err
			})
			return err
		},
		"idempotency.Do (claim)": func(c string) error {
			inject(c)
			_, err := store.Do(ctx, db.Pool, idempotency.Request{Scope: "v", Key: key()}, func(context.Context, pgx.Tx) ([]byte, error) { return nil, nil })
			return err
		},
		"idempotency.Claim": func(c string) error {
			inject(c)
			_, err := store.Claim(ctx, db.Pool, idempotency.Request{Scope: "v", Key: key()})
			return err
		},
		"leases.TryAcquire": func(c string) error {
			inject(c)
			_, err := client.TryAcquire(ctx, "vocabulary/"+key(), time.Minute, &leases.AcquireOptions{NoKeepAlive: true})
			return err
		},
		"leases.Renew": func(c string) error {
			l, err := client.TryAcquire(ctx, "vocabulary/"+key(), time.Minute, &leases.AcquireOptions{NoKeepAlive: true})
			if err != nil {
				t.Fatal(err)
			}
			inject(c)
			return l.Renew(ctx)
		},
		"job.Runner.Run": func(c string) error {
			_, err := runner.Run(ctx, key(), func(context.Context, *job.Slot) error { inject(c); return nil })
			return err
		},
	}
	for code, target := range targets {
		for name, path := range paths {
			want := target
			switch {
			case name == "leases.TryAcquire" && code == "55P03":
				// A first grant waits at most a moment for another first
				// grant of the key (its index entry) and then answers
				// that the key is being granted: that is what a lock
				// timeout means there.
				want = pgfence.ErrLeaseHeld
			case name == "idempotency.Claim" && code == "55P03":
				// A claim that waited for the key's row longer than its
				// wait answers that the key is in progress: that is what
				// the lock timeout means there.
				want = idempotency.ErrInProgress
			case name == "idempotency.Do (claim)" && (code == "PF004" || code == "PF007" || code == "55P03"),
				name == "idempotency.Claim" && code == "PF010":
				// These answers of the first claim are outcomes the store
				// acts on (a lock timeout in an atomic claim is "in
				// progress" too): it claims again (reading the stored
				// answer, or in a READ COMMITTED transaction of its own),
				// and the injected fault has fired by then.
				continue
			}
			if err := path(code); !errors.Is(err, want) {
				t.Errorf("%s, SQLSTATE %s: %v, want errors.Is %v", name, code, err, want)
			}
			if _, err := db.Pool.Exec(ctx, `DELETE FROM public.injected`); err != nil {
				t.Fatal(err)
			}
		}
	}

	// Client-side failures, the same target from every package.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close()
	down, err := pgxpool.New(ctx, "postgres://u@"+closed+"/db?sslmode=disable&connect_timeout=2")
	if err != nil {
		t.Fatal(err)
	}
	defer down.Close()
	downClient, err := leases.New(down, &leases.Config{DisableWakeups: true})
	if err != nil {
		t.Fatal(err)
	}
	defer downClient.Close()
	fn := func(context.Context, pgx.Tx) ([]byte, error) { return nil, nil }
	for name, err := range map[string]error{
		"pgfence.Exec":        second(pgfence.Exec(ctx, down, lease, `SELECT 1`)),
		"pgfence.Write":       second(pgfence.Write(ctx, down, lease, func(context.Context, pgx.Tx) error { return nil })),
		"idempotency.Do":      second(store.Do(ctx, down, idempotency.Request{Scope: "v", Key: "down"}, fn)),
		"idempotency.Claim":   second(store.Claim(ctx, down, idempotency.Request{Scope: "v", Key: "down"})),
		"leases.TryAcquire":   second(downClient.TryAcquire(ctx, "vocabulary/down", time.Minute, nil)),
		"pgfence.LookupFence": second(pgfence.LookupFence(ctx, down, "vocabulary/r")),
	} {
		if !errors.Is(err, pgfence.ErrUnavailable) || errors.Is(err, pgfence.ErrOutcomeUnknown) {
			t.Errorf("%s on a server that is down: %v, want ErrUnavailable", name, err)
		}
	}
	for name, err := range map[string]error{
		"pgfence.Exec":      second(pgfence.Exec(ctx, db.Pool, pgfence.LeaseOf("", "", 1), `SELECT 1`)),
		"idempotency.Do":    second(store.Do(ctx, db.Pool, idempotency.Request{Scope: "", Key: "k"}, fn)),
		"leases.TryAcquire": second(client.TryAcquire(ctx, "", time.Minute, nil)),
		"job.New":           second(job.New(client, "", nil)),
	} {
		if !errors.Is(err, pgfence.ErrInvalid) {
			t.Errorf("%s with an empty name: %v, want ErrInvalid", name, err)
		}
	}
}

func second[T any](_ T, err error) error { return err }
