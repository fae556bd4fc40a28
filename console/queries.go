package console

import (
	"fmt"

	"github.com/oncekit/oncekit/internal/untrusted"
	"github.com/oncekit/oncekit/report"
)

// statements is the console's own SQL, over its own table console_audit
// (migration 016), rendered for the schema once. Every other figure comes
// from the package that owns its table: outbox, inbox, sideeffect and
// idempotency.
type statements struct {
	audit, insertAudit string
}

// auditSQL lists the entries before the ID $1, the newest first.
const auditSQL = `
SELECT id, at, operator, action, target, count, note FROM {schema}.console_audit
WHERE id < $1 ORDER BY id DESC LIMIT $2`

const insertAuditSQL = `
INSERT INTO {schema}.console_audit (operator, action, target, count, note) VALUES ($1, $2, $3, $4, $5)`

// printable is s as the console shows text from outside: control
// characters and invalid UTF-8 escaped.
func printable(s string) string { return untrusted.Printable(s) }

// iecBytes formats a byte count (an int64 or a *int64; nil is "no limit")
// in its largest binary unit.
func iecBytes(v any) string {
	var n int64
	switch x := v.(type) {
	case int64:
		n = x
	case *int64:
		if x == nil {
			return "no limit"
		}
		n = *x
	}
	return report.BytesIEC(n)
}

// optionalSeconds formats a figure in seconds that may be unknown (nil).
func optionalSeconds(v *float64) string {
	if v == nil {
		return "unknown"
	}
	return fmt.Sprintf("%.0f s", *v)
}
