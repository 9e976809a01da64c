package nn

import (
	"fmt"
	"math"
	"sort"
	"strings"

	"github.com/tinyacc/tinyacc/core/tensor"
)

// MoEConfig makes a model's feed-forward layers mixtures of experts
// (model.moe.*). Experts 0 keeps every block dense.
type MoEConfig struct {
	Experts int // experts per MoE block; 0 = dense model
	TopK    int // experts each token is sent to
	Every   int // blocks Every-1, 2·Every-1, ... (0-based) are MoE
	// CapacityFactor 0 routes every token to its experts (dropless). Above
	// 0 an expert takes at most ceil(CapacityFactor·N·TopK/Experts) of the
	// N tokens of a micro-batch's forward; see MoE.route for which drop.
	CapacityFactor float64
	AuxLossCoef    float64 // weight of the load-balancing loss
	ZLossCoef      float64 // weight of the router z-loss
	// AuxScale is the weight of one forward's auxiliary losses in the
	// step's loss: 1/train.grad_accum, as each micro-batch's language-model
	// loss weighs (0 counts as 1).
	AuxScale float64
}

// Validate reports a configuration the layers cannot be built with.
func (c MoEConfig) Validate() error {
	if c.Experts == 0 {
		return nil
	}
	switch {
	case c.Experts < 0:
		return fmt.Errorf("nn: model.moe.experts=%d: use 0 for a dense model or at least 1 expert", c.Experts)
	case c.TopK < 1 || c.TopK > c.Experts:
		return fmt.Errorf("nn: model.moe.top_k=%d must be between 1 and model.moe.experts=%d", c.TopK, c.Experts)
	case c.Every < 1:
		return fmt.Errorf("nn: model.moe.every=%d must be at least 1", c.Every)
	case c.CapacityFactor < 0 || math.IsNaN(c.CapacityFactor):
		return fmt.Errorf("nn: model.moe.capacity_factor=%v must be 0 (dropless) or positive", c.CapacityFactor)
	case c.AuxLossCoef < 0 || c.ZLossCoef < 0:
		return fmt.Errorf("nn: model.moe.aux_loss_coef=%v and z_loss_coef=%v must not be negative", c.AuxLossCoef, c.ZLossCoef)
	}
	return nil
}

// IsMoE reports whether block i is a mixture of experts.
func (c MoEConfig) IsMoE(i int) bool { return c.Experts > 0 && (i+1)%c.Every == 0 }

// Expert is one expert: the architecture's MLP (GPT-2's c_fc, GELU,
// c_proj) with weights of its own.
type Expert struct {
	FcW, FcB, ProjW, ProjB *tensor.Tensor
	// Fc and Proj, when set, replace the two linear maps: tensor parallel
	// (plugins/tp) splits an expert like the dense MLP, c_fc by columns
	// and c_proj by rows, the output summed over its group.
	Fc, Proj Layer
}

// Forward runs the expert on its tokens x [n, C].
func (e *Expert) Forward(x *tensor.Tensor, p Pass) (*tensor.Tensor, error) {
	if e.Fc == nil {
		return tensor.Linear(tensor.Gelu(tensor.Linear(x, e.FcW, e.FcB)), e.ProjW, e.ProjB), nil
	}
	h, err := e.Fc.Forward(x, p)
	if err != nil {
		return nil, err
	}
	return e.Proj.Forward(tensor.Gelu(h), p)
}

