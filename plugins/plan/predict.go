// Package plan chooses a layout for a model and a machine: it enumerates
// the layouts of N ranks (plugins.PlanDims), keeps those whose memory
// estimate fits, and predicts each one's step time from a profile of the
// machine (Profile, measured by `tinyacc plan calibrate`).
package plan

import (
	"fmt"
	"math"
	"sort"

	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/nn"
	"github.com/tinyacc/tinyacc/core/trainer"
	"github.com/tinyacc/tinyacc/plugins/pp"
)

// Prediction is a layout's predicted optimizer step: its length and how
// it divides into compute, exposed communication and pipeline bubble
// (seconds; the three add up to Step).
type Prediction struct {
	Step    float64 `json:"step_s"`
	Compute float64 `json:"compute_s"`
	Comm    float64 `json:"exposed_comm_s"`
	Bubble  float64 `json:"bubble_s"`
	// Naive is the step as the naive sum: every rank's compute and
	// communication plus the bubble formula's share of the compute
	// (pp.Formula), no schedule played. Kept beside Step to show what
	// playing the schedule changes.
	Naive float64 `json:"naive_step_s"`
}

// Predict is the step time of cfg's layout on world ranks of the machine
// p describes. It is a pure function of its arguments. The model:
//
// Compute. Every rank runs its share of each micro-batch (batch_size
// sequences, block_size/cp tokens each): per block the forward FLOPs
// per token of pp.BlockFLOPs, the head's pp.HeadFLOPs on the last
// chunk, both divided by tp; backward twice the forward; full
// recomputation one more forward of its blocks. FLOPs run at the
// profile's matrix-product rate for the product's class (the cube root
// of rows × n_embd × n_embd/tp), with cores/world of the machine's cores
// each (the ranks share them). Element-wise kernels move, per block, the
// activation widths of nn.GPTConfig.ActWidths (forward once, backward
// twice, selective recomputation a third more; the logits on the last
// chunk) at the profile's kernel rate;
// the optimizer reads and writes 32 bytes per parameter it updates, at
// the profile's optimizer rate (its own loop, timed by calibrate). The
// rates are scaled by the profile's efficiency for world ranks (what a
// measured step of a reference model achieved of them with that many
// processes at once).
//
// Every collective of a group inside the world takes at least the busy
// latency measured with world ranks (Profile.collectiveIn): a member
// waits for the scheduler to give it a core back, and that depends on
// how many ranks compete for the cores, not on the group.
//
// Communication inside a micro-batch (innerComm). Tensor parallel's
// all-reduces (or, with sequence parallel, all-gathers and
// reduce-scatters) of one activation, two per block forward and two
// backward, the embedding's and the head's, and the cross-entropy's two
// small ones, cannot overlap: they add to the chunk's forward and
// backward. Context parallel's ring passes cp-1 key/value blocks per
// block forward and 2cp-1 backward, of which the profile's overlap share
// hides behind the attention; its all-gather variant hides nothing.
// Pipeline messages (one activation per micro-batch and chunk) are the
// latency of the pipeline's play.
//
// Those collectives wait longer while other pipeline stages compute
// (Profile.contendedIn): the other stages' ranks do not wait in step
// with this group, so a member that waits for its peer gets a core back
// only when one of them gives its own up, at their next collective (on
// average half their compute between two) or when the scheduler preempts
// them (the contended latency calibrate measures: a pair's all-reduce
// while the other ranks multiply matrices). Data-parallel peers run the
// same collectives at the same points, as calibrate's busy latency does,
// and without a pipeline nothing else computes; a stage computing alone
// pays the busy latency.
//
// Split backward (zb1). B keeps backward's input gradients, element-wise
// kernels and collectives; W the weight-gradient half of the matrix
// products' backward FLOPs (pp.BlockProductFLOPs, and the head's), and
// it reads each product's input and output gradient once more from
// memory (pp.BlockProductWidths, at the kernel rate), where the fused
// backward has them in cache from the input gradient's product just
// before. On a machine whose cores the stages share, filling the bubble
// with W gains little (a waiting stage lends its cores anyway), so with
// one micro-batch zb1 is 1F1B plus that second read.
//
// Expert parallel's exchanges (expertExchange) add to the forward and
// backward of every mixture-of-experts block: all-to-alls of the rank's
// routed rows priced at the profile's all-to-all over ep ranks. Under
// tensor parallel each of the block's experts all-reduces its own rows
// in place of the dense MLP's one all-reduce (expertsUnderTP).
//
// Bubble. The schedule (pp.Generate) is played by the pipeline
// simulator with these per-chunk costs, the stages sharing the cores
// (pp.SimulateShared): while k of the pp stages compute, the costs are
// those of k·(world/pp) ranks computing at once, with cores/(k·world/pp)
// cores each, so a stage waiting in the bubble lends its cores to those
// that compute. The rates keep the efficiency of the whole world (the
// waiting ranks' processes, threads and memory stay on the machine; a
// measured pipeline of one micro-batch, where half the ranks wait at any
// time, is not faster than data parallel). The play's makespan is the
// pipelined part of the step, and the bubble is the makespan less the
// busiest rank's time on its actions. Without a pipeline the same play
// is one rank running its micro-batches one after the other.
//
// After the micro-batches. The gradients of the rank's parameters
// (Ψ/(tp·pp)) are averaged over the dp × cp group: an all-reduce (ZeRO
// 0, bucketed: the profile's overlap share of it, at most one micro-
// batch's backward, hides behind backward), a reduce-scatter and an
// all-gather (ZeRO 1, nothing hidden; ZeRO 2, the reduce-scatter hidden
// as DDP's), and ZeRO 3's all-gathers of the parameters before every
// forward and backward (hidden by the overlap share). The loss and the
// gradient norm are two small all-reduces over the world; a pipeline
// sums the tied embedding's gradient over its first and last stage.
// Under expert parallel the experts are not among those parameters: a
// rank holds experts/ep of each block's experts and all-reduces their
// gradients over the dp·cp/ep ranks that hold the same ones (hidden as
// DDP's buckets are), and updates them itself.
//
// Step = makespan + exposed gradient communication + optimizer + the
// small all-reduces. What it leaves out: memory bandwidth shared between
// ranks, and the load of other programs.
func Predict(cfg config.Config, world int, p *Profile) (Prediction, error) {
	var out Prediction
	m := trainer.GPTConfig(cfg)
	par := cfg.Parallel
	tp, ppN, cp := max(1, par.TP), max(1, par.PP), max(1, par.CP)
	dp := world / (tp * ppN * cp)
	if dp < 1 || dp*tp*ppN*cp != world {
		return out, fmt.Errorf("plan: tp=%d × pp=%d × cp=%d does not divide %d ranks", tp, ppN, cp, world)
	}
	v, sched := 1, pp.OneFOneB
	if ppN > 1 {
		v, sched = max(1, cfg.PP.VirtualStages), cfg.PP.Schedule
	}
	M := cfg.Train.GradAccum
	s, err := pp.Generate(sched, ppN, v, M)
	if err != nil {
		return out, err
	}
	split, err := cfg.PPLayers()
	if err != nil {
		return out, err
	}
	if split == nil {
		if split, err = pp.Balance(m, ppN*v); err != nil {
			return out, err
		}
	}
	backend := cfg.Comm.Backend
	coll := func(op string, n int, bytes float64) float64 { return p.collectiveIn(backend, op, n, world, bytes) }
	rows := float64(cfg.Train.BatchSize*m.BlockSize) / float64(cp) // tokens of one micro-batch on one rank
	C, V := float64(m.NEmbd), float64(m.VocabSize)
	whole, splitW := m.ActWidths()
	actBytes := 4 * rows * (float64(whole) + float64(splitW)/float64(tp)) // one block's activations
	logitBytes := 4 * rows * 3 * V / float64(tp)
	bf, hf := pp.BlockFLOPs(m), pp.HeadFLOPs(m)
	// A split backward's weight-gradient pass (W): the weight-gradient
	// halves of the matrix products' backward FLOPs, and the bytes of
	// the products' inputs and output gradients it reads again.
	wWhole, wSplit := pp.BlockProductWidths(m)
	wfl := rows * pp.BlockProductFLOPs(m) / float64(tp)
	wBytes := 4 * rows * (wWhole + wSplit/float64(tp))
	ov := min(1, max(0, p.Overlap))

	// The efficiency of the world, whichever ranks compute (see Bubble).
	eff := p.efficiency(world)
	// rates are the products' and kernels' rates and a block's fixed cost
	// while n ranks compute at once and share the machine's cores
	// (cores/n each). The fixed cost runs on one core; ranks beyond the
	// cores share them.
	rates := func(n int) (mmRate, elRate, over float64) {
		share := float64(p.Host.Cores) / float64(n)
		mmRate = eff * p.matmulRate(math.Cbrt(rows*C*C/float64(tp)), share)
		elRate = eff * scaled(p.Elementwise.One, p.Elementwise.All, share)
		return mmRate, elRate, p.BlockOverhead * max(1, float64(n)/float64(p.Host.Cores))
	}

	// Per block and micro-batch: the communication inside it (inner),
	// priced once with the other pipeline stages waiting and once with
	// them computing (contended: see Predict's doc). Those stages wait
	// for their own collectives between their compute, a block's forward
	// and backward cut into as many pieces as the block has collectives;
	// on average a waiting member of this group gets its core back half
	// a piece later, or after the profile's contended latency if sooner.
	calm := innerComm(cfg, rows, tp, cp, ov, coll)
	mmW, elW, overW := rates(world)
	wake := 3*rows*bf/float64(tp)/mmW + 3*actBytes/elW + overW
	if waits := waitsPerBlock(cfg, tp, cp); waits > 0 {
		wake /= 2 * float64(waits)
	}
	busyOthers := innerComm(cfg, rows, tp, cp, ov, func(op string, n int, bytes float64) float64 {
		return p.contendedIn(backend, op, n, world, bytes, wake)
	})
	epF, epB := expertExchange(cfg, coll, rows)
	xF, xB := expertsUnderTP(cfg, coll, rows)
	epF, epB = epF+xF, epB+xB
	last := len(split) - 1
	// Per chunk and micro-batch, forward + backward: the communication
	// while only the chunk's stage computes, and while every stage does.
	commAlone, commAll := make([]float64, len(split)), make([]float64, len(split))
	per := world / ppN // the ranks of a stage
	// costsWith are the chunks' costs while n ranks compute at once.
	costsWith := func(n int) []pp.Costs {
		mmRate, elRate, over := rates(n)
		in := calm
		if n > per {
			in = busyOthers
		}
		costs := make([]pp.Costs, len(split))
		for c, nb := range split {
			L := float64(nb)
			moe := float64(moeBlocks(m, split, c))
			fl := rows * L * bf / float64(tp)
			el := L * actBytes
			if c == last {
				fl += rows * hf / float64(tp)
				el += logitBytes
			}
			blocks := L
			if c == last {
				blocks++ // the head and the loss
			}
			inF := L*(in.tpF+in.cpF) + moe*epF // communication inside a forward
			inB := L*(in.tpB+in.cpB) + moe*epB
			if c == 0 {
				inF, inB = inF+in.embF, inB+in.embB
			}
			if c == last {
				inF, inB = inF+in.headF, inB+in.headB
			}
			f := fl/mmRate + el/elRate + blocks*over/3
			back := 2*fl/mmRate + 2*el/elRate + inB + 2*blocks*over/3
			if cfg.Recompute.Granularity == "selective" {
				back += L * actBytes / 3 / elRate
			}
			comm := inF + inB
			if k := trainer.RecomputedBlocks(cfg, nb); k > 0 {
				back += float64(k) * (rows*bf/float64(tp)/mmRate + actBytes/elRate + in.tpF + in.cpF)
				comm += float64(k) * (in.tpF + in.cpF)
				if moe > 0 { // the recomputed blocks' share of the exchanges
					back += moe * float64(k) / L * epF
					comm += moe * float64(k) / L * epF
				}
			}
			if n == per {
				commAlone[c] = comm
			}
			if n == world {
				commAll[c] = comm
			}
			costs[c] = pp.Costs{F: f + inF, B: back, W: 0}
			if s.Split {
				// W computes the weight gradients of the chunk's
				// products (and the head's), after B, which keeps the
				// rest of backward: the input gradients, the element-
				// wise kernels, the collectives. W reads each
				// product's input and output gradient once more from
				// memory (the fused backward has them in cache from the
				// input gradient's product just before), at the kernel
				// rate.
				wf, wb := L*wfl, L*wBytes
				if c == last {
					wf += rows * hf / float64(tp)
					wb += 4 * rows * (C + V/float64(tp))
				}
				costs[c].B, costs[c].W = back-wf/mmRate, wf/mmRate+wb/elRate
			}
			if ppN > 1 {
				costs[c].L = coll("broadcast", 2, 4*rows*C)
			}
		}
		return costs
	}
	// A pipeline's stages compute at once only where the schedule says:
	// the stages that wait in the bubble leave their cores to the others
	// (pp.SimulateShared). Every one of the world/pp ranks of a stage
	// (its dp, tp and cp peers) computes when the stage does.
	byBusy := make([][]pp.Costs, ppN+1)
	for k := 1; k <= ppN; k++ {
		byBusy[k] = costsWith(k * per)
	}
	all := byBusy[ppN]
	sim, err := s.SimulateShared(func(c, busy int) pp.Costs { return byBusy[busy][c] })
	if err != nil {
		return out, err
	}
	// The busiest rank's work with every rank computing: the naive sum's
	// measure.
	busy, busiest := 0.0, 0
	for r := range ppN {
		b := 0.0
		for c := r; c < len(split); c += ppN {
			b += float64(M) * (all[c].F + all[c].B + all[c].W)
		}
		if b > busy {
			busy, busiest = b, r
		}
	}
	// What that rank spends on its actions in the shared play (faster
	// where other stages waited), and of that its communication: as
	// contended as the share of its time other stages computed too.
	played := 0.0
	for _, sp := range sim.Spans[busiest] {
		played += sp.End - sp.Start
	}
	together := sharedShare(sim.Spans, busiest)
	busyComm := 0.0
	for c := busiest; c < len(split); c += ppN {
		busyComm += float64(M) * ((1-together)*commAlone[c] + together*commAll[c])
	}
	optRate := eff * p.optimizerRate(float64(p.Host.Cores)/float64(world))

	// After the micro-batches. A rank holds its share of the parameters,
	// Ψ/(tp·pp); under expert parallel the experts are not among them:
	// it holds experts/ep of each mixture-of-experts block's experts
	// (psiExp) and reduces their gradients itself (below).
	psi := float64(m.NumParams()) / float64(tp*ppN)
	var psiExp float64
	if par.EP > 1 {
		x := float64(m.ExpertParams())
		psi -= x / float64(tp*ppN)
		psiExp = x / float64(par.EP*ppN)
	}
	grads := 4 * psi
	g := dp * cp
	lastBackward := played / float64(M) * 2 / 3
	var gradComm float64
	switch cfg.Zero.Stage {
	case 0:
		t := coll("all_reduce", g, grads)
		if cfg.DDP.Mode == "bucketed" {
			t -= min(ov*t, lastBackward)
		}
		gradComm = t
	case 1:
		gradComm = coll("reduce_scatter", g, grads) + coll("all_gather", g, grads)
	case 2:
		rs := coll("reduce_scatter", g, grads)
		gradComm = rs - min(ov*rs, lastBackward) + coll("all_gather", g, grads)
	default:
		rs := coll("reduce_scatter", g, grads)
		ag := float64(2*M) * coll("all_gather", g, grads)
		gradComm = (1 - ov) * (rs + ag)
	}
	if g < 2 {
		gradComm = 0
	}
	// An expert's gradient is all-reduced over the g/ep ranks that hold
	// it as soon as it is final (under every ZeRO stage, which leaves
	// experts whole), hidden behind backward as DDP's buckets are.
	if r := g / max(1, par.EP); psiExp > 0 && r > 1 {
		t := coll("all_reduce", r, 4*psiExp)
		if cfg.DDP.Mode == "bucketed" {
			t -= min(ov*t, lastBackward)
		}
		gradComm += t
	}
	updated := psi
	if cfg.Zero.Stage > 0 && g > 1 {
		updated /= float64(g)
	}
	updated += psiExp
	optim := 32 * updated / optRate
	small := 2 * coll("all_reduce", world, 16)
	if ppN > 1 {
		small += coll("all_reduce", 2, 4*V*C)
	}

	out.Step = sim.Makespan + gradComm + optim + small
	out.Compute = played - busyComm + optim
	out.Comm = busyComm + gradComm + small
	out.Bubble = sim.Makespan - played
	formula, _ := pp.Formula(sched, ppN, v, M)
	if ppN == 1 {
		formula = 0
	}
	out.Naive = busy*(1+formula) + gradComm + optim + small
	return out, nil
}

