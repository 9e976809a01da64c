package ptest

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/tensor"
	"github.com/tinyacc/tinyacc/core/trainer"
)

// HeldParts is the bytes of the parameter parts tr's rank holds by its
// placement, and of the largest of them.
func HeldParts(tr *trainer.Trainer) (held, largest int64, err error) {
	es := int64(tr.DType().Size())
	for _, p := range tr.Model.Params() {
		h, err := tr.Holding(p)
		if err != nil {
			return 0, 0, err
		}
		if h.Value.Data == nil {
			continue
		}
		b := es * int64(h.Value.Spec.HeldElements(tr.Coord()))
		held += b
		largest = max(largest, b)
	}
	return held, largest, nil
}

// AssertConstructionPeak holds rank r's allocator (usage, after
// construction) to construction by placement: its parameter bytes cover
// its parts (held), the parts are less than share of the model's whole
// parameter bytes, and neither the total nor the parameters ever peaked
// above what is held now plus the largest single part. The parameters'
// own peak is held too because the optimizer state comes last and is
// larger than any part: the total alone would let the parameters be
// built whole one at a time before it.
func AssertConstructionPeak(t testing.TB, u tensor.Usage, held, largest, whole int64, share float64, what string, r int) {
	t.Helper()
	params := u.Current[tensor.Params]
	require.GreaterOrEqual(t, params, held, "%s, rank %d: parameter bytes against its parts", what, r)
	require.Less(t, float64(held), share*float64(whole), "%s, rank %d: holds %d of the model's %d parameter bytes", what, r, held, whole)
	require.LessOrEqual(t, u.TotalPeak, u.Total+largest,
		"%s, rank %d: construction peaked at %d bytes; it holds %d, its largest part is %d", what, r, u.TotalPeak, u.Total, largest)
	require.LessOrEqual(t, u.Peak[tensor.Params], params+largest,
		"%s, rank %d: parameters peaked at %d bytes; it holds %d, its largest part is %d", what, r, u.Peak[tensor.Params], params, largest)
	t.Logf("%s rank %d: construction peak %d B, holds %d B (parameters %d of the model's %d), largest part %d B",
		what, r, u.TotalPeak, u.Total, held, whole, largest)
}
