package job

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence"
)

// Limits, checked before any round trip ([pgfence.ErrInvalid] names the
// argument); pgfence.job_slot_begin and pgfence.job_slot_save enforce the
// same for other clients (PF008): a slot name is 1 to 256 bytes, a
// checkpoint at most 64 KiB. The database remembers the newest 1000 slots
// of a job (by start): an older slot counts as never run.
const (
	maxSlotBytes       = 256
	maxCheckpointBytes = 65536
	maxCatchUp         = 999 // periods: the database keeps the newest 1000 slots of a job
	ttlDefault         = 30 * time.Second
)

// Result reports one [Runner.Run].
type Result struct {
	// Slot is the slot's name; also when Run fails, except for a
	// [Runner.RunPeriod] that failed before its lease was granted (its slot
	// is decided by the grant), where it is "".
	Slot string
	// Ran is true when this call ran the slot and recorded its completion,
	// false when the slot had been completed before (by any replica) and
	// nothing ran.
	Ran bool
	// Runs is how many runs the slot had, this one included when it ran: 1
	// unless earlier runs were taken over.
	Runs int
	// CompletedAt is the completion time by the database clock.
	CompletedAt time.Time
	// Token is the fencing token of the run that completed the slot (this
	// one's when Ran).
	Token int64
}

// Config configures a [Runner]. A nil *Config and zero fields use the
// defaults.
type Config struct {
	// TTL is the job lease's TTL: a runner that dies mid-run is taken over
	// about this long after its last renewal. Default 30 s.
	TTL time.Duration
	// AcquireOptions say how the job's lease is taken and kept, as for
	// [leases.Client.Do]: TryOnce skips the slot when another replica runs
	// the job now (the error wraps [pgfence.ErrLeaseHeld]); MaxWait bounds the
	// wait for it; MaxHold bounds a run and defaults to
	// [leases.MaxHoldDefault] (one hour): raise it for longer jobs.
	leases.AcquireOptions
	// Restart makes a run that takes over a slot an earlier run started and
	// did not complete (its runner died, lost its lease, or its work failed)
	// start over: the checkpoint is dropped. By default the run resumes: it
	// gets the checkpoint the earlier run saved ([Slot.Checkpoint]).
	Restart bool
	// CatchUp makes RunPeriod run late the slots of the last CatchUp periods
	// before the current one that no run completed (missed, or begun and left
	// unfinished), oldest first, before the current period's, under the same
	// lease (MaxHold bounds them all). Its [Result] is the current period's;
	// a late run that fails ends the call with its error and slot, and the
	// next call takes it over first. Default 0: RunPeriod runs only the
	// current period, and [Runner.Unfinished] lists the others. At most 999.
	CatchUp int
	// Logger receives one event per run. Default: discard.
	Logger *slog.Logger
}

// Runner runs the slots of one job, each once across every replica,
// restart and takeover. It is safe for concurrent use.
type Runner struct {
	client *leases.Client
	key    string
	cfg    Config
}

// New returns a runner for the job whose lease key is key (members of
// pgfence_app need a granted prefix of it); every replica uses the same
// key. The slots are recorded in the database of the client's leases, where
// the job's writes that complete a slot go too.
func New(client *leases.Client, key string, cfg *Config) (*Runner, error) {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	switch {
	case client == nil:
		return nil, fmt.Errorf("%w: client: must not be nil", pgfence.ErrInvalid)
	case c.TTL < 0:
		return nil, fmt.Errorf("%w: Config.TTL: must not be negative, got %s", pgfence.ErrInvalid, c.TTL)
	case c.NoKeepAlive:
		return nil, fmt.Errorf("%w: Config.NoKeepAlive: a run's lease is kept alive while it runs", pgfence.ErrInvalid)
	case c.CatchUp < 0 || c.CatchUp > maxCatchUp:
		return nil, fmt.Errorf("%w: Config.CatchUp: must be 0 to %d, got %d", pgfence.ErrInvalid, maxCatchUp, c.CatchUp)
	}
	c.TTL = cmp.Or(c.TTL, ttlDefault)
	// The key and what the run's grant and keep-alive would refuse.
	if err := client.Check(key, c.TTL, &c.AcquireOptions); err != nil {
		return nil, fmt.Errorf("job: Config.TTL %s: %w", c.TTL, err)
	}
	c.Logger = cmp.Or(c.Logger, slog.New(slog.DiscardHandler))
	return &Runner{client: client, key: key, cfg: c}, nil
}

