package broker_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Adapters depend on the broker seam only, never on the consumer or the
// relay: `go list -deps` of each adapter names no other oncekit package but
// internal/cfgerr, the Configs' error vocabulary, which itself depends on no
// oncekit package.
func TestAdaptersDependOnBrokerOnly(t *testing.T) {
	t.Parallel()
	require.Equal(t, []string{"github.com/oncekit/oncekit/internal/cfgerr"}, oncekitDeps(t, "../internal/cfgerr"))
	for pkg, path := range map[string]string{"./natsjs": "broker/natsjs", "../watermill/asbroker": "watermill/asbroker"} {
		for _, dep := range oncekitDeps(t, pkg) {
			require.Contains(t, []string{"github.com/oncekit/oncekit/broker", "github.com/oncekit/oncekit/" + path,
				"github.com/oncekit/oncekit/internal/cfgerr"}, dep, "%s must depend on package broker only", path)
		}
	}
}

// oncekitDeps returns the oncekit packages pkg depends on, itself included.
func oncekitDeps(t *testing.T, pkg string) []string {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", pkg).CombinedOutput()
	require.NoError(t, err, string(out))
	var deps []string
	for _, dep := range strings.Fields(string(out)) {
		if strings.HasPrefix(dep, "github.com/oncekit/oncekit") {
			deps = append(deps, dep)
		}
	}
	return deps
}
