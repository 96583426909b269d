package patroni

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"
)

// Member roles as Patroni's REST API reports them.
const (
	RoleLeader      = "leader"
	RoleReplica     = "replica"
	RoleSyncStandby = "sync_standby"
)

// Member is one node as Patroni records it in etcd.
type Member struct {
	Name string
	// Role is [RoleLeader], [RoleReplica] or [RoleSyncStandby].
	Role string
	// State is PostgreSQL's as Patroni sees it: running, starting, stopped,
	// crashed, ...
	State    string
	Host     string
	Port     int
	Timeline int64
	// Lag is a replica's replication lag in bytes; nil when unknown (and
	// for the leader).
	Lag *int64
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

// Members reads the cluster from etcd, as Patroni keeps it there: the
// leader key, each member's key and the synchronous standby. Reading the
// DCS, not a node's REST API, matters: a node that was frozen answers
// from its cache, which still says what it was before.
func (c *Cluster) Members(ctx context.Context) ([]Member, error) {
	kv, err := c.readDCS(ctx)
	if err != nil {
		return nil, err
	}
	leader := kv["leader"]
	var syncKey struct {
		SyncStandby string `json:"sync_standby"`
	}
	_ = json.Unmarshal([]byte(kv["sync"]), &syncKey)
	syncs := map[string]bool{}
	for _, name := range strings.Split(syncKey.SyncStandby, ",") {
		syncs[name] = name != ""
	}
	var status struct {
		Optime int64 `json:"optime"`
	}
	_ = json.Unmarshal([]byte(kv["status"]), &status)
	var out []Member
	for key, value := range kv {
		name, ok := strings.CutPrefix(key, "members/")
		if !ok {
			continue
		}
		var data struct {
			State        string `json:"state"`
			ConnURL      string `json:"conn_url"`
			Timeline     int64  `json:"timeline"`
			XLogLocation *int64 `json:"xlog_location"`
		}
		if err := json.Unmarshal([]byte(value), &data); err != nil {
			return nil, fmt.Errorf("patroni: member %s: %w", name, err)
		}
		m := Member{Name: name, Role: RoleReplica, State: data.State, Timeline: data.Timeline}
		if n := c.Node(name); n != nil {
			m.Host, m.Port = "127.0.0.1", n.Port()
		}
		switch {
		case name == leader:
			m.Role = RoleLeader
		case syncs[name]:
			m.Role = RoleSyncStandby
		}
		if name != leader && data.XLogLocation != nil && status.Optime > 0 {
			lag := max(0, status.Optime-*data.XLogLocation)
			m.Lag = &lag
		}
		out = append(out, m)
	}
	slices.SortFunc(out, func(a, b Member) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// readDCS returns the cluster's keys in etcd, relative to its prefix
// (leader, members/node0, sync, status, ...), through etcd's v2 or v3 API.
func (c *Cluster) readDCS(ctx context.Context) (map[string]string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	prefix := "/pgfence/" + c.scope + "/"
	out := map[string]string{}
	if c.dcs == DCSEtcdV2 {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.etcd.url+"/v2/keys"+prefix+"?recursive=true", nil)
		if err != nil {
			return nil, err
		}
		var body struct {
			Node v2Node `json:"node"`
		}
		if err := c.doJSON(req, &body); err != nil {
			return nil, err
		}
		var walk func(n v2Node)
		walk = func(n v2Node) {
			if !n.Dir {
				out[strings.TrimPrefix(n.Key, prefix)] = n.Value
			}
			for _, ch := range n.Nodes {
				walk(ch)
			}
		}
		walk(body.Node)
		return out, nil
	}
	end := []byte(prefix)
	end[len(end)-1]++
	raw, _ := json.Marshal(map[string]string{
		"key":       base64.StdEncoding.EncodeToString([]byte(prefix)),
		"range_end": base64.StdEncoding.EncodeToString(end),
	})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.etcd.url+"/v3/kv/range", bytes.NewReader(raw))
	if err != nil {
		return nil, err
	}
	var body struct {
		KVs []struct {
			Key, Value string
		} `json:"kvs"`
	}
	if err := c.doJSON(req, &body); err != nil {
		return nil, err
	}
	for _, kv := range body.KVs {
		k, err1 := base64.StdEncoding.DecodeString(kv.Key)
		v, err2 := base64.StdEncoding.DecodeString(kv.Value)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("patroni: etcd answered a key that is not base64: %q", kv.Key)
		}
		out[strings.TrimPrefix(string(k), prefix)] = string(v)
	}
	return out, nil
}

// v2Node is a key or directory of etcd's v2 API.
type v2Node struct {
	Key   string   `json:"key"`
	Value string   `json:"value"`
	Dir   bool     `json:"dir"`
	Nodes []v2Node `json:"nodes"`
}

// doJSON sends req and decodes a 2xx JSON answer into out. etcd's v2 API
// answers 404 for a prefix with no key yet: that is an empty cluster.
func (c *Cluster) doJSON(req *http.Request, out any) error {
	resp, err := c.client.Do(req)
	if err != nil {
		return fmt.Errorf("patroni: etcd: %w", err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode == http.StatusNotFound {
		return nil
	}
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("patroni: etcd %s: %s: %s", req.URL.Path, resp.Status, strings.TrimSpace(string(raw)))
	}
	return json.Unmarshal(raw, out)
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
