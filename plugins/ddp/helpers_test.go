package ddp_test

import (
	"testing"

	"github.com/tinyacc/tinyacc/plugins/ptest"
)

// assertEquivalent is ptest.AssertEquivalent (which splits out the
// attention key biases; see ptest.KeyBiasTol).
func assertEquivalent(t *testing.T, want, got ptest.Result, nEmbd int, what string) {
	t.Helper()
	ptest.AssertEquivalent(t, want, got, what)
}
