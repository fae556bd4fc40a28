-- A completed record has two lifetimes: its response body, replayed until
-- body_expires_at (Route.TTL), and the key's meaning (fingerprint, status,
-- the replayed headers with the resource's Location, times), kept until
-- expires_at (Route.KeyTTL). Between
-- the two, a retry is told the key expired instead of running as new.
-- Records stored before this migration keep one lifetime (NULL: the body
-- lives as long as the record).
ALTER TABLE {schema}.idempotency_keys ADD COLUMN body_expires_at timestamptz;

-- Cleanup empties the response bodies past their lifetime.
CREATE INDEX idempotency_keys_body_expired ON {schema}.idempotency_keys (body_expires_at)
	WHERE response_body IS NOT NULL;
