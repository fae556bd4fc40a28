package release_test

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	"golang.org/x/mod/zip"
)

// library is the module path of the library; the released modules are it
// and the modules below it that users install or require.
const library = "github.com/oncekit/oncekit"

// released are the modules a release tags, by directory in the repository.
var released = map[string]string{
	".":           library,
	"cmd/oncekit": library + "/cmd/oncekit",
	"oncekitotel": library + "/oncekitotel",
}

// repoRoot is the checkout's top directory.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", "..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.work")); err != nil {
		t.Fatalf("no go.work at %s: %v", root, err)
	}
	return root
}

// releaseVersion is the version of the library that the released modules
// require: the version the release's tags carry. Every released module
// requires the same one, and go.work builds that version from the checkout.
func releaseVersion(t *testing.T, root string) string {
	t.Helper()
	version := ""
	for dir, path := range released {
		if dir == "." {
			continue
		}
		f := parseGoMod(t, filepath.Join(root, dir, "go.mod"))
		if f.Module.Mod.Path != path {
			t.Fatalf("%s/go.mod: module %s, want %s", dir, f.Module.Mod.Path, path)
		}
		if len(f.Replace) > 0 {
			t.Errorf("%s/go.mod has a replace directive: a released go.mod must resolve outside the checkout", dir)
		}
		v := ""
		for _, r := range f.Require {
			if r.Mod.Path == library {
				v = r.Mod.Version
			}
		}
		switch {
		case v == "":
			t.Fatalf("%s/go.mod does not require %s", dir, library)
		case version != "" && v != version:
			t.Fatalf("%s/go.mod requires %s@%s, another released module @%s: a release tags them together", dir, library, v, version)
		}
		version = v
	}
	work, err := os.ReadFile(filepath.Join(root, "go.work"))
	if err != nil {
		t.Fatal(err)
	}
	wf, err := modfile.ParseWork("go.work", work, nil)
	if err != nil {
		t.Fatal(err)
	}
	replaced := false
	for _, r := range wf.Replace {
		replaced = replaced || (r.Old.Path == library && r.Old.Version == version && r.New.Path == "./")
	}
	if !replaced {
		t.Errorf("go.work does not replace %s %s => ./: the workspace would fetch the release it is building", library, version)
	}
	return version
}

func parseGoMod(t *testing.T, file string) *modfile.File {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	f, err := modfile.Parse(file, data, nil)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// writeProxy writes a module proxy (GOPROXY=file://dir) that serves each
// released module at version: list, .info, .mod and .zip, the layout of
// `go mod download`'s cache. The zips hold the files git tracks or would
// track (what a commit of the tree would tag), as they are in the tree.
func writeProxy(t *testing.T, root, dir, version string) {
	t.Helper()
	for sub, path := range released {
		escaped, err := module.EscapePath(path)
		if err != nil {
			t.Fatal(err)
		}
		v := filepath.Join(dir, filepath.FromSlash(escaped), "@v")
		if err := os.MkdirAll(v, 0o755); err != nil {
			t.Fatal(err)
		}
		info, _ := json.Marshal(map[string]any{"Version": version, "Time": time.Now().UTC().Truncate(time.Second)})
		gomod, err := os.ReadFile(filepath.Join(root, sub, "go.mod"))
		if err != nil {
			t.Fatal(err)
		}
		var z bytes.Buffer
		if err := zip.Create(&z, module.Version{Path: path, Version: version}, moduleFiles(t, filepath.Join(root, sub))); err != nil {
			t.Fatalf("zip %s: %v", path, err)
		}
		for name, data := range map[string][]byte{"list": []byte(version + "\n"), version + ".info": info,
			version + ".mod": gomod, version + ".zip": z.Bytes()} {
			if err := os.WriteFile(filepath.Join(v, name), data, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// moduleFiles are the files of the module in dir that git tracks or would
// (ignored files left out); zip.Create leaves out those of the modules in
// its subdirectories.
func moduleFiles(t *testing.T, dir string) []zip.File {
	t.Helper()
	cmd := exec.Command("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard")
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("git ls-files in %s: %v", dir, err)
	}
	var files []zip.File
	seen := map[string]bool{}
	for _, name := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		fi, err := os.Lstat(filepath.Join(dir, name))
		if err != nil || !fi.Mode().IsRegular() || seen[name] { // deleted in the tree, or a link
			continue
		}
		seen[name] = true
		files = append(files, treeFile{dir: dir, name: filepath.ToSlash(name), fi: fi})
	}
	return files
}

// treeFile is a file of the tree as zip.Create reads it.
type treeFile struct {
	dir, name string
	fi        os.FileInfo
}

func (f treeFile) Path() string                 { return f.name }
func (f treeFile) Lstat() (os.FileInfo, error)  { return f.fi, nil }
func (f treeFile) Open() (io.ReadCloser, error) { return os.Open(filepath.Join(f.dir, f.name)) }
