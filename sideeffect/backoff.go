package sideeffect

import (
	"time"

	"github.com/oncekit/oncekit/internal/backoff"
)

// maxClaimBackoff caps the wait between failing claims (as the relay's
// MaxBrokerBackoff does by default): after an outage of the database the
// dispatcher claims again within seconds, whatever MaxBackoff says of calls.
const maxClaimBackoff = 10 * time.Second

// callBackoff is the wait before the next call of an effect after its
// attempt-th failed with an indefinite error: MinBackoff, ×2 per attempt,
// ±20 %, within MinBackoff and MaxBackoff.
func (d *Dispatcher) callBackoff() backoff.Policy {
	return backoff.Policy{Min: d.cfg.MinBackoff, Max: d.cfg.MaxBackoff, Jitter: 0.2}
}

// claimBackoff is the wait before claiming again after a claim failed:
// PollInterval after the first failure, doubling with each consecutive one,
// ±20 %, at most MaxBackoff or maxClaimBackoff, whichever is shorter (and
// never below PollInterval).
func (d *Dispatcher) claimBackoff() *backoff.Backoff {
	return backoff.Policy{Min: d.cfg.PollInterval, Max: min(d.cfg.MaxBackoff, maxClaimBackoff), Jitter: 0.2}.Start()
}
