package tp

import (
	"fmt"
	"math/rand"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/nn"
	"github.com/tinyacc/tinyacc/core/tensor"
)

func TestVocabRange(t *testing.T) {
	for _, c := range []struct{ v, n int }{{10, 2}, {11, 2}, {257, 4}, {3, 3}, {7, 3}} {
		at := 0
		for r := 0; r < c.n; r++ {
			lo, hi := VocabRange(c.v, c.n, r)
			require.Equal(t, at, lo, "%v rank %d starts where the last ended", c, r)
			require.InDelta(t, float64(c.v)/float64(c.n), float64(hi-lo), 1, "%v rank %d", c, r)
			at = hi
		}
		require.Equal(t, c.v, at, "%v: the parts cover the vocabulary", c)
	}
}

// Vocabulary-parallel cross-entropy equals the full one, loss and logit
// gradients, whether or not the vocabulary divides by the ranks, with some
// targets ignored.
func TestCrossEntropyEqualsFull(t *testing.T) {
	const rows = 12
	for _, c := range []struct{ v, n int }{{10, 2}, {11, 2}, {11, 3}, {13, 4}} {
		t.Run(fmt.Sprintf("V%d/n%d", c.v, c.n), func(t *testing.T) {
			r := rand.New(rand.NewSource(int64(c.v*10 + c.n)))
			logits0 := randT(r, 3, 4, c.v)
			for i := range logits0.F64() {
				logits0.F64()[i] *= 4 // a sharp softmax: the maximum matters
			}
			tg := make([]int32, rows)
			for i := range tg {
				tg[i] = int32(r.Intn(c.v))
			}
			tg[3], tg[7] = -1, -1
			targets := tensor.FromI32(tg, 3, 4)
			logits := leaf(logits0)
			loss := tensor.CrossEntropy(logits, targets)
			backward(t, tensor.Scale(loss, 0.5))
			rs := ranks(t, c.n, func(cm *Comm) (got, error) {
				lo, hi := VocabRange(c.v, c.n, cm.G.Rank())
				l := leaf(slice(logits0, 2, lo, hi))
				y, err := CrossEntropy(cm, l, targets, lo, c.v)
				if err != nil {
					return got{}, err
				}
				_, err = tensor.Backward(tensor.Scale(y, 0.5), nil, tensor.BackwardOptions{})
				return got{y: y, gx: l.Grad}, err
			})
			for k, g := range rs {
				lo, hi := VocabRange(c.v, c.n, k)
				require.InEpsilon(t, loss.Scalar(), g.y.Scalar(), tol, "rank %d loss", k)
				near(t, slice(logits.Grad, 2, lo, hi), g.gx, fmt.Sprintf("rank %d logit gradient", k))
			}
		})
	}
}

// The vocabulary-parallel embedding and head equal the tied GPT-2 ones:
// embeddings, logits, the loss and the gradients of wte and wpe, plain and
// under sequence parallelism, with a vocabulary that does not divide.
func TestVocabEmbeddingAndHeadEqualFull(t *testing.T) {
	const B, T, C, V = 2, 4, 6, 11
	r := rand.New(rand.NewSource(7))
	wte0, wpe0 := randT(r, V, C), randT(r, T, C)
	ids := make([]int32, B*T)
	tg := make([]int32, B*T)
	for i := range ids {
		ids[i], tg[i] = int32(r.Intn(V)), int32(r.Intn(V))
	}
	idx, targets := tensor.FromI32(ids, B, T), tensor.FromI32(tg, B, T)
	mix := randT(r, C, C) // a stand-in for the blocks between the two
	wte, wpe := leaf(wte0), leaf(wpe0)
	emb := tensor.AddPositions(tensor.Embedding(wte, idx), wpe, nil)
	head := &nn.TiedHead{Wte: wte}
	h := tensor.Linear(emb, mix, nil)
	logits, err := head.Logits(h, nn.Pass{})
	require.NoError(t, err)
	loss := tensor.CrossEntropy(logits, targets)
	backward(t, loss)
	for _, sp := range []bool{false, true} {
		for _, n := range []int{2, 3} {
			if sp && T%n != 0 {
				continue
			}
			t.Run(fmt.Sprintf("sp=%v/n%d", sp, n), func(t *testing.T) {
				type res struct{ emb, logits, loss, gwte, gwpe *tensor.Tensor }
				rs := ranks(t, n, func(c *Comm) (res, error) {
					lo, hi := VocabRange(V, n, c.G.Rank())
					w, p := leaf(slice(wte0, 0, lo, hi)), leaf(wpe0)
					e := &VocabEmbedding{Wte: w, Wpe: p, Lo: lo, C: c, SP: sp}
					hd := &VocabHead{Wte: w, Lo: lo, V: V, C: c, SP: sp}
					x, err := e.Forward(idx, nn.Pass{})
					if err != nil {
						return res{}, err
					}
					hx := tensor.Linear(x, mix, nil)
					lg, err := hd.Logits(hx, nn.Pass{})
					if err != nil {
						return res{}, err
					}
					l, err := hd.Loss(hx, targets, nn.Pass{})
					if err != nil {
						return res{}, err
					}
					_, err = tensor.Backward(l, nil, tensor.BackwardOptions{})
					return res{x, lg, l, w.Grad, p.Grad}, err
				})
				for k, g := range rs {
					lo, hi := VocabRange(V, n, k)
					what := fmt.Sprintf("rank %d", k)
					if sp {
						near(t, part(emb, 1, n, k), g.emb, what+" embedding of its part of the sequence")
					} else {
						near(t, emb, g.emb, what+" embedding")
					}
					near(t, logits, g.logits, what+" logits")
					require.InEpsilon(t, loss.Scalar(), g.loss.Scalar(), tol, "%s loss", what)
					near(t, slice(wte.Grad, 0, lo, hi), g.gwte, what+" wte gradient")
					near(t, wpe.Grad, g.gwpe, what+" wpe gradient")
				}
			})
		}
	}
}
