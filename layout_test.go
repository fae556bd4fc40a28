package oncekit_test

import (
	"path"
	"strings"
	"testing"
)

// testkit is the folder of what only tests use: harnesses, fixtures and the
// repository's checks. Every other package under internal/ is one the
// library runs on.
const testkit = "github.com/oncekit/oncekit/internal/testkit"

// internal/ holds two kinds of package, apart: the library never links a
// test harness (no package of the module but the test kit's own and
// oncekittest, which only users' tests import, depends on one under
// internal/testkit), and every other package under internal/ is one the
// library links, or the test companion <name>test of one.
func TestInternalIsSortedByWhoUsesIt(t *testing.T) {
	t.Parallel()
	linked := map[string]bool{}
	checked := 0
	for _, line := range goList(t, `{{.ImportPath}}:{{join .Deps ","}}`, "./...") {
		pkg, deps, _ := strings.Cut(line, ":")
		if strings.HasPrefix(pkg, testkit+"/") || pkg == "github.com/oncekit/oncekit/oncekittest" {
			continue
		}
		checked++
		for _, dep := range strings.Split(deps, ",") {
			linked[dep] = true
			if strings.HasPrefix(dep, testkit+"/") {
				t.Errorf("%s links the test harness %s", pkg, dep)
			}
		}
	}
	if checked < 10 {
		t.Fatalf("checked %d library packages; expected every one of them", checked)
	}
	for _, pkg := range goList(t, "{{.ImportPath}}", "./internal/...") {
		companion := path.Base(pkg) == path.Base(path.Dir(pkg))+"test" && linked[path.Dir(pkg)]
		if !strings.HasPrefix(pkg, testkit+"/") && !linked[pkg] && !companion {
			t.Errorf("%s: no library package links it; what only tests use belongs under internal/testkit", pkg)
		}
	}
}
