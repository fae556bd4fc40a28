package natsjs

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncekit/oncekit/internal/cfgerr"
)

// DefaultDuplicates is the dedup window EnsureStream uses unless told
// otherwise: JetStream's own default is 2 minutes, which is shorter than a
// relay outage worth surviving. Within the window, a re-published message with
// a known Nats-Msg-Id is acknowledged as a duplicate and not stored again;
// beyond it, consumers' inbox dedup is what absorbs it.
const DefaultDuplicates = 10 * time.Minute

// StreamConfig describes the stream EnsureStream creates or updates.
type StreamConfig struct {
	// Name of the stream. Required.
	Name string
	// Subjects the stream captures. Required.
	Subjects []string
	// Duplicates is the dedup window. Defaults to DefaultDuplicates.
	Duplicates time.Duration
	// Storage defaults to file storage.
	Storage jetstream.StorageType
	// Replicas defaults to 1.
	Replicas int
	// MaxAge bounds how long messages are kept. Defaults to unlimited.
	MaxAge time.Duration
}

// EnsureStream creates the stream, or updates it to cfg if it exists.
func EnsureStream(ctx context.Context, js jetstream.JetStream, cfg StreamConfig) (jetstream.Stream, error) {
	if js == nil {
		return nil, fmt.Errorf("%w: EnsureStream: nil JetStream", ErrInvalidConfig)
	}
	bad := cfgerr.For(ErrInvalidConfig, "natsjs: StreamConfig")
	switch {
	case cfg.Name == "":
		return nil, bad("Name", "required")
	case len(cfg.Subjects) == 0:
		return nil, bad("Subjects", "required")
	}
	if err := bad.IfNegative(cfg, "Duplicates", "Replicas", "MaxAge"); err != nil {
		return nil, err
	}
	cfg.Duplicates = cmp.Or(cfg.Duplicates, DefaultDuplicates)
	cfg.Replicas = cmp.Or(cfg.Replicas, 1)
	s, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:       cfg.Name,
		Subjects:   cfg.Subjects,
		Duplicates: cfg.Duplicates,
		Storage:    cfg.Storage,
		Replicas:   cfg.Replicas,
		MaxAge:     cfg.MaxAge,
	})
	if err != nil {
		return nil, fmt.Errorf("natsjs: ensure stream %s: %w", cfg.Name, err)
	}
	return s, nil
}
