package tp

import (
	"strings"

	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/nn"
	"github.com/tinyacc/tinyacc/core/trainer"
)

// Estimator is tensor parallel's term of the memory estimate
// (trainer.MemoryEstimator and trainer.ParamLocalizer) for a TP group of
// N ranks: each rank's part of the parameters, as Prepare cuts them, and
// the activations of one micro-batch with the head- and MLP-internal
// buffers divided by N.
type Estimator struct{ N int }

// LocalParams implements trainer.ParamLocalizer: the part of each
// parameter TP rank r of n holds, as Prepare cuts them: c_attn and
// mlp.c_fc by columns (heads, for c_attn), their biases alike;
// attn.c_proj and mlp.c_proj by rows, their biases whole; the tied wte by
// rows of the vocabulary (VocabRange); wpe and the LayerNorms whole.
func (e Estimator) LocalParams(in trainer.EstimateInput, ps []nn.ParamShape) []nn.ParamShape {
	n, r := e.N, in.Rank%e.N // TP is the innermost mesh dimension
	out := make([]nn.ParamShape, len(ps))
	for i, p := range ps {
		shape := append([]int(nil), p.Shape...)
		switch name := p.Name; {
		case nn.IsAdapter(name):
			// LoRA: B as a column-parallel base's output rows, A as a
			// row-parallel base's input columns (lora.go).
			row := strings.Contains(name, "c_proj.") || strings.Contains(name, "o_proj.") || strings.Contains(name, "down_proj.")
			if row && strings.HasSuffix(name, ".lora_A.weight") {
				shape[1] /= n
			} else if !row && strings.HasSuffix(name, ".lora_B.weight") {
				shape[0] /= n
			}
		case name == "wte.weight", name == nn.LlamaEmbedName, name == nn.LlamaHeadName:
			lo, hi := VocabRange(shape[0], n, r)
			shape[0] = hi - lo
		case strings.HasSuffix(name, "_proj.weight") && strings.HasPrefix(name, "model.layers."):
			// A Llama's [out, in] matrices: q, k, v, gate and up by rows
			// (heads, key/value heads, SwiGLU columns), o and down by
			// columns.
			if strings.HasSuffix(name, "o_proj.weight") || strings.HasSuffix(name, "down_proj.weight") {
				shape[1] /= n
			} else {
				shape[0] /= n
			}
		case strings.HasSuffix(name, "attn.c_attn.weight"), strings.HasSuffix(name, "c_fc.weight"),
			strings.HasSuffix(name, "attn.c_attn.bias"), strings.HasSuffix(name, "c_fc.bias"):
			shape[len(shape)-1] /= n
		case strings.HasSuffix(name, "c_proj.weight"):
			shape[0] /= n
		}
		out[i] = nn.ParamShape{Name: p.Name, Shape: shape}
	}
	return out
}

// ActivationBytes is trainer.ActivationBytes under tensor parallel over n
// ranks. Of a block's saved 18·B·T·C, the buffers as wide as the model
// (the LayerNorms' inputs and outputs, the residual stream, the
// row-parallel outputs after their all-reduce: 6·B·T·C) stay whole; the
// others (q|k|v, the attention output, the MLP's 4C-wide hidden layer
// before and after GELU: 12·B·T·C) are divided by n, as are the
// attention's log-sum-exp (H/n heads), the backward's MLP gradient and
// the logits (V/n columns). Under sequence parallel the residual stream
// (the block's input, output and middle residual) and the embeddings
// hold 1/n of the sequence; the column layers' gathered inputs are whole
// and saved for backward. Selective recomputation's norm drops the
// LayerNorms' outputs, 1/n of the sequence each under sequence parallel.
func ActivationBytes(cfg config.Config, m nn.GPTConfig, n int) int64 {
	return trainer.ActivationBytes(cfg, m, trainer.ActLayout{TP: n, SP: cfg.TP.SequenceParallel})
}

// EstimateMemory implements trainer.MemoryEstimator: the core has
// counted this rank's parts of the parameters (LocalParams); the
// activations follow ActivationBytes.
func (e Estimator) EstimateMemory(in trainer.EstimateInput, est *trainer.MemoryEstimate) error {
	est.ActPeak = ActivationBytes(in.Cfg, in.Model, e.N)
	est.PeakBytes = est.ParamsBytes + est.GradsBytes + est.OptimBytes + est.ActPeak + est.CommBytes
	return nil
}
