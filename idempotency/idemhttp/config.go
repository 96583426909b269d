package idemhttp

import (
	"cmp"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/idempotency"
	"github.com/pgfence/pgfence/internal/driver"
)

// HeaderKey is the request header that carries the key (IETF
// draft-ietf-httpapi-idempotency-key-header), and HeaderReplayed marks a
// response that was replayed from the store.
const (
	HeaderKey      = "Idempotency-Key"
	HeaderReplayed = "Idempotent-Replayed"
)

// Defaults for [Config].
const (
	// MaxBodyBytesDefault bounds the request body read for the fingerprint.
	MaxBodyBytesDefault = 1 << 20
	// MaxResponseBytesDefault bounds the stored response body, and in
	// [ModeAtomic] the response a handler may write.
	MaxResponseBytesDefault = 1 << 20
)

// maxKeyBytes is the longest accepted Idempotency-Key value.
const maxKeyBytes = 255

// Mode says how the middleware runs a handler under a key.
type Mode int

const (
	// ModeAtomic, the default, is for handlers whose effect is writes to the
	// database that holds the keys. The middleware opens a READ COMMITTED
	// transaction, claims the key in it, hands it to the handler ([Tx]),
	// buffers the response and stores it in the same COMMIT as the handler's
	// writes: a crash at any point leaves either nothing (the retry runs the
	// handler) or the writes with their response (the retry replays it). The
	// response is sent after the COMMIT, so it cannot stream and is bounded
	// by [Config.MaxResponseBytes].
	ModeAtomic Mode = iota
	// ModeLeased is for handlers with external side effects (a payment
	// provider, an e-mail), with recovery points: the key is claimed with a
	// lease that commits before the handler runs, the handler reaches its
	// [idempotency.Attempt] with [Attempt] (derived keys for downstream
	// calls, [idempotency.Attempt.AdvanceTx] in the transaction of each
	// phase's writes), and the response is stored when the handler returns.
	// A crash between a phase and the stored response leaves the key in
	// progress; after the lease a retry or [idempotency.Store.Recover]
	// takes it over and resumes from the last recovery point. Use it also
	// for responses that stream or exceed [Config.MaxResponseBytes].
	ModeLeased
)

