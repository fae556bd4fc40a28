package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"

	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/sideeffect"
	"github.com/oncekit/oncekit/sideeffect/webhook"
)

// Deliberately broken builds, selected by PAYMENTS_BROKEN, exist only so that
// the chaos checker can be shown to catch what each guarantee prevents. A
// real service never sets it.
const (
	// brokenAckBeforeCommit acks each message as soon as it arrives, before
	// its transaction commits: a crash in between loses the ledger entry.
	brokenAckBeforeCommit = "ack-before-commit"
	// brokenFreshKey sends every provider call with a new idempotency key
	// instead of the effect's derived one: a retried call acts twice.
	brokenFreshKey = "fresh-provider-key"
)

// ackOnReceive acks deliveries before the consumer handles them. It keeps
// the source's order (an OrderedSource, as the real consumer reads), so the
// broken consumer works as the real one does, and loses only what a killed
// process had received and not committed.
type ackOnReceive struct{ inbox.OrderedSource }

func (s ackOnReceive) Receive(ctx context.Context, max int) ([]inbox.Delivery, error) {
	ds, err := s.OrderedSource.Receive(ctx, max)
	for _, d := range ds {
		_ = d.Ack(ctx)
	}
	return ds, err
}

// freshKey calls the provider with a random key, while still claiming to
// honour keys so that the dispatcher retries indefinite outcomes.
type freshKey struct{ *webhook.Provider }

func (p freshKey) Call(ctx context.Context, c sideeffect.Call) (string, error) {
	var b [16]byte
	_, _ = rand.Read(b[:])
	c.Key = hex.EncodeToString(b[:])
	return p.Provider.Call(ctx, c)
}

// ignoreCancel treats a daemon stopped by its context as a clean exit.
func ignoreCancel(err error) error {
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}
