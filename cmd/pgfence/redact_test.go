package main

import (
	"context"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/testkit/pgcluster"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

func TestRedact(t *testing.T) {
	const pw = "s3cr3t-PW"
	for _, s := range []string{
		"postgres://app:s3cr3t-PW@db.internal:5432/orders",
		"postgresql://app:s3cr3t-PW@db.internal/orders?sslmode=disable",
		"postgres://app:s3cr3t-PW@@db.internal/orders", // an unescaped '@' in the password
		"postgres://app:x@s3cr3t-PW@db.internal/orders",
		"postgres://app@db.internal/orders?password=s3cr3t-PW&sslmode=disable",
		"postgres://app@db.internal/orders?sslpassword=s3cr3t-PW",
		"host=db.internal user=app password=s3cr3t-PW dbname=orders",
		"host=db.internal password = 's3cr3t-PW x' dbname=orders",
		`host=db.internal password='it\'s s3cr3t-PW' dbname=orders`,
		"failed to connect: PASSWORD=s3cr3t-PW",
		"cannot parse `postgres://app:s3cr3t-PW@db.internal:port/x`: invalid port",
	} {
		if got := redact(s); strings.Contains(got, "s3cr3t") {
			t.Errorf("redact(%q) = %q: the password survived", s, got)
		}
	}
	// A known password is hidden wherever it occurs, also percent-encoded.
	if got := redact("auth for s3cr3t-PW and s3cr3t%2BPW failed", pw, "s3cr3t+PW"); strings.Contains(got, "s3cr3t") {
		t.Errorf("redact with known secrets: %q", got)
	}
	// What is not a password stays readable.
	for _, s := range []string{
		"cannot reach the database at localhost:5432 (connection failed): dial tcp: connection refused",
		"password authentication failed for user \"app\"",
		"postgres://app@db.internal:5432/orders",
	} {
		if got := redact(s); got != s {
			t.Errorf("redact(%q) = %q, want it unchanged", s, got)
		}
	}
}

// FuzzRedact: a password put into a connection string in any of the usual
// ways never survives redact, whatever it contains, and neither does an error
// message pgx builds from that string.
func FuzzRedact(f *testing.F) {
	for _, s := range []string{"s3cr3t-PW", "p@ss:w/rd?", "it's a 'secret'", `back\slash`, "spa ce", "üñí©ødé", "x&password=y"} {
		f.Add(s, "app", "db.internal")
	}
	f.Fuzz(func(t *testing.T, pw, user, host string) {
		// Σ marks the password's ends, so that it cannot be found by chance
		// in the rest of the string.
		if strings.ContainsRune(pw, 0) || strings.Contains(user+host, "Σ") {
			t.Skip()
		}
		pw = "Σ" + pw + "Σ"
		u := url.URL{Scheme: "postgres", User: url.UserPassword(user, pw), Host: host, Path: "/db"}
		q := url.Values{"password": {pw}, "sslmode": {"disable"}}
		kvQuoted := "host=h password='" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(pw) + "' dbname=d"
		forms := []string{
			u.String(),
			"postgres://" + user + "@" + host + "/db?" + q.Encode(),
			kvQuoted,
		}
		if !strings.ContainsAny(pw, " '\\\t\n\r\v\f") {
			forms = append(forms, "host=h password="+pw+" dbname=d")
		}
		for _, s := range forms {
			msgs := []string{s, "cannot connect with " + s + ": refused"}
			if _, err := pgxpool.ParseConfig(s); err != nil {
				msgs = append(msgs, err.Error())
			}
			for _, m := range msgs {
				got := redact(m, pw)
				if strings.Contains(got, pw) || strings.Contains(got, url.QueryEscape(pw)) || strings.Contains(got, url.PathEscape(pw)) {
					t.Fatalf("password %q survived in %q", pw, got)
				}
				// Without the known password, the patterns alone must hide it
				// in the raw connection string forms.
				if m == s {
					if got := redact(m); strings.Contains(got, pw) {
						t.Fatalf("patterns alone left %q in %q", pw, got)
					}
				}
			}
		}
	})
}

// TestSecretsStayOutOfCLIErrors runs commands against a database that cannot
// be reached and one that refuses the password: neither the password nor the
// full connection string reaches stderr or stdout.
func TestSecretsStayOutOfCLIErrors(t *testing.T) {
	t.Parallel()
	const pw = "s3cr3t-PW"
	const tail = "Zq9-rest-of-it" // the part of a password pgx may not recognise as one
	urls := []string{
		"postgres://app:" + pw + "@127.0.0.1:1/orders?connect_timeout=2",
		"host=127.0.0.1 port=1 user=app password=" + pw + " dbname=orders connect_timeout=2",
		"postgres://app:" + pw + "@127.0.0.1:notaport/orders", // a parse error
		"host=127.0.0.1 port=1 user=app password='" + pw + " x' dbname=orders connect_timeout=2",
		// Careless strings whose password pgx cannot delimit: an unescaped
		// '@' (the rest parses as the host name) and an unterminated quote.
		"postgres://app:" + pw + "@" + tail + "@127.0.0.1:1/orders?connect_timeout=2",
		"host=127.0.0.1 port=1 user=app password='" + pw + " " + tail + " dbname=orders",
	}
	// A server that is up and refuses the password.
	cluster := startPasswordCluster(t)
	urls = append(urls, cluster+"&password="+url.QueryEscape(pw),
		strings.Replace(cluster, "pwuser@", "pwuser:"+pw+"@", 1))
	refused := 0
	for _, u := range urls {
		for _, args := range [][]string{
			{"leases", "list"}, {"fences", "list"}, {"doctor"}, {"migrate", "status"}, {"tables", "protect", "t", "--resource-column", "c"}, {"bench", "compare"}, {"demo"},
		} {
			code, out, errOut := cli(t, map[string]string{"DATABASE_URL": u}, args...)
			if code == exitOK {
				t.Errorf("%v with %q: exit 0", args, u)
			}
			if strings.Contains(errOut, "authentication failed") {
				refused++
			}
			if strings.Contains(out+errOut, pw) || strings.Contains(out+errOut, tail) || strings.Contains(out+errOut, u) {
				t.Errorf("%v: the password leaked:\n%s%s", args, out, errOut)
			}
			code, out, errOut = cli(t, nil, append(args, "--database-url", u)...)
			if code == exitOK || strings.Contains(out+errOut, pw) || strings.Contains(out+errOut, tail) {
				t.Errorf("%v --database-url: code %d, the password leaked:\n%s%s", args, code, out, errOut)
			}
		}
	}
	if refused == 0 {
		t.Fatal("no command met a refused password: the test did not exercise authentication errors")
	}
}

// startPasswordCluster starts a cluster whose pg_hba.conf asks role pwuser
// for a password (scram-sha-256) and returns a URL for it without one.
func startPasswordCluster(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "pgfence-hba-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	hba := filepath.Join(dir, "pg_hba.conf")
	rules := "host all pwuser 127.0.0.1/32 scram-sha-256\nhost all all 127.0.0.1/32 trust\nlocal all all trust\n"
	// The server may run as another user (postgres, when the tests run as root).
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(hba, []byte(rules), 0o644); err != nil {
		t.Fatal(err)
	}
	c := pgfencetest.NewCluster(t, &pgfencetest.ClusterOptions{Settings: map[string]string{"hba_file": hba}})
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, pgcluster.At(c.Addr()).ConnString("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, `CREATE ROLE pwuser LOGIN PASSWORD 'the-right-one'`); err != nil {
		t.Fatal(err)
	}
	return "postgres://pwuser@" + c.Addr() + "/postgres?connect_timeout=5"
}
