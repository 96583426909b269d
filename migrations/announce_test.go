package migrations_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/pgerr"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// A renewal announcement carries the tag the documentation gives, made with
// the key's tag key, and says what the lease row says: the expiry the
// renewal just set, in the renewal's own statement. Keys have different tag
// keys; a role not granted a key gets neither its tag key nor an
// announcement of it; a grant that is not live is not announced.
func TestAnnouncementsAreSigned(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := pgfencetest.NewDatabase(t)
	name, app := loginRole(t, db, "pgfence_app")
	if _, err := db.Pool.Exec(ctx, `SELECT pgfence.revoke_prefix($1::regrole, $2)`, name, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `SELECT pgfence.grant_prefix($1::regrole, $2)`, name, "svc/"); err != nil {
		t.Fatal(err)
	}
	listener, err := pgx.Connect(ctx, db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Close(context.Background())
	if _, err := listener.Exec(ctx, `LISTEN pgfence_lease_changed`); err != nil {
		t.Fatal(err)
	}

	const key = "svc/leader:eu" // a colon in the key: it comes last in the payload
	var holder string
	var token int64
	if err := app.QueryRow(ctx, `SELECT holder::text, token FROM pgfence.try_acquire($1, interval '1 hour')`, key).Scan(&holder, &token); err != nil {
		t.Fatal(err)
	}
	var expires time.Time
	var announced bool
	if err := app.QueryRow(ctx, `SELECT r.expires_at, n FROM pgfence.renew($1, $2::uuid, $3, interval '10 minutes') AS r
		CROSS JOIN LATERAL pgfence.announce_renewal($1, $2::uuid, r.token) AS n`, key, holder, token).Scan(&expires, &announced); err != nil || !announced {
		t.Fatalf("renew and announce: %v, announced %v", err, announced)
	}
	wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
	n, err := listener.WaitForNotification(wctx)
	wcancel()
	if err != nil {
		t.Fatal(err)
	}
	fields := strings.SplitN(n.Payload, ":", 6)
	if len(fields) != 6 || fields[0] != "renewed" || fields[2] != strconv.FormatInt(token, 10) || fields[5] != key {
		t.Fatalf("payload %q, want renewed:<remaining>:%d:<expiry>:<tag>:%s", n.Payload, token, key)
	}
	if fields[3] != strconv.FormatInt(expires.UnixMicro(), 10) {
		t.Errorf("announced expiry %s µs, want the renewal's %d (%s)", fields[3], expires.UnixMicro(), expires)
	}
	if remaining, err := strconv.ParseInt(fields[1], 10, 64); err != nil || remaining <= int64(9*time.Minute/time.Microsecond) || remaining > int64(10*time.Minute/time.Microsecond) {
		t.Errorf("announced remaining %s µs, want about 10 minutes", fields[1])
	}
	var tagKey []byte
	if err := app.QueryRow(ctx, `SELECT pgfence.announce_key($1)`, key).Scan(&tagKey); err != nil {
		t.Fatal(err)
	}
	msg := sha256.Sum256([]byte(fields[2] + ":" + fields[3] + ":" + key))
	want := sha256.Sum256(append(bytes.Clone(tagKey), msg[:]...))
	if fields[4] != hex.EncodeToString(want[:]) {
		t.Errorf("tag %s, want sha256(k || sha256(msg)) = %x", fields[4], want)
	}

	var other []byte
	if err := app.QueryRow(ctx, `SELECT pgfence.announce_key('svc/other')`).Scan(&other); err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(other, tagKey) || len(tagKey) != sha256.Size {
		t.Errorf("tag keys of two keys: %x and %x, want two different 32-byte keys", tagKey, other)
	}
	// Not granted: PF014, and nothing sent.
	if _, err := app.Exec(ctx, `SELECT pgfence.announce_key('billing/leader')`); pgerr.Code(err) != pgerr.CodeNotGranted {
		t.Errorf("announce_key of a key not granted: %v, want PF014", err)
	}
	if _, err := app.Exec(ctx, `SELECT pgfence.announce_renewal('billing/leader', $1::uuid, $2)`, holder, token); pgerr.Code(err) != pgerr.CodeNotGranted {
		t.Errorf("announce_renewal of a key not granted: %v, want PF014", err)
	}
	// Another holder, another token, a released grant: not announced.
	if _, err := app.Exec(ctx, `SELECT pgfence.release($1, $2::uuid, $3)`, key, holder, token); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]any{
		{key, "3b241101-e2bb-4255-8caf-4136c566a962", token},
		{key, holder, token + 1},
		{key, holder, token},
	} {
		if err := app.QueryRow(ctx, `SELECT pgfence.announce_renewal($1, $2::uuid, $3)`, args...).Scan(&announced); err != nil || announced {
			t.Errorf("announce_renewal%v: %v, %v; want false", args, announced, err)
		}
	}
	wctx, wcancel = context.WithTimeout(ctx, 300*time.Millisecond)
	defer wcancel()
	for {
		n, err := listener.WaitForNotification(wctx)
		if err != nil {
			break
		}
		if strings.HasPrefix(n.Payload, "renewed:") {
			t.Errorf("announced anyway: %q", n.Payload)
		}
	}
}