// inner is the communication inside one micro-batch's chunk on one
// rank (seconds): tensor and context parallel's per block, forward and
// backward, and tensor parallel's at the model's ends: the embedding's
// on the first chunk, the head's and the cross-entropy's on the last.
type inner struct {
	tpF, tpB, cpF, cpB       float64
	embF, embB, headF, headB float64
}

// innerComm prices inner with coll, for micro-batches of rows tokens a
// rank. Tensor parallel: two all-reduces of one activation per block
// forward and two backward (under sequence parallel an all-gather and a
// reduce-scatter each); the embedding's sum over the group forward
// (sequence parallel: a reduce-scatter, and its gradient's all-gather);
// the head's input gradient backward (sequence parallel: the hidden
// state's all-gather forward, its gradient's reduce-scatter); the
// cross-entropy's row maximum (a float a token) and sums (two) forward.
// Context parallel: the ring passes cp-1 key/value blocks forward and
// 2cp-1 backward, of which the overlap share ov hides behind attention;
// the all-gather variant hides nothing.
func innerComm(cfg config.Config, rows float64, tp, cp int, ov float64, coll func(op string, n int, bytes float64) float64) inner {
	var in inner
	C := float64(cfg.Model.NEmbd)
	if tp > 1 {
		one := 4 * rows * C
		if cfg.TP.SequenceParallel {
			ag, rs := coll("all_gather", tp, one), coll("reduce_scatter", tp, one)
			in.tpF, in.tpB = 2*(ag+rs), 2*(ag+rs)
			in.embF, in.embB, in.headF, in.headB = rs, ag, ag, rs
		} else {
			ar := coll("all_reduce", tp, one)
			in.tpF, in.tpB = 2*ar, 2*ar
			in.embF, in.headB = ar, ar
		}
		in.headF += coll("all_reduce", tp, 4*rows) + coll("all_reduce", tp, 8*rows)
	}
	if cp > 1 {
		blk := 2 * 4 * rows * C // one rank's keys and values
		if cfg.CP.Attention == "allgather" {
			c := coll("all_gather", cp, blk*float64(cp)) + coll("reduce_scatter", cp, blk*float64(cp))
			in.cpF, in.cpB = c, c
		} else {
			msg := coll("broadcast", 2, blk)
			in.cpF, in.cpB = (1-ov)*float64(cp-1)*msg, (1-ov)*float64(2*cp-1)*msg
		}
	}
	return in
}

