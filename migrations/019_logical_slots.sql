-- The replication slots oncekit created for the logical relay, one row per
-- slot (Config.Slot), written by SetUpLogical right after it creates the
-- slot (or when it finds the slot without its row, set up before this
-- migration). The row outlives the slot: a slot missing while its row is here was
-- dropped (or invalidated and removed), and a new slot would skip what the
-- old one held, so the relay refuses. A slot missing with no row was never
-- made, whatever else exists: the schema's owner may create the publication
-- beforehand so that the relay's role needs no CREATE.
CREATE TABLE {schema}.logical_slots (
	slot       text        PRIMARY KEY,
	created_at timestamptz NOT NULL DEFAULT now()
);
