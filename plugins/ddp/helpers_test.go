package ddp_test

import (
	"testing"

	"github.com/tinyacc/tinyacc/plugins/ptest"
)

// assertEquivalent is ptest.AssertEquivalent, within the bounds of want's
// dtype.
func assertEquivalent(t *testing.T, want, got ptest.Result, nEmbd int, what string) {
	t.Helper()
	ptest.AssertEquivalent(t, want, got, what)
}
