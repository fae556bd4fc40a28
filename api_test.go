package oncekit_test

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/mod/semver"

	"github.com/oncekit/oncekit/internal/testkit/apiguard"
)

// goList runs `go list` with a template over the module's packages.
func goList(t *testing.T, format string, patterns ...string) []string {
	t.Helper()
	out, err := exec.Command("go", append([]string{"list", "-f", format}, patterns...)...).Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	return strings.Fields(string(out))
}

// The public API names no type a user cannot import: `go doc -all` of every
// public package mentions neither an internal package's path nor one of its
// identifiers.
func TestPublicDocsMentionNoInternalPackage(t *testing.T) {
	var names []string
	for _, n := range goList(t, "{{.Name}}", "./internal/...") {
		names = append(names, regexp.QuoteMeta(n))
	}
	internalRef := regexp.MustCompile(`internal/|\b(` + strings.Join(names, "|") + `)\.[A-Z]`)
	checked := 0
	for _, line := range goList(t, "{{.ImportPath}}:{{.Name}}", "./...") {
		path, name, _ := strings.Cut(line, ":")
		if name == "main" || strings.Contains(path, "/internal/") {
			continue
		}
		out, err := exec.Command("go", "doc", "-all", path).CombinedOutput()
		if err != nil {
			t.Fatalf("go doc -all %s: %v\n%s", path, err, out)
		}
		for i, l := range strings.Split(string(out), "\n") {
			if internalRef.MatchString(l) {
				t.Errorf("%s: go doc line %d names an internal package: %s", path, i+1, strings.TrimSpace(l))
			}
		}
		checked++
	}
	if checked < 10 {
		t.Fatalf("checked %d public packages; expected every one of them", checked)
	}
}

// Examples are what users copy: no program under examples/ and no
// example_test.go imports an internal package.
func TestExamplesImportNoInternalPackage(t *testing.T) {
	for _, line := range goList(t, `{{.ImportPath}}:{{join .Imports ","}},{{join .TestImports ","}},{{join .XTestImports ","}}`, "./examples/...") {
		path, imports, _ := strings.Cut(line, ":")
		for _, imp := range strings.Split(imports, ",") {
			if strings.Contains(imp, "/internal/") {
				t.Errorf("%s imports %s", path, imp)
			}
		}
	}
	files := 0
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "internal" || d.Name() == "bench" || strings.HasPrefix(d.Name(), ".")) && path != "." {
			return filepath.SkipDir
		}
		if d.IsDir() || d.Name() != "example_test.go" {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		for _, imp := range f.Imports {
			if p, _ := strconv.Unquote(imp.Path.Value); strings.Contains(p, "/internal/") {
				t.Errorf("%s imports %s", path, p)
			}
		}
		files++
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 10 {
		t.Fatalf("found %d example_test.go files; expected every package's", files)
	}
}

// A service that imports the library carries no client of a broker it does
// not use, and none of the CLI's dependencies: the CLI and the tests that
// run on RabbitMQ and Redis are modules of their own. The graph is the
// library module's alone (GOWORK=off), as a service that requires it sees it,
// not the development workspace's.
func TestLibraryModuleCarriesNoBrokerClient(t *testing.T) {
	cmd := exec.Command("go", "mod", "graph")
	cmd.Env = append(os.Environ(), "GOWORK=off")
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		for _, client := range []string{"github.com/rabbitmq/", "github.com/redis/", "watermill-amqp", "watermill-redisstream"} {
			if strings.Contains(line, client) {
				t.Errorf("go mod graph: %s", line)
			}
		}
	}
}

// The API of the last release (the newest api/vX.Y.Z.txt) holds: every
// identifier it lists is still there with the same signature, unless the
// changelog's Unreleased section names it (`make api` writes a release's
// listing; `make release` runs this test before it writes the next).
func TestAPIKeepsTheReleasedSurface(t *testing.T) {
	last := lastListing(t)
	released, err := os.ReadFile(filepath.Join("api", last+".txt"))
	if err != nil {
		t.Fatal(err)
	}
	current, err := apiguard.List(".", "github.com/oncekit/oncekit")
	if err != nil {
		t.Fatal(err)
	}
	changelog, err := os.ReadFile("CHANGELOG.md")
	if err != nil {
		t.Fatal(err)
	}
	_, unreleased, ok := strings.Cut(string(changelog), "\n## Unreleased\n")
	if !ok {
		t.Fatal("CHANGELOG.md has no ## Unreleased section")
	}
	unreleased, _, _ = strings.Cut(unreleased, "\n## ")
	for _, line := range apiguard.Check(strings.Split(strings.TrimSpace(string(released)), "\n"), current, unreleased) {
		t.Errorf("incompatible with %s and not in CHANGELOG.md's Unreleased section (name %s there): %s", last, apiguard.Identifier(line), line)
	}
}

// lastListing is the newest release that api/ lists.
func lastListing(t *testing.T) string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("api", "v*.txt"))
	if err != nil {
		t.Fatal(err)
	}
	last := ""
	for _, f := range files {
		v := strings.TrimSuffix(filepath.Base(f), ".txt")
		if semver.IsValid(v) && (last == "" || semver.Compare(v, last) > 0) {
			last = v
		}
	}
	if last == "" {
		t.Fatal("api/ lists no release")
	}
	return last
}
