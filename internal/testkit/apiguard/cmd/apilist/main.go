// Command apilist prints the exported API of the module in the current
// directory, one line per identifier: what api/vX.Y.Z.txt holds for a
// release (`make api`).
package main

import (
	"fmt"
	"os"
	"os/exec"
	"strings"

	"github.com/oncekit/oncekit/internal/testkit/apiguard"
)

func main() {
	// The module in the current directory alone: in the development
	// workspace, `go list -m` lists every module of it.
	cmd := exec.Command("go", "list", "-m")
	cmd.Env = append(os.Environ(), "GOWORK=off")
	mod, err := cmd.Output()
	if err != nil {
		fmt.Fprintln(os.Stderr, "apilist: go list -m:", err)
		os.Exit(1)
	}
	lines, err := apiguard.List(".", strings.TrimSpace(string(mod)))
	if err != nil {
		fmt.Fprintln(os.Stderr, "apilist:", err)
		os.Exit(1)
	}
	fmt.Println(strings.Join(lines, "\n"))
}