func validSlot(slot string) error {
	switch {
	case slot == "" || len(slot) > maxSlotBytes:
		return fmt.Errorf("%w: slot: must be 1 to %d bytes, got %d", pgfence.ErrInvalid, maxSlotBytes, len(slot))
	case !utf8.ValidString(slot) || strings.IndexByte(slot, 0) >= 0:
		return fmt.Errorf("%w: slot: must be UTF-8 without NUL", pgfence.ErrInvalid)
	}
	return nil
}

// Run runs fn for slot once across replicas: it takes the job's lease (as
// [leases.Client.Do] does, with [Config.Hold]), and under it begins the slot.
// A slot completed before is skipped ([Result.Ran] false; fn does not
// run). Otherwise fn runs under the kept-alive lease, its context ending
// if the lease is lost; it completes the slot with [Slot.Finish] (or
// [Slot.Complete] in its own transaction) together with its last write, and
// if it returns nil without doing so, Run records the completion itself.
// Either way the completion commits only while this run holds the job's
// lease and the slot is still its run, so a slot completes once.
//
// When fn fails (or the lease is lost), the slot stays unfinished and Run
// returns the error; the next Run of the slot, here or on any replica, takes
// it over: it resumes from the last checkpoint ([Slot.Save]) or restarts
// ([Config.Restart]), and [Slot.Runs] counts the runs. Once the slot's
// completion has committed, Run reports it ([Result.Ran], nil error)
// even if the lease is lost or its release fails afterwards (logged).
//
// ctx bounds the wait for the lease and the run, as for [leases.Client.Do]:
// use [leases.AcquireOptions.MaxWait] to bound only the wait.
func (r *Runner) Run(ctx context.Context, slot string, fn func(ctx context.Context, s *Slot) error) (Result, error) {
	if err := validSlot(slot); err != nil {
		return Result{}, err
	}
	return r.run(ctx, slot, func(context.Context, *leases.Lease) ([]string, error) { return []string{slot}, nil }, fn)
}

// RunPeriod is [Runner.Run] for the slot of the period that contains the
// database's clock_timestamp() when the job's lease is granted: the slot's
// name is the period's start in RFC 3339, UTC ("2026-12-03T00:00:00Z" for a
// day), periods counted from 0001-01-01T00:00:00Z (so a day starts at
// midnight UTC, an hour on the hour). Replicas that call it every minute
// with a period of 24 h run the day's job once.
//
// Under the same grant, RunPeriod first records as missed the periods
// between the job's newest slot named like a period and the current one, at
// most the 999 newest, and logs them: no run began them (the replicas were
// stopped, busy with an earlier period, or waiting out a dead runner's
// lease). [Runner.Unfinished] lists them with the slots left unfinished;
// [Config.CatchUp] runs the last ones late.
func (r *Runner) RunPeriod(ctx context.Context, period time.Duration, fn func(ctx context.Context, s *Slot) error) (Result, error) {
	if period < time.Second {
		return Result{}, fmt.Errorf("%w: period: must be at least 1s, got %s", pgfence.ErrInvalid, period)
	}
	return r.run(ctx, "", func(ctx context.Context, l *leases.Lease) ([]string, error) {
		var now time.Time
		if err := r.client.Pool().QueryRow(ctx, sqlNow).Scan(&now); err != nil {
			return nil, fmt.Errorf("job %q: read the database clock: %w", r.key, pgfence.MapError(err))
		}
		cur := now.UTC().Truncate(period)
		slot := cur.Format(time.RFC3339)
		var missed []string
		if err := r.client.Pool().QueryRow(ctx, sqlMissed, r.key, l.Holder(), l.Token(), cur, period).Scan(&missed); err != nil {
			return nil, fmt.Errorf("job %q: record missed periods: %w", r.key, pgfence.MapError(err))
		}
		if len(missed) > 0 {
			r.cfg.Logger.Warn("pgfence job: periods missed (no run began them), recorded as unfinished", "key", r.key, "slots", missed)
		}
		if r.cfg.CatchUp == 0 {
			return []string{slot}, nil
		}
		from := cur
		for range r.cfg.CatchUp {
			from = from.Add(-period)
		}
		rows, _ := r.client.Pool().Query(ctx, sqlOwed, r.key, from.Format(time.RFC3339), slot) // an error shows in CollectRows
		owed, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return nil, fmt.Errorf("job %q: list the periods to catch up: %w", r.key, pgfence.MapError(err))
		}
		return append(owed, slot), nil
	}, fn)
}

