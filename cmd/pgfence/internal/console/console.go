package console

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"html/template"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/idempotency"
	"github.com/pgfence/pgfence/leases"
)

// Defaults for [Config] fields left zero.
const (
	RefreshDefault     = 5 * time.Second
	PageSizeDefault    = 50
	DoctorEveryDefault = 30 * time.Second
)

// TokenEnv names the environment variable `pgfence ui` reads the access
// token from when --access-token is not given.
const TokenEnv = "PGFENCE_UI_TOKEN"

// Finding is one of the doctor's checks, shown on the overview.
type Finding struct {
	Name   string
	Status string // ok, warn or fail
	Detail string
}

// Config configures a [Server]. Zero fields take the defaults.
type Config struct {
	// Pool is the database, as the role the console reads (and acts) with.
	Pool *pgxpool.Pool
	// AllowActions registers the operator actions; without it none exists.
	AllowActions bool
	// AccessToken, when set, must be presented by every request.
	AccessToken string
	// Refresh is how often the overview reloads its data in the browser
	// (default [RefreshDefault], at least a second).
	Refresh time.Duration
	// PageSize is the number of rows of a list page (default
	// [PageSizeDefault], 1 to 1000).
	PageSize int
	// Doctor returns the doctor's findings; nil leaves them out.
	Doctor func(ctx context.Context) []Finding
	// DoctorEvery is how long the overview reuses the doctor's findings
	// (default [DoctorEveryDefault]).
	DoctorEvery time.Duration
}

// Server serves the console. Close it to stop its lease client.
type Server struct {
	cfg         Config
	leases      *leases.Client
	store       *idempotency.Store
	mux         *http.ServeMux
	csrf        string // this process's action token
	byteOrdered bool   // the database's default collation sorts by bytes
	doctor      struct {
		sync.Mutex
		at       time.Time
		findings []Finding
		running  bool // a run in the background
		wg       sync.WaitGroup
	}
}

//go:embed web
var web embed.FS

var pages = template.Must(template.New("").Funcs(template.FuncMap{
	"stamp": stamp, "left": left, "q": query,
}).ParseFS(web, "web/*.html"))

// New returns a console on cfg.Pool; it reads the database's collation once.
func New(ctx context.Context, cfg *Config) (*Server, error) {
	c := *cmp.Or(cfg, &Config{})
	switch {
	case c.Pool == nil:
		return nil, errors.New("console: Config.Pool is nil")
	case c.Refresh != 0 && c.Refresh < time.Second:
		return nil, fmt.Errorf("console: Config.Refresh must be at least 1s, got %s", c.Refresh)
	case c.PageSize < 0 || c.PageSize > 1000:
		return nil, fmt.Errorf("console: Config.PageSize must be 1 to 1000, got %d", c.PageSize)
	}
	c.Refresh = cmp.Or(c.Refresh, RefreshDefault)
	c.PageSize = cmp.Or(c.PageSize, PageSizeDefault)
	c.DoctorEvery = cmp.Or(c.DoctorEvery, DoctorEveryDefault)
	s := &Server{cfg: c, mux: http.NewServeMux()}
	var err error
	if s.byteOrdered, err = byteOrdered(ctx, c.Pool); err != nil {
		return nil, fmt.Errorf("console: read the database's collation: %w", err)
	}
	if s.store, err = idempotency.NewStore(nil); err != nil {
		return nil, err
	}
	if s.leases, err = leases.New(c.Pool, &leases.Config{DisableWakeups: true}); err != nil {
		return nil, err
	}
	var b [32]byte
	_, _ = rand.Read(b[:])
	s.csrf = hex.EncodeToString(b[:])

	s.mux.HandleFunc("GET /{$}", s.overview)
	s.mux.HandleFunc("GET /key", s.key)
	for _, l := range lists {
		s.mux.HandleFunc("GET /"+l.name, s.list(l))
	}
	s.mux.HandleFunc("GET /static/{file}", static)
	if c.AllowActions {
		for name, a := range actions {
			s.mux.HandleFunc("GET /action/"+name, s.confirm(name, a))
			s.mux.HandleFunc("POST /action/"+name, s.act(name, a))
		}
	}
	return s, nil
}

// Close waits for a doctor's run in the background and stops the console's
// lease client; the pool stays open.
func (s *Server) Close() {
	s.doctor.wg.Wait()
	s.leases.Close()
}

