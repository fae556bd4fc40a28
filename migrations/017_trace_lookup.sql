-- The console's chain looks an operation up by its W3C trace ID (the 32
-- hex digits of a traceparent, "00-<trace ID>-<span ID>-<flags>"): in the
-- trace context stored with each effect (migration 009) and in a dead
-- letter's headers (as oncekit writes them, or in their canonical MIME
-- form). Hash indexes: looked up by equality only, and cheaper to insert
-- into than a B-tree over random keys. The effects' index names neither
-- state nor the due time, so the claims' updates stay HOT (decision 014);
-- effects recorded without a trace context are not in it.
CREATE INDEX side_effects_trace_id ON {schema}.side_effects
	USING hash ((substr(trace->>'traceparent', 4, 32))) WHERE trace IS NOT NULL;
CREATE INDEX dead_letters_trace_id ON {schema}.dead_letters
	USING hash ((substr(coalesce(headers->'traceparent'->>0, headers->'Traceparent'->>0), 4, 32)));
