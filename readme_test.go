package oncekit_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// markdownLink matches the target of a Markdown link.
var markdownLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// The README stays a user's guide (at most 350 lines), and no page links
// outside the repository: every relative link resolves inside it.
func TestDocsStayInsideTheRepository(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(readme), "\n"); n > 350 {
		t.Errorf("README.md has %d lines; a user's guide keeps to 350, the rest belongs under docs/", n)
	}
	root, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	pages, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	decisions, _ := filepath.Glob("docs/decisions/*.md")
	for _, page := range append(append([]string{"README.md", "bench/RESULTS.md"}, pages...), decisions...) {
		text, err := os.ReadFile(page)
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range markdownLink.FindAllStringSubmatch(string(text), -1) {
			target, _, _ := strings.Cut(m[1], "#")
			if target == "" || strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			abs := filepath.Join(root, filepath.Dir(page), target)
			if rel, err := filepath.Rel(root, abs); err != nil || strings.HasPrefix(rel, "..") {
				t.Errorf("%s links outside the repository: %s", page, m[1])
			}
		}
	}
}

// The README's quickstart is examples/quickstart's setUp, word for word, so
// it compiles (and runs, in the example's test) in make test: every error
// checked, every name defined.
func TestReadmeQuickstartIsTheExamplesCode(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("examples/quickstart/main.go")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(readme), "\n## Quickstart\n")
	_, block, ok2 := strings.Cut(section, "```go\n")
	block, _, ok3 := strings.Cut(block, "```\n")
	if !ok || !ok2 || !ok3 {
		t.Fatal("README.md has no Go block under ## Quickstart")
	}
	start := strings.Index(string(src), "// setUp wires")
	end := strings.Index(string(src)[max(start, 0):], "\n}\n")
	if start < 0 || end < 0 {
		t.Fatal("examples/quickstart/main.go has no setUp")
	}
	if fn := string(src)[start : start+end+3]; block != fn {
		t.Errorf("README's quickstart differs from examples/quickstart's setUp; paste the function into README.md:\n%s", fn)
	}
}

// make fuzz runs every fuzz target: each func FuzzX in a test file of this
// module is in the Makefile's FUZZ_TARGETS as ./dir:FuzzX.
func TestMakeFuzzRunsEveryTarget(t *testing.T) {
	makefile, err := os.ReadFile("Makefile")
	if err != nil {
		t.Fatal(err)
	}
	fuzz := regexp.MustCompile(`(?m)^func (Fuzz\w+)\(`)
	found := 0
	err = filepath.WalkDir(".", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != "." && (strings.HasPrefix(d.Name(), ".") || fileExists(filepath.Join(path, "go.mod"))) {
			return filepath.SkipDir // another module
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range fuzz.FindAllStringSubmatch(string(src), -1) {
			found++
			if target := "./" + filepath.Dir(path) + ":" + m[1]; !strings.Contains(string(makefile), target) {
				t.Errorf("make fuzz does not run %s", target)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if found < 10 {
		t.Fatalf("found %d fuzz targets; expected every one", found)
	}
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