const (
	sqlNow    = `SELECT pg_catalog.clock_timestamp()`
	sqlMissed = `SELECT pgfence.job_slot_missed($1, $2::uuid, $3, $4, $5)`
	sqlOwed   = `SELECT slot FROM pgfence.job_slots WHERE key = $1 AND completed_at IS NULL
   AND slot COLLATE "C" >= $2 AND slot COLLATE "C" < $3 AND slot ~ '^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$' ORDER BY slot COLLATE "C"`
	sqlBegin = `SELECT completed, runs, coalesce(checkpoint, ''), coalesce(previous_token, 0), completed_at
  FROM pgfence.job_slot_begin($1, $2::uuid, $3, $4, $5)`
	sqlSave       = `SELECT pgfence.job_slot_save($1, $2::uuid, $3, $4, $5)`
	sqlComplete   = `SELECT pgfence.job_slot_complete($1, $2::uuid, $3, $4)`
	sqlCompletion = `SELECT token, completed_at FROM pgfence.job_slots WHERE key = $1 AND slot = $2`
	sqlUnfinished = `SELECT slot FROM pgfence.job_slots WHERE key = $1 AND completed_at IS NULL ORDER BY started_at, slot`
)

// run runs fn for each slot names gives once the job's lease is granted, in
// order, and returns the last one's result; slot is the name when it is known
// before (Run), "" when the grant decides it (RunPeriod).
func (r *Runner) run(ctx context.Context, slot string, names func(context.Context, *leases.Lease) ([]string, error), fn func(ctx context.Context, s *Slot) error) (Result, error) {
	if fn == nil {
		return Result{}, fmt.Errorf("%w: fn: must not be nil", pgfence.ErrInvalid)
	}
	res := Result{Slot: slot}
	err := r.client.Do(ctx, r.key, r.cfg.TTL, &r.cfg.AcquireOptions, func(ctx context.Context, l *leases.Lease) error {
		slots, err := names(ctx, l)
		if err != nil {
			return err
		}
		for _, slot := range slots {
			res = Result{Slot: slot}
			s, err := r.begin(ctx, l, slot)
			if err != nil {
				return err
			}
			if s.done {
				res.Runs, res.CompletedAt, res.Token = s.runs, s.completedAt, s.previous
				r.cfg.Logger.Debug("pgfence job: slot already completed", "key", r.key, "slot", slot)
				continue
			}
			r.cfg.Logger.Info("pgfence job: run", "key", r.key, "slot", slot, "run", s.runs, "token", l.Token(), "resumed", s.checkpoint != "")
			if err := fn(ctx, s); err != nil {
				return err
			}
			s.mu.Lock()
			finished, inTx := s.finished, s.inTx
			s.mu.Unlock()
			switch {
			case !finished:
				if err := s.Finish(ctx, nil); err != nil {
					return err
				}
			case inTx:
				// Complete ran in fn's transaction: see that it committed.
				if err := s.committed(ctx); err != nil {
					return err
				}
			}
			s.mu.Lock()
			res.Ran, res.Runs, res.CompletedAt, res.Token = true, s.runs, s.completedAt, l.Token()
			s.mu.Unlock()
		}
		return nil
	})
	switch {
	case err == nil:
		return res, nil
	case !res.CompletedAt.IsZero():
		// The slot was settled (its completion committed, or it had been
		// completed before); the lease was lost or its release failed only
		// afterwards, which changes nothing for the slot.
		r.cfg.Logger.Warn("pgfence job: the lease ended badly after the slot was settled", "key", r.key, "slot", res.Slot,
			"ran", res.Ran, "err", err)
		return res, nil
	case res.Slot == "":
		return res, fmt.Errorf("job %q: %w", r.key, err) // RunPeriod before its slot was known
	}
	return res, fmt.Errorf("job %q, slot %q: %w", r.key, res.Slot, err)
}

