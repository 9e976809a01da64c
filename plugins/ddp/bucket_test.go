package ddp

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/tensor"
	"github.com/tinyacc/tinyacc/core/trainer"
	"github.com/tinyacc/tinyacc/plugins/ptest"
)

func TestPlanBuckets(t *testing.T) {
	cases := []struct {
		name            string
		sizes           []int64
		first, capBytes int64
		want            [][]int
	}{
		{"empty", nil, 4, 10, nil},
		{"all fit in the first", []int64{1, 2, 1}, 4, 10, [][]int{{0, 1, 2}}},
		{"first is smaller", []int64{2, 2, 2, 2, 2, 2}, 4, 6, [][]int{{0, 1}, {2, 3, 4}, {5}}},
		{"exact fit closes nothing early", []int64{3, 3, 5, 5}, 6, 10, [][]int{{0, 1}, {2, 3}}},
		{"oversized item alone", []int64{1, 20, 1, 1}, 4, 10, [][]int{{0}, {1}, {2, 3}}},
		{"oversized first item", []int64{20, 1}, 4, 10, [][]int{{0}, {1}}},
	}
	for _, c := range cases {
		require.Equal(t, c.want, planBuckets(c.sizes, c.first, c.capBytes), c.name)
	}
}

// TestLayout checks the bucket layout on the test model: gradients in
// reverse order of use (wte last), every cap respected unless a single
// gradient exceeds it, each bucket as full as the next gradient allows,
// and every p.Grad a view of its bucket (backward writes what is sent).
func TestLayout(t *testing.T) {
	cfg := ptest.Config()
	firstMB, bucketMB := 0.005, 0.02
	first, capBytes := int64(firstMB*mib), int64(bucketMB*mib)
	withGroup(t, func(g comm.Group) {
		d, err := New(g, Bucketed, bucketMB, firstMB)
		require.NoError(t, err)
		tr, err := trainer.New(cfg, trainer.Options{Train: ptest.Corpus(), Plugins: []trainer.Plugin{d}})
		require.NoError(t, err)

		params := tr.Model.Params()
		byName := map[string]*tensor.Tensor{}
		var want []string
		var total int64
		for i := len(params) - 1; i >= 0; i-- {
			want = append(want, params[i].Name)
			byName[params[i].Name] = params[i]
			total += params[i].Bytes()
		}
		require.Equal(t, "wte.weight", want[len(want)-1])

		infos := d.Buckets()
		require.Greater(t, len(infos), 3, "small caps should make several buckets")
		var got []string
		var sum int64
		for i, b := range infos {
			require.Equal(t, i, b.Index)
			limit := capBytes
			if i == 0 {
				limit = first
			}
			var bytes int64
			for _, name := range b.Params {
				bytes += byName[name].Bytes()
			}
			require.Equal(t, bytes, b.Bytes, "bucket %d size", i)
			if len(b.Params) > 1 {
				require.LessOrEqual(t, b.Bytes, limit, "bucket %d over its cap", i)
			}
			if i+1 < len(infos) {
				next := byName[infos[i+1].Params[0]].Bytes()
				require.Greater(t, b.Bytes+next, limit, "bucket %d closed while %s still fitted", i, infos[i+1].Params[0])
			}
			got = append(got, b.Params...)
			sum += b.Bytes
		}
		require.Equal(t, want, got, "reverse order of use, each gradient once")
		require.Equal(t, total, sum)
		require.Equal(t, total, tr.Alloc.Usage().Current[tensor.Grads], "the buckets are the gradients' memory")

		// Zero copy: writing a bucket's buffer is writing the gradients.
		for _, b := range d.buckets {
			for i := range b.flat.F32() {
				b.flat.F32()[i] = float32(b.index*100000 + i)
			}
			off := 0
			for _, p := range b.params {
				require.Same(t, d.slots[p].view, p.Grad)
				for j, v := range p.Grad.F32() {
					require.Equal(t, float32(b.index*100000+off+j), v, "%s element %d", p.Name, j)
				}
				off += p.Numel()
			}
		}
	})
}

// TestGradReadyErrors covers the misuse gradReady reports instead of
// silently sending a wrong bucket.
func TestGradReadyErrors(t *testing.T) {
	cfg := ptest.Config()
	withGroup(t, func(g comm.Group) {
		d, err := New(g, Bucketed, 25, 1)
		require.NoError(t, err)
		tr, err := trainer.New(cfg, trainer.Options{Train: ptest.Corpus(), Plugins: []trainer.Plugin{d}})
		require.NoError(t, err)
		last := tensor.PassInfo{Last: true}

		stranger := tensor.New(tensor.Float32, 3)
		stranger.Name = "extra.weight"
		require.EqualError(t, d.GradReady(tr, stranger, last),
			"ddp: parameter extra.weight has no gradient bucket; parameters added after ddp's Prepare are not synchronised (list ddp after plugins that rewrite the model)")

		p := tr.Model.Params()[0]
		require.NoError(t, d.GradReady(tr, p, tensor.PassInfo{Micro: 0, Last: false}), "earlier micro-batches only accumulate")
		require.NoError(t, d.GradReady(tr, p, last))
		require.EqualError(t, d.GradReady(tr, p, last), "ddp: gradient of wte.weight reported final twice in one step (bucket 0)")
		// PreStep sends the incomplete bucket anyway and resets the counts.
		require.NoError(t, d.PreStep(tr))
		require.NoError(t, d.GradReady(tr, p, last))
		require.NoError(t, d.PreStep(tr))

		old := p.Grad
		p.Grad = tensor.New(tensor.Float32, p.Shape()...)
		require.EqualError(t, d.GradReady(tr, p, last),
			"ddp: the gradient of wte.weight is no longer a view of bucket 0; something replaced p.Grad after ddp's Prepare")
		p.Grad = old
	})
}

func TestBucketInfoEmptyInNaiveMode(t *testing.T) {
	withGroup(t, func(g comm.Group) {
		d, err := New(g, Naive, 0, 0)
		require.NoError(t, err)
		_, err = trainer.New(ptest.Config(), trainer.Options{Train: ptest.Corpus(), Plugins: []trainer.Plugin{d}})
		require.NoError(t, err)
		require.Empty(t, d.Buckets())
	})
}

// withGroup runs fn with a one-rank group, on the test's goroutine so
// require may stop it.
func withGroup(t *testing.T, fn func(g comm.Group)) {
	groups, err := comm.NewLocal(1, comm.Options{})
	require.NoError(t, err)
	defer groups[0].Close()
	fn(groups[0])
}
