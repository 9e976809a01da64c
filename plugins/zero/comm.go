package zero

import (
	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/trace"
)

// op is a collective in flight. Its trace span runs from issue to the
// moment Wait returns, so the trace shows how long communication really
// took and how much of it hid behind compute.
type op struct {
	h    comm.Handle
	span trace.Span
	// then runs once after a successful wait: accumulate a received shard,
	// release the buffers the collective read.
	then func()
	done bool
	err  error
}

// issue starts a collective with a span named name carrying its size in
// bytes (the full buffer, as bus-bandwidth reports count it).
func (z *Zero) issue(name string, bytes int64, start func() comm.Handle, then func()) *op {
	span := z.t.Trace.Begin(name, "comm", trace.Comm).With("bytes", bytes).With("group", z.g.Name())
	return &op{h: start(), span: span, then: then}
}

// wait blocks until the collective is done; later calls return the same
// result.
func (o *op) wait() error {
	if o.done {
		return o.err
	}
	o.done = true
	o.err = o.h.Wait()
	o.span.End()
	if o.err == nil && o.then != nil {
		o.then()
	}
	return o.err
}

// run issues a collective and waits for it.
func (z *Zero) run(name string, bytes int64, start func() comm.Handle) error {
	return z.issue(name, bytes, start, nil).wait()
}

// keep records the first error seen where it cannot be returned (module
// hooks); the next hook that can return an error reports it.
func (z *Zero) keep(err error) {
	if err != nil && z.err == nil {
		z.err = err
	}
}

// waitReduces finishes the reduce-scatters in flight, oldest first, until
// at most keepN are left.
func (z *Zero) waitReduces(keepN int) error {
	for len(z.reduces) > keepN {
		o := z.reduces[0]
		z.reduces = z.reduces[1:]
		if err := o.wait(); err != nil {
			return err
		}
	}
	return nil
}
