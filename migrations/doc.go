// Package migrations holds oncekit's schema as numbered SQL files embedded in
// the binary, and applies them.
//
// Up applies the pending migrations in order, in one transaction under a
// transaction-scoped advisory lock, and records each in
// <schema>.schema_migrations; two deploys running it at once are safe, and a
// second run is a no-op. The schema name is configurable (WithSchema) and must
// be a plain identifier. Teams that run their own migration tool can take the
// DDL from SQL (or `oncekit migrate sql`) instead.
//
// Files are named NNN_name.sql. Every table reference is written
// "{schema}.table" and rendered with the configured schema.
package migrations
