package idemhttp

import (
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

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

// Defaults and limits for [Config].
const (
	// MaxBodyBytesDefault bounds the request body read for the fingerprint.
	MaxBodyBytesDefault = 1 << 20
	// MaxResponseBytesDefault bounds the stored response body, and in
	// [ModeAtomic] the response a handler may write.
	MaxResponseBytesDefault = 1 << 20
	// MaxKeyBytes is the longest accepted Idempotency-Key value.
	MaxKeyBytes = 255
)

// MethodsDefault are the methods the middleware covers by default: the
// ones that are not idempotent by definition.
var MethodsDefault = []string{http.MethodPost, http.MethodPatch}

// ReplayHeadersDefault are the response headers stored and replayed by
// default. Anything else (Set-Cookie, per-request ids, Date) is not replayed.
var ReplayHeadersDefault = []string{
	"Content-Type", "Content-Language", "Content-Location", "Location", "ETag", "Last-Modified",
}

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

// String returns "atomic" or "leased", the value of the
// pgfence.idempotency.mode span attribute.
func (m Mode) String() string {
	switch m {
	case ModeAtomic:
		return "atomic"
	case ModeLeased:
		return "leased"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

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
	// Methods are the covered methods; others pass through. Default
	// [MethodsDefault].
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
	// [ReplayHeadersDefault]. Content-Encoding is always kept too: the
	// body is stored as sent, and a replay without it would pass compressed
	// bytes off as the body.
	ReplayHeaders []string
	// Heartbeat is how often [ModeLeased] extends the lease while the
	// handler runs. Default a third of the store's [idempotency.Config.Lease];
	// 1 ms to half the lease (a heartbeat nearer the lease could arrive after
	// it lapsed, and a retry take the key over from a running handler).
	Heartbeat time.Duration
	// Logger receives a debug event per covered request, and warnings when a
	// key cannot be settled. Default: discard.
	Logger *slog.Logger
	// MeterProvider receives pgfence.idempotency.http.requests. Default: the
	// global otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// TracerProvider receives a pgfence.idempotency.http span per covered
	// request. Default: the global otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
}

// Middleware applies idempotency keys to net/http handlers; see the package
// documentation. It is safe for concurrent use.
type Middleware struct {
	store     *idempotency.Store
	db        idempotency.DB
	mode      Mode
	required  bool
	methods   map[string]bool
	principal func(*http.Request) string
	shared    bool   // keys are shared by all callers: no principal
	prefix    string // of every scope: Service + "/http:"
	route     func(*http.Request) string
	canonical func(*http.Request, []byte) ([]byte, error)
	maxBody   int64
	maxResp   int
	headers   []string
	heartbeat time.Duration
	logger    *slog.Logger
	tel       *instruments
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
	if cfg == nil {
		cfg = &Config{}
	}
	m := &Middleware{
		prefix:    "http:",
		store:     store,
		db:        db,
		mode:      cfg.Mode,
		required:  cfg.Required,
		methods:   map[string]bool{},
		principal: cfg.Principal,
		route:     cfg.Route,
		canonical: cfg.CanonicalBody,
		maxBody:   cfg.MaxBodyBytes,
		maxResp:   cfg.MaxResponseBytes,
		headers:   cfg.ReplayHeaders,
		heartbeat: cfg.Heartbeat,
		logger:    cfg.Logger,
	}
	switch {
	case len(cfg.Service) > 64 || !validText(cfg.Service) || strings.Contains(cfg.Service, "/"):
		return nil, fmt.Errorf("%w: Config.Service must be at most 64 bytes of UTF-8 without NUL or \"/\", got %q", idempotency.ErrInvalid, cfg.Service)
	case m.mode != ModeAtomic && m.mode != ModeLeased:
		return nil, fmt.Errorf("%w: Config.Mode must be ModeAtomic or ModeLeased, got %v", idempotency.ErrInvalid, m.mode)
	case m.principal == nil && !cfg.KeysSharedByAllCallers:
		return nil, fmt.Errorf("%w: Config.Principal is required: without it one caller's stored response is replayed to any other caller "+
			"who sends the same key and request (set Config.KeysSharedByAllCallers only if keys are secret)", idempotency.ErrInvalid)
	case m.principal != nil && cfg.KeysSharedByAllCallers:
		return nil, fmt.Errorf("%w: Config.Principal and Config.KeysSharedByAllCallers exclude each other", idempotency.ErrInvalid)
	case m.principal == nil:
		m.principal, m.shared = sharedPrincipal, true
	}
	methods := cfg.Methods
	if len(methods) == 0 {
		methods = MethodsDefault
	}
	for _, meth := range methods {
		m.methods[strings.ToUpper(meth)] = true
	}
	if cfg.Service != "" {
		m.prefix = cfg.Service + "/http:"
	}
	if m.route == nil {
		m.route = defaultRoute
	}
	if m.canonical == nil {
		m.canonical = defaultCanonicalBody
	}
	switch {
	case m.maxBody < 0:
		return nil, fmt.Errorf("%w: Config.MaxBodyBytes must not be negative, got %d", idempotency.ErrInvalid, m.maxBody)
	case m.maxBody == 0:
		m.maxBody = MaxBodyBytesDefault
	}
	switch {
	case m.maxResp < 0 || m.maxResp > idempotency.MaxResultBytes/2:
		return nil, fmt.Errorf("%w: Config.MaxResponseBytes must be 0 to %d, got %d", idempotency.ErrInvalid, idempotency.MaxResultBytes/2, m.maxResp)
	case m.maxResp == 0:
		m.maxResp = MaxResponseBytesDefault
	}
	if m.headers == nil {
		m.headers = ReplayHeadersDefault
	}
	if !slices.ContainsFunc(m.headers, func(h string) bool { return strings.EqualFold(h, "Content-Encoding") }) {
		m.headers = append(slices.Clip(m.headers), "Content-Encoding")
	}
	lease := store.Lease()
	switch {
	case m.heartbeat < 0:
		return nil, fmt.Errorf("%w: Config.Heartbeat must not be negative, got %v", idempotency.ErrInvalid, m.heartbeat)
	case m.heartbeat == 0:
		m.heartbeat = lease / 3
	case m.heartbeat < time.Millisecond || m.heartbeat > lease/2:
		return nil, fmt.Errorf("%w: Config.Heartbeat must be 1ms to half the store's lease (%v), got %v", idempotency.ErrInvalid, lease/2, m.heartbeat)
	}
	if m.logger == nil {
		m.logger = slog.New(slog.DiscardHandler)
	}
	m.tel = newInstruments(cfg.MeterProvider, cfg.TracerProvider, m.logger)
	return m, nil
}

// sharedPrincipal is the principal of every caller when keys are shared.
func sharedPrincipal(*http.Request) string { return "" }

func defaultRoute(r *http.Request) string {
	if r.Pattern != "" {
		return r.Method + " " + r.Pattern
	}
	return r.Method + " " + r.URL.Path
}
