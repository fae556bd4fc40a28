package broker_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Adapters depend on the broker seam only, never on the consumer or the
// relay: `go list -deps` of each adapter names no other oncekit package.
func TestAdaptersDependOnBrokerOnly(t *testing.T) {
	t.Parallel()
	for _, pkg := range []string{"./natsjs", "./wmbroker"} {
		out, err := exec.Command("go", "list", "-deps", pkg).CombinedOutput()
		require.NoError(t, err, string(out))
		for _, dep := range strings.Fields(string(out)) {
			if strings.HasPrefix(dep, "github.com/oncekit/oncekit") {
				require.Contains(t, []string{"github.com/oncekit/oncekit/broker", "github.com/oncekit/oncekit/broker/" + strings.TrimPrefix(pkg, "./")}, dep,
					"%s must depend on package broker only", pkg)
			}
		}
	}
}
