package nn

import (
	"hash/fnv"
	"math"

	"github.com/tinyacc/tinyacc/core/tensor"
)

// Rand is a small deterministic generator (splitmix64). Each parameter gets
// its own, seeded by (seed, parameter name), so initial weights do not depend
// on how the model is split across ranks or in which order it is built.
type Rand struct{ s uint64 }

// NewRand returns the generator for a parameter name under a run seed.
func NewRand(seed int64, name string) *Rand {
	h := fnv.New64a()
	h.Write([]byte(name))
	return &Rand{s: uint64(seed)*0x9E3779B97F4A7C15 ^ h.Sum64()}
}

// Uint64 returns the next 64 random bits.
func (r *Rand) Uint64() uint64 {
	r.s += 0x9E3779B97F4A7C15
	z := r.s
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
	z = (z ^ (z >> 27)) * 0x94D049BB133111EB
	return z ^ (z >> 31)
}

// Float64 returns a uniform number in [0, 1).
func (r *Rand) Float64() float64 { return float64(r.Uint64()>>11) / (1 << 53) }

// Normal returns a standard normal number (Box-Muller).
func (r *Rand) Normal() float64 {
	u1 := r.Float64()
	for u1 == 0 {
		u1 = r.Float64()
	}
	u2 := r.Float64()
	return math.Sqrt(-2*math.Log(u1)) * math.Cos(2*math.Pi*u2)
}

// FillNormal fills t with normal(0, std) numbers from the generator of
// (seed, t.Name).
func FillNormal(t *tensor.Tensor, seed int64, std float64) {
	r := NewRand(seed, t.Name)
	for i := 0; i < t.Numel(); i++ {
		t.Set(i, std*r.Normal())
	}
}

// Fill sets every element of t to v.
func Fill(t *tensor.Tensor, v float64) {
	for i := 0; i < t.Numel(); i++ {
		t.Set(i, v)
	}
}
