// Package sideeffect is oncekit's side-effect ledger: it makes the effects a
// service causes outside its own database (emails, webhooks, payment captures)
// happen once, or end in a state an operator can see.
//
// A handler records the effect in its own transaction with
// [Ledger.Record]; the row commits with the handler's other writes or not at
// all. The effect's idempotency key is derived from (source ID, kind) with
// [oncekit.DeriveKey], so recording the same effect again (a redelivered
// event, a retried request) is a no-op that returns the first row.
//
// A [Dispatcher] fires recorded effects: it claims due rows with
// FOR UPDATE SKIP LOCKED, commits them as fired (attempts+1, with a lease)
// BEFORE calling the kind's [Provider] with the key, and commits confirmed
// with the provider's reference afterwards. Claims and results are committed
// in batches, so throughput is not bounded by one commit per effect.
//
// Errors are classified by what they prove:
//
//   - definite ([Definite]): the provider certainly did not act (a
//     validation error). The effect becomes failed; it is not retried.
//   - indefinite (every other error): a timeout, a reset connection, a 5xx;
//     the provider may have acted. The effect is retried later with the SAME
//     key, with capped exponential backoff, or after the provider's
//     Retry-After ([RetryAfter]).
//
// A fired row whose lease expired means a dispatcher died mid-call. Recovery
// never invents a new key: when the provider honours keys (the default; see
// [KeyHonourer]) the effect is fired again with the same key; when it does
// not but offers a [Looker], the dispatcher asks the provider whether the key
// was acted on; otherwise the effect becomes unknown, is counted, and is never
// fired again until an operator decides ([Ledger.Retry], [Ledger.Resolve], or
// `oncekit effects`).
//
// States: pending -> fired -> confirmed, plus failed and unknown. Confirmed
// and failed rows are deleted after DispatcherConfig.Retention by
// [Dispatcher.Prune], which Run calls every RetentionInterval. The
// built-in HTTP webhook provider is in the webhook subpackage; the
// `oncekit dispatch` daemon runs a Dispatcher for kinds mapped to webhook
// endpoints.
package sideeffect