// sharedShare is the share of rank r's time on its actions in the play
// during which another rank computed too (0 for a rank without any).
func sharedShare(spans [][]pp.Span, r int) float64 {
	mine, both := 0.0, 0.0
	for _, a := range spans[r] {
		mine += a.End - a.Start
		// The union of the other ranks' spans inside a.
		var cuts [][2]float64
		for q := range spans {
			if q == r {
				continue
			}
			for _, b := range spans[q] {
				if lo, hi := max(a.Start, b.Start), min(a.End, b.End); hi > lo {
					cuts = append(cuts, [2]float64{lo, hi})
				}
			}
		}
		sort.Slice(cuts, func(i, j int) bool { return cuts[i][0] < cuts[j][0] })
		end := a.Start
		for _, c := range cuts {
			if c[1] > end {
				both += c[1] - max(c[0], end)
				end = c[1]
			}
		}
	}
	if mine == 0 {
		return 0
	}
	return both / mine
}

// waitsPerBlock is how many collectives a block's forward and backward
// wait for on one micro-batch: tensor parallel's four (eight under
// sequence parallel), context parallel's ring messages (3cp-2, or two
// collectives with the all-gather variant).
func waitsPerBlock(cfg config.Config, tp, cp int) int {
	n := 0
	if tp > 1 {
		n += 4
		if cfg.TP.SequenceParallel {
			n += 4
		}
	}
	if cp > 1 {
		if cfg.CP.Attention == "allgather" {
			n += 4
		} else {
			n += 3*cp - 2
		}
	}
	return n
}

