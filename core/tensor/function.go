package tensor

// Function is an op written by its caller: a forward and the matching
// backward. Plugins build their communication ops on it (tensor parallel's
// f and g, ring attention), since autograd cannot see through a collective.
type Function interface {
	// Forward computes the output from the inputs. It must not keep inputs
	// it will need in backward other than through ctx.Save.
	Forward(ctx *FuncCtx, inputs ...*Tensor) (*Tensor, error)
	// Backward returns one gradient per input (nil where none flows), given
	// the gradient of the output.
	Backward(ctx *FuncCtx, gout *Tensor) ([]*Tensor, error)
}

// Refiller is a Function whose output can be formed again from what its
// backward keeps (its saved tensors and parameters), without
// communication: selective recomputation may then drop the output after
// the forward (Drop), and Refill writes it again, bitwise, into out's
// fresh storage before the first backward that reads it. OutputUnread
// says whether the Function's own backward leaves the output unread, so
// the output can go before it runs.
type Refiller interface {
	Refill(ctx *FuncCtx, out *Tensor)
	OutputUnread() bool
}

// FuncCtx carries state from a Function's forward to its backward.
type FuncCtx struct {
	saved []*Tensor
	owned []*Tensor
	// Values holds anything else the forward wants to pass on.
	Values map[string]any
	// Backprop is the pass running the backward (nil during forward); it
	// gives the micro-batch index and the allocator.
	Backprop *Backprop
	// readsHalf: ReadsHalf.
	readsHalf bool
}

// ReadsHalf says the backward reads the saved inputs stored in 2 bytes
// under mixed precision through their copies (Tensor.StoredHalf), so the
// backward pass does not widen them for it: a loss over the logits forms
// its gradient from them in its own buffer, without a widened copy beside
// it. Call it in Forward.
func (c *FuncCtx) ReadsHalf() { c.readsHalf = true }

// Save keeps tensors for the backward.
func (c *FuncCtx) Save(ts ...*Tensor) { c.saved = append(c.saved, ts...) }

// Saved returns the tensors kept by Save, in order.
func (c *FuncCtx) Saved() []*Tensor { return c.saved }

// Own hands buffers the forward allocated for the backward (statistics,
// probabilities) to the graph: they are released with it, as the
// built-in ops' are (after a backward with Release, by FreeGraph), or at
// once when nothing needs a gradient. The backward must not release them.
func (c *FuncCtx) Own(ts ...*Tensor) { c.owned = append(c.owned, ts...) }

// FunctionError is the panic value raised when a custom Function's backward
// fails inside Backward; Backward recovers it into an error.
type FunctionError struct {
	Op  string
	Err error
}

func (e *FunctionError) Error() string { return "tensor: backward of " + e.Op + ": " + e.Err.Error() }
func (e *FunctionError) Unwrap() error { return e.Err }

// Apply runs f on inputs and records it for autograd under the given name.
func Apply(name string, f Function, inputs ...*Tensor) (*Tensor, error) {
	ctx := &FuncCtx{Values: map[string]any{}}
	out, err := f.Forward(ctx, inputs...)
	if err != nil {
		return nil, err
	}
	record(out, name, func(b *Backprop, g *Tensor) []*Tensor {
		ctx.Backprop = b
		for _, t := range ctx.saved {
			if ctx.readsHalf && storedHalf(t) != nil {
				continue // read as stored (ReadsHalf)
			}
			refill(t) // a saved tensor that is no input nor the output
		}
		gs, err := f.Backward(ctx, g)
		if err != nil {
			panic(&FunctionError{Op: name, Err: err})
		}
		return gs
	}, inputs...)
	if out.node != nil {
		out.node.readsHalf = ctx.readsHalf
		saveBuf(out, ctx.owned...)
		if r, ok := f.(Refiller); ok {
			setRefill(out, func(out *Tensor) { r.Refill(ctx, out) })
			if r.OutputUnread() {
				outUnread(out)
			}
		}
	} else {
		for _, t := range ctx.owned {
			t.Release()
		}
	}
	return out, nil
}
