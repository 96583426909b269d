// Command device shows a device command channel where a controller that froze
// past its lease cannot send a late command to the device.
//
// Controllers take the lease "device/thermostat-7" and send set-point commands
// over HTTP to a simulated device gateway, each command carrying the lease's
// fencing token. The gateway is the authority at the edge: it remembers the
// highest token it accepted per device and rejects older ones (409), checking
// and applying under one lock. ctl-1 takes the lease first, prepares "set 30°C"
// and freezes past its lease; ctl-2 and ctl-3 take over and send their
// commands; when ctl-1 wakes up, the gateway rejects its command.
//
// The leases and tokens come from PostgreSQL; the check happens outside it.
// That only works because the gateway compares tokens: a device API that
// cannot do so is not protected by any lock (see examples/README.md).
//
// Run it:
//
//	go run ./examples/device                      # throwaway local PostgreSQL
//	DATABASE_URL=postgres://… go run ./examples/device
//
// It exits non-zero unless the device ends with the command of the highest
// token and the late command was rejected.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

const (
	device    = "thermostat-7"
	pausedTTL = 300 * time.Millisecond
	ttl       = time.Second
)

func main() {
	// DATABASE_URL, or a throwaway local PostgreSQL removed on exit.
	pgfencetest.Run("device", func(ctx context.Context, db *pgfencetest.Database) error {
		_, err := run(ctx, db.Pool, os.Stdout)
		return err
	})
}

// command is what a controller sends to the gateway.
type command struct {
	Controller string `json:"controller"`
	Token      int64  `json:"token"`
	SetPoint   int    `json:"set_point"`
}

// gateway simulates a device gateway that keeps the highest token it accepted
// per device. (A real one keeps it durably, or the device firmware does.)
type gateway struct {
	mu      sync.Mutex
	highest map[string]int64 // per device
	applied []command        // commands applied to thermostat-7, in order
}

func (g *gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var c command
	if err := json.NewDecoder(r.Body).Decode(&c); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	id := r.PathValue("device")
	// The check and the effect happen under one lock: atomic compare-and-apply.
	g.mu.Lock()
	defer g.mu.Unlock()
	if c.Token < g.highest[id] {
		w.WriteHeader(http.StatusConflict)
		fmt.Fprintf(w, "stale token %d, device already obeyed token %d", c.Token, g.highest[id])
		return
	}
	g.highest[id] = c.Token
	g.applied = append(g.applied, c)
	fmt.Fprintf(w, "%s set to %d°C", id, c.SetPoint)
}

// result is the business outcome, checked by main_test.go.
type result struct {
	Applied       []command // in the order the device applied them
	Final         command   // the device's current set point
	StaleRejected bool
}

func run(ctx context.Context, pool *pgxpool.Pool, out io.Writer) (result, error) {
	var res result
	var mu sync.Mutex // serialises output
	say := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(out, "  "+format+"\n", args...)
	}

	// Start the gateway on a loopback port.
	gw := &gateway{highest: map[string]int64{}}
	mux := http.NewServeMux()
	mux.Handle("POST /devices/{device}/commands", gw)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return res, err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln) //nolint:errcheck // returns ErrServerClosed on Shutdown
	defer srv.Shutdown(context.Background())
	hc := &http.Client{Timeout: 5 * time.Second}
	defer hc.CloseIdleConnections()
	url := "http://" + ln.Addr().String() + "/devices/" + device + "/commands"
	send := func(c command) (int, string, error) {
		body, _ := json.Marshal(c)
		resp, err := hc.Post(url, "application/json", bytes.NewReader(body))
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		msg, err := io.ReadAll(resp.Body)
		return resp.StatusCode, string(msg), err
	}

	client, err := leases.New(pool, nil)
	if err != nil {
		return res, err
	}
	defer client.Close()
	key := "device/" + device
	fmt.Fprintf(out, "device: three controllers command %s through a gateway that compares tokens\n", device)

	// ctl-1 gets the lease, prepares its command and freezes (nothing renews
	// its lease while it is frozen).
	frozen, err := client.Acquire(ctx, key, pausedTTL, &leases.AcquireOptions{HolderInfo: "ctl-1", NoKeepAlive: true})
	if err != nil {
		return res, err
	}
	late := command{Controller: "ctl-1", Token: frozen.Token(), SetPoint: 30}
	say("ctl-1 got the lease (token %d), prepared \"set 30°C\" and froze", frozen.Token())

	// ctl-2 and ctl-3 take over in turn and command the device.
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	var grantedMu sync.Mutex
	var highestGranted int64 // of ctl-2 and ctl-3's leases
	for i, ctl := range []string{"ctl-2", "ctl-3"} {
		wg.Go(func() {
			err := client.Do(ctx, key, ttl, nil, func(ctx context.Context, l *leases.Lease) error {
				grantedMu.Lock()
				highestGranted = max(highestGranted, l.Token())
				grantedMu.Unlock()
				status, msg, err := send(command{Controller: ctl, Token: l.Token(), SetPoint: 21 - i})
				if err == nil && status != http.StatusOK {
					err = fmt.Errorf("gateway answered %d: %s", status, msg)
				}
				if err == nil {
					say("%s (token %d): %s", ctl, l.Token(), msg)
				}
				return err
			})
			if err != nil {
				errs <- fmt.Errorf("%s: %w", ctl, err)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		return res, err
	}

	// ctl-1 wakes up and sends the command it prepared.
	status, msg, err := send(late)
	if err != nil {
		return res, err
	}
	res.StaleRejected = status == http.StatusConflict
	say("ctl-1 woke up and sent \"set 30°C\" with token %d: %d %s", late.Token, status, msg)
	_ = frozen.Release(ctx) // ErrLeaseLost: it expired while ctl-1 was frozen

	// Check the device's state: it never obeyed ctl-1, and it obeys the
	// command of the newest lease, the highest token the database granted.
	gw.mu.Lock()
	res.Applied = append([]command(nil), gw.applied...)
	gw.mu.Unlock()
	for _, c := range res.Applied {
		if c.Controller == "ctl-1" {
			return res, fmt.Errorf("the device obeyed the frozen controller's command (token %d)", c.Token)
		}
		res.Final = c
	}
	if res.Final.Token != highestGranted {
		return res, fmt.Errorf("the device ends with token %d's command, not the newest lease's (token %d)", res.Final.Token, highestGranted)
	}
	fmt.Fprintf(out, "result: %s applied %d commands; it is set to %d°C by %s (token %d); late command rejected: %t\n",
		device, len(res.Applied), res.Final.SetPoint, res.Final.Controller, res.Final.Token, res.StaleRejected)
	if !res.StaleRejected || res.Final.Controller == "ctl-1" {
		return res, fmt.Errorf("the frozen controller's late command reached the device")
	}
	fmt.Fprintln(out, "OK: the device obeys the newest lease holder only")
	return res, nil
}
