// Package idemhttp applies idempotency keys to net/http handlers, following
// the IETF Idempotency-Key header draft (draft-ietf-httpapi-idempotency-key-header):
// a request of a covered method (POST and PATCH by default) that carries
// an Idempotency-Key runs the handler at most once per (principal, route,
// key); every duplicate gets the stored response, marked
// "Idempotent-Replayed: true".
//
//	store, err := idempotency.NewStore(nil)
//	mw, err := idemhttp.New(store, pool, &idemhttp.Config{
//		Principal: func(r *http.Request) string { return userID(r) }, // set by your auth middleware
//	})
//	mux.Handle("POST /orders", mw.Wrap(http.HandlerFunc(createOrder)))
//
//	func createOrder(w http.ResponseWriter, r *http.Request) {
//		tx := idemhttp.Tx(r.Context()) // the transaction that holds the key
//		... tx.Exec(r.Context(), `INSERT INTO orders ...`) ...
//		w.WriteHeader(http.StatusCreated)
//	}
//
// # Modes
//
// [ModeAtomic], the default, is for handlers whose effect is writes to the
// database that holds the keys. The middleware opens a READ COMMITTED
// transaction, claims the key in it ([idempotency.Store.Begin]), hands it to
// the handler ([Tx]), buffers the response and stores it in the same COMMIT
// as the handler's writes; only then is the response sent. The response is
// bounded by [Config.MaxResponseBytes] and cannot stream; the writer is no
// http.Flusher and cannot be hijacked.
//
// [ModeLeased] is for handlers with external side effects (a payment
// provider, an e-mail), with recovery points, and for responses that stream
// or are large. The key is claimed with a lease that commits before the
// handler runs and is extended while it runs; the handler reaches its
// [idempotency.Attempt] with [Attempt] to derive downstream keys and to
// record each phase's recovery point with [idempotency.Attempt.AdvanceTx]
// in that phase's transaction; the response is stored when the handler
// returns. Its writer streams (http.Flusher) but cannot be hijacked
// either: a hijacked answer would bypass what the key stores. A key whose
// process crashed is taken over after its lease by the client's retry (the handler runs again and resumes from the recovery point)
// or by [idempotency.Store.Recover] (a completer; [EncodeResponse] stores a
// response for it).
//
// Asynchronous answers: a handler in ModeAtomic that hands the work over
// instead of doing it enqueues an ordered task through [Tx]
// (leases/tasks.Enqueue) and answers 202 Accepted with a Location the
// client polls. The task commits with the stored answer, or not at all, and
// every duplicate gets the same 202 and Location; the status handler reads
// tasks.Status and answers only the principal whose task it is (keep the
// principal in the payload). No caller holds a connection while the work
// waits for its turn.
//
// # Keys, principals and fingerprints
//
// Keys are scoped by principal and route: [Config.Principal] is required
// (without it one caller's stored response, a 201 with private data, say,
// would be replayed to any other caller who sends the same key and body),
// unless [Config.KeysSharedByAllCallers] says keys are secret values shared
// by all callers. A replay does not run the handler, so authorization that
// the handler does is not repeated: decide it before the middleware, or fold
// it into the principal. 401 and 403 answers are never stored.
//
// Several services on one database: give each a [Config.Service] and a
// database role granted only its own prefix (pgfence.grant_prefix(role,
// service + '/')). Every scope then starts with the service's name
// ([Middleware.ScopePrefix]), so that one service can neither read another's
// stored responses nor answer with them. Without it every scope starts with
// "http:", which suits a database with one service.
//
// A duplicate must be the same request: method, URI (path and query), media
// type (Content-Type, case and parameter order normalised) and the body in a
// canonical form. For a JSON body (application/json or any +json type) the
// canonical form is [idempotency.CanonicalJSON]: member order, white space,
// string escapes and number forms (2, 2.0, 20e-1) do not matter; any other
// body must match byte for byte. [Config.CanonicalBody] supplies another form,
// for example the fields that name the intent only. The request is stored
// only as its SHA-256.
//
// # Status codes
//
//	request                                      ModeAtomic and ModeLeased
//	no Idempotency-Key, Config.Required          400 problem; handler not run
//	no Idempotency-Key, not required             the handler runs unprotected
//	key repeated, not an sf-string or a token    400 problem saying what is wrong
//	  of printable ASCII, empty, > 255 chars
//	principal ""                                 401 problem; handler not run
//	body larger than Config.MaxBodyBytes         413 problem
//	body refused by Config.CanonicalBody         400 problem
//	same key, another request                    422 problem; stored response not shown
//	same key, first request still running        atomic: waits up to the store's
//	                                             WaitTimeout (at most 10 s, then 503
//	                                             with Retry-After: 1), then its
//	                                             response or 409;
//	                                             leased: 409; both with Retry-After
//	same key, first request done                 its stored status, allow-listed headers
//	                                             and body, Idempotent-Replayed: true
//	key store unreachable or too slow to claim,  503 problem with Retry-After: 1
//	  or a standby (failover under way)
//	claim's outcome unknown (connection broke)   503 problem; Retry-After: 1 (atomic),
//	                                             the lease (leased: the claim may hold
//	                                             the key until it ends)
//	atomic: COMMIT's outcome unknown             503 problem with Retry-After: 1; retry
//	                                             with the same key to learn the result
//	key store failing otherwise                  500 problem
//
// Problem documents follow RFC 9457 (application/problem+json). The package
// README compares each case with the IETF draft and with Stripe.
//
// # Guarantees
//
//   - One execution per (principal, route, key) and request: in ModeAtomic the
//     handler's writes commit at most once, and only together with the
//     response every duplicate gets; in ModeLeased the handler runs with one
//     owner at a time, and a takeover resumes from the last recovery point
//     the crashed owner committed.
//   - A crash at any point of an atomic request — before the COMMIT, during
//     it, after it, before the response is written — leaves either nothing
//     (the retry runs the handler) or the writes and their stored response
//     (the retry replays it); never the writes without the response.
//   - A duplicate never runs concurrently with the first request and never
//     gets a 500 for it: it waits (atomic) or gets 409 with Retry-After.
//   - Principals never share keys, stored responses or derived keys.
//   - Only the allow-listed headers ([Config.ReplayHeaders], plus
//     Content-Encoding) are stored and replayed; Set-Cookie and per-request
//     headers are not.
//   - 2xx and 3xx responses are stored as results, 4xx as permanent failures,
//     except 401, 403, 408, 409, 425 and 429, which, like 5xx and panics, are
//     not stored: the retry runs the handler again. In ModeAtomic such an
//     answer also rolls the handler's writes back.
//
// # Failure handling
//
//   - The handler panics: ModeAtomic rolls its transaction back, ModeLeased
//     releases the key (its recovery points stay); the panic goes on and the
//     retry runs the handler.
//   - The handler answers 5xx (or another answer that is not stored): in
//     ModeAtomic its writes roll back and nothing is kept; in ModeLeased the
//     key is released and its recovery points stay.
//   - The handler commits or rolls back [Tx] itself: the database refuses a
//     COMMIT without the stored response, and the client gets 500 with
//     nothing kept.
//   - An atomic response larger than [Config.MaxResponseBytes]: Write returns
//     an error, the writes roll back, the client gets 500.
//   - The client goes away: in ModeAtomic the handler's context ends, and a
//     handler that stops rolls back (a handler that finishes with
//     context.WithoutCancel commits and its response is stored for the
//     retry); in ModeLeased the lease is kept until the handler returns, and
//     its response is stored.
//   - The connection to the store breaks while an atomic request commits: 503
//     (outcome unknown); the retry replays the response if the COMMIT ran, or
//     runs the handler if it did not.
//   - The process dies in ModeLeased: the key stays in progress until its
//     lease ends, then a retry (409 until then) or [idempotency.Store.Recover]
//     takes it over.
//
// The store records every claim the middleware makes (pgfence.idempotency.
// operations by mode and outcome, a span per claim with scope and key; see
// [idempotency.Config]); the answers the middleware gives without a claim
// (400, 401, 413) are its status codes, which HTTP instrumentation such as
// otelhttp records, and a replay carries Idempotent-Replayed: true.
// [Config.Logger] gets the claims and settlements that fail. Bodies are
// never recorded.
package idemhttp
