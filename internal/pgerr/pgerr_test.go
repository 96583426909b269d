package pgerr_test

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/lib/pq"
	"github.com/lib/pq/pqerror"

	"github.com/pgfence/pgfence/internal/pgerr"
)

func TestClassifyServerErrors(t *testing.T) {
	for _, tc := range []struct {
		code string
		want error
	}{
		{pgerr.CodeNotPrimary, pgerr.ErrNotPrimary},
		{pgerr.CodeReadOnlyTransaction, pgerr.ErrNotPrimary},
		{pgerr.CodeSerializationFailure, pgerr.ErrIsolation},
		{pgerr.CodeIsolation, pgerr.ErrIsolation},
		{pgerr.CodeLockNotAvailable, pgerr.ErrLockTimeout},
		{pgerr.CodeQueryCanceled, pgerr.ErrStatementTimeout},
		{pgerr.CodeIdleInTxTimeout, pgerr.ErrIdleInTransactionTimeout},
		{pgerr.CodeInvalid, pgerr.ErrInvalid},
		{pgerr.CodeGrantsPaused, pgerr.ErrGrantsPaused},
		{pgerr.CodeAbandoned, pgerr.ErrAbandoned},
		{pgerr.CodeNotGranted, pgerr.ErrNotGranted},
		{pgerr.CodeStaleToken, pgerr.ErrStaleToken},
		{pgerr.CodeLeaseNotHeld, pgerr.ErrLeaseLost},
		{pgerr.CodeLeaseHeld, pgerr.ErrLeaseHeld},
		{pgerr.CodeKeyMismatch, pgerr.ErrMismatch},
		{pgerr.CodeUnfencedWrite, pgerr.ErrUnfencedWrite},
		{pgerr.CodeKeyInProgress, pgerr.ErrInProgress},
		{pgerr.CodeFloorNotRaised, pgerr.ErrFloorLowered},
		{pgerr.CodeTokenNotIssued, pgerr.ErrTokenNotIssued},
	} {
		err := pgerr.Classify(fmt.Errorf("wrapped: %w", &pgconn.PgError{Code: tc.code}), true)
		if !errors.Is(err, tc.want) {
			t.Errorf("Classify(%s) = %v, want %v", tc.code, err, tc.want)
		}
		if pgerr.Code(err) != tc.code {
			t.Errorf("Classify(%s) lost the original error: code %q", tc.code, pgerr.Code(err))
		}
	}
	// A statement the server rejected for a reason of its own is returned
	// as is: nothing committed.
	dup := &pgconn.PgError{Code: pgerr.CodeUniqueViolation}
	if err := pgerr.Classify(dup, true); err != dup {
		t.Errorf("Classify(23505) = %v, want it unchanged", err)
	}
}

// Classifying an error twice changes nothing: an unavailable database stays
// unavailable (not "outcome unknown"), and no message is repeated.
func TestClassifyIdempotent(t *testing.T) {
	for _, first := range []error{
		pgerr.Classify(&pgconn.ConnectError{}, true),
		pgerr.Classify(fmt.Errorf("x: %w", io.ErrUnexpectedEOF), true),
		pgerr.Classify(&pgconn.PgError{Code: pgerr.CodeNotPrimary}, true),
		pgerr.Classify(&pgconn.PgError{Code: pgerr.CodeLockNotAvailable}, true),
	} {
		if again := pgerr.Classify(first, true); again != first {
			t.Errorf("Classify(Classify(err)) = %v, want %v unchanged", again, first)
		}
		if !pgerr.Classified(first) {
			t.Errorf("Classified(%v) = false", first)
		}
	}
	if pgerr.Classified(errors.New("other")) {
		t.Error("Classified(a plain error) = true")
	}
}

