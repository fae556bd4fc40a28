package oncekit

import "errors"

// ErrAlreadyRunning is returned by the Run method of every oncekit daemon
// (outbox.Relay, inbox.Consumer, sideeffect.Dispatcher) called while
// another Run of the same value has not returned. Once Run returned, the
// value may run again.
var ErrAlreadyRunning = errors.New("oncekit: Run called while already running")
