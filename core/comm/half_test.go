package comm

import (
	"fmt"
	"math/rand"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/tensor"
)

// A half-precision sum rounds once: rank 0 holds big, every other rank
// small, and big+small is not representable while the exact total is.
// bf16 (last place 2 at 256): 256 + 0.75 + 0.75 = 257.5, which rounds to
// 258, where rounding after each addition would stay at 256. fp16 (last
// place 2 at 2048): 2048 + 0.75 + 0.75 rounds to 2050. Checked on every
// backend, through the segment too, for all-reduce, reduce-scatter and
// reduce; and the bytes sent are half those of the same float32
// all-reduce, 2(N-1)/N of the tensor.
func TestHalfReductionsRoundOnce(t *testing.T) {
	const n, cnt = 3, 3 * 4099
	big := map[tensor.DType]float64{tensor.BFloat16: 256, tensor.Float16: 2048}
	want := map[tensor.DType]float64{tensor.BFloat16: 258, tensor.Float16: 2050}
	run := func(t *testing.T, runner runner) {
		require.NoError(t, runner(t, n, Options{ChunkBytes: 4096}, func(g Group) error {
			for _, dt := range halfDTypes {
				in := func(k int) *tensor.Tensor {
					x := tensor.Default.New(tensor.Comm, dt, k)
					for i := range k {
						x.Set(i, 0.75)
						if g.Rank() == 0 {
							x.Set(i, big[dt])
						}
					}
					return x
				}
				bc := g.(ByteCounter)
				before := bc.SentBytes()
				x := in(cnt)
				if err := g.AllReduce(x, Sum); err != nil {
					return err
				}
				halfBytes := bc.SentBytes() - before
				if err := expectEq(fmt.Sprintf("all_reduce %s", dt), x, fill(cnt, want[dt])); err != nil {
					return err
				}
				if w := int64(2 * (n - 1) * cnt / n * 2); halfBytes != w {
					return fmt.Errorf("%s all_reduce of %d elements sent %d bytes, want 2(N-1)/N of %d bytes = %d", dt, cnt, halfBytes, 2*cnt, w)
				}
				before = bc.SentBytes()
				if err := g.AllReduce(tensor.Default.New(tensor.Comm, tensor.Float32, cnt), Sum); err != nil {
					return err
				}
				if f32 := bc.SentBytes() - before; f32 != 2*halfBytes {
					return fmt.Errorf("float32 all_reduce sent %d bytes, %s %d: want twice", f32, dt, halfBytes)
				}
				out := tensor.Default.New(tensor.Comm, dt, cnt/n)
				if err := g.ReduceScatter(in(cnt), out, Sum); err != nil {
					return err
				}
				if err := expectEq(fmt.Sprintf("reduce_scatter %s", dt), out, fill(cnt/n, want[dt])); err != nil {
					return err
				}
				r := in(cnt)
				if err := g.Reduce(r, 1, Sum); err != nil {
					return err
				}
				if g.Rank() == 1 {
					if err := expectEq(fmt.Sprintf("reduce %s", dt), r, fill(cnt, want[dt])); err != nil {
						return err
					}
				}
			}
			return nil
		}))
	}
	for name, runner := range backendRunners {
		t.Run(name, func(t *testing.T) {
			if name == "tcp" {
				t.Setenv("TINYACC_SHM", "0")
			}
			run(t, runner)
		})
	}
	t.Run("segment", func(t *testing.T) {
		t.Setenv("TINYACC_SHM", "1")
		run(t, runTCP)
	})
}

func fill(n int, v float64) []float64 {
	out := make([]float64, n)
	for i := range out {
		out[i] = v
	}
	return out
}

// The C fold of half sources (fold_cgo.go) gives the bits of the Go fold
// and of the rule computed apart: random finite halves of every magnitude
// (fp16 subnormals and sums that overflow to infinity included) widened,
// summed in float32 in source order, divided for avg, rounded once by
// roundHalfRef or, past the largest half, to an infinity.
func TestFoldHalfMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewSource(7))
	for _, dt := range halfDTypes {
		for _, op := range []ReduceOp{Sum, Avg, Max, Min} {
			for _, nsrc := range []int{1, 2, 5} {
				const m = 3001
				srcs := make([]uint16, nsrc*m)
				for i := range srcs {
					for {
						h := uint16(rng.Uint32())
						if e := h >> 7 & 0xff; dt == tensor.BFloat16 && e != 0xff && e > 60 && e < 200 {
							srcs[i] = h
							break
						}
						if dt == tensor.Float16 && h>>10&0x1f != 0x1f {
							srcs[i] = h
							break
						}
					}
				}
				base := unsafe.Pointer(&srcs[0])
				got := make([]uint16, m)
				foldHalf(dt, op, u16Bytes(got), base, 2*m, nsrc)
				goFold := make([]uint16, m)
				foldHalfGo(dt, op, u16Bytes(goFold), base, 2*m, nsrc)
				require.Equal(t, goFold, got, "%s %s nsrc=%d: C and Go folds differ", dt, op, nsrc)
				src := tensor.FromBF16(srcs, nsrc*m)
				res := tensor.FromBF16(got, m)
				if dt == tensor.Float16 {
					src, res = tensor.FromF16(srcs, nsrc*m), tensor.FromF16(got, m)
				}
				for i := range m {
					acc := float32(src.At(i))
					for k := 1; k < nsrc; k++ {
						v := float32(src.At(k*m + i))
						switch op {
						case Sum, Avg:
							acc += v
						case Max:
							acc = max(acc, v)
						case Min:
							acc = min(acc, v)
						}
					}
					if op == Avg {
						acc /= float32(nsrc)
					}
					w := roundHalfRef(dt, float64(acc))
					if limit := map[tensor.DType]float64{tensor.BFloat16: 0x1.fep127, tensor.Float16: 65504}[dt]; w > limit || w < -limit {
						w = float64(w) * 1e300 * 1e300 // an infinity of its sign
					}
					require.Equal(t, w, res.At(i), "%s %s nsrc=%d element %d", dt, op, nsrc, i)
				}
			}
		}
	}
}

