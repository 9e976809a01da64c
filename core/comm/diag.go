package comm

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/tinyacc/tinyacc/core/tensor"
)

// fingerprint describes a collective call; in Debug mode all ranks compare
// theirs before running it.
type fingerprint struct {
	Op     string `msgpack:"op"`
	Count  int64  `msgpack:"count"`
	DType  string `msgpack:"dtype"`
	Reduce string `msgpack:"reduce"` // empty for non-reducing ops
	Extra  string `msgpack:"extra"`  // root, counts
}

// String renders a call as all_reduce(4096 float32), naming the reduction
// and root only when they are not the defaults.
func (f fingerprint) String() string {
	var parts []string
	if f.Op == "barrier" {
		return "barrier()"
	}
	parts = append(parts, fmt.Sprintf("%d %s", f.Count, f.DType))
	if f.Reduce != "" && f.Reduce != Sum.String() {
		parts = append(parts, f.Reduce)
	}
	if f.Extra != "" {
		parts = append(parts, f.Extra)
	}
	return fmt.Sprintf("%s(%s)", f.Op, strings.Join(parts, ", "))
}

// checkFingerprints exchanges this call's fingerprint with every member and
// compares them all against group rank 0's, so every rank reports the same
// pair when they disagree.
func (c *opCtx) checkFingerprints() error {
	n, me := c.size(), c.me()
	mine, err := msgpack.Marshal(c.op.fp)
	if err != nil {
		return err
	}
	for p := 0; p < n; p++ {
		if p != me {
			if err := c.sendMsg(chDebug, p, 0, tensor.Int32, padTo4(mine)); err != nil {
				return err
			}
		}
	}
	fps := make([]fingerprint, n)
	fps[me] = c.op.fp
	for p := 0; p < n; p++ {
		if p == me {
			continue
		}
		var raw []byte
		err := c.recvDebug(p, func(b []byte) { raw = append(raw, b...) })
		if err != nil {
			return err
		}
		if err := checkLengths(raw); err != nil {
			return &protocolError{fmt.Sprintf("rank %d sent an unreadable fingerprint: %v", c.g.ranks[p], err)}
		}
		if err := msgpack.Unmarshal(raw, &fps[p]); err != nil {
			return &protocolError{fmt.Sprintf("rank %d sent an unreadable fingerprint: %v", c.g.ranks[p], err)}
		}
	}
	for p := 1; p < n; p++ {
		if fps[p] != fps[0] {
			return &protocolError{fmt.Sprintf("comm: rank %d called %s but rank %d called %s at seq %d on group %q",
				c.g.ranks[0], fps[0], c.g.ranks[p], fps[p], c.op.seq, c.g.name)}
		}
	}
	return nil
}

// recvDebug receives a fingerprint message of any length. Its op tag is not
// checked: telling which operation each side ran is the point.
func (c *opCtx) recvDebug(peer int, fn func([]byte)) error {
	box := c.g.w.tr.inbox()
	key := boxKey{src: c.g.ranks[peer], group: c.g.id, ch: chDebug}
	for {
		msg, err := box.take(key, c.deadline, c.watch)
		if err != nil {
			return err
		}
		if msg.h.seq != c.op.seq {
			box.release(msg)
			return &protocolError{fmt.Sprintf("comm: rank %d is at seq %d but rank %d at seq %d on group %q: ranks issued a different number of collectives",
				c.g.ranks[peer], msg.h.seq, c.g.ranks[c.me()], c.op.seq, c.g.name)}
		}
		fn(msg.data)
		last := msg.h.flags&flagLast != 0
		box.release(msg)
		if last {
			return nil
		}
	}
}

