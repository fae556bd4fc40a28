package release_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// clone is a clone of the checkout's HEAD in a temp dir, where a test may
// commit and tag.
func clone(t *testing.T, root string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "oncekit")
	if out, err := exec.Command("git", "clone", "-q", "--no-hardlinks", root, dir).CombinedOutput(); err != nil {
		t.Fatalf("git clone: %v\n%s", err, out)
	}
	return dir
}

func gitEnv() []string {
	return append(os.Environ(), "GIT_AUTHOR_NAME=release test", "GIT_AUTHOR_EMAIL=release@example.invalid",
		"GIT_COMMITTER_NAME=release test", "GIT_COMMITTER_EMAIL=release@example.invalid", "RELEASE_SKIP_CHECKS=1")
}

// `make release` tags the three released modules together at one commit
// whose go.mod files require the library at the tagged version (and whose
// go.work builds that version from the tree), with the API listed and the
// changelog's section named; it refuses a bad version, a dirty tree, and a
// version that was released. In a clone: the checkout gets no tag.
func TestReleaseTagsEveryModuleTogether(t *testing.T) {
	if testing.Short() {
		t.Skip("clones the repository")
	}
	t.Parallel()
	dir := clone(t, repoRoot(t))
	release := func(version string) (string, error) {
		cmd := exec.Command("bash", "internal/testkit/release/release.sh", version)
		cmd.Dir, cmd.Env = dir, gitEnv()
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	git := func(args ...string) string {
		cmd := exec.Command("git", args...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
		return strings.TrimSpace(string(out))
	}

	for _, bad := range []string{"", "0.9.0", "v0.9", "v2.0.0"} {
		if out, err := release(bad); err == nil || !strings.Contains(out, "release: want a version vX.Y.Z") && !strings.Contains(out, "/vN module path") {
			t.Fatalf("release %q: %v\n%s", bad, err, out)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "stray.txt"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := release("v0.9.0"); err == nil || !strings.Contains(out, "uncommitted") {
		t.Fatalf("release on a dirty tree: %v\n%s", err, out)
	}
	if err := os.Remove(filepath.Join(dir, "stray.txt")); err != nil {
		t.Fatal(err)
	}

	out, err := release("v0.9.0")
	if err != nil {
		t.Fatalf("release v0.9.0: %v\n%s", err, out)
	}
	t.Logf("release v0.9.0:\n%s", out)
	head := git("rev-parse", "HEAD")
	for _, tag := range []string{"v0.9.0", "cmd/oncekit/v0.9.0", "oncekitotel/v0.9.0"} {
		if at := git("rev-list", "-n1", tag); at != head {
			t.Errorf("tag %s at %s, want HEAD %s", tag, at, head)
		}
	}
	if v := releaseVersion(t, dir); v != "v0.9.0" {
		t.Errorf("the released modules require the library at %s, want v0.9.0", v)
	}
	if _, err := os.Stat(filepath.Join(dir, "api", "v0.9.0.txt")); err != nil {
		t.Errorf("no API listing: %v", err)
	}
	changelog, err := os.ReadFile(filepath.Join(dir, "CHANGELOG.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(changelog), "\n## Unreleased\n\n## v0.9.0\n") {
		t.Error("CHANGELOG.md: the Unreleased section did not become v0.9.0's")
	}
	if out, err := release("v0.9.0"); err == nil || !strings.Contains(out, "exists") {
		t.Fatalf("a second release v0.9.0: %v\n%s", err, out)
	}
}