func u16Bytes(s []uint16) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), 2*len(s))
}

// The float32 helpers that carry a tensor in a half dtype round it once to
// that dtype, move 2-byte elements (half of float32's bytes) and widen the
// result back: SendAs/RecvAs, AllGatherAs, and AllReduceAs and
// ReduceScatterAs by the round-once rule. With Float32 they are the plain
// collectives, bitwise.
func TestCarriedAsHalf(t *testing.T) {
	const n, k = 2, 4098
	x := func(r int) []float32 { // 1 + r/3 + i/7: none of them a half
		out := make([]float32, k)
		for i := range out {
			out[i] = 1 + float32(r)/3 + float32(i%50)/7
		}
		return out
	}
	for _, d := range []tensor.DType{tensor.Float32, tensor.BFloat16, tensor.Float16} {
		round := func(v float32) float64 {
			if d == tensor.Float32 {
				return float64(v)
			}
			return roundHalfRef(d, float64(v))
		}
		require.NoError(t, RunLocal(n, Options{}, func(g Group) error {
			bc, me := g.(ByteCounter), g.Rank()
			mine := tensor.FromF32(x(me), k)
			before := bc.SentBytes()
			got := tensor.FromF32(make([]float32, k), k)
			if me == 0 {
				if err := SendAs(g, mine, 1, d); err != nil {
					return err
				}
				if sent := bc.SentBytes() - before; sent != int64(k*d.Size()) {
					return fmt.Errorf("%s: SendAs sent %d bytes, want %d", d, sent, k*d.Size())
				}
			} else if err := RecvAs(g, got, 0, d); err != nil {
				return err
			}
			all := tensor.FromF32(make([]float32, n*k), n*k)
			if err := AllGatherAs(g, mine, all, d); err != nil {
				return err
			}
			sum := tensor.FromF32(x(me), k)
			if err := AllReduceAs(g, sum, Sum, d); err != nil {
				return err
			}
			rs := tensor.FromF32(make([]float32, k/n), k/n)
			if err := ReduceScatterAs(g, tensor.FromF32(x(me), k), rs, Sum, d); err != nil {
				return err
			}
			for i := range k {
				a, b := x(0)[i], x(1)[i]
				if me == 1 && got.At(i) != round(a) {
					return fmt.Errorf("%s: RecvAs element %d = %v, want %v", d, i, got.At(i), round(a))
				}
				if all.At(i) != round(a) || all.At(k+i) != round(b) {
					return fmt.Errorf("%s: AllGatherAs element %d", d, i)
				}
				w := round(float32(round(a)) + float32(round(b))) // widened halves summed in float32, rounded once
				if sum.At(i) != w {
					return fmt.Errorf("%s: AllReduceAs element %d = %v, want %v", d, i, sum.At(i), w)
				}
				if j := i - me*(k/n); j >= 0 && j < k/n && rs.At(j) != w {
					return fmt.Errorf("%s: ReduceScatterAs element %d = %v, want %v", d, j, rs.At(j), w)
				}
			}
			return nil
		}))
	}
}

// BenchmarkFoldHalf folds 4 sources of 1 MiB of bf16 or fp16 each in C
// (fold_cgo.go, vectorized) and in Go: compare the two lines' ns/op.
func BenchmarkFoldHalf(b *testing.B) {
	const nsrc, m = 4, 512 << 10
	srcs := make([]uint16, nsrc*m)
	for i := range srcs {
		srcs[i] = 0x3f80 + uint16(i%127) // bf16 1.0 and up; finite fp16 too
	}
	dst := make([]uint16, m)
	for _, dt := range halfDTypes {
		for _, impl := range []struct {
			name string
			fold func(tensor.DType, ReduceOp, []byte, unsafe.Pointer, int, int)
		}{{"c", foldHalf}, {"go", foldHalfGo}} {
			b.Run(fmt.Sprintf("%s/%s", dt, impl.name), func(b *testing.B) {
				b.SetBytes(int64(2 * nsrc * m))
				for range b.N {
					impl.fold(dt, Sum, u16Bytes(dst), unsafe.Pointer(&srcs[0]), 2*m, nsrc)
				}
			})
		}
	}
}
