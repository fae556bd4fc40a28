// Package browsertests drives the operator console in a real headless
// Chromium (Debian's chromium package), as an operator would: it finds a
// payment by its Idempotency-Key, follows its chain, replays a dead letter,
// resolves an unknown effect and reads the audit, and fails on any console
// error or Content-Security-Policy violation. It is a module of its own so
// that the library's go.mod carries no browser driver.
package browsertests
