package tasks_test

import (
	"testing"

	"github.com/pgfence/pgfence/internal/testkit/pyclient"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// A Python client (psycopg2, which opens a transaction before the first
// statement) produces and consumes through the SQL functions alone: a
// rolled-back enqueue leaves no task, a duplicate idempotency key returns the
// first task, a claim sent first in its transaction numbers the tasks 1, 2
// in enqueue order, and the business write commits with task_complete; a
// claim after the transaction wrote takes no numbering mark (nothing is
// numbered), and a full backlog is PF016.
func TestSQLClientProducesAndConsumes(t *testing.T) {
	db := pgfencetest.NewDatabase(t)
	lines := pyclient.Run(t, db.URL, `
import sys, psycopg2
url = sys.argv[1]
p = psycopg2.connect(url)                      # a producer: its transaction opens by itself
c = psycopg2.connect(url)                      # a consumer
pc, cc = p.cursor(), c.cursor()
pc.execute("CREATE TABLE applied (task bigint PRIMARY KEY, seq bigint)")
p.commit()

pc.execute("SELECT id FROM pgfence.task_enqueue('py/k', '{\"n\": 0}')")
p.rollback()
pc.execute("SELECT id, created FROM pgfence.task_enqueue('py/k', '{\"n\": 1}', 'req-1')")
first, created = pc.fetchone()
pc.execute("SELECT id, created FROM pgfence.task_enqueue('py/k', '{\"n\": 1}', 'req-1')")
again, created2 = pc.fetchone()
print("duplicate returns the first", created and not created2 and again == first)
pc.execute("SELECT id FROM pgfence.task_enqueue('py/k', '{\"n\": 2}')")
second = pc.fetchone()[0]
p.commit()
try:
    pc.execute("SELECT id FROM pgfence.task_enqueue('py/k', '{}', NULL, 2)")
    print("backlog not full")
except psycopg2.Error as e:
    print("backlog", e.pgcode)
p.rollback()

cc.execute("SELECT holder, token FROM pgfence.try_acquire(pgfence.task_lease_key('py/k'), interval '1 minute')")
holder, token = cc.fetchone()
cc.execute("SELECT count(*) FROM pgfence.task_claim('py/k', %s, %s)", (holder, token))
c.commit()                                     # the grant's transaction wrote: no mark taken
cc.execute("SELECT coalesce(mark_id, 0) FROM pgfence.task_keys WHERE key = 'py/k'")
print("mark after a late claim", cc.fetchone()[0])
c.commit()
batch = []
for _ in range(3):                             # first in its transaction: mark, then number
    cc.execute("SELECT id, seq FROM pgfence.task_claim('py/k', %s, %s) ORDER BY seq", (holder, token))
    batch = cc.fetchall()
    c.commit()
    if batch:
        break
print("claimed", [(i == first, i == second, s) for i, s in batch])
for i, s in batch:
    cc.execute("INSERT INTO applied VALUES (%s, %s)", (i, s))
cc.execute("SELECT pgfence.task_complete('py/k', %s, %s, %s, NULL)", (holder, token, [i for i, _ in batch]))
print("completed", cc.fetchone()[0])
c.commit()
cc.execute("SELECT state, seq FROM pgfence.task_status(%s)", (second,))
print("status", cc.fetchone())
cc.execute("SELECT count(*) FROM pgfence.task_status(123456)")
print("unknown id rows", cc.fetchone()[0])
`)
	want := []string{
		"duplicate returns the first True",
		"backlog PF016",
		"mark after a late claim 0",
		"claimed [(True, False, 1), (False, True, 2)]",
		"completed 2",
		"status ('done', 2)",
		"unknown id rows 0",
	}
	if len(lines) != len(want) {
		t.Fatalf("python printed %q, want %q", lines, want)
	}
	for i := range want {
		if lines[i] != want[i] {
			t.Errorf("line %d: %q, want %q", i, lines[i], want[i])
		}
	}
}
