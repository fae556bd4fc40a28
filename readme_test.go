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
