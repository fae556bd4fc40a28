-- Idempotency keys are kept as digests, never as the client sent them:
-- idempotency_keys.key holds the hex SHA-256 of 'oncekit/idempotency/key/v1:'
-- followed by the key (idempotency.StoredKey), and lookups stay exact. The
-- records stored before this migration are rewritten the same way. Apply it
-- while no edge of an earlier release runs: one would look its keys up as
-- sent, miss them, and run a retried request again.
UPDATE {schema}.idempotency_keys
	SET key = encode(sha256(convert_to('oncekit/idempotency/key/v1:' || key, 'UTF8')), 'hex');
