-- A claim's key leads with the event ID. Event IDs are hashes, so two claims
-- almost never share one: a descent of the key decides on 16 bytes of uuid
-- and seldom compares the consumer's name. The batch consumer's claims cost
-- PostgreSQL about 1 µs less per message (BenchmarkConsume/oncekit-batch:
-- 17.1 -> 16.0 µs of PostgreSQL CPU per message, medians of four runs).
-- Every inbox statement names both columns, so each still finds its rows
-- through the key.
--
-- The new key is built under an exclusive lock on processed_messages: on a
-- large table, apply this migration while consumers are stopped.
ALTER TABLE {schema}.processed_messages
	DROP CONSTRAINT processed_messages_pkey,
	ADD PRIMARY KEY (message_id, consumer);
