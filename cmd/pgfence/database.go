package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/pgerr"
	"github.com/pgfence/pgfence/migrations"
)

// connectTimeoutDefault bounds how long a command waits for the database.
const connectTimeoutDefault = 10 * time.Second

// dbFlags are the connection flags shared by every command that needs a database.
type dbFlags struct {
	url     string
	timeout time.Duration
}

func (f *dbFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.url, "database-url", "", "PostgreSQL URL (default: $DATABASE_URL)")
	fs.DurationVar(&f.timeout, "connect-timeout", connectTimeoutDefault, "how long to wait for the database")
}

// resolve returns the URL to use: the flag, else DATABASE_URL.
func (f *dbFlags) resolve(e *env) (string, error) {
	url := f.url
	if url == "" {
		url = e.getenv("DATABASE_URL")
	}
	if url == "" {
		return "", &cliError{
			msg:  "no database: --database-url and DATABASE_URL are both empty",
			hint: "pass --database-url postgres://user:pass@host:5432/db or set DATABASE_URL",
			code: exitUsage,
		}
	}
	return url, nil
}

// connect opens a pool on the database and checks it answers within the
// connect timeout. Errors explain what is wrong in one line with a hint.
func (f *dbFlags) connect(ctx context.Context, e *env) (*pgxpool.Pool, error) {
	url, err := f.resolve(e)
	if err != nil {
		return nil, err
	}
	if f.timeout <= 0 {
		return nil, usageError("--connect-timeout must be positive, got %s", f.timeout)
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, &cliError{
			msg:  "invalid database URL: " + parseErrorText(err),
			hint: "expected postgres://user:password@host:5432/dbname?sslmode=disable or 'host=... dbname=...'",
			code: exitUsage,
			err:  err,
		}
	}
	// postgres://user:p@ss@host parses with the password's tail in the host
	// name, which every later message would show.
	for _, host := range hosts(cfg) {
		if strings.Contains(host, "@") {
			return nil, &cliError{
				msg:  "invalid database URL: its host name contains '@'",
				hint: "percent-encode an '@' in the user name or password as %40",
				code: exitUsage,
			}
		}
	}
	if cfg.ConnConfig.ConnectTimeout == 0 || cfg.ConnConfig.ConnectTimeout > f.timeout {
		cfg.ConnConfig.ConnectTimeout = f.timeout
	}
	if !namesExecMode(url) {
		cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	}
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, &cliError{msg: "invalid database configuration: " + redact(err.Error(), cfg.ConnConfig.Password), code: exitUsage, err: err}
	}
	pctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		// Not waited for: a connection cut short by the timeout is closed
		// with a cancel request, which PgBouncer holds while it has no
		// server connection (the server is down), and pgx waits up to 15 s
		// for it: past --connect-timeout.
		go pool.Close()
		addr := net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port)))
		return nil, unreachable(addr, cfg.ConnConfig.Database, err, cfg.ConnConfig.Password)
	}
	return pool, nil
}

// execModeParam is pgx's connection-string parameter that says how
// statements are sent.
const execModeParam = "default_query_exec_mode"

// The CLI sends every statement in pgx's exec mode (the extended protocol
// with the unnamed statement: Parse, Bind, Execute in one round trip), not
// pgx's default cache_statement, which prepares named statements on the
// server connection. Behind a transaction-mode pooler (PgBouncer
// pool_mode=transaction, before 1.21's max_prepared_statements) the next
// transaction may run on another server connection, where that name does
// not exist ("prepared statement stmtcache_... does not exist", 26000). Exec
// mode works on every server and pooler; for a command that runs each
// statement once it costs nothing (cache_statement takes a round trip more
// to prepare a statement the first time). A connection string that names
// default_query_exec_mode keeps its own choice.

// namesExecMode reports whether connString sets default_query_exec_mode
// itself, as a URL query parameter or a keyword.
func namesExecMode(connString string) bool {
	if strings.HasPrefix(connString, "postgres://") || strings.HasPrefix(connString, "postgresql://") {
		_, query, _ := strings.Cut(connString, "?")
		for _, kv := range strings.Split(query, "&") {
			if k, _, _ := strings.Cut(kv, "="); k == execModeParam {
				return true
			}
		}
		return false
	}
	return keywordExecMode.MatchString(connString)
}

var keywordExecMode = regexp.MustCompile(`(^|\s)` + execModeParam + `\s*=`)

// withExecMode returns connString with default_query_exec_mode=exec added,
// for the code that opens its own pools from a connection string (the demo
// and its worker process, the bench when a pooler is in between); one that
// names a mode already is returned as it is.
func withExecMode(connString string) string {
	switch {
	case namesExecMode(connString):
		return connString
	case strings.HasPrefix(connString, "postgres://") || strings.HasPrefix(connString, "postgresql://"):
		sep := "?"
		if strings.Contains(connString, "?") {
			sep = "&"
		}
		return connString + sep + execModeParam + "=exec"
	default:
		return connString + " " + execModeParam + "=exec"
	}
}

// hosts returns every host cfg would connect to.
func hosts(cfg *pgxpool.Config) []string {
	hs := []string{cfg.ConnConfig.Host}
	for _, fb := range cfg.ConnConfig.Fallbacks {
		hs = append(hs, fb.Host)
	}
	return hs
}

