package drift

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/internal/pgsql"
	"github.com/oncekit/oncekit/sideeffect"
)

// Rule is a user check. Either SQL returns one row per violation, the first
// column describing it (cast to text), and no rows means no drift; or Expect
// declares the side effects a set of business IDs must have. SQL may use
// "{schema}" for oncekit's schema and "{since}" for the start of
// Config.Window.
type Rule struct {
	// Name identifies the rule in reports and metrics: [a-z0-9_], unique.
	Name string
	// SQL returns the violating rows. Ignored when Expect is set.
	SQL string
	// Expect, when set, makes the rule an expectation.
	Expect *Expectation
}

// Expectation is "every business ID returned by SourcesSQL has exactly one
// side effect of Kind, and every effect of Kind has a business ID among
// them". A business ID without its effect is missing; an effect whose
// business ID is not a source, or the second effect of one business ID (two
// effects recorded under different source IDs for one payment), is extra.
type Expectation struct {
	// Kind is the side effect's kind.
	Kind string
	// SourcesSQL returns one column: the business IDs. It may use
	// "{schema}" and "{since}".
	SourcesSQL string
	// BusinessID is a JSON path into the effect's payload (such as
	// "$.payment_id" or "$.order.id") holding the business ID. Empty means
	// the effect's source_id (what the handler passed to
	// sideeffect.Record). With a path, the payloads of Kind must be JSON.
	BusinessID string
}

// ExpectEffects is the rule "every source returned by sourcesSQL has exactly
// one side effect of kind, and no effect of kind exists without a source".
// sourcesSQL returns one text column, the source IDs (the SourceID the
// handler passed to sideeffect.Record).
func ExpectEffects(name, kind, sourcesSQL string) Rule {
	return Rule{Name: name, Expect: &Expectation{Kind: kind, SourcesSQL: sourcesSQL}}
}

var jsonPath = regexp.MustCompile(`^\$?(\.[A-Za-z0-9_-]+|\[[0-9]+\])+$`)

// pathParts turns "$.a.b[0]" into {a, b, 0}, the operand of #>>.
func pathParts(p string) []string {
	p = strings.TrimPrefix(p, "$")
	p = strings.NewReplacer("[", ".", "]", "").Replace(p)
	return strings.Split(strings.TrimPrefix(p, "."), ".")
}

func (r Rule) validate() error {
	if !ruleName.MatchString(r.Name) {
		return fmt.Errorf("Name %q: want [a-z0-9_]{1,64}", r.Name)
	}
	if x := r.Expect; x != nil {
		switch {
		case x.Kind == "":
			return fmt.Errorf("rule %s: Expect.Kind is empty", r.Name)
		case cleanSQL(x.SourcesSQL) == "":
			return fmt.Errorf("rule %s: Expect.SourcesSQL is empty", r.Name)
		case x.BusinessID != "" && !jsonPath.MatchString(x.BusinessID):
			return fmt.Errorf("rule %s: Expect.BusinessID %q: want a JSON path like $.payment_id or $.order.id", r.Name, x.BusinessID)
		}
		return nil
	}
	if cleanSQL(r.SQL) == "" {
		return fmt.Errorf("rule %s: SQL is empty", r.Name)
	}
	return nil
}

// cleanSQL drops what may end a statement but not a subquery: trailing
// semicolons and white space.
func cleanSQL(s string) string { return strings.TrimRight(s, "; \t\r\n") }

// renderUser renders a user's SQL: schema and window start.
func renderUser(sql string, c Config) string {
	since := `'-infinity'::timestamptz`
	if c.Window > 0 {
		since = fmt.Sprintf(`(now() - make_interval(secs => %g))`, c.Window.Seconds())
	}
	return strings.ReplaceAll(pgsql.Render(cleanSQL(sql), c.Schema), "{since}", since)
}

// wrapped is a query built around a user's SQL, which sits at byte offset
// at, so that an error PostgreSQL locates can be told in the user's terms.
type wrapped struct {
	sql    string
	at, n  int // the user's SQL is sql[at:at+n]
	reason string
}

func wrap(prefix, user, suffix string) wrapped {
	// The newlines keep a trailing "-- comment" of the user's SQL from
	// swallowing the suffix.
	prefix += "\n"
	return wrapped{sql: prefix + user + "\n" + suffix, at: len(prefix), n: len(user)}
}

