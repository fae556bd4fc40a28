// Package untrusted makes strings that come from outside oncekit (broker
// message IDs, subjects and headers, providers' answers, broker and handler
// error text) storable in PostgreSQL text and jsonb columns.
//
// PostgreSQL refuses a text value that is not valid UTF-8 or holds a NUL
// byte, and jsonb refuses the escape \u0000; an index refuses a row wider
// than about 2,700 bytes. One such value in a statement that carries others
// fails them all. Every string from outside therefore goes through Text (for
// what an operator reads) or Key (for what identifies a row) before it
// reaches a column; the exact bytes are kept apart, as bytea, where an
// operator needs them.
package untrusted
