package brokerkill

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Failed checks lost and duplicates always, order violations only on a
// broker that keeps a key's order; the line says when order is not checked.
func TestSummaryFailed(t *testing.T) {
	for _, tc := range []struct {
		name string
		s    Summary
		fail bool
	}{
		{"clean", Summary{}, false},
		{"lost", Summary{Lost: 1}, true},
		{"duplicate", Summary{Duplicates: 1}, true},
		{"out of order", Summary{OrderViolations: 1}, true},
		{"out of order, unordered broker", Summary{OrderViolations: 7, Unordered: true}, false},
		{"lost, unordered broker", Summary{Lost: 1, Unordered: true}, true},
		{"duplicate, unordered broker", Summary{Duplicates: 1, Unordered: true}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.fail, tc.s.Failed() != nil)
			line := tc.s.String()
			require.True(t, strings.HasPrefix(line, "brokerkill broker="), line)
			require.Equal(t, tc.s.Unordered, strings.HasSuffix(line, " order_checked=false"), line)
		})
	}
}
