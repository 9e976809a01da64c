package comm

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// A rank 0 that finishes at once must not cut the others off the store
// before they have read the end of their rendezvous.
func TestRunTCPLocalWithEmptyBodies(t *testing.T) {
	for _, n := range []int{1, 2, 3, 4} {
		for i := 0; i < 5; i++ {
			require.NoError(t, RunTCPLocal(n, Options{}, func(g Group) error { return nil }), "n=%d", n)
		}
	}
}