// padTo4 keeps debug payloads whole int32 elements; msgpack ignores the
// trailing zeros.
func padTo4(b []byte) []byte {
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

// explain turns the low-level failure of an operation into the error the
// caller sees, and returns the missing ranks with why. A timeout or a dead
// neighbour alone does not say who is to blame (ring neighbours only see
// their neighbour), so every live member is asked how far it got on this
// group; those that never started this sequence number, and the dead, are
// the ranks that did not arrive. Members that reported giving up the same
// operation (abortNote) did arrive, even if they have exited since.
func (c *opCtx) explain(err error) (error, []int, []string) {
	var pe *protocolError
	if errors.As(err, &pe) {
		if strings.HasPrefix(pe.msg, "comm: ") {
			return errors.New(pe.msg), nil, nil
		}
		return fmt.Errorf("comm: %s on group %q seq %d: %s", c.op.name, c.g.name, c.op.seq, pe.msg), nil, nil
	}
	var we *waitError
	if !errors.As(err, &we) {
		return fmt.Errorf("comm: %s on group %q seq %d failed after %s: %w", c.op.name, c.g.name, c.op.seq, c.elapsed(false), err), nil, nil
	}
	after := c.elapsed(we.timeout)
	if c.op.ch == chP2P {
		return fmt.Errorf("comm: %s on group %q seq %d failed after %s: %s", c.op.name, c.g.name, c.op.seq, after, we), nil, nil
	}
	missing, whys := c.findMissing(we.timeout)
	if len(missing) == 0 {
		return fmt.Errorf("comm: %s on group %q seq %d failed after %s: %s (every rank arrived)", c.op.name, c.g.name, c.op.seq, after, we), nil, nil
	}
	details := make([]string, len(missing))
	for i, r := range missing {
		details[i] = fmt.Sprintf("rank %d: %s", r, whys[i])
	}
	return fmt.Errorf("comm: %s on group %q seq %d failed after %s: ranks %v did not arrive (%s)",
		c.op.name, c.g.name, c.op.seq, after, missing, strings.Join(details, "; ")), missing, whys
}

// tellOthers sends this rank's verdict to every other member, in parallel
// and bounded in time, before the caller sees the error (and maybe exits).
func (c *opCtx) tellOthers(err error, missing []int, whys []string) {
	n := &abortNote{Group: c.g.id, Seq: c.op.seq, Missing: missing, Details: whys, Reason: err.Error()}
	deadline := time.Now().Add(min(probeTimeout, c.g.w.opts.Timeout))
	var wg sync.WaitGroup
	for r, wr := range c.g.ranks {
		if r == c.me() {
			continue
		}
		wg.Add(1)
		go func(wr int) {
			defer wg.Done()
			c.g.w.tr.notify(wr, n, deadline)
		}(wr)
	}
	wg.Wait()
}

func (c *opCtx) elapsed(timedOut bool) time.Duration {
	if timedOut {
		return c.g.w.opts.Timeout
	}
	d := time.Since(c.start)
	if d >= time.Millisecond {
		return d.Round(time.Millisecond)
	}
	return d.Round(time.Microsecond)
}

// probeTimeout bounds how long explaining a failure may take, and again how
// long telling the others may take. A live rank answers a probe from its
// reader goroutine within milliseconds, so a fraction of a second tells it
// from a stopped one.
const probeTimeout = 300 * time.Millisecond

// probeShare is the part of a collective's timeout kept for probing the
// ranks that did not arrive: a collective waits for them until timeout less
// this share, then probes until the timeout itself, so a rank that stops
// answering fails its peers within comm.timeout, explanation included, and
// the job ends right after.
func probeShare(timeout time.Duration) time.Duration { return min(probeTimeout, timeout/2) }

// findMissing returns the world ranks of the group that are dead or never
// started this operation, with the reason for each, in rank order. Live
// ranks are probed only after a timeout: when a failure is fast (a peer
// died), a live rank that has not started yet is merely slower, not missing.
func (c *opCtx) findMissing(probe bool) ([]int, []string) {
	tr := c.g.w.tr
	box := tr.inbox()
	var (
		mu      sync.Mutex
		why     = map[int]string{}
		arrived = map[int]bool{}
		wg      sync.WaitGroup
	)
	// Until the operation's timeout, and some time however late this is.
	deadline := c.start.Add(c.g.w.opts.Timeout)
	if least := time.Now().Add(probeShare(c.g.w.opts.Timeout) / 3); least.After(deadline) {
		deadline = least
	}
	for r, wr := range c.g.ranks {
		if r == c.me() {
			continue
		}
		wg.Add(1)
		go func(wr int) {
			defer wg.Done()
			// Death is looked at before the note: a peer's note is
			// delivered before its connection ends, so a peer seen dead
			// without a note really left without arriving.
			reason, dead := box.deadReason(wr)
			if n := box.note(wr, c.g.id); n != nil && n.Seq >= c.op.seq {
				mu.Lock()
				arrived[wr] = true
				mu.Unlock()
				return
			}
			w := ""
			if dead {
				w = reason
			} else if !probe {
				return
			} else if seq, err := tr.probe(wr, c.g.id, deadline); err != nil {
				if n := box.note(wr, c.g.id); n != nil && n.Seq >= c.op.seq {
					// It gave up this operation (and may have left)
					// while the probe was out: it did arrive.
					mu.Lock()
					arrived[wr] = true
					mu.Unlock()
					return
				}
				if reason, dead := box.deadReason(wr); dead {
					w = reason
				} else {
					w = "no answer: " + err.Error()
				}
			} else if seq < c.op.seq {
				if seq == 0 {
					w = "has not started any collective on this group"
				} else {
					w = fmt.Sprintf("last started seq %d", seq)
				}
			}
			if w != "" {
				mu.Lock()
				why[wr] = w
				mu.Unlock()
			}
		}(wr)
	}
	wg.Wait()
	// Ranks that others found missing, when this rank could not tell.
	for r, wr := range c.g.ranks {
		if r == c.me() || !arrived[wr] {
			continue
		}
		n := box.note(wr, c.g.id)
		for i, m := range n.Missing {
			if _, known := why[m]; !known && !arrived[m] && m != c.g.ranks[c.me()] && i < len(n.Details) {
				why[m] = n.Details[i]
			}
		}
	}
	missing := make([]int, 0, len(why))
	for r := range why {
		missing = append(missing, r)
	}
	sort.Ints(missing)
	whys := make([]string, len(missing))
	for i, r := range missing {
		whys[i] = why[r]
	}
	return missing, whys
}
