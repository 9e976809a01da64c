package tensor

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestAliasSharesFlatStorage(t *testing.T) {
	a := NewAllocator()
	flat := a.New(Params, Float32, 10)
	p := a.New(Params, Float32, 2, 3)
	for i := range p.f32 {
		p.f32[i] = float32(i + 1)
	}
	require.Equal(t, int64(16*4), a.Usage().Current[Params])
	vals := p.Clone(Other)
	p.Alias(flat, 4)
	require.Equal(t, int64(10*4), a.Usage().Current[Params], "p's own buffer was released")
	p.CopyFrom(vals)
	require.Equal(t, []float32{0, 0, 0, 0, 1, 2, 3, 4, 5, 6}, flat.F32())
	flat.F32()[5] = 42
	require.Equal(t, 42.0, p.At(1))
	p.DropStorage()
	require.False(t, p.HasStorage())
	require.Panics(t, func() { p.At(0) })
	require.PanicsWithValue(t, "tensor: cannot alias Tensor(float32 [2 3]) to 6 elements at 5 of Tensor(float32 [10])",
		func() { p.Alias(flat, 5) })
}

func TestOpsAllocateFromTheTensorsHomeAllocator(t *testing.T) {
	a := NewAllocator()
	flat := a.New(Params, Float32, 8)
	w := a.New(Params, Float32, 2, 4)
	w.Alias(flat, 0)
	before := Default.Usage().Current[Activations]
	y := Gelu(View(w, 8))
	require.Equal(t, int64(8*4), a.Usage().Current[Activations], "the output is accounted to w's allocator")
	require.Equal(t, before, Default.Usage().Current[Activations])
	y.Release()
}

// Span is a view of a range of a tensor's storage in its dtype: writes
// through it land in the tensor, and it owns nothing.
func TestSpan(t *testing.T) {
	for _, dt := range []DType{Float32, Float64} {
		flat := New(dt, 6)
		s := flat.Span(2, 6, 2, 2)
		require.Equal(t, []int{2, 2}, s.Shape())
		require.Equal(t, dt, s.DType())
		s.Set(3, 7)
		require.Equal(t, 7.0, flat.At(5), "%s: the write lands in the tensor", dt)
		require.Equal(t, []int{2}, flat.Span(0, 2).Shape(), "%s: one dimension by default", dt)
	}
}
