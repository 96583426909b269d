package bench

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/pgfence/pgfence/pgfence"
)

// retentionCycles is how many maintenance cycles the retention curve runs;
// retentionChunk how many one-off keys one statement makes (each holds a
// lock per key until it commits).
const (
	retentionCycles = 10
	retentionChunk  = 1000
)

// RetentionCycle is pgfence's tables at the end of one cycle of the
// retention curve, before and after its maintenance.
type RetentionCycle struct {
	// Resources is how many one-off resources were made so far.
	Resources int64
	// Rows (lease and fence rows) and Bytes (leases, fences and lease_events
	// with their indexes) before the maintenance, and after it.
	Rows, Bytes, RowsAfter, BytesAfter int64
}

// Retention is what the retention curve measured: one-off keys (granted,
// fenced and released once, never used again) made in cycles, each followed
// by the scheduled maintenance.
type Retention struct {
	Resources int64
	Cycles    []RetentionCycle
}

const (
	// sqlOneOff makes %[2]d one-off keys numbered from %[3]d under prefix
	// %[1]s (the curve's constant): each is granted, fenced and released
	// through the SQL functions, one after the other, as any client would.
	sqlOneOff = `DO $$
DECLARE
    a record;
BEGIN
    FOR a IN SELECT s.k, t.holder, t.token
               FROM (SELECT '%[1]sone-off/' OPERATOR(pg_catalog.||) g AS k FROM pg_catalog.generate_series(%[3]d::bigint, %[3]d::bigint OPERATOR(pg_catalog.+) %[2]d - 1) g) s,
                    LATERAL pgfence.try_acquire(s.k, interval '1 minute') t LOOP
        PERFORM pgfence.fence(a.k, a.token);
        PERFORM pgfence.release(a.k, a.holder, a.token);
    END LOOP;
END $$`
	// sqlPassHour moves the curve's lease and fence rows an hour and a
	// minute into the past: the hour prune_retired leaves them.
	sqlPassHour = `WITH l AS (
		UPDATE pgfence.leases SET granted_at = granted_at OPERATOR(pg_catalog.-) interval '61 minutes',
		       expires_at = expires_at OPERATOR(pg_catalog.-) interval '61 minutes',
		       released_at = released_at OPERATOR(pg_catalog.-) interval '61 minutes'
		 WHERE pg_catalog.starts_with(key, $1) RETURNING 1)
		UPDATE pgfence.fences SET accepted_at = accepted_at OPERATOR(pg_catalog.-) interval '61 minutes'
		 WHERE pg_catalog.starts_with(resource, $1)`
	sqlRetentionSize = `SELECT (SELECT pg_catalog.count(*) FROM pgfence.leases) OPERATOR(pg_catalog.+) (SELECT pg_catalog.count(*) FROM pgfence.fences),
		pg_catalog.pg_total_relation_size('pgfence.leases') OPERATOR(pg_catalog.+) pg_catalog.pg_total_relation_size('pgfence.fences')
		OPERATOR(pg_catalog.+) pg_catalog.pg_total_relation_size('pgfence.lease_events')`
	sqlRetentionVacuum = `VACUUM pgfence.leases, pgfence.fences, pgfence.lease_events`
)

// curveRetention makes resources one-off keys in retentionCycles cycles, and
// after each runs what `pgfence maintenance schedule` runs an hour later:
// advance_retention, then prune_retired until it deletes nothing, then a
// VACUUM (autovacuum's work, done at once so that sizes compare). The hour
// is passed by moving the curve's rows back in time, so the curve runs on
// the throwaway cluster only.
func (lab *Lab) curveRetention(ctx context.Context, resources int64) (*Retention, error) {
	res := &Retention{Resources: resources}
	per := max(resources/retentionCycles, 1)
	for made := int64(0); made < resources; {
		n := min(per, resources-made)
		start := time.Now()
		done := startProgress(lab.progress, fmt.Sprintf("retention: one-off resources %d…%d", made, made+n), 0, 0)
		c, err := lab.retentionCycle(ctx, made, n)
		done()
		if err != nil {
			return nil, err
		}
		made += n
		fmt.Fprintf(lab.progress, "  retention: %d one-off resources in %s: %d rows, %s before maintenance; %d rows, %s after\n",
			made, time.Since(start).Round(time.Millisecond), c.Rows, bytesString(c.Bytes), c.RowsAfter, bytesString(c.BytesAfter))
		res.Cycles = append(res.Cycles, c)
	}
	return res, nil
}

// retentionCycle makes n one-off keys numbered from made, measures the
// tables, runs the maintenance an hour later and measures them again.
func (lab *Lab) retentionCycle(ctx context.Context, made, n int64) (RetentionCycle, error) {
	c := RetentionCycle{Resources: made + n}
	for off := int64(0); off < n; off += retentionChunk {
		if _, err := lab.db.Pool.Exec(ctx, fmt.Sprintf(sqlOneOff, curvePrefix, min(retentionChunk, n-off), made+off)); err != nil {
			return c, fmt.Errorf("one-off resources: %w", err)
		}
	}
	if err := lab.db.Pool.QueryRow(ctx, sqlRetentionSize).Scan(&c.Rows, &c.Bytes); err != nil {
		return c, err
	}
	if _, err := pgfence.AdvanceRetention(ctx, lab.db.Pool); err != nil {
		return c, err
	}
	if _, err := lab.db.Pool.Exec(ctx, sqlPassHour, curvePrefix+"one-off/"); err != nil {
		return c, err
	}
	for {
		p, err := pgfence.PruneRetired(ctx, lab.db.Pool, 100_000)
		if err != nil {
			return c, err
		}
		if p == (pgfence.Pruned{}) {
			break
		}
	}
	if _, err := lab.db.Pool.Exec(ctx, sqlRetentionVacuum); err != nil {
		return c, err
	}
	err := lab.db.Pool.QueryRow(ctx, sqlRetentionSize).Scan(&c.RowsAfter, &c.BytesAfter)
	return c, err
}

func printRetention(w io.Writer, r *Retention) {
	fmt.Fprintf(w, "\nretention: %d one-off resources (granted, fenced and released once) in %d cycles, each followed an hour later by advance_retention, prune_retired and VACUUM\n",
		r.Resources, len(r.Cycles))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "RESOURCES\tROWS BEFORE\tSIZE BEFORE\tROWS AFTER\tSIZE AFTER\t")
	for _, c := range r.Cycles {
		fmt.Fprintf(tw, "%d\t%d\t%s\t%d\t%s\t\n", c.Resources, c.Rows, bytesString(c.Bytes), c.RowsAfter, bytesString(c.BytesAfter))
	}
	tw.Flush()
}

// retentionVerdict compares the tables' size at the end with their size
// after the first cycle.
func retentionVerdict(r *Retention) []string {
	if r == nil || len(r.Cycles) < 2 {
		return nil
	}
	first, last := r.Cycles[0], r.Cycles[len(r.Cycles)-1]
	return []string{fmt.Sprintf("one-off resources: pgfence's tables %s after %d resources against %s after %d, %.2f× (goal: flat); %d rows left",
		bytesString(last.BytesAfter), last.Resources, bytesString(first.BytesAfter), first.Resources,
		float64(last.BytesAfter)/float64(max(first.BytesAfter, 1)), last.RowsAfter)}
}
