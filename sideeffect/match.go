package sideeffect

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/internal/pgsql"
)

// SourceMatch asks MatchSources which business IDs lack their effect of
// Kind, and which have one too many.
type SourceMatch struct {
	// Kind is the effects' kind.
	Kind string
	// Sources is a SELECT of one column, the business IDs, run as a
	// subquery of the match in the same statement (a caller's SQL: drift's
	// expectations).
	Sources string
	// BusinessID is the path into the effects' JSON payloads (the operand
	// of #>>, such as {"order", "id"}) holding the business ID; empty
	// means the effect's source ID.
	BusinessID []string
	// Window, when positive, matches only the effects recorded within it.
	Window time.Duration
	// Limit bounds the business IDs listed of each class.
	Limit int
}

// Matched is what MatchSources found.
type Matched struct {
	// Missing lists business IDs without their effect, at most
	// SourceMatch.Limit of them in order; MissingTotal counts them all.
	Missing      []string
	MissingTotal int64
	// Extra lists business IDs with an effect too many: an effect without
	// a source, or a second effect for one business ID (at most
	// SourceMatch.Limit, in order; ExtraTotal counts them all).
	Extra      []ExtraEffects
	ExtraTotal int64
}

// ExtraEffects is a business ID with an effect too many.
type ExtraEffects struct {
	// BusinessID is "" for effects whose payload holds none.
	BusinessID string
	// Effects lists the effects' IDs, comma-separated, in order.
	Effects string
	// HasSource says that the business ID is among the sources: it has
	// more than one effect.
	HasSource bool
}

// SourcesError is the error MatchSources returns when PostgreSQL refuses
// its statement, so that a caller can tell an error in its Sources from
// one around it: Statement is the SQL run, whose bytes [At, At+Len) are
// Sources.
type SourcesError struct {
	Err       *pgconn.PgError
	Statement string
	At, Len   int
}

func (e *SourcesError) Error() string { return "sideeffect: match sources: " + e.Err.Error() }

func (e *SourcesError) Unwrap() error { return e.Err }

// MatchSources matches the business IDs m.Sources returns against the
// effects of m.Kind: every business ID has exactly one effect, and every
// effect a business ID among them. It runs as one statement on q.
func (l *Ledger) MatchSources(ctx context.Context, q oncekit.Querier, m SourceMatch) (Matched, error) {
	bid := "e.source_id"
	if len(m.BusinessID) > 0 {
		bid = "convert_from(e.payload, 'UTF8')::jsonb #>> $3::text[]"
	}
	window := ""
	if m.Window > 0 {
		window = fmt.Sprintf(" AND e.created_at >= now() - make_interval(secs => %g)", m.Window.Seconds())
	}
	// The newlines keep a trailing "-- comment" of Sources from swallowing
	// what follows.
	prefix := "WITH src AS MATERIALIZED (SELECT DISTINCT s::text AS id FROM (\n"
	sql := prefix + m.Sources + "\n" + pgsql.Render(`) AS q(s) WHERE s IS NOT NULL),
	eff AS MATERIALIZED (SELECT e.id, `+bid+` AS bid FROM {schema}.side_effects e WHERE e.kind = $1`+window+`),
	v AS (
		SELECT 'missing' AS class, src.id AS bid, '' AS effects, true AS has_source FROM src
		WHERE NOT EXISTS (SELECT 1 FROM eff WHERE eff.bid = src.id)
		UNION ALL
		SELECT 'extra', g.bid, g.effects, src.id IS NOT NULL
		FROM (SELECT eff.bid, string_agg(eff.id::text, ',' ORDER BY eff.id) AS effects, count(*) AS n
			FROM eff GROUP BY eff.bid) g
		LEFT JOIN src ON src.id = g.bid
		WHERE g.n > 1 OR src.id IS NULL),
	n AS (SELECT v.*, count(*) OVER (PARTITION BY class) AS total,
		row_number() OVER (PARTITION BY class ORDER BY bid) AS i FROM v)
	SELECT class, coalesce(bid, ''), effects, has_source, total FROM n WHERE i <= $2 ORDER BY class DESC, bid`, l.schema)
	args := []any{m.Kind, m.Limit}
	if len(m.BusinessID) > 0 {
		args = append(args, m.BusinessID)
	}
	refused := func(err error) error {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) {
			return &SourcesError{Err: pgErr, Statement: sql, At: len(prefix), Len: len(m.Sources)}
		}
		return fmt.Errorf("sideeffect: match sources: %w", err)
	}
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return Matched{}, refused(err)
	}
	defer rows.Close()
	var out Matched
	for rows.Next() {
		var class, id, effects string
		var hasSource bool
		var total int64
		if err := rows.Scan(&class, &id, &effects, &hasSource, &total); err != nil {
			return Matched{}, err
		}
		if class == "missing" {
			out.Missing, out.MissingTotal = append(out.Missing, id), total
		} else {
			out.Extra, out.ExtraTotal = append(out.Extra, ExtraEffects{BusinessID: id, Effects: effects, HasSource: hasSource}), total
		}
	}
	if err := rows.Err(); err != nil {
		return Matched{}, refused(err)
	}
	return out, nil
}
