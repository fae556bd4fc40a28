// Package chaos holds the infrastructure of oncekit's chaos runs: real
// services and real OS processes on loopback that a run can kill and bring
// back while the chain works.
//
//   - NATSCluster: n nats-server processes forming one JetStream cluster,
//     whose nodes can be SIGKILLed and restarted on the same ports and store.
//   - StartPG: a throwaway PostgreSQL cluster (internal/testkit/pgcluster, with
//     fsync on and frequent checkpoints) that can be stopped with `pg_ctl
//     stop -m immediate` and started again through crash recovery.
//   - PGProxy: a TCP proxy in front of PostgreSQL that follows the frontend
//     protocol and can cut connections at random or right after a COMMIT
//     reached the server and before its reply reaches the client.
//   - Supervisor: runs named roles as OS processes, restarts them when they
//     die, kills them on demand and counts deaths by cause.
//
// Two runs are built on them: Run (make chaos), the payments example's whole
// chain, and RunFleet (make chaos-fleet), a relay fleet of thirty members in
// five processes (FleetMemberMain) serving eleven databases on three
// PostgreSQL clusters, judged by CheckFleet.
//
// Every piece picks free loopback ports at start, keeps its files (configs,
// logs, stores) under a directory the caller gives, and releases everything on
// Close, which is safe to call after a failed test.
//
// The checker reads oncekit's tables with SQL of its own on purpose, not
// through the reads of the packages that own them (outbox, inbox,
// sideeffect, idempotency): it is an oracle, and a mistake in an owner's
// read must not hide from the run that checks it.
package chaos
