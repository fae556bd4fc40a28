package apiguard

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestListsTheExportedAPI(t *testing.T) {
	t.Parallel()
	lines, err := List("testdata/mod", "example.com/mod")
	require.NoError(t, err)
	p := "pkg example.com/mod/sub, "
	require.Equal(t, []string{
		p + "const Limit",
		p + "func New(*Config, ...string) (*Config, error)",
		p + "method (*Config) Start(context.Context) error",
		p + "type Alias = Config",
		p + "type Config struct",
		p + "type Config struct, Name string",
		p + "type Config struct, Timeout int",
		p + "type Config struct, embedded Embedded",
		p + "type Embedded struct",
		p + "type Embedded struct, X int",
		p + "type Runner interface",
		p + "type Runner interface, Run(context.Context) error",
		p + "var Err error",
	}, lines)
}

// The check fails on a released identifier that is gone or changed, unless
// the changelog's Unreleased section names it; additions are compatible.
func TestCheckRefusesUnrecordedIncompatibleChanges(t *testing.T) {
	t.Parallel()
	p := "pkg example.com/mod/outbox, "
	released := []string{
		p + "type RelayConfig struct, Lease time.Duration",
		p + "func New(*Config) (*Outbox, error)",
		p + "method (*Relay) Run(context.Context) error",
	}
	renamed := []string{
		p + "type RelayConfig struct, LeaseTTL time.Duration", // renamed
		p + "func New(*Config, int) (*Outbox, error)",         // signature changed
		p + "method (*Relay) Run(context.Context) error",
		p + "func Added()", // compatible
	}
	require.Equal(t, released[:2], Check(released, renamed, ""))
	require.Equal(t, released[1:2], Check(released, renamed, "- `outbox.RelayConfig.Lease` is `LeaseTTL` again"))
	require.Empty(t, Check(released, renamed, "outbox.RelayConfig.Lease, outbox.New"))
	require.Empty(t, Check(released, released, ""))
}

func TestIdentifierIsHowTheChangelogNamesIt(t *testing.T) {
	t.Parallel()
	p := "pkg github.com/oncekit/oncekit/outbox, "
	for line, want := range map[string]string{
		p + "func New(*Config) (*Outbox, error)":                                       "outbox.New",
		p + "method (*Relay) Run(context.Context) error":                               "outbox.Relay.Run",
		p + "method (Entry) State() State":                                             "outbox.Entry.State",
		p + "type RelayConfig struct":                                                  "outbox.RelayConfig",
		p + "type RelayConfig struct, Lease time.Duration":                             "outbox.RelayConfig.Lease",
		p + "type Source interface, Receive(context.Context, int) ([]Delivery, error)": "outbox.Source.Receive",
		p + "type Message struct, embedded broker.Message":                             "outbox.Message.Message",
		p + "const DefaultPartitions":                                                  "outbox.DefaultPartitions",
		p + "var ErrInvalidConfig":                                                     "outbox.ErrInvalidConfig",
		"pkg github.com/oncekit/oncekit, func DeriveID(...string) uuid.UUID":           "oncekit.DeriveID",
	} {
		require.Equal(t, want, Identifier(line), line)
	}
}
