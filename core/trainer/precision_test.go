package trainer_test

import (
	"context"
	"math"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/ckpt"
	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/tensor/cpu"
	"github.com/tinyacc/tinyacc/core/trainer"
	"github.com/tinyacc/tinyacc/plugins/ptest"
)

func runSteps(t *testing.T, cfg config.Config) (*trainer.Trainer, []trainer.StepMetrics) {
	t.Helper()
	var steps []trainer.StepMetrics
	tr, err := trainer.New(cfg, trainer.Options{Train: ptest.Corpus(), OnStep: func(m trainer.StepMetrics) { steps = append(steps, m) }})
	require.NoError(t, err)
	_, err = tr.Run(context.Background())
	require.NoError(t, err)
	return tr, steps
}

func losses(steps []trainer.StepMetrics) []float64 {
	out := make([]float64, len(steps))
	for i, m := range steps {
		out[i] = m.Loss
	}
	return out
}

// bf16 and fp16 training follows float32's: 40 steps of the small model end
// within 2% of float32's loss, by a different path (the losses differ, so
// the half-precision products ran). fp16 reports its loss scale, bf16 none.
func TestMixedPrecisionFollowsFloat32(t *testing.T) {
	for _, arch := range []string{"gpt2", "llama"} {
		cfg := ptest.Config()
		cfg.Train.Steps = 40
		cfg.Model.Arch = arch
		_, f32 := runSteps(t, cfg)
		for _, mp := range []string{"bf16", "fp16"} {
			c := cfg
			c.Train.MixedPrecision = mp
			_, half := runSteps(t, c)
			last, want := half[len(half)-1].Loss, f32[len(f32)-1].Loss
			require.InDelta(t, want, last, 0.02*want, "%s %s final loss against float32's", arch, mp)
			require.NotEqual(t, losses(f32), losses(half), "%s %s: the losses equal float32's bitwise", arch, mp)
			for _, m := range half {
				require.False(t, m.Skipped, "%s %s step %d", arch, mp, m.Step)
				if mp == "fp16" {
					require.Positive(t, m.LossScale, "fp16 step %d", m.Step)
				} else {
					require.Zero(t, m.LossScale)
				}
			}
		}
	}
}

// A mixed-precision checkpoint holds the float32 masters and fp16's loss
// scale; resuming it continues bitwise, loss scale included, and a run in
// another precision is refused, naming the key.
func TestMixedPrecisionResumeBitwise(t *testing.T) {
	for _, mp := range []string{"bf16", "fp16"} {
		cfg := ptest.Config()
		cfg.Train.Steps, cfg.Train.MixedPrecision, cfg.Train.LossScaleWindow = 4, mp, 1
		cfg.Checkpoint.Dir, cfg.Checkpoint.Every = t.TempDir(), 2
		whole, wholeSteps := runSteps(t, cfg)

		dir := filepath.Join(cfg.Checkpoint.Dir, ckpt.StepDir(2))
		ix, err := ckpt.ReadIndex(dir)
		require.NoError(t, err)
		for name, ti := range ix.Tensors {
			require.Equal(t, "float32", ti.DType, "%s %s: the checkpoint keeps the masters", mp, name)
		}
		if mp == "fp16" {
			require.Equal(t, wholeSteps[1].LossScale, ix.Trainer.LossScale)
			require.Equal(t, 4*float64(config.DynamicLossScaleStart), ix.Trainer.LossScale, "window 1 doubles after each of the 2 steps")
		}

		res := cfg
		res.Resume, res.Checkpoint.Dir = dir, t.TempDir()
		resumed, resSteps := runSteps(t, res)
		require.Len(t, resSteps, 2)
		for i, m := range resSteps {
			require.Equal(t, wholeSteps[2+i].Loss, m.Loss, "%s step %d", mp, m.Step)
			require.Equal(t, wholeSteps[2+i].LossScale, m.LossScale, "%s step %d", mp, m.Step)
		}
		for _, p := range whole.Model.Params() {
			require.Equal(t, p.F32(), resumed.Model.Param(p.Name).F32(), "%s %s", mp, p.Name)
		}

		other := res
		other.Train.MixedPrecision = "no"
		tr, err := trainer.New(other, trainer.Options{Train: ptest.Corpus()})
		require.NoError(t, err)
		_, err = tr.Run(context.Background())
		require.EqualError(t, err, `resume: the checkpoint cannot continue this run: train.mixed_precision is "no" here but "`+mp+`" in the checkpoint`)
	}
}

// nanLossAt reports a NaN loss at one step, as a loss reducer that met a
// non-finite loss would.
type nanLossAt struct{ step, at int }

func (p *nanLossAt) Name() string { return "nan-loss" }

func (p *nanLossAt) ReduceLoss(t *trainer.Trainer, loss float64) (float64, error) {
	p.at++
	if p.at == p.step {
		return math.NaN(), nil
	}
	return loss, nil
}

// A non-finite loss still stops an fp16 run (train.nonfinite=stop): loss
// scaling skips the steps whose gradients overflow, never a loss that is
// itself NaN or infinite.
func TestFP16NonFiniteLossStops(t *testing.T) {
	cfg := ptest.Config()
	cfg.Train.MixedPrecision = "fp16"
	tr, err := trainer.New(cfg, trainer.Options{Train: ptest.Corpus(), Plugins: []trainer.Plugin{&nanLossAt{step: 2}}})
	require.NoError(t, err)
	_, err = tr.Run(context.Background())
	require.ErrorContains(t, err, "step 2: trainer: non-finite loss (NaN)")
}

// A bf16 run's checkpoint exports in the dtype asked for: --dtype fp32
// writes the masters (F32, the file save_to writes), --dtype bf16 each
// master rounded to nearest even (BF16, 2 bytes per element). init_from
// accepts either: the fp32 export gives back every master bitwise, the
// bf16 export the rounded numbers, widened exactly.
func TestExportDTypeInitFromRoundTrip(t *testing.T) {
	cfg := ptest.Config()
	cfg.Train.Steps, cfg.Train.MixedPrecision = 2, "bf16"
	cfg.Checkpoint.Dir = t.TempDir()
	tr, _ := runSteps(t, cfg)
	dir := filepath.Join(cfg.Checkpoint.Dir, ckpt.StepDir(2))
	for _, dt := range []string{"fp32", "bf16"} {
		out := filepath.Join(t.TempDir(), dt+".safetensors")
		require.NoError(t, trainer.ExportCheckpointAs(dir, out, dt))
		ts, _, err := ckpt.Inspect(out)
		require.NoError(t, err)
		for name, e := range ts {
			require.Equal(t, map[string]string{"fp32": "F32", "bf16": "BF16"}[dt], e.DType, "%s %s", dt, name)
		}
		back := cfg
		back.InitFrom, back.Checkpoint.Dir, back.Train.MixedPrecision = out, "", "no"
		m, err := trainer.BuildModel(back, nil)
		require.NoError(t, err)
		for _, p := range tr.Model.Params() {
			want := append([]float32(nil), p.F32()...)
			if dt == "bf16" {
				cpu.RoundBF16(want)
			}
			require.Equal(t, want, m.Param(p.Name).F32(), "%s: %s after export and init_from", dt, p.Name)
		}
	}
	require.EqualError(t, trainer.ExportCheckpointAs(dir, filepath.Join(t.TempDir(), "x.safetensors"), "fp16"), `export: --dtype "fp16": use fp32 or bf16`)
}