// begin begins (or takes over, or finds completed) the slot, in a
// transaction that first fences the job's resource with the run's token: from
// then on, fenced writes of earlier runs are refused.
func (r *Runner) begin(ctx context.Context, l *leases.Lease, slot string) (*Slot, error) {
	s := &Slot{r: r, lease: l, name: slot}
	_, err := pgfence.Write(ctx, r.client.Pool(), l, func(ctx context.Context, tx pgx.Tx) error {
		var completed *time.Time
		err := tx.QueryRow(ctx, sqlBegin, r.key, l.Holder(), l.Token(), slot, r.cfg.Restart).
			Scan(&s.done, &s.runs, &s.checkpoint, &s.previous, &completed)
		if completed != nil {
			s.completedAt = *completed
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("begin: %w", err)
	}
	return s, nil
}

// Unfinished lists the job's slots that no run completed, oldest first:
// slots a run began and left unfinished (it failed, or its runner died) and
// that no replica asked for since, and periods [Runner.RunPeriod] recorded as
// missed (runs = 0 in pgfence.job_slots). [Runner.Run] them by name to run
// them late, or let [Config.CatchUp] do it.
func (r *Runner) Unfinished(ctx context.Context) ([]string, error) {
	rows, _ := r.client.Pool().Query(ctx, sqlUnfinished, r.key) // an error shows in CollectRows
	slots, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("job %q: unfinished: %w", r.key, pgfence.MapError(err))
	}
	return slots, nil
}

// Slot is one run of a slot, given to the function [Runner.Run] runs. Its
// methods are safe for concurrent use by the goroutines of that function;
// concurrent calls of [Slot.Save] are made one at a time.
type Slot struct {
	r        *Runner
	lease    *leases.Lease
	name     string
	runs     int
	previous int64 // the token of the run taken over (0 if none), or of the one that completed the slot

	saveMu     sync.Mutex // serialises Save (never held by the other methods)
	mu         sync.Mutex // guards what follows; never held across a statement
	checkpoint string

	done        bool // begin found it completed
	completedAt time.Time
	finished    bool // this run completed it (Finish), or asked to (Complete)
	inTx        bool // ... in the caller's transaction (Complete)
}

// Name is the slot's name.
func (s *Slot) Name() string { return s.name }

// Lease is the job's lease for this run: pass it to pgfence's fenced writes
// (it names the job's key as the resource). Its token fences the run: once a
// later run of the job began, this run's fenced writes are refused.
func (s *Slot) Lease() *leases.Lease { return s.lease }

// Runs is how many runs the slot had, this one included: 1, or more when
// this run took over from earlier ones.
func (s *Slot) Runs() int { return s.runs }

// Checkpoint is the last checkpoint saved for the slot ([Slot.Save]): by an
// earlier run it took over (unless [Config.Restart]) or by this run; "" when none.
func (s *Slot) Checkpoint() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.checkpoint
}