// A connection exception the server or a pooler sent is unavailable before a
// statement that could commit was sent and an unknown outcome after it:
// PgBouncer answers 08P01 both before it forwarded anything and after it
// forwarded a COMMIT whose reply it lost: the SQLSTATE cannot tell them
// apart, only whether a statement that could commit was sent can.
func TestClassifyPoolerRefusal(t *testing.T) {
	for _, pe := range []*pgconn.PgError{
		{Severity: "ERROR", Code: "08P01", Message: "server login has been failing, try again later (server_login_retry)"},
		{Severity: "FATAL", Code: "08P01", Message: "server conn crashed?"},
		{Severity: "FATAL", Code: pgerr.CodeAdminShutdown, Message: "terminating connection due to administrator command"},
	} {
		if err := pgerr.Classify(pe, false); !errors.Is(err, pgerr.ErrUnavailable) || errors.Is(err, pgerr.ErrOutcomeUnknown) || pgerr.Code(err) != pe.Code {
			t.Errorf("Classify(%s %q, not sent) = %v, want ErrUnavailable keeping the server error", pe.Code, pe.Message, err)
		}
		if err := pgerr.Classify(pe, true); !errors.Is(err, pgerr.ErrOutcomeUnknown) || errors.Is(err, pgerr.ErrUnavailable) || pgerr.Code(err) != pe.Code {
			t.Errorf("Classify(%s %q, a commit sent) = %v, want ErrOutcomeUnknown keeping the server error", pe.Code, pe.Message, err)
		}
	}
}

// A refused connection sent nothing: unavailable, never "outcome unknown",
// even when the caller was about to send a commit.
func TestClassifyRefusedConnection(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = pgx.Connect(ctx, "postgres://u@"+addr+"/db?sslmode=disable")
	if err == nil {
		t.Fatal("connected to a closed port")
	}
	for _, sent := range []bool{false, true} {
		got := pgerr.Classify(err, sent)
		if !errors.Is(got, pgerr.ErrUnavailable) || errors.Is(got, pgerr.ErrOutcomeUnknown) {
			t.Errorf("Classify(refused, sent=%v) = %v, want ErrUnavailable only", sent, got)
		}
	}
}

// A connection that breaks after the request was sent is an unknown outcome;
// before, it is unavailable.
func TestClassifyBrokenConnection(t *testing.T) {
	broken := fmt.Errorf("read tcp: %w", io.ErrUnexpectedEOF)
	if got := pgerr.Classify(broken, true); !errors.Is(got, pgerr.ErrOutcomeUnknown) {
		t.Errorf("Classify(broken after send) = %v, want ErrOutcomeUnknown", got)
	}
	if got := pgerr.Classify(broken, false); !errors.Is(got, pgerr.ErrUnavailable) {
		t.Errorf("Classify(broken, not sent) = %v, want ErrUnavailable", got)
	}
	// The caller's context ending mid-flight: the server may still commit.
	if got := pgerr.Classify(context.DeadlineExceeded, true); !errors.Is(got, pgerr.ErrOutcomeUnknown) || !errors.Is(got, context.DeadlineExceeded) {
		t.Errorf("Classify(deadline after send) = %v, want ErrOutcomeUnknown wrapping the deadline", got)
	}
}

// An error raised inside the client before anything was sent is the caller's
// own bug: returned as is, never "unavailable".
func TestClassifyClientSideError(t *testing.T) {
	local := fmt.Errorf("mismatched param and argument count")
	if got := pgerr.Classify(local, false); got != local {
		t.Errorf("Classify(client-side error) = %v, want it unchanged", got)
	}
}

// A pgfence object that does not exist means the schema is missing or older
// than the client: the error says what to do and keeps the server's error.
// An application's own missing table is left alone.
// A prepared statement missing on the backend (a pooler moved the client
// between round trips) is explained with the URL settings that avoid it,
// once however often it is classified, and stays the server's error.
func TestClassifyStatementGone(t *testing.T) {
	for _, msg := range []string{`prepared statement "stmtcache_1f2e" does not exist`, "unnamed prepared statement does not exist"} {
		pe := &pgconn.PgError{Code: "26000", Message: msg}
		err := pgerr.Classify(pgerr.Classify(fmt.Errorf("pgfence: resolve: %w", pe), true), true)
		if strings.Count(err.Error(), "binary_parameters=yes") != 1 || !strings.Contains(err.Error(), "default_query_exec_mode=exec") {
			t.Errorf("Classify(26000 %q) = %v; want the pooler hint once", msg, err)
		}
		if pgerr.Code(err) != "26000" || errors.Is(err, pgerr.ErrOutcomeUnknown) || errors.Is(err, pgerr.ErrUnavailable) {
			t.Errorf("Classify(26000 %q) = %v: lost the server error or reclassified it", msg, err)
		}
	}
}

