package nn

import (
	"hash/fnv"
	"math"
	"strings"

	"github.com/tinyacc/tinyacc/core/place"
	"github.com/tinyacc/tinyacc/core/tensor"
)

// Rand is a small deterministic generator (splitmix64). Each parameter gets
// its own, seeded by (seed, parameter name), so initial weights do not depend
// on how the model is split across ranks or in which order it is built.
// splitmix64 is counter-based: draw k is a fixed mix of seed + k·γ, so
// NormalAt computes element i of a parameter without walking the elements
// before it, and a rank fills only the part it holds.
type Rand struct{ s uint64 }

// gamma is splitmix64's increment.
const gamma = 0x9E3779B97F4A7C15

// NewRand returns the generator for a parameter name under a run seed.
func NewRand(seed int64, name string) *Rand {
	h := fnv.New64a()
	h.Write([]byte(name))
	return &Rand{s: uint64(seed)*gamma ^ h.Sum64()}
}

// mix is splitmix64's output function.
func mix(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
	z = (z ^ (z >> 27)) * 0x94D049BB133111EB
	return z ^ (z >> 31)
}

// Uint64 returns the next 64 random bits.
func (r *Rand) Uint64() uint64 {
	r.s += gamma
	return mix(r.s)
}

// unit maps 64 random bits to a uniform number in [0, 1).
func unit(b uint64) float64 { return float64(b>>11) / (1 << 53) }

// Float64 returns a uniform number in [0, 1).
func (r *Rand) Float64() float64 { return unit(r.Uint64()) }

// boxMuller is a standard normal number from two uniforms in [0, 1). A
// zero u1 (one draw in 2⁵³) becomes the smallest uniform above zero, so
// every normal takes exactly two draws.
func boxMuller(u1, u2 float64) float64 {
	if u1 == 0 {
		u1 = 1.0 / (1 << 53)
	}
	return math.Sqrt(-2*math.Log(u1)) * math.Cos(2*math.Pi*u2)
}

// Normal returns a standard normal number (Box-Muller, two draws).
func (r *Rand) Normal() float64 {
	u1 := r.Float64()
	return boxMuller(u1, r.Float64())
}

// NormalAt is the i-th number Normal would return from a fresh generator,
// computed directly: draws 2i+1 and 2i+2. The generator is not advanced.
func (r *Rand) NormalAt(i int) float64 {
	k := r.s + uint64(2*i+1)*gamma
	return boxMuller(unit(mix(k)), unit(mix(k+gamma)))
}

// UniformAt is a uniform number in [-1, 1) from draw i+1 of a fresh
// generator, computed directly. The generator is not advanced.
func (r *Rand) UniformAt(i int) float64 {
	return 2*unit(mix(r.s+uint64(i+1)*gamma)) - 1
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

// initOf is GPT-2's initialisation of the parameter named name: normal(0,
// std) when std > 0, else every element v. Weights are normal(0, 0.02),
// the residual projections' scaled by 1/sqrt(2·n_layer); LayerNorm
// weights one; biases zero.
func (c GPTConfig) initOf(name string) (std, v float64) {
	const base = 0.02
	if c.Llama != nil { // Hugging Face's Llama: matrices normal(0, 0.02), norms one
		if strings.HasSuffix(name, "norm.weight") {
			return 0, 1
		}
		return base, 0
	}
	switch {
	case strings.HasSuffix(name, "c_proj.weight"):
		return base / math.Sqrt(2*float64(c.NLayer)), 0
	case strings.HasSuffix(name, "ln_1.weight"), strings.HasSuffix(name, "ln_2.weight"), name == "ln_f.weight":
		return 0, 1
	case strings.HasSuffix(name, ".weight"):
		return base, 0
	}
	return 0, 0
}

// InitPart writes the initial values of the elements of parameter
// spec.Name that the rank at c holds into data, laid out as spec says (the
// local tensor, or its Flat range). Every value is a function of (seed,
// name, element index) only, so each layout starts from the very numbers
// of one process, and a rank computes no element it does not hold.
func (c GPTConfig) InitPart(seed int64, spec *place.Spec, at place.Coord, data *tensor.Tensor) {
	std, v := c.initOf(spec.Name)
	r := NewRand(seed, spec.Name)
	value := func(g int) float64 { return v }
	if std > 0 {
		value = func(g int) float64 { return std * r.NormalAt(g) }
	}
	if bound, ok := loraInit(spec.Name, spec.Shape); ok { // lora.go
		value = func(g int) float64 { return bound * r.UniformAt(g) }
	}
	spec.Runs(at, func(g, l, n int) {
		switch data.DType() {
		case tensor.Float32:
			d := data.F32()[l : l+n]
			for k := range d {
				d[k] = float32(value(g + k))
			}
		case tensor.Float64:
			d := data.F64()[l : l+n]
			for k := range d {
				d[k] = value(g + k)
			}
		default:
			for k := 0; k < n; k++ {
				data.Set(l+k, value(g+k))
			}
		}
	})
}