// Save records checkpoint (at most 64 KiB) for the slot,
// durably, while this run holds the job's lease: a run that takes the slot
// over later starts from it. It fails with [pgfence.ErrLeaseLost] when
// the lease was lost or the slot taken over. Saves made at the same time
// are sent one at a time: the slot keeps the checkpoint of the one that
// returned last.
func (s *Slot) Save(ctx context.Context, checkpoint string) error {
	if len(checkpoint) > maxCheckpointBytes || !utf8.ValidString(checkpoint) || strings.IndexByte(checkpoint, 0) >= 0 {
		return fmt.Errorf("%w: checkpoint: must be UTF-8 without NUL, at most %d bytes", pgfence.ErrInvalid, maxCheckpointBytes)
	}
	// Saves take turns so that the slot keeps the checkpoint of the last one;
	// the field lock is taken only to record it: Complete, in a transaction
	// that holds the slot's row, may wait for it while a Save waits for the
	// row.
	s.saveMu.Lock()
	defer s.saveMu.Unlock()
	if _, err := s.r.client.Pool().Exec(ctx, sqlSave, s.r.key, s.lease.Holder(), s.lease.Token(), s.name, checkpoint); err != nil {
		return fmt.Errorf("save checkpoint: %w", pgfence.MapError(err))
	}
	s.mu.Lock()
	s.checkpoint = checkpoint
	s.mu.Unlock()
	return nil
}

// Complete records the slot's completion in tx, the caller's transaction of
// the run's last write: the slot is completed if and only if tx commits.
// The lease row stays locked until tx ends, so no takeover commits in
// between; a run whose lease was lost, or whose slot was taken over, is
// refused with [pgfence.ErrLeaseLost] and tx must roll back. Fence the
// writes of tx with [Slot.Lease] (or use [Slot.Finish], which does both).
func (s *Slot) Complete(ctx context.Context, tx pgx.Tx) error {
	if tx == nil {
		return fmt.Errorf("%w: tx: must not be nil (the transaction of the run's last write)", pgfence.ErrInvalid)
	}
	var at time.Time
	if err := tx.QueryRow(ctx, sqlComplete, s.r.key, s.lease.Holder(), s.lease.Token(), s.name).Scan(&at); err != nil {
		return fmt.Errorf("complete: %w", pgfence.MapError(err))
	}
	s.mu.Lock()
	s.completedAt, s.finished, s.inTx = at, true, true
	s.mu.Unlock()
	return nil
}

// Finish runs fn (the run's last write; nil for none) and records the
// slot's completion in one transaction, fenced with the run's token
// ([pgfence.Write]): a stale run is refused ([pgfence.ErrStaleToken] when a
// later run began, [pgfence.ErrLeaseLost] when its lease was lost) and
// nothing of fn commits. An outcome lost with the connection is reported as
// [pgfence.ErrOutcomeUnknown]: the next Run of the slot tells (completed, or
// taken over).
func (s *Slot) Finish(ctx context.Context, fn func(ctx context.Context, tx pgx.Tx) error) error {
	var at time.Time
	_, err := pgfence.Write(ctx, s.r.client.Pool(), s.lease, func(ctx context.Context, tx pgx.Tx) error {
		if fn != nil {
			if err := fn(ctx, tx); err != nil {
				return err
			}
		}
		return tx.QueryRow(ctx, sqlComplete, s.r.key, s.lease.Holder(), s.lease.Token(), s.name).Scan(&at)
	})
	if err != nil {
		return fmt.Errorf("finish: %w", err)
	}
	s.mu.Lock()
	s.completedAt, s.finished = at, true
	s.mu.Unlock()
	return nil
}

// committed reads back that the slot is completed by this run, after
// Complete in the caller's transaction (which the caller may have rolled
// back).
func (s *Slot) committed(ctx context.Context) error {
	var (
		token int64
		at    *time.Time
	)
	if err := s.r.client.Pool().QueryRow(ctx, sqlCompletion, s.r.key, s.name).Scan(&token, &at); err != nil {
		return fmt.Errorf("read the completion back: %w", pgfence.MapError(err))
	}
	if at == nil || token != s.lease.Token() {
		return errors.New("fn returned nil, but the transaction in which it completed the slot did not commit")
	}
	s.mu.Lock()
	s.completedAt = *at
	s.mu.Unlock()
	return nil
}