func TestClassifySchemaMissing(t *testing.T) {
	for _, tc := range []struct {
		code, msg string
		hint      bool
	}{
		{"42883", "function pgfence.try_acquire(unknown, bigint, unknown, unknown, unknown, boolean) does not exist", true},
		{"42P01", `relation "pgfence.leases" does not exist`, true},
		{"3F000", `schema "pgfence" does not exist`, true},
		{"42P01", `relation "orders" does not exist`, false},
		{"42P01", `relation "pgfence_demo.stock" does not exist`, false},
		{"42883", "function my_func(integer) does not exist", false},
	} {
		pe := &pgconn.PgError{Code: tc.code, Message: tc.msg}
		err := pgerr.Classify(fmt.Errorf("leases: acquire: %w", pe), true)
		if got := strings.Contains(err.Error(), "migrate up"); got != tc.hint {
			t.Errorf("Classify(%s %q) = %v; hint %v, want %v", tc.code, tc.msg, err, got, tc.hint)
		}
		if pgerr.Code(err) != tc.code || errors.Is(err, pgerr.ErrOutcomeUnknown) {
			t.Errorf("Classify(%s %q) = %v: lost the server error or called it unknown", tc.code, tc.msg, err)
		}
	}
}

// fakeServer accepts one connection on 127.0.0.1, completes the startup
// without authentication, then reads one message and closes the connection
// without answering. It returns a connection string to it.
func fakeServer(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { l.Close(); <-done })
	go func() {
		defer close(done)
		conn, err := l.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
		b := pgproto3.NewBackend(conn, conn)
		if _, err := b.ReceiveStartupMessage(); err != nil {
			return
		}
		b.Send(&pgproto3.AuthenticationOk{})
		b.Send(&pgproto3.BackendKeyData{ProcessID: 1, SecretKey: []byte{0, 0, 0, 0}})
		b.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
		if err := b.Flush(); err != nil {
			return
		}
		_, _ = b.Receive() // the statement: then hang up without a reply
	}()
	host, port, _ := net.SplitHostPort(l.Addr().String())
	return fmt.Sprintf("host=%s port=%s user=u database=db sslmode=disable", host, port)
}

