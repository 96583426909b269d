package robustness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/pgfence/pgfence/internal/testkit/workerproc"
	"github.com/pgfence/pgfence/pgfence/pgfencetest/container"
)

func TestMain(m *testing.M) {
	workerproc.Serve(map[string]workerproc.Handler{"actor": serveActor})
	container.Main(m)
}

// opArgs are the arguments of every actor command.
type opArgs struct {
	Key   string        `json:"key,omitempty"`
	Token int64         `json:"token,omitempty"`
	Value string        `json:"value,omitempty"`
	TTL   time.Duration `json:"ttl,omitempty"`
	Wait  time.Duration `json:"wait,omitempty"`
	// Timeout bounds the operation inside the worker.
	Timeout time.Duration `json:"timeout,omitempty"`
	// Resolve reads an unknown outcome of a fenced write or an effect back
	// before answering (writeResolved, effectResolved).
	Resolve bool `json:"resolve,omitempty"`
}

var worker struct {
	mu    sync.Mutex
	actor *actor
}

// serveActor runs in a worker process: one actor, driven by the parent.
func serveActor(ctx context.Context, op string, raw json.RawMessage) (any, error) {
	if op == "open" {
		var c actorConfig
		if err := json.Unmarshal(raw, &c); err != nil {
			return nil, err
		}
		a, err := newActor(ctx, c)
		if err != nil {
			return nil, err
		}
		worker.mu.Lock()
		worker.actor = a
		worker.mu.Unlock()
		return "ok", nil
	}
	worker.mu.Lock()
	a := worker.actor
	worker.mu.Unlock()
	if a == nil {
		return nil, errors.New("open first")
	}
	var args opArgs
	if err := json.Unmarshal(raw, &args); err != nil {
		return nil, err
	}
	if args.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, args.Timeout)
		defer cancel()
	}
	switch op {
	case "acquire":
		return a.acquire(ctx, args.Key, args.TTL, args.Wait), nil
	case "write":
		if args.Resolve {
			return a.writeResolved(ctx, args.Key, args.Token, args.Value), nil
		}
		return a.write(ctx, args.Key, args.Token, args.Value), nil
	case "write_leased":
		return a.writeLeased(ctx, args.Key, args.Token, args.Value), nil
	case "effect":
		if args.Resolve {
			return a.effectResolved(ctx, args.Key, args.Value), nil
		}
		return a.effect(ctx, args.Key, args.Value), nil
	case "release":
		return a.release(ctx, args.Key), nil
	case "renew":
		return a.renewOp(ctx, args.Key), nil
	case "close":
		a.close()
		return "ok", nil
	}
	return nil, fmt.Errorf("unknown op %q", op)
}

// remote is an actor in a worker process, as seen by the test.
type remote struct {
	e      *env
	w      *workerproc.Worker
	client int
}

// startRemote starts a worker process with an actor connected to url.
func (e *env) startRemote(client int, url string) *remote {
	e.t.Helper()
	w := workerproc.Start(e.t, "actor", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// With wake-ups, as by default: a release wakes the workers waiting for the key.
	cfg := actorConfig{URL: url, App: fmt.Sprintf("pf-worker-%d", client), MaxConns: 4, Wakeups: true}
	if err := w.Call(ctx, "open", cfg, nil); err != nil {
		e.t.Fatalf("open worker %d: %v", client, err)
	}
	return &remote{e: e, w: w, client: client}
}

// kindOf maps an actor command to the kind of operation it records.
func kindOf(cmd string) Kind {
	switch cmd {
	case "acquire":
		return Acquire
	case "release":
		return Release
	case "effect":
		return Effect
	case "renew":
		return Renew
	default:
		return Write
	}
}

// pending is a recorded command in flight.
type pending struct {
	r    *remote
	p    *workerproc.Pending
	op   Op
	call int64
}

// send sends a command to the worker without waiting; the operation is
// recorded when its result is awaited.
func (r *remote) send(cmd string, args opArgs) *pending {
	planned := Op{Client: r.client, Kind: kindOf(cmd), Key: args.Key, Token: args.Token, Value: args.Value}
	call := r.e.rec.Now()
	return &pending{r: r, p: r.w.Go(cmd, args), op: planned, call: call}
}

// wait waits for the result at most d and records the operation; a result that
// does not come in time is an unknown outcome.
func (p *pending) wait(d time.Duration) Op {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var got Op
	err := p.p.Wait(ctx, &got)
	op := p.op
	if err != nil {
		op.Outcome, op.Err = Unknown, err.Error()
	} else {
		got.Client = op.Client
		if got.Kind == Write && got.Token == 0 {
			got.Token = op.Token
		}
		op = got
	}
	op.Call, op.Return = p.call, p.r.e.rec.Now()
	p.r.e.rec.Add(op)
	return op
}

// do runs one command and records it; d bounds the wait for the answer.
func (r *remote) do(cmd string, args opArgs, d time.Duration) Op {
	return r.send(cmd, args).wait(d)
}
