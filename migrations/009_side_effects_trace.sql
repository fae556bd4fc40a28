-- The trace context (W3C traceparent and tracestate, or whatever headers the
-- configured propagator writes) of the context an effect was recorded in, as
-- a JSON object of header name to value; NULL when there was none. The
-- dispatcher hands it to the provider with the call. Adding a nullable
-- column without a default rewrites nothing.
ALTER TABLE {schema}.side_effects ADD COLUMN trace jsonb;
