package cpu

import (
	"fmt"
	"math"
)

// CrossEntropyForward computes, for each of rows rows of logits (each vocab
// wide), probs = softmax(row) and losses[r] = -log probs[r, targets[r]].
// A negative target marks a position to ignore (padding): its loss is 0 and
// CrossEntropyBackward gives it no gradient; its probs are still written.
// The loss is formed as logsumexp - logit rather than as -log(prob), so it
// stays finite and accurate when the target's probability underflows.
func CrossEntropyForward[T Float](logits []T, targets []int32, rows, vocab int, probs, losses []T) {
	checkRows("CrossEntropyForward", rows, vocab, []int{len(logits), len(probs)}, []int{len(targets), len(losses)}, nil)
	if rows > 0 && vocab < 1 {
		panic(fmt.Sprintf("cpu.CrossEntropyForward: vocab is %d; a softmax needs at least one class", vocab))
	}
	checkTargets("CrossEntropyForward", targets[:rows], vocab)
	if isF32[T]() {
		ceForward32(as32(logits), targets, rows, vocab, as32(probs), as32(losses))
		return
	}
	ParallelFor(rows, max(1, elemGrain/max(vocab, 1)), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			lr := logits[r*vocab : (r+1)*vocab]
			pr := probs[r*vocab : (r+1)*vocab]
			mx := lr[0]
			for _, v := range lr {
				mx = max(mx, v)
			}
			sum := expShift(lr, pr, mx)
			inv := 1 / sum
			for i := range pr {
				pr[i] *= inv
			}
			if tg := targets[r]; tg >= 0 {
				losses[r] = T(math.Log(float64(sum))) + mx - lr[tg]
			} else {
				losses[r] = 0
			}
		}
	})
}

// ceForward32 is CrossEntropyForward's float32 path: the softmax rows go
// through the vectorised fast path, which also reports each row's maximum
// and sum of exponentials for the loss.
func ceForward32(logits []float32, targets []int32, rows, vocab int, probs, losses []float32) {
	stats := getBuf[float32](2 * rows)
	defer putBuf(stats)
	maxs, sums := (*stats)[:rows], (*stats)[rows:]
	ParallelFor(rows, max(1, elemGrain/max(vocab, 1)), func(lo, hi int) {
		softmaxRows32(logits[lo*vocab:hi*vocab], probs[lo*vocab:hi*vocab], hi-lo, vocab, maxs[lo:hi], sums[lo:hi])
		for r := lo; r < hi; r++ {
			if tg := targets[r]; tg >= 0 {
				losses[r] = float32(math.Log(float64(sums[r]))) + maxs[r] - logits[r*vocab+int(tg)]
			} else {
				losses[r] = 0
			}
		}
	})
}

// CrossEntropyLosses is CrossEntropyForward's losses without its
// probabilities, for a caller that keeps the logits instead (mixed
// precision's cross-entropy): each row's softmax is formed in a scratch
// row of its thread and dropped, so no buffer of the logits' size sits
// beside them. The losses are bitwise CrossEntropyForward's.
func CrossEntropyLosses(logits []float32, targets []int32, rows, vocab int, losses []float32) {
	checkRows("CrossEntropyLosses", rows, vocab, []int{len(logits)}, []int{len(targets), len(losses)}, nil)
	if rows > 0 && vocab < 1 {
		panic(fmt.Sprintf("cpu.CrossEntropyLosses: vocab is %d; a softmax needs at least one class", vocab))
	}
	checkTargets("CrossEntropyLosses", targets[:rows], vocab)
	ParallelFor(rows, max(1, elemGrain/max(vocab, 1)), func(lo, hi int) {
		row := getBuf[float32](vocab)
		defer putBuf(row)
		var mx, sum [1]float32
		for r := lo; r < hi; r++ {
			lr := logits[r*vocab : (r+1)*vocab]
			softmaxRows32(lr, *row, 1, vocab, mx[:], sum[:])
			if tg := targets[r]; tg >= 0 {
				losses[r] = float32(math.Log(float64(sum[0]))) + mx[0] - lr[tg]
			} else {
				losses[r] = 0
			}
		}
	})
}

// expShift writes dst[i] = exp(src[i] - shift) and returns their sum
// (the float64 path of the softmax kernels).
func expShift[T Float](src, dst []T, shift T) T {
	dst = dst[:len(src)]
	var sum T
	for i, v := range src {
		e := T(math.Exp(float64(v - shift)))
		dst[i] = e
		sum += e
	}
	return sum
}

func checkTargets(op string, targets []int32, vocab int) {
	for r, tg := range targets {
		if int(tg) >= vocab {
			panic(fmt.Sprintf("cpu.%s: target %d of row %d is outside the vocabulary of %d tokens", op, tg, r, vocab))
		}
	}
}

// CrossEntropyBackward overwrites dlogits with (probs - onehot(target)) *
// dlosses[r] row by row; ignored rows (negative target) get zeros.
func CrossEntropyBackward[T Float](probs []T, targets []int32, dlosses []T, rows, vocab int, dlogits []T) {
	checkRows("CrossEntropyBackward", rows, vocab, []int{len(probs), len(dlogits)}, []int{len(targets), len(dlosses)}, nil)
	checkTargets("CrossEntropyBackward", targets[:rows], vocab)
	ParallelFor(rows, max(1, elemGrain/max(vocab, 1)), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			dr := dlogits[r*vocab : (r+1)*vocab]
			tg := targets[r]
			if tg < 0 {
				clear(dr)
				continue
			}
			d := dlosses[r]
			for i, p := range probs[r*vocab : (r+1)*vocab] {
				dr[i] = p * d
			}
			dr[tg] -= d
		}
	})
}
