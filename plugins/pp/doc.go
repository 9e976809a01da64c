// Package pp is pipeline parallelism: the blocks of the GPT are cut into
// consecutive stages, one per rank of the pipeline group, and micro-batches
// flow through them, activations forward and gradients backward, so each
// rank holds only its stage's parameters, gradients and optimizer state.
//
// Stages (stages.go). The blocks are split into p·v contiguous chunks,
// v per rank (chunk c on rank c mod p), by pp.layers or balanced by
// compute: a block costs 24·C² + 4·T·C forward FLOPs per token, the head
// 2·V·C more on the last chunk. The first stage holds the embedding, the
// last the final LayerNorm and the head with its own copy of the tied
// wte; that copy's gradient is the head's part, the first stage's the
// embedding's part, and the true gradient is their sum, so after every
// step's backward the two ranks all-reduce it over their embedding group
// and only then tell the other plugins (data parallel) that it is final.
// Both copies therefore take the same step and stay bitwise equal.
//
// Schedules are data (schedule.go). A generator gives each rank the
// ordered list of its actions: F (forward of a chunk on a micro-batch),
// B (backward), W (weight gradient, when backward is split) and the sends
// and receives around them. The checker (check.go) plays the lists before
// anything runs, with sends that never block (the comm layer's are eager)
// and FIFO matching per pair of ranks, and rejects a schedule whose
// receive does not match the next message, that deadlocks, or that misses
// a micro-batch, naming the rank and the action. With unit costs
// F = B = W (a full backward costs B+W) the same play measures the
// bubble, idle time over compute time:
//
//	afab, 1f1b:   (p-1)/m          every rank idles (p-1)(F+B+W)
//	interleaved:  (p-1)/(v·m)      a pipeline fill costs a chunk, 1/v of a stage
//	zb1 (m ≥ p):  (p-1)/(3m)       (p-1)(F+B-W): W's fill the cool-down
//
// and as a share of wall time bubble/(1+bubble), e.g. (p-1)/(m+p-1).
// Activations: AFAB keeps all m micro-batches alive on every rank, 1F1B
// at most p-r on rank r, ZB-H1 at most p (a micro-batch lives until its W).
//
// The executor (pp.go) is the trainer's step owner and runs any checked
// schedule: it receives into fresh leaves, calls Trainer.PreForward before
// each forward, Trainer.BackwardFrom (or BackwardSplit and RunDeferred for
// split backward) so GradReady reaches data parallel as in the trainer's
// own loop, and Trainer.PostGrad once a micro-batch's last chunk on this
// rank is done. The loss is the last stage's mean over the step's
// micro-batches, broadcast to every stage. Every send and receive has the
// comm layer's deadline; a failure names the stage, the action and, from
// the comm layer, the peer.
//
// Composition. Data parallel (DDP, ZeRO-1) runs over each stage's
// replicas: the registry lists pp before it, so it lays out the stage's
// gradients, and bucketed DDP starts its all-reduces during the last
// micro-batch's backward (except the bucket of the tied wte, which waits
// for the embedding group's sum at the end of the step). ZeRO-2 and -3
// reduce gradients inside every micro-batch's backward, before that sum,
// and are refused under pp by the config check. Model rewriters (tensor,
// context parallel) run before pp's Prepare: a stage keeps the very block
// and head objects of the whole model, so layers they installed stay, and
// received activations take the local [B, T, C] of this rank's batch.
package pp
