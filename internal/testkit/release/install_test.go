package release_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A user installs the CLI and requires the OpenTelemetry module with
// nothing but the go command: in a directory outside the checkout, with no
// workspace, from a module proxy that serves the released modules at the
// version the release tags carry (the other dependencies come from the
// module cache, then the configured proxy). A go.mod that needs the
// checkout (replace ../..) or a CLI that imports what the library's
// module does not export at that version fails here.
func TestInstallFromAModuleProxy(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the CLI from a module proxy")
	}
	t.Parallel()
	root := repoRoot(t)
	version := releaseVersion(t, root)
	proxy := t.TempDir()
	start := time.Now()
	writeProxy(t, root, proxy, version)
	t.Logf("proxy of %d modules at %s written in %v", len(released), version, time.Since(start).Round(time.Millisecond))

	work := t.TempDir()
	if strings.HasPrefix(work, root+string(filepath.Separator)) {
		t.Fatalf("temp dir %s is inside the checkout", work)
	}
	env := userEnv(t, proxy, work)

	start = time.Now()
	run(t, work, env, "go", "install", library+"/cmd/oncekit@"+version)
	out := run(t, work, env, filepath.Join(work, "bin", "oncekit"), "help")
	if !strings.HasPrefix(out, "usage: oncekit <command>") {
		t.Fatalf("the installed oncekit's help:\n%s", out)
	}
	t.Logf("go install %s/cmd/oncekit@%s: ok in %v; `oncekit help`: %s", library, version,
		time.Since(start).Round(time.Millisecond), strings.SplitN(out, "\n", 2)[0])

	start = time.Now()
	app := filepath.Join(work, "app")
	write(t, filepath.Join(app, "go.mod"), "module example.com/app\n\ngo 1.26.0\n")
	write(t, filepath.Join(app, "main.go"), `package main

import (
	"fmt"
	"net/http"

	"github.com/oncekit/oncekit/oncekitotel"
)

func main() {
	h := oncekitotel.Edge(http.NotFoundHandler(), &oncekitotel.Config{})
	fmt.Println("traced edge:", h != nil)
}
`)
	run(t, app, env, "go", "get", library+"/oncekitotel@"+version)
	run(t, app, env, "go", "build", "-o", "app", ".")
	out = run(t, app, env, filepath.Join(app, "app"))
	if strings.TrimSpace(out) != "traced edge: true" {
		t.Fatalf("the app printed %q", out)
	}
	t.Logf("a module requiring %s/oncekitotel@%s: go get, go build and run ok in %v", library, version, time.Since(start).Round(time.Millisecond))
}

// userEnv is the environment of a user outside the checkout: no workspace,
// the released modules from proxy and everything else from this machine's
// module cache (served as a proxy), then its configured proxy. The
// downloads go to a module cache of their own, so that the versions made
// here never reach the machine's; -trimpath keeps the build cache valid
// across runs whatever that cache's path.
func userEnv(t *testing.T, proxy, work string) []string {
	t.Helper()
	goenv := func(name string) string {
		out, err := exec.Command("go", "env", name).Output()
		if err != nil {
			t.Fatalf("go env %s: %v", name, err)
		}
		return strings.TrimSpace(string(out))
	}
	proxies := "file://" + filepath.ToSlash(proxy) + ",file://" + filepath.ToSlash(filepath.Join(goenv("GOMODCACHE"), "cache", "download"))
	if p := goenv("GOPROXY"); p != "" && p != "off" {
		proxies += "," + p
	}
	var env []string
	for _, kv := range os.Environ() {
		switch name, _, _ := strings.Cut(kv, "="); name {
		case "GOWORK", "GOFLAGS", "GOPROXY", "GOMODCACHE", "GOBIN", "GOSUMDB", "GONOSUMDB", "GOPRIVATE", "GOTOOLCHAIN", "PWD":
		default:
			env = append(env, kv)
		}
	}
	return append(env, "GOWORK=off", "GOFLAGS=-modcacherw -trimpath", "GOPROXY="+proxies,
		"GOMODCACHE="+filepath.Join(work, "modcache"), "GOBIN="+filepath.Join(work, "bin"),
		// The released modules are not in the checksum database (they are made
		// here), and the rest come from this machine's verified cache.
		"GOSUMDB=off", "GOTOOLCHAIN=local")
}

func run(t *testing.T, dir string, env []string, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir, cmd.Env = dir, env
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s (in %s): %v\n%s", name, strings.Join(args, " "), dir, err, out)
	}
	return string(out)
}

func write(t *testing.T, file, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}