// parseErrorText describes a connection string that could not be parsed
// without quoting it: pgx's message quotes the whole string with the password
// hidden as well as pgx can tell where it ends, which an unterminated quote
// defeats (password='hunter 22 ... showed "22 ...").
func parseErrorText(err error) string {
	var pe *pgconn.ParseConfigError
	if !errors.As(err, &pe) {
		return redact(err.Error())
	}
	text := pe.Error()
	inner := errors.Unwrap(pe)
	if inner != nil {
		text = strings.TrimSuffix(text, " ("+inner.Error()+")")
	}
	if i := strings.LastIndex(text, "`: "); i >= 0 {
		text = text[i+len("`: "):]
	} else {
		text = "cannot parse the connection string"
	}
	if inner != nil {
		text += ": " + redact(inner.Error())
	}
	return text
}

// unreachable explains a failed connection attempt; password is hidden from
// every message.
func unreachable(addr, database string, err error, password string) error {
	ce := &cliError{code: exitUnavailable, err: fmt.Errorf("%w: %w", pgerr.ErrUnavailable, err)}
	switch pgerr.Code(err) {
	case "28P01", "28000":
		ce.msg = fmt.Sprintf("authentication failed at %s: %s", addr, pgerr.PgError(err).Message)
		ce.hint = "check the user and password in the database URL"
		ce.code = exitFailure
	case "3D000":
		ce.msg = fmt.Sprintf("database %q does not exist at %s", database, addr)
		ce.hint = "create it (createdb -- " + shellQuote(database) + ") or fix the database name in the URL"
		ce.code = exitFailure
	case "08P01":
		// PgBouncer's "server login has been failing, try again later
		// (server_login_retry)": after a failed login to the server it
		// refuses every new client for server_login_retry, even once the
		// server is back.
		ce.msg = fmt.Sprintf("the pooler at %s refused the connection: %s", addr, pgerr.PgError(err).Message)
		ce.hint = "PgBouncer refuses new clients for server_login_retry (default 15s) after its login to the server failed (a restart, a failover): retry in a few seconds; a lower server_login_retry in pgbouncer.ini shortens the wait"
	case "57P03":
		ce.msg = fmt.Sprintf("the server at %s is starting up or shutting down", addr)
		ce.hint = "retry in a few seconds"
	default:
		reason := "no answer"
		var netErr net.Error
		switch {
		case errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &netErr) && netErr.Timeout()):
			reason = "timed out"
		case pgerr.IsConnectionError(err):
			reason = "connection failed"
		}
		ce.msg = fmt.Sprintf("cannot reach the database at %s (%s): %s", addr, reason, redact(rootCause(err).Error(), password))
		ce.hint = "is PostgreSQL running and reachable from here? check the host and port in --database-url / DATABASE_URL"
	}
	return ce
}

// schemaError explains a schema problem found by the migrator.
func schemaError(err error) error {
	if errors.Is(err, migrations.ErrSchemaTooNew) {
		return &cliError{msg: err.Error(), hint: "when a newer pgfence migrated the schema, upgrade this binary: go install github.com/pgfence/pgfence/cmd/pgfence@latest", code: exitSchema, err: err}
	}
	if pgerr.IsConnectionError(err) {
		return &cliError{msg: "lost the database connection: " + redact(err.Error()), hint: "check that the server is up, then rerun (migrations are transactional and resume where they stopped)", code: exitUnavailable, err: err}
	}
	return err
}

// rootCause returns the innermost error: for a failed connection, the dial or
// protocol error without pgx's repeated per-address wrapping.
func rootCause(err error) error {
	for {
		if joined, ok := err.(interface{ Unwrap() []error }); ok && len(joined.Unwrap()) > 0 {
			err = joined.Unwrap()[0] // one attempt per address: the first says it
			continue
		}
		next := errors.Unwrap(err)
		if next == nil {
			return err
		}
		err = next
	}
}

// dbError explains an error from a command's database work.
func dbError(err error) error {
	switch {
	case errors.Is(err, pgerr.ErrUnavailable) || pgerr.IsConnectionError(err):
		return &cliError{msg: "lost the database: " + redact(err.Error()), hint: "check that the server is up and reachable, then rerun", code: exitUnavailable, err: err}
	case pgerr.Code(err) == "42P01" || pgerr.Code(err) == "3F000" || pgerr.Code(err) == "42883":
		return &cliError{msg: redact(err.Error()), hint: "the pgfence schema is missing or outdated: run `pgfence migrate up`", code: exitSchema, err: err}
	case pgerr.Code(err) == "42501":
		return &cliError{msg: redact(err.Error()), hint: "the role lacks a privilege: run operating commands as a member of pgfence_operator (protect and unprotect as the table's owner); see \"Roles and the threat model\" in pgfence/README.md", code: exitFailure, err: err}
	case errors.Is(err, pgerr.ErrInvalid):
		msg := err.Error()
		if se, ok := pgerr.Server(err); ok { // the server's words, without the SQLSTATE
			msg = se.Message
		}
		return &cliError{msg: redact(msg), hint: "see `pgfence help` for the command's arguments", code: exitUsage, err: err}
	case pgerr.Code(err) == pgerr.CodeNotGranted:
		return &cliError{msg: redact(err.Error()), hint: "no prefix of that name is granted to this role: the schema's owner (or an operator) grants one with SELECT pgfence.grant_prefix('ROLE', 'PREFIX'), or run the command as the schema's owner; see \"Roles and the threat model\" in pgfence/README.md", code: exitFailure, err: err}
	}
	return err
}

// shellQuote quotes s for a POSIX shell, so that a suggested command is
// safe to paste whatever the name contains.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
