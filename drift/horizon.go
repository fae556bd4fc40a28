package drift

import (
	"context"
	"fmt"
	"time"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/inbox"
)

// Horizon declares how far back a consumer's claims in processed_messages
// must reach: its source's redelivery and duplicate horizon (what
// inbox.Horizon computes from the source's limits). A redelivered copy older
// than the oldest claim would run its handler again.
type Horizon struct {
	// Consumer is the inbox consumer's name.
	Consumer string
	// Horizon is the redelivery/duplicate horizon.
	Horizon time.Duration
	// Since is when the consumer first ran. A consumer younger than its
	// horizon cannot have claims that old and is not checked. Zero means it
	// has run longer than its horizon.
	Since time.Time
}

// horizonCheck reports the consumers whose claims stop short of their
// horizon: claims newer than the horizon exist, none older does (retention
// deleted them). An idle consumer (no recent claim) is not judged. The
// inbox reads the claims (Store.ClaimsAround).
func horizonCheck(c Config) check {
	store, err := inbox.NewStore(c.Schema)
	return check{name: "processed_messages_retention", run: func(ctx context.Context, db oncekit.Querier) (Finding, error) {
		if err != nil {
			return Finding{}, err
		}
		var f Finding
		for _, h := range c.Horizons {
			if !h.Since.IsZero() && time.Since(h.Since) < h.Horizon {
				continue
			}
			recent, old, err := store.ClaimsAround(ctx, db, h.Consumer, h.Horizon)
			if err != nil {
				return Finding{}, err
			}
			if recent && !old {
				f.Value++
				f.Examples = append(f.Examples, fmt.Sprintf(
					"consumer %s keeps no claim older than its horizon %s: its retention is shorter, and an older redelivery would run again",
					h.Consumer, h.Horizon))
			}
		}
		f.Drift = f.Value > 0
		return f, nil
	}}
}
