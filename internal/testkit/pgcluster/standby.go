package pgcluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
)

// StandbyNameDefault is a standby's application_name when
// [StandbyConfig.Name] is empty.
const StandbyNameDefault = "pgfence_standby"

// StandbyConfig configures [Cluster.StartStandby]. A nil *StandbyConfig starts
// an asynchronous standby named [StandbyNameDefault].
type StandbyConfig struct {
	// Name is the standby's application_name on the primary. Default
	// [StandbyNameDefault].
	Name string
	// Sync makes the standby synchronous: the primary's
	// synchronous_standby_names is set to Name, so every commit on the primary
	// waits until the standby has flushed it.
	Sync bool
	// Settings are extra server settings of the standby.
	Settings map[string]string
}

// StartStandby creates a streaming-replication standby of c with
// pg_basebackup -R, starts it on a free port and waits until it streams from
// c (and, with Sync, until c lists it as synchronous). The standby is a
// Cluster of its own: Stop, Start, Kill, Close and [Cluster.Promote] work on
// it. Close it when done.
func (c *Cluster) StartStandby(ctx context.Context, cfg *StandbyConfig) (*Cluster, error) {
	if cfg == nil {
		cfg = &StandbyConfig{}
	}
	name := cfg.Name
	if name == "" {
		name = StandbyNameDefault
	}
	if !c.Running() {
		return nil, errors.New("pgcluster: StartStandby: the primary is not running")
	}
	root, err := os.MkdirTemp("", dirPrefix)
	if err != nil {
		return nil, fmt.Errorf("pgcluster: %w", err)
	}
	s := &Cluster{root: root, dataDir: filepath.Join(root, "data"), binDir: c.binDir, cred: c.cred, progress: c.progress}
	if err := s.chown(root); err != nil {
		s.removeAll()
		return nil, err
	}
	// The owner file marks the directory as ours before the server first starts.
	if err := os.WriteFile(filepath.Join(root, "owner.pid"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		s.removeAll()
		return nil, fmt.Errorf("pgcluster: %w", err)
	}
	c.progress("pg_basebackup of 127.0.0.1:" + strconv.Itoa(c.port))
	tool, err := c.toolPath("pg_basebackup")
	if err != nil {
		s.removeAll()
		return nil, err
	}
	cmd := s.command(ctx, "pg_basebackup", "-h", c.Host(), "-p", strconv.Itoa(c.port), "-U", Superuser,
		"-D", s.dataDir, "-X", "stream", "-c", "fast", "--no-sync", "-R")
	cmd.Path, cmd.Args[0] = tool, tool
	if out, err := cmd.CombinedOutput(); err != nil {
		s.removeAll()
		return nil, fmt.Errorf("pgcluster: pg_basebackup: %v: %s", err, lastLines(out, 5))
	}
	settings := map[string]string{
		// -R wrote a primary_conninfo too; this one adds the application_name
		// that synchronous_standby_names refers to.
		"primary_conninfo": fmt.Sprintf("host=%s port=%d user=%s application_name=%s", c.Host(), c.port, Superuser, name),
		"hot_standby":      "on",
	}
	for k, v := range cfg.Settings {
		settings[k] = v
	}
	s.settings = settings
	if err := s.Start(ctx); err != nil {
		s.removeAll()
		return nil, err
	}
	if cfg.Sync {
		if err := c.exec(ctx, `ALTER SYSTEM SET synchronous_standby_names = `+quoteLiteral(pgx.Identifier{name}.Sanitize())); err != nil {
			_ = s.Close()
			return nil, err
		}
		if err := c.exec(ctx, `SELECT pg_reload_conf()`); err != nil {
			_ = s.Close()
			return nil, err
		}
	}
	want := "async"
	if cfg.Sync {
		want = "sync"
	}
	if err := c.waitReplication(ctx, name, want); err != nil {
		_ = s.Close()
		return nil, err
	}
	return s, nil
}

// toolPath finds a client tool of the same installation as the server: next
// to the server binaries, next to the files they link to (a PATH directory of
// symlinks), else on PATH.
func (c *Cluster) toolPath(name string) (string, error) {
	candidates := []string{filepath.Join(c.binDir, name)}
	if real, err := filepath.EvalSymlinks(filepath.Join(c.binDir, "postgres")); err == nil {
		candidates = append(candidates, filepath.Join(filepath.Dir(real), name))
	}
	for _, p := range candidates {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("pgcluster: %s not found next to %s or on PATH", name, c.binDir)
}

func quoteLiteral(s string) string {
	out := []byte{'\''}
	for i := 0; i < len(s); i++ {
		if s[i] == '\'' {
			out = append(out, '\'')
		}
		out = append(out, s[i])
	}
	return string(append(out, '\''))
}

// exec runs one statement on c's maintenance database.
func (c *Cluster) exec(ctx context.Context, sql string) error {
	conn, err := pgx.Connect(ctx, c.ConnString("postgres"))
	if err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, sql); err != nil {
		return fmt.Errorf("pgcluster: %s: %w", sql, err)
	}
	return nil
}

// waitReplication waits until the primary c streams to standby name with
// sync_state state.
func (c *Cluster) waitReplication(ctx context.Context, name, state string) error {
	conn, err := pgx.Connect(ctx, c.ConnString("postgres"))
	if err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	defer conn.Close(context.Background())
	deadline := time.Now().Add(60 * time.Second)
	for {
		var got string
		err := conn.QueryRow(ctx, `SELECT sync_state FROM pg_stat_replication WHERE application_name = $1 AND state = 'streaming'`, name).Scan(&got)
		if err == nil && got == state {
			return nil
		}
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("pgcluster: waiting for standby %s: %w", name, err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pgcluster: standby %s not streaming (%s) after 60s (state %q)", name, state, got)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pgcluster: waiting for standby %s: %w", name, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// WaitReplayed waits until standby has replayed all WAL that c (its primary)
// has written so far.
func (c *Cluster) WaitReplayed(ctx context.Context, standby *Cluster) error {
	var target string
	pconn, err := pgx.Connect(ctx, c.ConnString("postgres"))
	if err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	err = pconn.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&target)
	_ = pconn.Close(context.Background())
	if err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	sconn, err := pgx.Connect(ctx, standby.ConnString("postgres"))
	if err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	defer sconn.Close(context.Background())
	deadline := time.Now().Add(60 * time.Second)
	for {
		var done bool
		if err := sconn.QueryRow(ctx, `SELECT coalesce(pg_last_wal_replay_lsn() >= $1::pg_lsn, false)`, target).Scan(&done); err != nil {
			return fmt.Errorf("pgcluster: %w", err)
		}
		if done {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pgcluster: standby has not replayed up to %s after 60s", target)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pgcluster: waiting for replay: %w", ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// Promote turns a standby into a primary with pg_promote() and waits until it
// accepts writes. The new primary runs on the next timeline.
func (c *Cluster) Promote(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, c.ConnString("postgres"))
	if err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	defer conn.Close(context.Background())
	var ok bool
	if err := conn.QueryRow(ctx, `SELECT pg_promote(true, 60)`).Scan(&ok); err != nil {
		return fmt.Errorf("pgcluster: pg_promote: %w", err)
	}
	if !ok {
		return errors.New("pgcluster: pg_promote: not promoted within 60s")
	}
	return nil
}

// InRecovery reports whether the server is a standby (pg_is_in_recovery()).
func (c *Cluster) InRecovery(ctx context.Context) (bool, error) {
	conn, err := pgx.Connect(ctx, c.ConnString("postgres"))
	if err != nil {
		return false, fmt.Errorf("pgcluster: %w", err)
	}
	defer conn.Close(context.Background())
	var in bool
	if err := conn.QueryRow(ctx, `SELECT pg_is_in_recovery()`).Scan(&in); err != nil {
		return false, fmt.Errorf("pgcluster: %w", err)
	}
	return in, nil
}
