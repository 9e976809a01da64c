// Package tp is tensor parallelism in the Megatron manner, with sequence
// parallelism as its memory-saving form, over the mesh's TP group (the
// innermost dimension: neighbouring ranks, which talk at every layer).
//
// # Layers and their communication
//
// The communication ops sit beside the layers that use them (comm.go), each
// an autograd op whose backward is its conjugate:
//
//	f  Copy        identity forward          all-reduce backward
//	g  Reduce      all-reduce forward        identity backward
//	   GatherSeq   all-gather (sequence)     reduce-scatter backward
//	   ScatterSeq  reduce-scatter (sequence) all-gather backward
//
// A ColumnParallel Linear holds some output columns: f (or GatherSeq) then
// the product. A RowParallel Linear holds the matching input rows: the
// product, then g (or ScatterSeq), then the bias, once. Their naive forms
// (Gather on the column layer, Split on the row layer) take and give whole
// tensors, which is how the tests hold them to one Linear.
//
// # The GPT under tensor parallel
//
// Prepare rewrites the model in place. attn.c_attn is column-parallel over
// heads (rank r holds the q, k and v columns of heads [r·H/N, (r+1)·H/N):
// nn.QKVShard) and the attention core runs on those heads; attn.c_proj is
// row-parallel over the same heads; mlp.c_fc is column-parallel and
// mlp.c_proj row-parallel, and so is each expert's of a MoE block (every
// rank of the group routes the same tokens with the whole router, and each
// expert's output is summed over the group before it is weighted, so the
// router's gradient is whole on every rank). The tied wte is split by rows (VocabRange): the
// embedding looks up the tokens a rank holds and sums over the group, and
// the head computes the logits of those tokens only, the cross-entropy
// reducing the row maximum, the sum of exponentials and the target logit
// across ranks, so no rank holds the full logits. A vocabulary that does
// not divide by N splits into parts that differ by one row: no padding row
// exists, none can win, and a checkpoint holds the real vocabulary.
//
// Every parameter declares its placement (place.Shard along TP, or whole
// on every rank), so the gradient norm, checkpoints, resuming on another
// layout, save_to and the equivalence checks need no tensor-parallel case,
// and data parallel (DDP, ZeRO 1-3 over the DP group) works on the local
// shards unchanged. The ranks of a TP group compute the same loss: the
// plugin reduces none.
//
// # Sequence parallel
//
// With SP, the LayerNorm and residual regions hold 1/N of the sequence
// (model.block_size % N == 0): the column layers all-gather their input
// along the sequence, the row layers reduce-scatter their output, the
// embedding reduce-scatters its lookup, and the head all-gathers the final
// hidden state. The parameters used on part of the sequence (ln_1, ln_2,
// ln_f, the row-parallel biases, wpe) get partial gradients; their ops sum
// them over the group inside backward, every micro-batch, so what reaches
// the parameter is the full gradient, identical on every rank of the
// group, and gradient accumulation, DDP's buckets and ZeRO's reduce-scatters
// see nothing new.
//
// # Communication per step
//
// StepBytes states, and TestTensorParallelCommBytes holds to the byte,
// what a rank sends over the group per step; `tinyacc bench layouts`
// measures it beside the formula.
package tp
