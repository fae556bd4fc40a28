// Package backoff is oncekit's one home for the wait between a failure and
// the next try, over github.com/cenkalti/backoff/v4. A Policy names it in
// the words every Config uses: Min (the first wait), doubling with each
// consecutive failure, at most Max, spread by Jitter (or FullJitter), and
// never outside [Min, Max].
//
// Three forms share a Policy:
//
//   - Policy.Delay(attempt) is the wait after the attempt-th failure, for
//     attempts counted and stored elsewhere: the outbox relay's
//     next_attempt_at, the inbox consumer's redelivery delay, a side
//     effect's next call.
//   - Policy.Start returns a *Backoff whose Next grows with each failure
//     and Reset starts over after a success: a daemon's loop that retries
//     a claim, a batch or a broker connection in place.
//   - Retry calls an operation until it succeeds, returns an error marked
//     Permanent, or ctx ends: a reconnect loop.
package backoff
