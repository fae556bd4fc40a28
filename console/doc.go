// Package console is oncekit's operator console: one web page per layer
// (overview, outbox, inbox, side effects, edge, drift, audit) and the chain,
// which follows one operation through every layer from any of its IDs or
// its W3C trace ID, with the actions that fix what is stuck (unpark, replay
// dead letters, resolve or retry effects, resolve the edge's unknown
// records).
//
// It is an http.Handler (New) that a service may mount, and the `oncekit
// console` command. Pages are rendered on the server with html/template;
// its few static files are embedded, and every answer carries a strict
// Content-Security-Policy (no inline script or style, nothing from another
// origin).
//
// It is safe by default: read-only unless Config.Writes; with writes on,
// every action needs an authenticated operator (HTTP basic credentials, or
// a trusted header set by a reverse proxy), is refused cross-origin
// (http.CrossOriginProtection), asks for confirmation, and is written to
// the console_audit table (who, when, what, how many), which the console
// shows. Payloads and stored responses are hidden unless Config.Reveal
// allows showing them on request; sealed bodies are never decrypted; no
// credential is ever shown. Every query reads through an index or under a
// limit, with keyset pagination, so a page costs the same on a year of
// history as on an empty database. The console reads each table through
// the package that owns it (outbox, inbox, sideeffect, idempotency); its
// own SQL is over console_audit only.
package console
