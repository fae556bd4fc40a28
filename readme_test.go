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
