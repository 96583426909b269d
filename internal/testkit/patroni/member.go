package patroni

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// Member roles as Patroni's REST API reports them.
const (
	RoleLeader      = "leader"
	RoleReplica     = "replica"
	RoleSyncStandby = "sync_standby"
)

// Member is one node as Patroni's /cluster endpoint reports it.
type Member struct {
	Name string `json:"name"`
	// Role is [RoleLeader], [RoleReplica] or [RoleSyncStandby].
	Role string `json:"role"`
	// State is PostgreSQL's as Patroni sees it: running, starting, stopped,
	// crashed, ...
	State    string `json:"state"`
	Host     string `json:"host"`
	Port     int    `json:"port"`
	Timeline int64  `json:"timeline"`
	// Lag is a replica's replication lag in bytes; nil when unknown (and
	// for the leader).
	Lag *int64 `json:"-"`
}

// UnmarshalJSON reads lag, which Patroni reports as bytes or as "unknown".
func (m *Member) UnmarshalJSON(b []byte) error {
	type plain Member
	var aux struct {
		plain
		Lag json.RawMessage `json:"lag"`
	}
	if err := json.Unmarshal(b, &aux); err != nil {
		return err
	}
	*m = Member(aux.plain)
	var lag int64
	if len(aux.Lag) > 0 && json.Unmarshal(aux.Lag, &lag) == nil {
		m.Lag = &lag
	}
	return nil
}

func (m Member) String() string {
	lag := "-"
	if m.Lag != nil {
		lag = fmt.Sprint(*m.Lag)
	}
	return fmt.Sprintf("%s %s %s tl=%d lag=%s", m.Name, m.Role, m.State, m.Timeline, lag)
}

func find(ms []Member, name string) (Member, bool) {
	for _, m := range ms {
		if m.Name == name {
			return m, true
		}
	}
	return Member{}, false
}

func leaderOf(ms []Member) (Member, bool) {
	for _, m := range ms {
		if m.Role == RoleLeader && m.State == "running" {
			return m, true
		}
	}
	return Member{}, false
}

// Members asks the nodes' REST APIs, in turn, for the cluster as Patroni
// sees it (from etcd); the first that answers wins. A frozen node's API does
// not answer: its request times out and the next node is asked.
func (c *Cluster) Members(ctx context.Context) ([]Member, error) {
	var errs []error
	for _, n := range c.nodes {
		var out struct{ Members []Member }
		if err := c.call(ctx, 2*time.Second, http.MethodGet, n, "/cluster", nil, &out); err != nil {
			errs = append(errs, err)
			continue
		}
		return out.Members, nil
	}
	return nil, errors.Join(errs...)
}

// call sends one request to n's REST API and decodes its JSON answer into
// out (when not nil).
func (c *Cluster) call(ctx context.Context, timeout time.Duration, method string, n *Node, path string, body, out any) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var rd io.Reader
	if body != nil {
		raw, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://"+n.RESTAddr()+path, rd)
	if err != nil {
		return err
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", n.Name, path, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s %s %s: %s: %s", n.Name, method, path, resp.Status, strings.TrimSpace(string(raw)))
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(raw, out)
}

// WaitFor polls the members until cond holds and returns them. It gives up
// after two minutes, or when ctx ends, with the last members seen and the
// logs' tails.
func (c *Cluster) WaitFor(ctx context.Context, what string, cond func([]Member) bool) ([]Member, error) {
	deadline := time.Now().Add(waitTimeout)
	var last []Member
	var lastErr error
	for {
		ms, err := c.Members(ctx)
		if err == nil {
			last, lastErr = ms, nil
			if cond(ms) {
				return ms, nil
			}
		} else {
			lastErr = err
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			cause := ctx.Err()
			if cause == nil {
				cause = fmt.Errorf("not after %s", waitTimeout)
			}
			return last, fmt.Errorf("patroni: waiting until %s: %w; members %v (last error %v)\n%s", what, cause, last, lastErr, c.Logs(8))
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Leader returns the running leader.
func (c *Cluster) Leader(ctx context.Context) (*Node, Member, error) {
	ms, err := c.WaitFor(ctx, "a leader runs", func(ms []Member) bool { _, ok := leaderOf(ms); return ok })
	if err != nil {
		return nil, Member{}, err
	}
	m, _ := leaderOf(ms)
	return c.Node(m.Name), m, nil
}

// Switchover asks Patroni to hand the leader role from leader to candidate
// (a planned switchover: the leader stops cleanly first, so nothing
// acknowledged is lost) and waits until Patroni reports it done.
func (c *Cluster) Switchover(ctx context.Context, leader, candidate *Node) error {
	c.progress(fmt.Sprintf("switchover %s -> %s", leader.Name, candidate.Name))
	// Patroni answers once the candidate leads, or after its own timeout.
	return c.call(ctx, waitTimeout, http.MethodPost, leader, "/switchover", map[string]string{"leader": leader.Name, "candidate": candidate.Name}, nil)
}
