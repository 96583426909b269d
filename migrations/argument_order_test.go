package migrations_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pgfence/pgfence/internal/pgerr"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// A bad name is an argument error (PF008) before it is anything else: a
// role that may use no name at all gets PF008 for an empty or over-long
// lease key, resource, idempotency scope or prefix from every function that
// takes one, never PF014 ("not granted"), which would send its operator
// looking for a missing grant. Every function the roles may execute that
// takes a name is in the list: a new one without its case fails the test.
func TestNameErrorsBeforeGrants(t *testing.T) {
	db := pgfencetest.NewDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	appName, app := loginRole(t, db, "pgfence_app")
	if _, err := db.Pool.Exec(ctx, `SELECT pgfence.revoke_prefix($1::regrole, $2)`, appName, ""); err != nil {
		t.Fatal(err)
	}
	_, operator := loginRole(t, db, "pgfence_operator")

	const (
		h  = `'3b241101-e2bb-4255-8caf-4136c566a962'`
		fp = `'\x00112233445566778899aabbccddeeff'`
	)
	long := "'" + strings.Repeat("x", 513) + "'"
	// Each call has $N where the name goes; operator-only functions run as
	// the operator.
	calls := map[string]struct {
		sql      string
		operator bool
		empty    bool // '' is a bad name too (for prefixes it means "every name")
	}{
		"abandon_fence":                {`SELECT pgfence.abandon_fence($N, ` + h + `)`, false, true},
		"abandon_grant":                {`SELECT pgfence.abandon_grant($N, ` + h + `)`, false, true},
		"acquire":                      {`SELECT * FROM pgfence.acquire($N, interval '1 minute')`, false, true},
		"announce_key":                 {`SELECT pgfence.announce_key($N)`, false, true},
		"announce_renewal":             {`SELECT pgfence.announce_renewal($N, ` + h + `, 1)`, false, true},
		"check_lease":                  {`SELECT pgfence.check_lease($N, ` + h + `, 1)`, false, true},
		"fence":                        {`SELECT pgfence.fence($N, 1)`, false, true},
		"fence_probe":                  {`SELECT * FROM pgfence.fence_probe($N)`, false, true},
		"force_release":                {`SELECT * FROM pgfence.force_release($N, 'test')`, true, true},
		"grant_prefix":                 {`SELECT pgfence.grant_prefix('pgfence_app', $N)`, true, false},
		"grant_probe":                  {`SELECT * FROM pgfence.grant_probe($N, ` + h + `)`, false, true},
		"idempotency_advance":          {`SELECT pgfence.idempotency_advance($N, 'k', ` + h + `, 'p', NULL, interval '1 minute')`, false, true},
		"idempotency_claim":            {`SELECT * FROM pgfence.idempotency_claim($N, 'k', ` + fp + `, interval '1 minute', interval '1 day')`, false, true},
		"idempotency_claim_atomic":     {`SELECT * FROM pgfence.idempotency_claim_atomic($N, 'k', ` + fp + `, interval '1 second', interval '1 day')`, false, true},
		"idempotency_claim_atomic_new": {`SELECT pgfence.idempotency_claim_atomic_new($N, 'k', ` + fp + `, interval '1 second', interval '1 day')`, false, true},
		"idempotency_complete":         {`SELECT pgfence.idempotency_complete($N, 'k', ` + h + `, '')`, false, true},
		"idempotency_complete_atomic":  {`SELECT pgfence.idempotency_complete_atomic($N, 'k', '')`, false, true},
		"idempotency_heartbeat":        {`SELECT pgfence.idempotency_heartbeat($N, 'k', ` + h + `, interval '1 minute')`, false, true},
		"idempotency_release":          {`SELECT pgfence.idempotency_release($N, 'k', ` + h + `)`, false, true},
		"job_slot_begin":               {`SELECT * FROM pgfence.job_slot_begin($N, ` + h + `, 1, 'slot')`, false, true},
		"job_slot_complete":            {`SELECT pgfence.job_slot_complete($N, ` + h + `, 1, 'slot')`, false, true},
		"job_slot_missed":              {`SELECT pgfence.job_slot_missed($N, ` + h + `, 1, now(), interval '1 day')`, false, true},
		"job_slot_save":                {`SELECT pgfence.job_slot_save($N, ` + h + `, 1, 'slot', 'step')`, false, true},
		"lease_queue_leave":            {`SELECT pgfence.lease_queue_leave($N, ` + h + `)`, false, true},
		"lease_queue_turn":             {`SELECT pgfence.lease_queue_turn($N, ` + h + `, interval '1 minute')`, false, true},
		"lower_fence":                  {`SELECT pgfence.lower_fence($N, 1, 'test')`, true, true},
		"pause_grants":                 {`SELECT pgfence.pause_grants($N, 'test')`, true, false},
		"protect":                      {`SELECT pgfence.protect('pgfence.token_floor', 'reason', $N)`, true, false},
		"prune_lease_events":           {`SELECT pgfence.prune_lease_events($N)`, true, true},
		"record_fence_rejection":       {`SELECT pgfence.record_fence_rejection($N, 1, 2, 'stale_token')`, false, true},
		"release":                      {`SELECT * FROM pgfence.release($N, ` + h + `, 1)`, false, true},
		"renew":                        {`SELECT * FROM pgfence.renew($N, ` + h + `, 1, interval '1 minute')`, false, true},
		"resume_grants":                {`SELECT pgfence.resume_grants($N)`, true, false},
		"revoke_prefix":                {`SELECT pgfence.revoke_prefix('pgfence_app', $N)`, true, false},
		"set_holder_info":              {`SELECT pgfence.set_holder_info($N, ` + h + `, 1, 'info')`, false, true},
		"task_claim":                   {`SELECT * FROM pgfence.task_claim($N, ` + h + `, 1)`, false, true},
		"task_complete":                {`SELECT pgfence.task_complete($N, ` + h + `, 1, '{1}', NULL)`, false, true},
		"task_enqueue":                 {`SELECT * FROM pgfence.task_enqueue($N, '{}')`, false, true},
		"task_fail":                    {`SELECT pgfence.task_fail($N, ` + h + `, 1, 1, 'error')`, false, true},
		"task_ready_keys":              {`SELECT pgfence.task_ready_keys($N)`, false, false},
		"try_acquire":                  {`SELECT * FROM pgfence.try_acquire($N, interval '1 minute')`, false, true},
	}
	// Not in the list: may_use and may_use_under (they answer a question:
	// false for any name the role may not use, a bad one included), and
	// task_lease_key (it only spells a task key's lease key).
	skipped := map[string]bool{"may_use": true, "may_use_under": true, "task_lease_key": true}

	rows, err := db.Pool.Query(ctx, `
SELECT DISTINCT p.proname
  FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
 WHERE n.nspname = 'pgfence'
   AND (pg_catalog.has_function_privilege('pgfence_app', p.oid, 'EXECUTE')
        OR pg_catalog.has_function_privilege('pgfence_operator', p.oid, 'EXECUTE'))
   AND p.proargnames[1:p.pronargs] && ARRAY['p_key', 'key', 'p_resource', 'resource', 'p_scope', 'p_prefix', 'prefix', 'p_name']`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			t.Fatal(err)
		}
		if _, ok := calls[name]; !ok && !skipped[name] {
			t.Errorf("pgfence.%s takes a name but has no case here", name)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}

	for name, c := range calls {
		pool := app
		if c.operator {
			pool = operator
		}
		bad := []string{long}
		if c.empty {
			bad = append(bad, "''")
		}
		for _, b := range bad {
			q := strings.Replace(c.sql, "$N", b, 1)
			if _, err := pool.Exec(ctx, q); pgerr.Code(err) != pgerr.CodeInvalid {
				t.Errorf("%s with the name %.12s…: %v, want PF008", name, b, err)
			}
		}
	}
}
