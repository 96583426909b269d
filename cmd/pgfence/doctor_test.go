package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

func TestDoctor(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgfencetest.NewDatabase(t)
	environ := map[string]string{"DATABASE_URL": db.URL}

	code, out, errOut := cli(t, environ, "doctor")
	if code != exitOK {
		t.Fatalf("doctor on a healthy database: code %d\n%s%s", code, out, errOut)
	}
	for _, want := range []string{"schema version", "synchronous_commit", "idle_in_transaction_session_timeout", "no transaction-mode pooler"} {
		if !strings.Contains(out, want) {
			t.Errorf("doctor output lacks %q:\n%s", want, out)
		}
	}

	// An expired, unreleased lease and a fenced-looking table without a trigger.
	if _, err := db.Pool.Exec(ctx, `
		INSERT INTO pgfence.leases (key, holder, token, granted_at, expires_at)
		VALUES ('job', gen_random_uuid(), pgfence.next_token(NULL), clock_timestamp() - interval '1 minute', clock_timestamp() - interval '30 seconds');
		CREATE TABLE public.reports (id int PRIMARY KEY, fence_token bigint NOT NULL);
		-- protected on a timestamptz column, as protect() allowed before migration 00014
		CREATE TABLE public.slots (at timestamptz PRIMARY KEY);
		CREATE TRIGGER pgfence_guard BEFORE INSERT OR UPDATE OR DELETE ON public.slots
		    FOR EACH ROW EXECUTE FUNCTION pgfence.guard('at', 'slot:')`); err != nil {
		t.Fatal(err)
	}
	code, out, _ = cli(t, environ, "doctor", "--json")
	var res struct {
		Checks []check
		Failed int
	}
	if code != exitOK || json.Unmarshal([]byte(out), &res) != nil {
		t.Fatalf("doctor --json: code %d\n%s", code, out)
	}
	got := map[string]check{}
	for _, c := range res.Checks {
		got[c.Name] = c
	}
	if c := got["leases"]; c.Status != statusWarn || !strings.Contains(c.Detail, "1 past expiry") {
		t.Errorf("leases check = %+v, want a warning about 1 expired lease", c)
	}
	if c := got["protected tables"]; c.Status != statusWarn || !strings.Contains(c.Detail, "public.reports") {
		t.Errorf("protected tables check = %+v, want a warning naming public.reports", c)
	}
	if c := got["protected resource columns"]; c.Status != statusWarn || !strings.Contains(c.Detail, "slots.at (timestamp with time zone)") {
		t.Errorf("protected resource columns check = %+v, want a warning naming slots.at", c)
	}

	// A missing schema fails the doctor.
	if _, err := db.Pool.Exec(ctx, `DROP SCHEMA pgfence CASCADE`); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = cli(t, environ, "doctor")
	if code != exitFailure || !strings.Contains(out, "migrate up") || !strings.Contains(errOut, "check(s) failed") {
		t.Fatalf("doctor without schema: code %d\n%s%s", code, out, errOut)
	}
}

// A schema whose version table records nothing (installed by a script from
// before `migrate sql` recorded its versions) is not "not installed": `migrate
// up` would fail on the objects that exist.
func TestDoctorUnrecordedSchema(t *testing.T) {
	t.Parallel()
	db := pgfencetest.NewDatabase(t)
	if _, err := db.Pool.Exec(context.Background(), `DELETE FROM pgfence.goose_db_version WHERE version_id > 0`); err != nil {
		t.Fatal(err)
	}
	c := doctorCheck(t, map[string]string{"DATABASE_URL": db.URL}, "schema")
	if c.Status != statusFail || !strings.Contains(c.Detail, "records no migration") || strings.Contains(c.Detail, "not installed") {
		t.Fatalf("schema check = %+v, want a failure naming the unrecorded objects", c)
	}
}