// ServeHTTP checks the access token, sets the security headers and serves
// the page.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "same-origin") // "no-referrer" makes Chromium send Origin: null with the forms
	h.Set("Cache-Control", "no-store")
	if s.cfg.AccessToken == "" && !loopbackHost(r.Host) {
		// A page of another site whose name was made to resolve to
		// 127.0.0.1 (DNS rebinding) is same-origin with itself, not with
		// the console: without a token, answer loopback names only.
		http.Error(w, fmt.Sprintf("pgfence ui: refused Host %q: without an access token the console answers only to localhost and loopback addresses", r.Host), http.StatusMisdirectedRequest)
		return
	}
	if s.cfg.AccessToken != "" && !s.authorized(w, r) {
		return
	}
	s.mux.ServeHTTP(w, r)
}

const accessCookie = "pgfence_access"

// authorized reports whether r presents the access token. A token given as
// ?access_token= is moved into a cookie and the URL reloaded without it.
func (s *Server) authorized(w http.ResponseWriter, r *http.Request) bool {
	if t := r.URL.Query().Get("access_token"); t != "" && same(t, s.cfg.AccessToken) {
		http.SetCookie(w, &http.Cookie{Name: accessCookie, Value: t, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode})
		q := r.URL.Query()
		q.Del("access_token")
		http.Redirect(w, r, (&url.URL{Path: r.URL.Path, RawQuery: q.Encode()}).String(), http.StatusSeeOther)
		return false
	}
	if c, err := r.Cookie(accessCookie); err == nil && same(c.Value, s.cfg.AccessToken) {
		return true
	}
	if b, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok && same(b, s.cfg.AccessToken) {
		return true
	}
	w.Header().Set("WWW-Authenticate", "Bearer")
	http.Error(w, "pgfence ui: this console needs its access token: open it once with ?access_token=TOKEN, or send Authorization: Bearer TOKEN", http.StatusUnauthorized)
	return false
}

// same compares two secrets in constant time (of their hashes, so that
// neither length leaks).
func same(a, b string) bool {
	ha, hb := sha256.Sum256([]byte(a)), sha256.Sum256([]byte(b))
	return subtle.ConstantTimeCompare(ha[:], hb[:]) == 1
}

// loopbackHost reports whether a request's Host names this machine.
func loopbackHost(hostport string) bool {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		host = hostport
	}
	ip := net.ParseIP(strings.Trim(host, "[]"))
	return host == "localhost" || (ip != nil && ip.IsLoopback())
}

// CheckAddr refuses to serve on a non-loopback address without an access
// token. A host name other than localhost counts as non-loopback.
func CheckAddr(addr, token string) error {
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return fmt.Errorf("address %q: %v", addr, err)
	}
	if loopbackHost(addr) || token != "" {
		return nil
	}
	return fmt.Errorf("address %q is reachable from other hosts: it needs an access token (--access-token or %s)", addr, TokenEnv)
}

// page is what every template gets.
type page struct {
	Title   string
	Nav     string // the section to highlight
	Refresh int    // seconds between reloads; 0: none
	Actions bool
	CSRF    string
	Data    any
}

func (s *Server) render(w http.ResponseWriter, r *http.Request, status int, name, title string, data any) {
	p := page{Title: title, Nav: name, Actions: s.cfg.AllowActions, Data: data}
	if name == "overview" {
		p.Refresh = int(s.cfg.Refresh / time.Second)
	}
	if s.cfg.AllowActions {
		p.CSRF = s.csrf
		http.SetCookie(w, &http.Cookie{Name: csrfCookie, Value: s.csrf, Path: "/action/", HttpOnly: true, SameSite: http.SameSiteStrictMode})
	}
	var b strings.Builder
	if err := pages.ExecuteTemplate(&b, name+".html", p); err != nil {
		http.Error(w, "pgfence ui: render "+name+": "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(b.String()))
}

// fail renders an error page: what went wrong, as text.
func (s *Server) fail(w http.ResponseWriter, r *http.Request, status int, err error) {
	s.render(w, r, status, "error", http.StatusText(status), err.Error())
}

func static(w http.ResponseWriter, r *http.Request) {
	types := map[string]string{"console.css": "text/css; charset=utf-8", "console.js": "text/javascript; charset=utf-8"}
	file := r.PathValue("file")
	b, err := web.ReadFile("web/" + file)
	if types[file] == "" || err != nil {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", types[file])
	_, _ = w.Write(b)
}

// stamp formats a database time, in UTC.
func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04:05.000Z")
}

// left formats a remaining duration.
func left(d time.Duration) string { return d.Round(time.Millisecond).String() }

// query builds a link's query string from name, value pairs, leaving out
// empty values.
func query(path string, kv ...string) string {
	q := url.Values{}
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] != "" {
			q.Set(kv[i], kv[i+1])
		}
	}
	if len(q) == 0 {
		return path
	}
	return path + "?" + q.Encode()
}