// MoE is the feed-forward layer of a MoE block: a router (a linear map to
// one logit per expert, no bias) and the experts. Each token goes to the
// TopK experts of highest router probability (softmax of the logits; ties
// to the lower index), and its output is their outputs weighted by those
// probabilities renormalised over the chosen TopK.
//
// The load-balancing loss is Switch Transformer's E·Σ_i f_i·P_i over the
// N tokens of the forward, f_i the share of the N·TopK assignments that
// chose expert i and P_i the mean router probability of expert i, times
// AuxLossCoef; the z-loss is ZLossCoef · mean_t logsumexp(logits_t)². Both
// ride the output into backward (tensor.WithLoss) with weight AuxScale.
type MoE struct {
	Cfg     MoEConfig
	Router  *tensor.Tensor // [C, Experts]
	Experts []*Expert      // one per expert, by index
	// AuxScale is the weight of one micro-batch's auxiliary losses in the
	// step's loss: 1/grad_accum, as each micro-batch's language-model loss.
	AuxScale float64
	// Stats accumulates over forwards until the trainer reads and resets
	// it at the end of a step.
	Stats MoEStats
	// Reduce, when set, sums in place, over the ranks that share each
	// micro-batch (data × context parallel), the statistics the auxiliary
	// losses are computed from; Ranks is how many they are. The losses are
	// then those of the whole micro-batch, as one process computes them,
	// and each rank's gradient of them is its share times Ranks, since the
	// ranks' gradients are averaged.
	Reduce func(v []float64) error
	Ranks  int
	// Dispatch, when set, spreads the experts over an expert-parallel
	// group (forwardEP): Experts then holds only this rank's experts,
	// the others nil.
	Dispatch Dispatcher
}

// MoEStats is what one MoE layer saw since the last reset.
type MoEStats struct {
	Forwards int     // forwards counted
	Aux, Z   float64 // sums over the forwards of the weighted losses
	Load     []int64 // tokens each expert processed
	Dropped  int64   // token-to-expert assignments dropped at capacity
}

// newMoE describes a block's MoE layer: the router and each expert's
// GPT-2 MLP. Their initial values follow GPTConfig.initOf by name (router
// and c_fc normal(0, 0.02), c_proj scaled like every residual projection,
// biases zero).
func newMoE(cfg MoEConfig, newP func(local string, shape ...int) *tensor.Tensor, C int) *MoE {
	m := &MoE{Cfg: cfg, AuxScale: cfg.AuxScale}
	if m.AuxScale == 0 {
		m.AuxScale = 1
	}
	m.Router = newP("mlp.router.weight", C, cfg.Experts)
	for e := 0; e < cfg.Experts; e++ {
		p := fmt.Sprintf("mlp.experts.%d.", e)
		ex := &Expert{
			FcW: newP(p+"c_fc.weight", C, 4*C), FcB: newP(p+"c_fc.bias", 4*C),
			ProjW: newP(p+"c_proj.weight", 4*C, C), ProjB: newP(p+"c_proj.bias", C),
		}
		m.Experts = append(m.Experts, ex)
	}
	return m
}

// expertsPart is what names an expert's parameters: block prefix, this,
// the expert's index, a dot, the MLP's own name.
const expertsPart = ".mlp.experts."

// ExpertOf returns the expert index of a parameter name
// ("h.3.mlp.experts.5.c_fc.weight" is 5) and false for a parameter of no
// expert.
func ExpertOf(name string) (int, bool) {
	i := strings.Index(name, expertsPart)
	if i < 0 {
		return 0, false
	}
	var e int
	if _, err := fmt.Sscanf(name[i+len(expertsPart):], "%d.", &e); err != nil {
		return 0, false
	}
	return e, true
}

// moeParamShapes lists the parameters of block prefix p's MoE layer.
func (c MoEConfig) paramShapes(p string, C int) []ParamShape {
	out := []ParamShape{{p + "mlp.router.weight", []int{C, c.Experts}}}
	for e := 0; e < c.Experts; e++ {
		q := fmt.Sprintf("%smlp.experts.%d.", p, e)
		out = append(out,
			ParamShape{q + "c_fc.weight", []int{C, 4 * C}}, ParamShape{q + "c_fc.bias", []int{4 * C}},
			ParamShape{q + "c_proj.weight", []int{4 * C, C}}, ParamShape{q + "c_proj.bias", []int{C}})
	}
	return out
}

