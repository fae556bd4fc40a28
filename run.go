package oncekit

import "errors"

// ErrAlreadyRunning is returned by the Run method of every oncekit daemon
// (outbox.Relay, inbox.Consumer, sideeffect.Dispatcher) called while
// another Run of the same value has not returned. Once Run returned, the
// value may run again.
var ErrAlreadyRunning = errors.New("oncekit: Run called while already running")

// ErrStatementBroken is wrapped by the error a daemon's Healthy method
// (inbox.Consumer, outbox.Relay, sideeffect.Dispatcher) returns while a
// statement of its loop fails in a way that sending it again cannot cure:
// a missing grant, a table or column that is not there, a read-only
// server, an argument the driver cannot encode. The daemon keeps retrying
// with backoff and loses nothing; an operator must fix the cause.
var ErrStatementBroken = errors.New("oncekit: a statement PostgreSQL refuses as sent")