// moeBlocks is how many of chunk c's blocks (split: blocks per chunk, in
// order) are mixtures of experts.
func moeBlocks(m nn.GPTConfig, split []int, c int) int {
	first := 0
	for _, nb := range split[:c] {
		first += nb
	}
	n := 0
	for i := first; i < first+split[c]; i++ {
		if m.MoE.IsMoE(i) {
			n++
		}
	}
	return n
}

// expertExchange is what expert parallel's exchanges cost one rank per
// mixture-of-experts block and micro-batch of rows tokens, forward and
// backward (seconds; they cannot overlap: the experts wait for their
// rows, the next layer for the outputs). Every token goes to top_k
// experts, spread evenly over the ep ranks (the aux loss's aim), so each
// rank sends rows·top_k·n_embd floats in one all-to-all, (ep-1)/ep of
// them away. ep.dispatch alltoall: forward, the experts' counts (float64
// per expert) then the rows out and the outputs back; backward, the two
// row exchanges reversed. ep.dispatch allgather (the naive form):
// forward, all-gathers of every rank's rows, routing weights and expert
// choices (float64) and a reduce-scatter of the outputs; backward, a
// reduce-scatter of the rows' and weights' gradients and an all-gather
// of the outputs'.
func expertExchange(cfg config.Config, coll func(op string, n int, bytes float64) float64, rows float64) (fwd, bwd float64) {
	ep, mc := cfg.Parallel.EP, cfg.Model.MoE
	if ep < 2 || mc.Experts == 0 {
		return 0, 0
	}
	C, k, n := float64(cfg.Model.NEmbd), float64(mc.TopK), float64(ep)
	if cfg.EP.Dispatch == "allgather" {
		h, w, ch := 4*n*rows*C, 4*n*rows*k, 8*n*rows*k
		fwd = coll("all_gather", ep, h) + coll("all_gather", ep, w) +
			coll("all_gather", ep, ch) + coll("reduce_scatter", ep, h)
		bwd = coll("reduce_scatter", ep, h) + coll("reduce_scatter", ep, w) +
			coll("all_gather", ep, h)
		return fwd, bwd
	}
	x := coll("all_to_all", ep, 4*rows*k*C)
	return coll("all_to_all", ep, 8*float64(mc.Experts)) + 2*x, 2 * x
}

// expertsUnderTP is what tensor parallel's all-reduces of a
// mixture-of-experts block cost beyond a dense block's (counted with
// every block), per micro-batch of rows tokens on one rank, forward and
// backward (seconds). Each expert is split like the dense MLP (c_fc by
// columns, c_proj by rows), so each of the rank's experts/ep experts
// all-reduces its output rows over the tp group forward and its input's
// gradient backward, one all-reduce each, on no rows when no token chose
// it; the rows·top_k routed rows (4·n_embd bytes each) spread evenly over
// them. They replace the dense MLP's one all-reduce of rows·n_embd floats
// per direction.
func expertsUnderTP(cfg config.Config, coll func(op string, n int, bytes float64) float64, rows float64) (fwd, bwd float64) {
	tp, mc := cfg.Parallel.TP, cfg.Model.MoE
	if tp < 2 || mc.Experts == 0 {
		return 0, 0
	}
	C, k := float64(cfg.Model.NEmbd), float64(mc.TopK)
	local := float64(mc.Experts / max(1, cfg.Parallel.EP))
	x := local*coll("all_reduce", tp, 4*rows*k*C/local) - coll("all_reduce", tp, 4*rows*C)
	return x, x
}
