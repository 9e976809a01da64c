package cpu

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

func refCrossEntropy(logits []float64, targets []int32, rows, vocab int) (probs, losses []float64) {
	probs = make([]float64, rows*vocab)
	losses = make([]float64, rows)
	for r := 0; r < rows; r++ {
		l := logits[r*vocab : (r+1)*vocab]
		mx := math.Inf(-1)
		for _, v := range l {
			mx = math.Max(mx, v)
		}
		var sum float64
		for _, v := range l {
			sum += math.Exp(v - mx)
		}
		for i, v := range l {
			probs[r*vocab+i] = math.Exp(v-mx) / sum
		}
		if targets[r] >= 0 {
			losses[r] = -(l[targets[r]] - mx - math.Log(sum))
		}
	}
	return probs, losses
}

func testCrossEntropy[T Float](t *testing.T) {
	rng := newRNG(41)
	rows, vocab := 37, 257
	logits := randSlice[T](rng, rows*vocab, 8)
	logits[5*vocab+3] = 60 // a dominant logit: other probs underflow-ish
	targets := make([]int32, rows)
	for r := range targets {
		targets[r] = int32(rng.IntN(vocab))
	}
	targets[2], targets[9] = -1, -100
	targets[5] = 4 // a target whose probability is ~e^-60
	probs, losses := make([]T, rows*vocab), randSlice[T](rng, rows, 1)
	CrossEntropyForward(logits, targets, rows, vocab, probs, losses)
	wp, wl := refCrossEntropy(to64(logits), targets, rows, vocab)
	tol := tolFor[T](1e-6, 1e-13)
	requireClose(t, probs, wp, tol, "probs")
	requireClose(t, losses, wl, tol, "losses")
	require.Zero(t, losses[2])
	require.Zero(t, losses[9])
	require.InDelta(t, wl[5], float64(losses[5]), 1e-5*wl[5], "loss of an improbable target")

	dl := randSlice[T](rng, rows, 1)
	dlogits := randSlice[T](rng, rows*vocab, 1) // overwritten, not accumulated
	CrossEntropyBackward(probs, targets, dl, rows, vocab, dlogits)
	want := make([]float64, rows*vocab)
	for r := 0; r < rows; r++ {
		if targets[r] < 0 {
			continue
		}
		for i := 0; i < vocab; i++ {
			want[r*vocab+i] = wp[r*vocab+i] * float64(dl[r])
		}
		want[r*vocab+int(targets[r])] -= float64(dl[r])
	}
	requireClose(t, dlogits, want, tol, "dlogits")
}

func TestCrossEntropy(t *testing.T) {
	t.Run("float32", testCrossEntropy[float32])
	t.Run("float64", testCrossEntropy[float64])
}

func TestCrossEntropyBackwardFiniteDifferences(t *testing.T) {
	rng := newRNG(42)
	rows, vocab := 4, 9
	logits := randSlice[float64](rng, rows*vocab, 3)
	targets := []int32{3, -1, 0, 8}
	dl := randSlice[float64](rng, rows, 1)
	loss := func() float64 {
		probs, losses := make([]float64, rows*vocab), make([]float64, rows)
		CrossEntropyForward(logits, targets, rows, vocab, probs, losses)
		var s float64
		for r, l := range losses {
			s += dl[r] * l
		}
		return s
	}
	want := make([]float64, rows*vocab)
	for i := range logits {
		old := logits[i]
		logits[i] = old + 1e-6
		lp := loss()
		logits[i] = old - 1e-6
		lm := loss()
		logits[i] = old
		want[i] = (lp - lm) / 2e-6
	}
	probs, losses := make([]float64, rows*vocab), make([]float64, rows)
	CrossEntropyForward(logits, targets, rows, vocab, probs, losses)
	got := make([]float64, rows*vocab)
	CrossEntropyBackward(probs, targets, dl, rows, vocab, got)
	requireClose(t, got, want, 1e-8, "dlogits")
}

func TestCrossEntropyBadTarget(t *testing.T) {
	require.PanicsWithValue(t, "cpu.CrossEntropyForward: target 5 of row 1 is outside the vocabulary of 5 tokens",
		func() {
			CrossEntropyForward(make([]float32, 10), []int32{0, 5}, 2, 5, make([]float32, 10), make([]float32, 2))
		})
}

// TestCrossEntropyLossesMatchForward: the losses without the
// probabilities are bitwise CrossEntropyForward's, ignored positions
// included, at a vocabulary that spans several of the kernel's chunks.
func TestCrossEntropyLossesMatchForward(t *testing.T) {
	rng := newRNG(21)
	for _, sz := range [][2]int{{1, 1}, {7, 33}, {64, 256}, {5, 50257}} {
		rows, V := sz[0], sz[1]
		logits := randSlice[float32](rng, rows*V, 4)
		targets := make([]int32, rows)
		for r := range targets {
			targets[r] = int32((r * 7919) % V)
		}
		targets[rows-1] = -1
		probs, want := make([]float32, rows*V), make([]float32, rows)
		CrossEntropyForward(logits, targets, rows, V, probs, want)
		got := make([]float32, rows)
		CrossEntropyLosses(logits, targets, rows, V, got)
		require.Equal(t, want, got, "rows %d vocab %d", rows, V)
	}
}
