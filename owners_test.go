package oncekit_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// owners names the package that holds each table's SQL: what its rows mean
// is stated there once, and every other package reads the table through
// its methods (status, the console and drift among them).
var owners = map[string]string{
	"outbox":                    "outbox",
	"relay_partitions":          "outbox",
	"relay_nodes":               "outbox",
	"logical_slots":             "outbox",
	"processed_messages":        "inbox",
	"dead_letters":              "inbox",
	"side_effects":              "sideeffect",
	"idempotency_keys":          "idempotency",
	"idempotency_business_keys": "idempotency",
	"idempotency_items":         "idempotency",
	"console_audit":             "console",
}

// sqlApart are the directories allowed SQL of their own over any table:
// the migrations that make them; the chaos checker, an oracle that must
// not share the reads it checks; the console's test seed; the payments
// example's own checks of its run.
var sqlApart = []string{"migrations", "internal/testkit/chaos", "internal/testkit/consoletest", "examples"}

// No package but a table's owner names it in SQL: {schema}.t, "schema".t,
// FROM/JOIN/INTO/UPDATE t, or a table("t") helper.
func TestTablesAreReadThroughTheirOwners(t *testing.T) {
	t.Parallel()
	uses := map[string]*regexp.Regexp{}
	for table := range owners {
		uses[table] = regexp.MustCompile(`(\{schema\}\.|"\.|\s(FROM|JOIN|INTO|UPDATE|TABLE)\s+("?[a-z_]*"?\.)?|\b(t|table)\(")` + table + `\b`)
	}
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		dir := filepath.ToSlash(filepath.Dir(path))
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		for _, apart := range sqlApart {
			if dir == apart || strings.HasPrefix(dir, apart+"/") {
				return nil
			}
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for table, re := range uses {
			if owner := owners[table]; dir != owner && re.Match(src) {
				t.Errorf("%s names the table %s in SQL: read it through package %s", path, table, owner)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