// Config configures [New]. A nil *Config is refused: the middleware needs a
// [Config.Principal] (or an explicit [Config.KeysSharedByAllCallers]).
// Other zero fields use the defaults.
type Config struct {
	// Mode is [ModeAtomic] (the default) or [ModeLeased].
	Mode Mode
	// Principal returns who sends the request (user, tenant, API client), as
	// established by authentication that runs before the middleware. Keys of
	// different principals never meet: one principal never gets another's
	// stored response. Return an identity, never a credential: it becomes
	// part of the stored scope and of span attributes. A request whose
	// principal is "" gets 401 and runs nothing.
	//
	// A replay does not run the handler, so authorization the handler would
	// do does not run either: decide it before the middleware, or fold it
	// into the principal (a caller that may no longer do what its key did
	// must not be let through to the replay).
	//
	// Required unless KeysSharedByAllCallers is set.
	Principal func(*http.Request) string
	// KeysSharedByAllCallers opts out of Principal: every caller shares one
	// key space, and anybody who sends another caller's key and request gets
	// that caller's stored response. Only for APIs whose keys are secret,
	// unguessable values. Setting both is refused.
	KeysSharedByAllCallers bool
	// Required makes a covered request without an Idempotency-Key fail with
	// 400. Default false: such requests run unprotected.
	Required bool
	// Methods are the covered methods; others pass through. Default POST
	// and PATCH, the methods that are not idempotent by definition.
	Methods []string
	// Service names the service whose keys these are, for several services
	// that share one database: every scope the middleware stores starts with
	// Service + "/" ([Middleware.ScopePrefix]), so that each service's
	// database role is granted its own prefix (pgfence.grant_prefix) and
	// can neither read nor answer with another service's stored responses.
	// Default "": scopes start with "http:", for a database with one
	// service. At most 64 bytes of UTF-8, without NUL or "/".
	Service string
	// Route names the operation. Default: method + " " + the ServeMux pattern
	// that matched (r.Pattern; wrap the handler, not the mux, to have it), or
	// the path when there is none. A route and principal whose scope would
	// be longer than [idempotency.MaxScopeBytes] or not valid UTF-8 without
	// NUL (a path decoded from %00 or %FF) are stored as a hash of it.
	Route func(*http.Request) string
	// CanonicalBody returns the part of the request body that names the
	// intent, in a canonical form: two requests whose results differ only in
	// what it leaves out count as the same request under one key. Method,
	// URI (path and query) and media type are always compared as well.
	// Default: [idempotency.CanonicalJSON] of a JSON body (media type
	// application/json or any +json), the bytes as sent otherwise (and for a
	// body that is not valid JSON). An error gets 400 and runs nothing.
	CanonicalBody func(r *http.Request, body []byte) ([]byte, error)
	// MaxBodyBytes bounds the request body read to fingerprint it; a larger
	// body gets 413. Default [MaxBodyBytesDefault].
	MaxBodyBytes int64
	// MaxResponseBytes bounds the stored response body. In [ModeLeased] a
	// larger response is still sent and the key completed (the effect
	// happened), but the replay carries the status and headers only. In
	// [ModeAtomic] the response is buffered until the COMMIT: a handler that
	// writes more gets an error from Write, its writes are rolled back and
	// the client gets 500. Default [MaxResponseBytesDefault]; at most half
	// of [idempotency.MaxResultBytes].
	MaxResponseBytes int
	// ReplayHeaders are the response headers stored and replayed. Default
	// Content-Type, Content-Language, Content-Location, Location, ETag and
	// Last-Modified; anything else (Set-Cookie, per-request ids, Date) is
	// not replayed. Content-Encoding is always kept too: the body is stored
	// as sent, and a replay without it would pass compressed bytes off as
	// the body.
	ReplayHeaders []string
	// Heartbeat is how often [ModeLeased] extends the lease while the
	// handler runs. Default a third of the store's [idempotency.Config.Lease];
	// 1 ms to half the lease (a heartbeat nearer the lease could arrive after
	// it lapsed, and a retry take the key over from a running handler).
	Heartbeat time.Duration
	// Logger receives warnings when a key cannot be claimed or settled.
	// Default: discard. The claims themselves are recorded by the store
	// ([idempotency.Config]).
	Logger *slog.Logger
}

// Middleware applies idempotency keys to net/http handlers; see the package
// documentation. It is safe for concurrent use.
type Middleware struct {
	cfg     Config // with the defaults
	store   *idempotency.Store
	db      idempotency.DB
	methods map[string]bool
	prefix  string // of every scope: Service + "/http:"
}

