// Package promshare registers the Prometheus collectors of oncekit's
// components. Those that may run several to a registerer (inbox consumers,
// side-effect dispatchers, drift checkers) use Register: the second one
// shares the first one's series instead of failing. Those that run one to a
// registerer (the outbox relay, the HTTP edge) use RegisterAlone, which
// says so when a second one tries.
package promshare
