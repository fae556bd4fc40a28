// Package idempotency is oncekit's HTTP edge: net/http middleware that makes
// a POST (or any unsafe method) safe to retry with an Idempotency-Key, after
// the IETF httpapi Idempotency-Key draft and Stripe's semantics.
//
// One Edge serves many routes; each route gets its own middleware from
// Edge.Route, a plain func(http.Handler) http.Handler, so it works with the
// standard mux, chi and gorilla alike.
//
// For each request with a key the middleware computes a fingerprint (SHA-256
// over method, operation, target and the RFC 8785 canonical form of a JSON
// body) and claims (tenant, operation, key) with one atomic INSERT … ON
// CONFLICT. Then:
//
//   - first request: the handler runs; its response is buffered, stored and
//     then sent;
//   - same key, same fingerprint, completed: the stored status, allow-listed
//     headers and body are replayed with Idempotent-Replayed: true;
//   - same key, different fingerprint: 422 IDEMPOTENCY_KEY_REUSED;
//   - same key still in progress: 409 IDEMPOTENCY_REQUEST_IN_PROGRESS with
//     Retry-After, or (Route.Waiting) a bounded wait and then the replay;
//   - 5xx, 401, 403, 408, 429 and panics store nothing: the key is free again.
//
// # Modes
//
// SameTx: the claim is a row inserted in a transaction that the handler
// receives through Tx(r). The handler's rows and outbox events, the claim and
// the stored response commit together, so a crash at any point leaves
// nothing, and a concurrent request waits on the claim's row lock (bounded
// by Route.Waiting; 409 otherwise). The claim adds no round trip to the
// handler's own BEGIN … COMMIT: it is pipelined with the BEGIN, and the
// response is stored in the COMMIT's round trip. A replay costs two round
// trips.
//
// Separate: the claim commits first, with a lease that the owner renews while
// its handler runs. The handler may call external systems. If the owning
// process dies, the claim stays in_progress until its lease runs out; the
// next retry with the same fingerprint then takes it over atomically (the row
// lock of ON CONFLICT DO UPDATE lets exactly one request win), with a new
// fencing token, and re-runs the handler with Info.Recovered set. A stale
// owner can then no longer store its response (the token does not match) and
// its handler context is cancelled with ErrOwnershipLost. The recovery is
// never a blind second execution: it is one fenced re-run, and handlers in
// Separate mode must make it harmless by deriving their IDs with DeriveID
// (writes become ON CONFLICT DO NOTHING no-ops) and by recording external
// calls in the side-effect ledger (oncekit's sideeffect package), which
// carries a deterministic key to the provider.
//
// # Storage
//
// Records live in the idempotency_keys table (migration 004) for Route.TTL
// (24 h by default); Edge.Run calls Edge.Prune every Config.RetentionInterval,
// which deletes expired completed records in batches of Config.RetentionBatch
// and never touches in-progress ones. A Sealer encrypts stored bodies;
// Route.Responses.NoStoreBody keeps no body at all. Keys appear in logs only as hashes.
package idempotency
