package outbox

import (
	"testing"

	"github.com/jackc/pglogrepl"
	"github.com/stretchr/testify/require"
)

func TestSwitchPoint(t *testing.T) {
	t.Parallel()
	history := []byte("1\t0/300E320\tno recovery target specified\n\n2\t0/5000000\tno recovery target specified\n")
	for _, c := range []struct {
		tli  int64
		want pglogrepl.LSN
	}{
		{1, 0x300E320},
		{2, 0x5000000},
		{3, 0}, // the current timeline has not ended
	} {
		require.Equal(t, c.want, switchPoint(history, c.tli), "timeline %d", c.tli)
	}
	require.Zero(t, switchPoint([]byte("garbage\n1 not-an-lsn\n"), 1))
}
