// Package zero implements ZeRO data parallelism, stages 1, 2 and 3: every
// rank of the data-parallel group trains the whole model on its slice of
// the global batch, as plain data parallel does, but owns only 1/N of the
// training state and shares the rest through collectives.
//
// # Layout
//
// The parameters are grouped in units, one per module of the GPT (embed:
// wte and wpe; each block; head: ln_f). Each unit lives in one flat buffer,
// padded at its end to a multiple of N, and rank r owns the contiguous shard
// [r·S/N, (r+1)·S/N) of it. The Layout remembers, per range of a flat
// buffer, which parameter it is (name, offset) and whether weight decay
// applies (tensors of two or more dimensions), so the optimizer over a
// shard, built on per-parameter views named "<name>[lo:hi]", performs
// exactly the element updates of the unsharded one. The trainer's
// optimizer is replaced by that ShardOptimizer: its Params are the views,
// their Grad the matching views of the shard gradient, so clipping scales
// exactly what the step uses, and the global gradient norm is the sum over
// ranks of the shards' sums of squares (padding is zero).
//
// # Experts
//
// Under expert parallel an expert's parameters are held by some ranks of
// the data-parallel group only, its replicas (plugins/ep), which differ
// from rank to rank. With Zero.Held set to the replicas' group, each
// module's held parameters form a unit of their own right after the
// module's other unit (Unit.Held), laid out, reduced, gathered and
// released like any unit but over the replicas' group: its gradient is
// averaged over the replicas and scaled by Zero.HeldScale (for experts,
// replicas/(dp·cp): the sum over the replicas divided by dp·cp). Both
// units are driven by the module's hooks. Without Held the experts stay
// whole (Layout.Whole), reduced by the plugin that placed them.
//
// # The stages and their communication
//
// Stage 1 shards the optimizer state. Backward fills full gradients (views
// of a flat buffer per unit) as usual, over every micro-batch; after the
// last one each unit's gradient is reduce-scattered (Avg) into this rank's
// shard gradient, the shard is stepped in place, and the updated shards
// are all-gathered back into the flat parameter buffers the model's
// tensors are aliased to. Per step: a reduce-scatter and an all-gather of
// Ψ elements, the 2Ψ of a plain all-reduce.
//
// Stage 2 also shards the gradients. A unit's full gradient buffer exists
// only for its backward: the module's PreBackward hook allocates it, and
// the moment its last parameter's gradient is final (GradReady) it is
// reduce-scattered asynchronously and freed when that completes, while
// backward goes on with earlier units. This happens every micro-batch, the
// results summed into the shard gradient, since no full gradient survives
// between micro-batches. Traffic: Ψ reduce-scattered per micro-batch and Ψ
// gathered per step, 2Ψ as in stage 1 without accumulation.
//
// Stage 3 (FSDP) also shards the parameters: a rank keeps only its shards.
// A unit is all-gathered before its forward (module PreForward hook) and
// released after it (PostForward), gathered again before its backward
// (PreBackward), and its gradients are reduce-scattered when final, after
// which its parameters and gradient buffer are released. When a unit
// starts, the all-gather of the next unit (forward order, or backward
// order during backward) is issued asynchronously so it overlaps the
// unit's compute. Every unit is released between its uses, the embed unit
// included: the head, which reads the tied wte, gathers it for its
// logits and keeps it into its backward (which immediately follows its
// forward) until the logits' matmul has computed its input's gradient,
// its last read of wte; when the matmul then asks for wte's gradient
// buffer (NeedGrad), wte is released and the buffer, of the same size,
// takes its storage from the allocator's free lists, so the table's
// values and its gradient never exist at once. The embedding's own
// backward reads no weight (a lookup's gradient is a scatter), so the
// embed unit is not gathered for it. Only wte's gradient buffer lives
// from the head's backward to the embedding's, the head's contribution
// waiting for the embedding's. Every buffer a step releases (gathered
// units, gradient buffers, activations) goes back to the allocator's
// free lists and is taken again by the next step: after the first, a
// step takes no storage from the Go heap and leaves the collector no
// garbage (TestStage3ReusesReleasedBuffers). Traffic per
// micro-batch: Ψ gathered for forward plus the embed unit again for the
// logits, Ψ less embed and head for backward, Ψ reduce-scattered: about
// 3Ψ against stage 2's 2Ψ, the price of holding Ψ/N parameters.
//
// # Memory (fp32, AdamW; P = padded Ψ)
//
//	          params                 grads                     optimizer
//	stage 1   4P                     4P                        8Ψ/N
//	stage 2   4P                     4P/N + T                  8Ψ/N
//	stage 3   4P/N + G               4P/N + T                  8Ψ/N
//
// The extra buffers beside the textbook formulas (docs/formulas.md):
// stage 1 borrows shard-sized comm buffers for its reduce-scatters (a
// reduce-scatter may not write into its own input) and copies each result
// into its range of the full gradient, so only comm memory grows, by 4P/N
// at the step's end.
// T = 4·(embed unit + the
// largest two units adjacent in forward order) is the gradients' transient
// working set of stages 2 and 3: the unit whose gradient is formed now and
// the one still being reduce-scattered, plus the embed unit's, which holds
// the tied head's contribution to wte's gradient until the embedding's
// backward adds its own. G = 4·max(two adjacent units, embed unit + head
// + last block) is stage 3's gathered parameters: the unit computed now
// and the one prefetched, or, during the head's backward, the tied wte
// (then its gradient) and the last block prefetched. Micro-batches after the first of a step also
// borrow one shard-sized comm buffer while their reduce-scatter runs.
// These are each category's own peak, reached at different moments, so
// their sum overstates the peak (by 2 to 24% on small models). The
// estimate's peak of stages 2 and 3 is the largest of the backward's
// moments, each with what it holds at once beside the shards: the head's
// (the logits' gradient beside every saved activation; the tied wte, the
// head and the last block gathered; the head's gradient, and wte's, which
// in stage 3 and under mixed precision replaces wte's values) and
// each block's MLP backward (the saved activations of the blocks up to
// it; that block and the one before it gathered; its gradient, the next
// unit's being reduce-scattered and wte's). TestZeroPeakAtItsMoment in
// plugins holds it to the allocator's peak within 1% on small and large
// tables, 2 and 8 layers.
// Under mixed precision (bf16, fp16) every stage keeps only its shard of
// the float32 masters, and the parameters are 2-byte copies gathered in
// 2 bytes per element (mixed.go, which has the table).
// Nothing unsharded exists at set-up: Prepare runs on the described
// model (trainer.New) and allocates stage 3's shards only, so the peaks
// the report shows cover construction too. TestMemory holds all of this
// to the byte.
//
// # Order and errors
//
// Collectives are issued from deterministic points (backward's GradReady
// order, module hooks, the trainer's step hooks), so every rank issues the
// same sequence. Each one is traced on the comm track from issue to
// completion, with its bytes. Module hooks cannot return errors: a failure
// there is kept and returned by the next hook that can (GradReady,
// PostGrad, the loss reduction, PreStep, the next PreForward).
//
// Stage 3 leaves the model's tensors without storage between uses, so
// anything reading the weights outside the training step finds them
// through the trainer (Trainer.Holding, GatherParam): Zero is a
// trainer.Holder, saying which flat range of each parameter, and of its
// averaged gradient, this rank keeps.
package zero