// Routing is where the tokens of one forward go: for each expert, its
// tokens in ascending order and the index (t·TopK + s) of the routing
// weight that scales each, and how many assignments capacity dropped.
type Routing struct {
	Rows, Weight [][]int
	Count        []int // assignments per expert before dropping
	Dropped      int
}

// TopK returns the k columns of highest value of each row of p [N, E],
// highest first (ties to the lower index), row-major.
func TopK(p *tensor.Tensor, k int) []int {
	E := p.Dim(-1)
	N := p.Numel() / E
	out := make([]int, 0, N*k)
	idx := make([]int, E)
	for t := 0; t < N; t++ {
		for j := range idx {
			idx[j] = j
		}
		sort.SliceStable(idx, func(a, b int) bool { return p.At(t*E+idx[a]) > p.At(t*E+idx[b]) })
		out = append(out, idx[:k]...)
	}
	return out
}

// Route assigns the choices (TopK's output for N tokens) to the experts.
// Dropless (capacity 0) every assignment is kept. With a capacity, an
// expert keeps the first capacity assignments in this order: every
// token's first choice, by token, then every token's second choice, and so
// on; the later ones are dropped (the token gets nothing from that expert;
// the weights of its other experts are not renormalised again).
func Route(choice []int, N, k, experts, capacity int) Routing {
	r := Routing{Rows: make([][]int, experts), Weight: make([][]int, experts), Count: make([]int, experts)}
	keep := make([]bool, N*k)
	taken := make([]int, experts)
	for s := 0; s < k; s++ {
		for t := 0; t < N; t++ {
			e := choice[t*k+s]
			r.Count[e]++
			if capacity > 0 && taken[e] >= capacity {
				r.Dropped++
				continue
			}
			taken[e]++
			keep[t*k+s] = true
		}
	}
	for t := 0; t < N; t++ {
		for s := 0; s < k; s++ {
			if keep[t*k+s] {
				e := choice[t*k+s]
				r.Rows[e] = append(r.Rows[e], t)
				r.Weight[e] = append(r.Weight[e], t*k+s)
			}
		}
	}
	return r
}

// Capacity is the most tokens an expert takes out of n (0: no limit).
func (c MoEConfig) Capacity(n int) int {
	if c.CapacityFactor == 0 {
		return 0
	}
	return int(math.Ceil(c.CapacityFactor * float64(n*c.TopK) / float64(c.Experts)))
}

