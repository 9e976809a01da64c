// Package cp is context parallelism: the ranks of the mesh's CP group each
// hold part of every sequence, and attention, the one layer that mixes
// positions, sees the rest of the sequence through the group.
//
// # The split
//
// A sequence of T tokens is cut into equal chunks (split.go). contiguous:
// n chunks, rank r holds chunk r. zigzag: 2n chunks, rank r holds chunks r
// and 2n-1-r. Under the causal mask a query at position i sees i+1 keys,
// so the work of a chunk grows with its position; pairing chunk r with its
// mirror 2n-1-r gives every rank the same number of visible (query, key)
// pairs, (T² + T)/(2n) with T/(2n)-token chunks, where the contiguous
// split gives rank r (2r+1)/(2n)·T²/n of them up to the diagonal: the last
// rank does 2n-1 times the first's work. Positions stay global: the
// embedding adds the position embedding of each token's place in the
// whole sequence (Embedding), and the causal mask compares global
// positions (core/tensor's attention over positions). model.block_size
// must divide into the chunks (times tp under sequence parallel, which
// cuts a rank's rows again); config.Validate says so before any rank
// starts.
//
// # Attention over the group
//
// Each rank keeps its queries and needs every key and value at or before
// them. Attention over several key blocks assembles exactly from the
// attention over each block through the log-sum-exp (the online softmax):
// with (out_a, lse_a) the attention over one block and (out_b, lse_b) over
// another,
//
//	m   = max(lse_a, lse_b)
//	lse = m + log(exp(lse_a - m) + exp(lse_b - m))
//	out = out_a·exp(lse_a - lse) + out_b·exp(lse_b - lse)
//
// and the backward of each block needs only the final lse and
// delta_i = dout_i·out_i (see core/tensor/cpu's AttentionLSEBackward).
// Two forms compute it, side by side:
//
//	allgather.go  all-gather K and V, attend block by block, keep them
//	              for backward, reduce-scatter dK and dV (the naive form)
//	ring.go       K and V travel around the ring, the next transfer in
//	              flight while the current block computes; blocks wholly
//	              in the future are skipped; backward runs the ring again
//	              and dK, dV travel back to their owner (the optimized form)
//
// # Loss and gradients
//
// The data rank is the DP rank: the CP ranks of a DP group read the same
// sequences (data.Loader.KeepColumns keeps each rank's positions of every
// window, inputs and targets). A rank's loss is the mean over its tokens,
// B·T/n of them, the same count on every rank, so the mean over the CP
// ranks of their means is the mean over every token of the sequences, and
// the DP × CP mean of the per-rank means is the global batch's mean loss;
// the same holds for the gradients. The loss a rank reports (training and
// evaluation) is that CP mean, taken in forward (Head); its gradient stays
// the rank's own. Plain DDP therefore averages over the
// mesh's DP × CP group at once. ZeRO and DDP as a plugin process reduce
// over the DP group only; the cp plugin then averages each gradient over
// CP itself as it becomes ready, before them (CP.ReduceGrads). Parameters
// are replicated along CP, which their placement (place.Replicate, the
// default) already says, so the gradient norm, checkpoints and resuming on
// another layout need no context-parallel case.
package cp
