-- What an idempotency record keeps of its answer past the answer's body:
-- the problem code of a rejection (the "code" of its JSON body, read by
-- the edge; NULL for a success or an answer without a valid code), kept
-- after the body is emptied at Route.TTL and on a route that stores no
-- body (Route.NoStoreBody); and the operation's ID (Info.ID,
-- DeriveID(tenant, key): the ID of the row the request creates), written
-- by the claim, so that an operator's tools find a key's record from a
-- payment's ID. Records claimed before this migration have neither.
ALTER TABLE {schema}.idempotency_keys
	ADD COLUMN problem_code text,
	ADD COLUMN operation_id uuid;

CREATE INDEX idempotency_keys_operation_id ON {schema}.idempotency_keys (operation_id)
	WHERE operation_id IS NOT NULL;