// New returns a Middleware that keeps keys through store in db, normally a
// pool. In [ModeAtomic] every request it runs holds one connection of db for
// the handler's duration, and a duplicate waiting for it one more for up to
// the store's [idempotency.Config.WaitTimeout]: a handler should do its
// database work through [Tx], not take a second connection from the same
// pool, which a burst of requests can exhaust (a claim that gets no
// connection within 10 s is answered 503). In [ModeLeased] the claim commits
// on its own before the handler runs.
//
// New refuses (with [idempotency.ErrInvalid], naming the field) a nil store
// or db (also a nil pool in the interface), a db that is one connection
// (*pgx.Conn, *pgxpool.Conn) or a transaction (pgx.Tx), which concurrent requests cannot
// share, a store not made by
// [idempotency.NewStore], a configuration without [Config.Principal] unless
// [Config.KeysSharedByAllCallers] is set, and out-of-range sizes.
func New(store *idempotency.Store, db idempotency.DB, cfg *Config) (*Middleware, error) {
	if store == nil || db == nil {
		return nil, fmt.Errorf("%w: idemhttp.New needs a store and a db", idempotency.ErrInvalid)
	}
	if err := driver.NilHandle(db); err != nil {
		return nil, err
	}
	switch db.(type) {
	case *pgx.Conn, *pgxpool.Conn:
		return nil, fmt.Errorf("%w: db is one connection (%T), which cannot serve concurrent requests: pass a *pgxpool.Pool", idempotency.ErrInvalid, db)
	case pgx.Tx:
		return nil, fmt.Errorf("%w: db is a transaction (pgx.Tx), which every request would share: pass a *pgxpool.Pool", idempotency.ErrInvalid)
	}
	if store.Lease() == 0 { // NewStore always sets one
		return nil, fmt.Errorf("%w: store: make it with idempotency.NewStore (a zero Store has no configuration)", idempotency.ErrInvalid)
	}
	m := &Middleware{cfg: *cmp.Or(cfg, &Config{}), store: store, db: db, methods: map[string]bool{}, prefix: "http:"}
	c, lease := &m.cfg, store.Lease()
	switch {
	case len(c.Service) > 64 || !validText(c.Service) || strings.Contains(c.Service, "/"):
		return nil, fmt.Errorf("%w: Config.Service must be at most 64 bytes of UTF-8 without NUL or \"/\", got %q", idempotency.ErrInvalid, c.Service)
	case c.Mode != ModeAtomic && c.Mode != ModeLeased:
		return nil, fmt.Errorf("%w: Config.Mode must be ModeAtomic or ModeLeased, got %d", idempotency.ErrInvalid, c.Mode)
	case c.Principal == nil && !c.KeysSharedByAllCallers:
		return nil, fmt.Errorf("%w: Config.Principal is required: without it one caller's stored response is replayed to any other caller "+
			"who sends the same key and request (set Config.KeysSharedByAllCallers only if keys are secret)", idempotency.ErrInvalid)
	case c.Principal != nil && c.KeysSharedByAllCallers:
		return nil, fmt.Errorf("%w: Config.Principal and Config.KeysSharedByAllCallers exclude each other", idempotency.ErrInvalid)
	case c.MaxBodyBytes < 0:
		return nil, fmt.Errorf("%w: Config.MaxBodyBytes must not be negative, got %d", idempotency.ErrInvalid, c.MaxBodyBytes)
	case c.MaxResponseBytes < 0 || c.MaxResponseBytes > idempotency.MaxResultBytes/2:
		return nil, fmt.Errorf("%w: Config.MaxResponseBytes must be 0 to %d, got %d", idempotency.ErrInvalid, idempotency.MaxResultBytes/2, c.MaxResponseBytes)
	case c.Heartbeat != 0 && (c.Heartbeat < time.Millisecond || c.Heartbeat > lease/2):
		return nil, fmt.Errorf("%w: Config.Heartbeat must be 1ms to half the store's lease (%v), got %v", idempotency.ErrInvalid, lease/2, c.Heartbeat)
	}
	if len(c.Methods) == 0 {
		c.Methods = []string{http.MethodPost, http.MethodPatch}
	}
	for _, meth := range c.Methods {
		m.methods[strings.ToUpper(meth)] = true
	}
	if c.Service != "" {
		m.prefix = c.Service + "/http:"
	}
	if c.Principal == nil { // keys shared by all callers: one principal for all
		c.Principal = func(*http.Request) string { return "" }
	}
	if c.Route == nil {
		c.Route = defaultRoute
	}
	if c.CanonicalBody == nil {
		c.CanonicalBody = defaultCanonicalBody
	}
	c.MaxBodyBytes = cmp.Or(c.MaxBodyBytes, MaxBodyBytesDefault)
	c.MaxResponseBytes = cmp.Or(c.MaxResponseBytes, MaxResponseBytesDefault)
	if c.ReplayHeaders == nil {
		c.ReplayHeaders = []string{"Content-Type", "Content-Language", "Content-Location", "Location", "ETag", "Last-Modified"}
	}
	if !slices.ContainsFunc(c.ReplayHeaders, func(h string) bool { return strings.EqualFold(h, "Content-Encoding") }) {
		c.ReplayHeaders = append(slices.Clip(c.ReplayHeaders), "Content-Encoding")
	}
	c.Heartbeat = cmp.Or(c.Heartbeat, lease/3)
	c.Logger = cmp.Or(c.Logger, slog.New(slog.DiscardHandler))
	return m, nil
}

func defaultRoute(r *http.Request) string {
	if r.Pattern != "" {
		return r.Method + " " + r.Pattern
	}
	return r.Method + " " + r.URL.Path
}