// pgx refuses to use a connection it already closed before sending anything
// ("conn closed", safe to retry): unavailable, never "outcome unknown", even
// when the caller was about to send a commit.
func TestClassifyClosedConnection(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := pgconn.Connect(ctx, fakeServer(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := conn.Close(ctx); err != nil {
		t.Fatal(err)
	}
	_, err = conn.Exec(ctx, "commit").ReadAll()
	if !errors.Is(err, pgconn.ErrConnClosed) || !pgconn.SafeToRetry(err) {
		t.Fatalf("Exec on a closed connection: %v, want a safe-to-retry conn closed", err)
	}
	for _, sent := range []bool{false, true} {
		got := pgerr.Classify(err, sent)
		if !errors.Is(got, pgerr.ErrUnavailable) || errors.Is(got, pgerr.ErrOutcomeUnknown) || !errors.Is(got, pgconn.ErrConnClosed) {
			t.Errorf("Classify(conn closed before sending, sent=%v) = %v, want ErrUnavailable only, wrapping it", sent, got)
		}
	}
	if !pgerr.IsConnectionError(err) {
		t.Errorf("IsConnectionError(conn closed) = false")
	}
}

// pgx also says "conn closed" when the connection broke after the statement
// was written (not safe to retry): that outcome is unknown, not guessed.
func TestClassifyClosedAfterSend(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := pgconn.Connect(ctx, fakeServer(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "commit").ReadAll()
	if !errors.Is(err, pgconn.ErrConnClosed) || pgconn.SafeToRetry(err) {
		t.Fatalf("Exec cut after sending: %v, want a conn closed that is not safe to retry", err)
	}
	if got := pgerr.Classify(err, true); !errors.Is(got, pgerr.ErrOutcomeUnknown) || errors.Is(got, pgerr.ErrUnavailable) {
		t.Errorf("Classify(conn closed after sending) = %v, want ErrOutcomeUnknown only", got)
	}
}

// lib/pq's server errors are read as pgx's are: the SQLSTATE through
// SQLState, the message and DETAIL from their fields, so pgfence's own codes
// map to the same sentinels whichever driver ran the statement.
func TestServerErrorOfEveryDriver(t *testing.T) {
	for _, err := range []error{
		&pgconn.PgError{Code: pgerr.CodeStaleToken, Message: "stale", Detail: "presented=1 accepted=2 resource=r"},
		&pq.Error{Code: pgerr.CodeStaleToken, Message: "stale", Detail: "presented=1 accepted=2 resource=r"},
	} {
		wrapped := fmt.Errorf("statement: %w", err)
		se, ok := pgerr.Server(wrapped)
		if !ok || se.Code != pgerr.CodeStaleToken || se.Message != "stale" || se.Detail != "presented=1 accepted=2 resource=r" {
			t.Errorf("%T: Server = %+v, %v", err, se, ok)
		}
		if pgerr.Code(wrapped) != pgerr.CodeStaleToken {
			t.Errorf("%T: Code = %q", err, pgerr.Code(wrapped))
		}
		if got := pgerr.Classify(wrapped, true); !errors.Is(got, pgerr.ErrStaleToken) || pgerr.Code(got) != pgerr.CodeStaleToken {
			t.Errorf("%T: Classify = %v, want ErrStaleToken keeping the server's answer", err, got)
		}
	}
	for _, tc := range []struct {
		code string
		want error
	}{
		{pgerr.CodeNotPrimary, pgerr.ErrNotPrimary},
		{pgerr.CodeLockNotAvailable, pgerr.ErrLockTimeout},
		{pgerr.CodeNotGranted, pgerr.ErrNotGranted},
		{pgerr.CodeAbandoned, pgerr.ErrAbandoned},
	} {
		if err := pgerr.Classify(&pq.Error{Code: pqerror.Code(tc.code)}, true); !errors.Is(err, tc.want) {
			t.Errorf("Classify(*pq.Error %s) = %v, want %v", tc.code, err, tc.want)
		}
	}
	missing := pgerr.Classify(&pq.Error{Code: "42883", Message: "function pgfence.fence(unknown, integer, unknown) does not exist"}, true)
	if !strings.Contains(missing.Error(), "migrate up") || errors.Is(missing, pgerr.ErrOutcomeUnknown) {
		t.Errorf("Classify(*pq.Error missing pgfence function) = %v", missing)
	}
	if _, ok := pgerr.Server(errors.New("not a server error")); ok {
		t.Error("Server found a server error in a plain error")
	}
}

// database/sql's driver.ErrBadConn says the connection cannot be used.
// lib/pq returns it also when the connection broke after a request was
// sent, so it is unavailable only when nothing can have been sent.
func TestClassifyBadConn(t *testing.T) {
	if got := pgerr.Classify(driver.ErrBadConn, true); !errors.Is(got, pgerr.ErrOutcomeUnknown) || !errors.Is(got, driver.ErrBadConn) {
		t.Errorf("Classify(ErrBadConn, sent) = %v, want ErrOutcomeUnknown wrapping it", got)
	}
	if got := pgerr.Classify(driver.ErrBadConn, false); !errors.Is(got, pgerr.ErrUnavailable) || errors.Is(got, pgerr.ErrOutcomeUnknown) {
		t.Errorf("Classify(ErrBadConn, not sent) = %v, want ErrUnavailable", got)
	}

	// What lib/pq returns for a COMMIT the server received before the
	// connection broke: ErrBadConn, although the COMMIT was sent.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	connector, err := pq.NewConnector(fakeServer(t))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := connector.Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, err = conn.(driver.ExecerContext).ExecContext(ctx, "commit", nil)
	if err != driver.ErrBadConn {
		t.Fatalf("lib/pq, connection cut after COMMIT was sent: %v, want driver.ErrBadConn", err)
	}
	if got := pgerr.Classify(err, true); !errors.Is(got, pgerr.ErrOutcomeUnknown) || errors.Is(got, pgerr.ErrUnavailable) {
		t.Errorf("Classify(lib/pq's ErrBadConn after COMMIT) = %v, want ErrOutcomeUnknown only", got)
	}
}
