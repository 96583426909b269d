package tasks_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

const sqlEnqueue = `SELECT id FROM pgfence.task_enqueue($1, $2::jsonb)`

// claimAll runs task_claim (autocommit, so that it may take a mark) and
// returns nothing: tests read the numbers from the table.
func claimAll(t testing.TB, ctx context.Context, pool *pgxpool.Pool, key, holder string, token int64) {
	t.Helper()
	if _, err := pool.Exec(ctx, `SELECT count(*) FROM pgfence.task_claim($1, $2::uuid, $3, 10000)`, key, holder, token); err != nil {
		t.Fatal(err)
	}
}

// Tasks are numbered in the order their enqueues commit. An enqueue whose
// transaction stays open holds back no other task: the ones committed
// meanwhile are numbered (and could be applied); it is numbered after them
// once it commits, although its id is lower than some of theirs, and the
// watermark that bounds the scans does not pass over it. A rolled-back
// enqueue leaves no task and no gap.
func TestNumberingFollowsCommitOrder(t *testing.T) {
	pool := pgfencetest.NewPool(t)
	ctx := ctxTimeout(t, time.Minute)
	const key = "sku/1"
	holder, token := grantConsumer(t, ctx, pool, key)

	// early takes its xid first, then late enqueues and commits, then early
	// enqueues, then after enqueues and commits while early is open.
	early, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = early.Rollback(ctx) }()
	if _, err := early.Exec(ctx, `SELECT pg_current_xact_id()`); err != nil {
		t.Fatal(err)
	}
	var lateID, earlyID int64
	if err := pool.QueryRow(ctx, sqlEnqueue, key, `"late"`).Scan(&lateID); err != nil {
		t.Fatal(err)
	}
	if err := early.QueryRow(ctx, sqlEnqueue, key, `"early"`).Scan(&earlyID); err != nil {
		t.Fatal(err)
	}
	var afterID int64
	if err := pool.QueryRow(ctx, sqlEnqueue, key, `"after"`).Scan(&afterID); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		claimAll(t, ctx, pool, key, holder, token)
	}
	got := numbers(t, ctx, pool, key)
	if want := map[int64]int64{lateID: 1, afterID: 2}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("with early open: numbers %v, want %v (late, after)", got, want)
	}
	var watermark int64
	if err := pool.QueryRow(ctx, `SELECT numbered_to FROM pgfence.task_keys WHERE key = $1`, key).Scan(&watermark); err != nil {
		t.Fatal(err)
	}
	if watermark >= earlyID {
		t.Fatalf("the watermark passed task %d of an open transaction: %d", earlyID, watermark)
	}
	// A rolled-back enqueue between them.
	rb, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rb.Exec(ctx, sqlEnqueue, key, `"rolled back"`); err != nil {
		t.Fatal(err)
	}
	if err := rb.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := early.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var lastID int64
	if err := pool.QueryRow(ctx, sqlEnqueue, key, `"last"`).Scan(&lastID); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		claimAll(t, ctx, pool, key, holder, token)
	}
	got = numbers(t, ctx, pool, key)
	want := map[int64]int64{lateID: 1, afterID: 2, earlyID: 3, lastID: 4}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("numbers %v, want %v (late, after, early, last; no task of the rolled-back enqueue)", got, want)
	}
	if err := pool.QueryRow(ctx, `SELECT numbered_to FROM pgfence.task_keys WHERE key = $1`, key).Scan(&watermark); err != nil {
		t.Fatal(err)
	}
	if watermark < earlyID {
		t.Fatalf("the watermark stays at %d below task %d after its transaction ended", watermark, earlyID)
	}
}

// Producers enqueue concurrently, some with early xids, some rolling back,
// while a consumer numbers: the committed tasks are numbered 1..N without a
// gap, a number never changes once assigned, and a task whose enqueue began
// after another's commit returned has the higher number.
func TestNumberingUnderConcurrentProducers(t *testing.T) {
	pool := pgfencetest.NewPool(t)
	ctx := ctxTimeout(t, 2*time.Minute)
	const key = "sku/hot"
	holder, token := grantConsumer(t, ctx, pool, key)

	type enq struct {
		id                 int64
		started, committed time.Time
	}
	var (
		mu        sync.Mutex
		committed []enq
		wg        sync.WaitGroup
	)
	for p := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(p), 1))
			for i := range 40 {
				tx, err := pool.Begin(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				if r.IntN(3) == 0 { // an early xid
					if _, err := tx.Exec(ctx, `SELECT pg_current_xact_id()`); err != nil {
						t.Error(err)
						return
					}
					time.Sleep(time.Duration(r.IntN(2000)) * time.Microsecond)
				}
				e := enq{started: time.Now()}
				if err := tx.QueryRow(ctx, sqlEnqueue, key, fmt.Sprintf(`{"p":%d,"i":%d}`, p, i)).Scan(&e.id); err != nil {
					t.Error(err)
					return
				}
				time.Sleep(time.Duration(r.IntN(1000)) * time.Microsecond)
				if r.IntN(5) == 0 {
					if err := tx.Rollback(ctx); err != nil {
						t.Error(err)
					}
					continue
				}
				if err := tx.Commit(ctx); err != nil {
					t.Error(err)
					return
				}
				e.committed = time.Now()
				mu.Lock()
				committed = append(committed, e)
				mu.Unlock()
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()

	seen := map[int64]int64{}
	check := func() (all bool) {
		claimAll(t, ctx, pool, key, holder, token)
		for id, seq := range numbers(t, ctx, pool, key) {
			if prev, ok := seen[id]; ok && prev != 0 && prev != seq {
				t.Fatalf("task %d renumbered from %d to %d", id, prev, seq)
			}
			seen[id] = seq
		}
		return true
	}
	for running := true; running; {
		select {
		case <-done:
			running = false
		default:
			check()
		}
	}
	for range 3 {
		check()
	}
	if t.Failed() {
		return
	}
	if len(seen) != len(committed) {
		t.Fatalf("%d tasks in the table, %d enqueues committed", len(seen), len(committed))
	}
	seqs := make([]int64, 0, len(seen))
	for _, s := range seen {
		seqs = append(seqs, s)
	}
	slices.Sort(seqs)
	for i, s := range seqs {
		if s != int64(i+1) {
			t.Fatalf("numbers are not 1..%d without a gap: %v", len(seqs), seqs)
		}
	}
	for _, a := range committed {
		for _, b := range committed {
			if a.committed.Before(b.started) && seen[a.id] > seen[b.id] {
				t.Errorf("task %d committed before task %d was enqueued, but has number %d > %d", a.id, b.id, seen[a.id], seen[b.id])
			}
		}
	}
	t.Logf("%d tasks committed and numbered", len(committed))
}