// explain rewrites err so that a position PostgreSQL reports points into the
// user's SQL, and never into the wrapping query.
func (w wrapped) explain(rule string, err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return err
	}
	msg := fmt.Sprintf("rule %s: %s (SQLSTATE %s)", rule, pgErr.Message, pgErr.Code)
	if pgErr.Position > 0 {
		pos := int(pgErr.Position) // in characters, from 1
		start := utf8.RuneCountInString(w.sql[:w.at])
		end := start + utf8.RuneCountInString(w.sql[w.at:w.at+w.n])
		if pos > start && pos <= end {
			msg += fmt.Sprintf(" at character %d of the rule's SQL", pos-start)
		} else {
			msg += "; the rule's SQL must be a single SELECT " + w.reason
		}
	}
	return errors.New(msg)
}

// maxExamples bounds the violating rows a rule reports in Examples.
const maxExamples = 5

func (r Rule) check(c Config) check {
	if r.Expect != nil {
		return expectCheck(r.Name, *r.Expect, c)
	}
	w := wrap(`SELECT v::text, count(*) OVER () FROM (`, renderUser(r.SQL, c),
		`) AS rule(v) LIMIT `+strconv.Itoa(maxExamples))
	w.reason = "whose first column describes a violation"
	return check{name: r.Name, run: func(ctx context.Context, db oncekit.Querier) (Finding, error) {
		rows, err := db.Query(ctx, w.sql)
		if err != nil {
			return Finding{}, w.explain(r.Name, err)
		}
		defer rows.Close()
		var f Finding
		for rows.Next() {
			var ex *string
			var n int64
			if err := rows.Scan(&ex, &n); err != nil {
				return Finding{}, err
			}
			if ex != nil {
				f.Examples = append(f.Examples, *ex)
			} else {
				f.Examples = append(f.Examples, "NULL")
			}
			f.Value = float64(n)
		}
		if err := rows.Err(); err != nil {
			return Finding{}, w.explain(r.Name, err)
		}
		f.Drift = f.Value > 0
		return f, nil
	}}
}

// expectCheck matches business IDs against effects of one kind and lists
// the missing and the extra ones, each class bounded by MaxIDs: the ledger
// runs the match (sideeffect.Ledger.MatchSources) around the rule's SQL.
func expectCheck(name string, x Expectation, c Config) check {
	ledger, err := sideeffect.New(&sideeffect.Config{Schema: c.Schema})
	m := sideeffect.SourceMatch{Kind: x.Kind, Sources: renderUser(x.SourcesSQL, c), Window: c.Window, Limit: c.MaxIDs}
	if x.BusinessID != "" {
		m.BusinessID = pathParts(x.BusinessID)
	}
	return check{name: name, run: func(ctx context.Context, db oncekit.Querier) (Finding, error) {
		if err != nil {
			return Finding{}, err
		}
		found, err := ledger.MatchSources(ctx, db, m)
		if se := (*sideeffect.SourcesError)(nil); errors.As(err, &se) {
			w := wrapped{sql: se.Statement, at: se.At, n: se.Len, reason: "returning one column of business IDs"}
			return Finding{}, w.explain(name, se.Err)
		}
		if err != nil {
			return Finding{}, err
		}
		f := Finding{Missing: found.Missing, MissingTotal: found.MissingTotal, ExtraTotal: found.ExtraTotal}
		for _, id := range found.Missing {
			f.Examples = append(f.Examples, "missing "+id)
		}
		for _, x := range found.Extra {
			f.Extra = append(f.Extra, x.BusinessID)
			switch {
			case x.BusinessID == "":
				f.Examples = append(f.Examples, "extra: effects "+x.Effects+" have no business ID in their payload")
			case x.HasSource:
				f.Examples = append(f.Examples, "extra "+x.BusinessID+": effects "+x.Effects+" for one business ID")
			default:
				f.Examples = append(f.Examples, "extra "+x.BusinessID+": effect "+x.Effects+" without a source")
			}
		}
		f.Examples = f.Examples[:min(len(f.Examples), maxExamples)]
		f.Value = float64(f.MissingTotal + f.ExtraTotal)
		f.Drift = f.Value > 0
		return f, nil
	}}
}
