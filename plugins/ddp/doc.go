// Package ddp is data parallelism: every rank holds a full replica of the
// model, reads its own slice of the global batch, and averages gradients
// with the other ranks before the optimizer step, so all replicas take the
// same step as one process on the whole batch would.
//
// Two forms live side by side and are selected by ddp.mode.
//
// Naive (naive.go) waits until backward of the step's last micro-batch is
// over, then all-reduces every gradient, one tensor after another. It is
// the easiest form to trust, and the tests hold the fast form to it. Its
// cost is that communication starts only once compute has stopped, and
// that it pays the per-message latency once per parameter.
//
// Bucketed (bucketed.go) removes both costs. At Prepare the gradients are
// laid out in a few flat buffers ("buckets") and each p.Grad becomes a view
// of its slice, so backward accumulates straight into the buffer that is
// sent: no copy in, no copy out. When the last gradient of a bucket is
// final (the trainer's GradReady hook), the bucket's asynchronous
// all-reduce starts while backward goes on with earlier layers; PreStep
// only waits for whatever is still in flight.
//
// Why reverse order: backward produces gradients from the last layer to
// the first, so buckets are filled in that order (the output LayerNorm
// first, the token embedding last, since its final contribution comes from
// the embedding lookup at the very start of the model). A bucket then
// completes as early as its contents allow, and buckets complete one after
// another instead of all at the very end.
//
// Why a smaller first bucket: nothing is on the wire until the first bucket
// is complete. A small first bucket (ddp.first_bucket_mb) starts
// communication after only the last few layers' backward, hiding more of
// it behind the remaining compute; later buckets are larger
// (ddp.bucket_mb) so the number of messages, each with its own latency,
// stays small.
//
// Gradient accumulation: micro-batches before the last one only accumulate
// into the buckets (PyTorch's no_sync); only the last micro-batch of a step
// communicates, so the traffic per step does not grow with accumulation.
//
// Both forms also broadcast from rank 0 the initial parameters a caller
// built (NewWith; trainer.New fills every rank with the same numbers after
// Prepare, so there is nothing to send), average the reported loss over
// ranks and gather every rank's memory report.
package ddp