// Forward implements Layer on x [B, T, C] (ln_2's output).
func (m *MoE) Forward(x *tensor.Tensor, p Pass) (*tensor.Tensor, error) {
	shape := x.Shape()
	C, E, k := x.Dim(-1), m.Cfg.Experts, m.Cfg.TopK
	N := x.Numel() / C
	if N == 0 {
		return nil, fmt.Errorf("nn: a MoE layer needs at least one token")
	}
	h := tensor.View(x, N, C)
	logits := tensor.Linear(h, m.Router, nil)
	probs := tensor.SoftmaxRows(logits)
	choice := TopK(probs, k)
	w := tensor.RoutedWeights(probs, choice, k)
	rt := Route(choice, N, k, E, m.Cfg.Capacity(N))
	var out *tensor.Tensor
	if m.Dispatch != nil {
		var err error
		if m.Dispatch.Gathers() {
			out, err = m.forwardGather(h, w, choice, p)
		} else {
			out, err = m.forwardEP(h, w, rt, p)
		}
		if err != nil {
			return nil, err
		}
	} else {
		// Every expert runs, on no rows when no token chose it: its
		// gradient is then zero but final like every other parameter's,
		// so data parallel's buckets complete alike on every rank.
		var parts []tensor.Routed
		for e, rows := range rt.Rows {
			y, err := m.Experts[e].Forward(tensor.GatherRows(h, rows), p)
			if err != nil {
				return nil, err
			}
			parts = append(parts, tensor.Routed{Y: y, Rows: rows, Weight: rt.Weight[e]})
		}
		out = tensor.CombineRows(N, w, parts)
	}
	if m.Stats.Load == nil {
		m.Stats.Load = make([]int64, E)
	}
	for e, rows := range rt.Rows {
		m.Stats.Load[e] += int64(len(rows))
	}
	m.Stats.Dropped += int64(rt.Dropped)
	m.Stats.Forwards++
	if m.Cfg.AuxLossCoef == 0 && m.Cfg.ZLossCoef == 0 {
		return tensor.View(out, shape...), nil
	}
	// The statistics of the losses, summed over the micro-batch's ranks:
	// assignments per expert, probability mass per expert, tokens, and
	// Σ_t logsumexp(logits_t)².
	st := make([]float64, 2*E+2)
	for i := 0; i < E; i++ {
		st[i] = float64(rt.Count[i])
		for t := 0; t < N; t++ {
			st[E+i] += probs.At(t*E + i)
		}
	}
	st[2*E] = float64(N)
	if m.Cfg.ZLossCoef > 0 {
		for t := 0; t < N; t++ {
			l := tensor.LogSumExpRow(logits, t)
			st[2*E+1] += l * l
		}
	}
	ranks := 1.0
	if m.Reduce != nil {
		if err := m.Reduce(st); err != nil {
			return nil, fmt.Errorf("nn: MoE load-balancing statistics: %w", err)
		}
		ranks = float64(max(1, m.Ranks))
	}
	n := st[2*E]
	if c := m.Cfg.AuxLossCoef; c > 0 {
		// f_i = Count_i/(n·k), P_i = Σ_t p[t,i]/n; the loss is linear in
		// p, with d/dp[t,i] = c·E·f_i/n.
		var value float64
		grad := make([]float64, E)
		for i := 0; i < E; i++ {
			f := st[i] / (n * float64(k))
			value += c * float64(E) * f * st[E+i] / n
			grad[i] = ranks * c * float64(E) * f / n
		}
		m.Stats.Aux += value
		out = tensor.WithLoss(out, tensor.RouterAuxLoss(probs, grad, value), m.AuxScale)
	}
	if c := m.Cfg.ZLossCoef; c > 0 {
		value := c * st[2*E+1] / n
		m.Stats.Z += value
		out = tensor.WithLoss(out, tensor.RouterZLoss(logits, ranks*c/n, value), m.AuxScale)
	}
	return tensor.View(out, shape...), nil
}

// TakeStats returns the layer's statistics and starts counting anew.
func (m *MoE) TakeStats() MoEStats {
	s := m.Stats
	m.Stats = MoEStats{}
	return s
}

// moeExtraParams is what the MoE blocks add to the dense model's parameter
// count with experts experts each: per MoE block a router (C·E) and
// experts-1 more MLPs of 8C²+5C.
func (c GPTConfig) moeExtraParams(experts int) int64 {
	if c.MoE.Experts == 0 {
		return 0
	}
	C := int64(c.NEmbd)
	var blocks int64
	for i := 0; i < c.NLayer; i++ {
		if c.MoE.IsMoE(i) {
			blocks++
		}
	}
	return blocks * (C*int64(c.MoE.Experts) + int64(experts-1)*(8*C*C+5*C))
}

// ExpertParams is the parameters of every MoE block's experts, all of
// them (the routers not counted): what expert parallel spreads over its
// ranks, E/ep experts of each block on each.
func (c GPTConfig) ExpertParams() int64 {
	return c.moeExtraParams(c.MoE.Experts) - c.moeExtraParams(0)
}

// ActiveParams is the parameters one token's forward uses: NumParams with
// top_k of each MoE block's experts instead of all of them (the router
// counted); equal to NumParams for a dense model.
func (c GPTConfig) ActiveParams() int64 {
	return c.NumParams() - c.moeExtraParams(c.MoE.Experts) + c.moeExtraParams(c.MoE.TopK)
}
