package migrations_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/pgerr"
	"github.com/pgfence/pgfence/internal/testkit/pgcluster"
	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// On a standby every function of the protocol raises PF005 before anything
// else: a standby never answers "held", "not granted", "stale" or "read
// only", whatever state it replicated. A lease that is live on the primary
// (and replicated) is the case that used to answer acquired = false.
func TestStandbyRefusesEveryProtocolFunction(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cluster := pgfencetest.NewCluster(t, nil)
	db := cluster.NewDatabase(t)
	var holder string
	var token int64
	if err := db.Pool.QueryRow(ctx, `SELECT holder::text, token FROM pgfence.acquire('held', interval '1 hour')`).Scan(&holder, &token); err != nil {
		t.Fatal(err)
	}
	standby, err := pgcluster.At(cluster.Addr()).StartStandby(ctx, &pgcluster.StandbyConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = standby.Close() })
	if err := pgcluster.At(cluster.Addr()).WaitReplayed(ctx, standby); err != nil {
		t.Fatal(err)
	}
	replica, err := pgx.Connect(ctx, standby.ConnString(db.Name))
	if err != nil {
		t.Fatal(err)
	}
	defer replica.Close(context.Background())

	const h = "3b241101-e2bb-4255-8caf-4136c566a962"
	calls := map[string][]any{
		`SELECT * FROM pgfence.try_acquire('held', interval '1 minute')`:                                                 nil,
		`SELECT * FROM pgfence.try_acquire('free', interval '1 minute')`:                                                 nil,
		`SELECT * FROM pgfence.acquire('free', interval '1 minute')`:                                                     nil,
		`SELECT * FROM pgfence.renew('held', $1, $2, interval '1 minute')`:                                               {holder, token},
		`SELECT * FROM pgfence.release('held', $1, $2)`:                                                                  {holder, token},
		`SELECT * FROM pgfence.force_release('held', 'test')`:                                                            nil,
		`SELECT pgfence.lease_queue_turn('held', '` + h + `', interval '1 minute')`:                                      nil,
		`SELECT pgfence.lease_queue_leave('held', '` + h + `')`:                                                          nil,
		`SELECT pgfence.pause_grants('x/', 'test')`:                                                                      nil,
		`SELECT pgfence.resume_grants('x/')`:                                                                             nil,
		`SELECT pgfence.prune_lease_events()`:                                                                            nil,
		`SELECT pgfence.abandon_grant('held', '` + h + `')`:                                                              nil,
		`SELECT * FROM pgfence.grant_probe('held', '` + h + `')`:                                                         nil,
		`SELECT pgfence.set_holder_info('held', $1, $2, 'leader at 10.0.0.7')`:                                           {holder, token},
		`SELECT pgfence.announce_renewal('held', $1, $2)`:                                                                {holder, token},
		`SELECT pgfence.announce_key('held')`:                                                                            nil,
		`SELECT * FROM pgfence.job_slot_begin('held', $1, $2, 'slot')`:                                                   {holder, token},
		`SELECT pgfence.job_slot_save('held', $1, $2, 'slot', 'step 2')`:                                                 {holder, token},
		`SELECT pgfence.job_slot_complete('held', $1, $2, 'slot')`:                                                       {holder, token},
		`SELECT pgfence.job_slot_missed('held', $1, $2, now(), interval '1 day')`:                                        {holder, token},
		`SELECT pgfence.fence('held', $1)`:                                                                               {token},
		`SELECT * FROM pgfence.fence_probe('held')`:                                                                      nil,
		`SELECT pgfence.abandon_fence('held', '` + h + `')`:                                                              nil,
		`SELECT pgfence.check_lease('held', $1, $2)`:                                                                     {holder, token},
		`SELECT pgfence.lower_fence('held', 1, 'test')`:                                                                  nil,
		`SELECT pgfence.record_fence_rejection('held', 1, 2, 'stale_token')`:                                             nil,
		`SELECT pgfence.prune_fence_rejections()`:                                                                        nil,
		`SELECT pgfence.raise_token_floor(1, 'test')`:                                                                    nil,
		`SELECT pgfence.advance_retention()`:                                                                             nil,
		`SELECT * FROM pgfence.prune_retired(10)`:                                                                        nil,
		`SELECT pgfence.next_token(NULL)`:                                                                                nil,
		`SELECT * FROM pgfence.idempotency_claim_atomic('s', 'k', '\x00112233445566778899aabbccddeeff', '1 s', '1 day')`: nil,
		`SELECT * FROM pgfence.idempotency_claim('s', 'k', '\x00112233445566778899aabbccddeeff', '1 s', '1 day')`:        nil,
		`SELECT pgfence.idempotency_gc(10)`:                                                                              nil,
		`SELECT * FROM pgfence.task_enqueue('sku/1', '{}')`:                                                              nil,
		`SELECT pgfence.task_ready_keys('sku/')`:                                                                         nil,
		`SELECT * FROM pgfence.task_claim('sku/1', $1, $2)`:                                                              {h, token},
		`SELECT pgfence.task_complete('sku/1', $1, $2, '{1}', NULL)`:                                                     {h, token},
		`SELECT pgfence.task_fail('sku/1', $1, $2, 1, 'error')`:                                                          {h, token},
		`SELECT pgfence.task_retry(1, 'test')`:                                                                           nil,
		`SELECT pgfence.task_skip(1, 'test')`:                                                                            nil,
		`SELECT pgfence.prune_tasks(interval '1 day')`:                                                                   nil,
	}
	for q, args := range calls {
		if _, err := replica.Exec(ctx, q, args...); pgerr.Code(err) != pgerr.CodeNotPrimary {
			t.Errorf("on a standby, %s: %v, want PF005", q, err)
		}
	}

	// From Go: a standby's answer is ErrNotPrimary, at once, for a key that
	// is held on the primary too; Acquire does not poll the standby.
	pool := newPoolOn(t, standby.ConnString(db.Name))
	c, err := leases.New(pool, &leases.Config{DisableWakeups: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.TryAcquire(ctx, "held", time.Minute, nil); !errors.Is(err, pgfence.ErrNotPrimary) {
		t.Errorf("TryAcquire of a held key on a standby: %v, want ErrNotPrimary", err)
	}
	// At once: a waiting Acquire does not retry a standby until its deadline
	// (an hour here, far beyond the 20 s this call is given).
	actx, acancel := context.WithTimeout(ctx, 20*time.Second)
	_, err = c.Acquire(actx, "held", time.Minute, &leases.AcquireOptions{MaxWait: time.Hour})
	acancel()
	if !errors.Is(err, pgfence.ErrNotPrimary) || errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Acquire of a held key on a standby: %v, want ErrNotPrimary at once", err)
	}
}

// newPoolOn returns a pool on url, closed when t ends.
func newPoolOn(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}
