package cpu

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

// denseInputs returns float32 points spread over [lo, hi] at spacing step,
// plus the given extra values.
func denseInputs(lo, hi, step float64, extra ...float32) []float32 {
	var xs []float32
	for x := lo; x <= hi; x += step {
		xs = append(xs, float32(x))
	}
	return append(xs, extra...)
}

func TestExpCoreAccuracy(t *testing.T) {
	extra := []float32{0, -0.34657359, 0.34657359, 1e-20, -1e-20, 88.7, -87.3, expLo, expHi}
	xs := denseInputs(expLo, expHi, 2e-5, extra...)
	worst, at := 0.0, float32(0)
	for _, x := range xs {
		got := float64(expCore(x))
		require.False(t, math.IsNaN(got) || math.IsInf(got, 0), "expCore(%g) = %g", x, got)
		want := math.Exp(float64(x))
		if rel := math.Abs(got-want) / want; rel > worst {
			worst, at = rel, x
		}
	}
	require.Less(t, worst, 2e-7, "worst relative error at x=%g", at)
	require.Equal(t, float32(1), expCore(0))
}
