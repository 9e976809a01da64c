package trainer

import (
	"fmt"
	"math"
	"sort"

	"github.com/tinyacc/tinyacc/core/tensor"
)

// The non-finite guard. A NaN or an infinity in the loss or the gradient
// norm poisons every weight the optimizer touches, and from then on every
// step and every saved file is worthless. train.nonfinite says what to do
// when it happens: "stop" ends the run with an error naming the step, what
// was non-finite and the first parameter with a non-finite gradient, so
// nothing is saved; "skip" drops that step's update on every rank and goes
// on, up to train.nonfinite_max_skips steps in a row.
//
// The decision needs no communication: the loss is already averaged over
// ranks and the norm is the global one, so every rank sees the same values
// and takes the same branch.

// nonfiniteState counts the steps skipped in a row.
type nonfiniteState struct {
	inRow int
}

// checkFinite decides whether step (counted from 0; named from 1 in
// messages, as the progress line does) may apply its update. It returns
// skip = true when the step's update must be dropped, and an error when the
// run must stop.
func (t *Trainer) checkFinite(step int, loss, norm float64) (skip bool, err error) {
	if isFinite(loss) && isFinite(norm) {
		t.nonfinite.inRow = 0
		return false, nil
	}
	what := describeNonFinite(loss, norm)
	if t.Cfg.Train.NonFinite == "skip" {
		t.nonfinite.inRow++
		if t.nonfinite.inRow <= t.Cfg.Train.NonFiniteMaxSkips {
			return true, nil
		}
		return true, fmt.Errorf("trainer: step %d: %s, %d steps in a row (train.nonfinite_max_skips=%d); %s; lower train.lr or set train.grad_clip",
			step+1, what, t.nonfinite.inRow, t.Cfg.Train.NonFiniteMaxSkips, t.firstNonFiniteGrad())
	}
	return true, fmt.Errorf("trainer: step %d: %s; %s; stopped before the update (train.nonfinite=stop): lower train.lr, set train.grad_clip, or set train.nonfinite=skip",
		step+1, what, t.firstNonFiniteGrad())
}

func isFinite(x float64) bool { return !math.IsNaN(x) && !math.IsInf(x, 0) }

func describeNonFinite(loss, norm float64) string {
	switch {
	case !isFinite(loss) && !isFinite(norm):
		return fmt.Sprintf("non-finite loss (%v) and gradient norm (%v)", loss, norm)
	case !isFinite(loss):
		return fmt.Sprintf("non-finite loss (%v)", loss)
	}
	return fmt.Sprintf("non-finite gradient norm (%v)", norm)
}

// firstNonFiniteGrad names the first parameter, in the optimizer's order,
// whose gradient on this rank holds a NaN or an infinity. Gradients are
// already reduced when the guard runs, so with replicated parameters every
// rank names the same one; a sharding plugin may leave the culprit on
// another rank, which the message says.
func (t *Trainer) firstNonFiniteGrad() string {
	params := t.Model.Params()
	if t.Opt != nil {
		params = t.Opt.Params()
	}
	for _, p := range params {
		if p.Grad == nil || !p.Grad.HasStorage() {
			continue
		}
		if i, ok := firstNonFinite(p.Grad); ok {
			return fmt.Sprintf("first non-finite gradient: %s (element %d = %v)", p.Name, i, p.Grad.At(i))
		}
	}
	return fmt.Sprintf("no gradient held by rank %d is non-finite", t.Rank)
}

// firstNonFinite returns the index of the first NaN or infinity in x.
func firstNonFinite(x *tensor.Tensor) (int, bool) {
	switch x.DType() {
	case tensor.Float32:
		for i, v := range x.F32() {
			if v != v || v > math.MaxFloat32 || v < -math.MaxFloat32 {
				return i, true
			}
		}
	case tensor.Float64:
		for i, v := range x.F64() {
			if !isFinite(v) {
				return i, true
			}
		}
	}
	return 0, false
}

// CheckFinite refuses tensors holding a NaN or an infinity, naming the
// first such tensor in sorted name order; what says which file it is for.
// Every writer of weights or optimizer state calls it before writing.
func CheckFinite(what string, ts map[string]*tensor.Tensor) error {
	names := make([]string, 0, len(ts))
	for name := range ts {
		names = append(names, name)
	}
	sort.Strings(names)
	return checkFiniteTensors(what, names, ts)
}

// checkFiniteTensors refuses a set of tensors holding a NaN or an
// infinity, naming the first such tensor; what says which file it is.
func checkFiniteTensors(what string, names []string, ts map[string]*tensor.Tensor) error {
	for _, name := range names {
		if i, ok := firstNonFinite(ts[name]); ok {
			return fmt.Errorf("%s: tensor %s holds a non-finite value (element %d = %v)", what, name, i, ts[name].At(i))
		}
	}
	return nil
}
