package comm

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tinyacc/tinyacc/core/tensor"
)

// world is one rank's view of the job: its transport and the groups it
// belongs to (so a peer's probe can be answered from any goroutine).
type world struct {
	tr   transport
	rank int
	size int
	opts Options

	mu     sync.Mutex
	groups map[uint64]*group
	sent   atomic.Int64 // payload bytes sent on every group (SentBytes)
}

const worldGroupID = 1

func newWorld(tr transport, rank, size int, opts Options) (*world, *group) {
	w := &world{tr: tr, rank: rank, size: size, opts: opts, groups: map[uint64]*group{}}
	ranks := make([]int, size)
	for i := range ranks {
		ranks[i] = i
	}
	g := w.newGroup(worldGroupID, "world", ranks, rank)
	g.isWorld = true
	return w, g
}

// progress is the sequence number of the last collective this rank started
// on group gid (0 when it has none or does not know the group yet).
func (w *world) progress(gid uint64) uint64 {
	w.mu.Lock()
	g := w.groups[gid]
	w.mu.Unlock()
	if g == nil {
		return 0
	}
	return g.started.Load()
}

func (w *world) newGroup(id uint64, name string, ranks []int, me int) *group {
	g := &group{w: w, id: id, name: name, ranks: ranks, me: me,
		sendSeq: map[int]uint64{}, recvSeq: map[int]uint64{}}
	g.coll.g, g.sends.g, g.recvs.g = g, g, g
	w.mu.Lock()
	w.groups[id] = g
	w.mu.Unlock()
	return g
}

// group implements Group on top of a transport.
type group struct {
	w       *world
	id      uint64
	name    string
	ranks   []int // world rank of each group rank
	me      int
	isWorld bool
	started atomic.Uint64
	sent    atomic.Int64 // payload bytes sent on this group (SentBytes)

	coll  opQueue // collectives, in issue order
	sends opQueue // sends, in issue order
	recvs opQueue // receives, in issue order: a pending Recv holds up no Send

	mu       sync.Mutex
	seq      uint64
	children uint64
	sendSeq  map[int]uint64 // per peer group rank
	recvSeq  map[int]uint64
	broken   error // first failure: the group cannot be trusted after it
	closed   bool
	scratch  []byte
	half     []byte // halfScratch: blocks a half-precision reduction receives

	// seg is the shared-memory segment of a group on one host (shmseg.go),
	// set up by its first collective; segState says whether that happened.
	// Only the collective queue touches them.
	seg      *shmSeg
	segState uint8
	// spread is how a group over several hosts shares memory within each
	// (spread.go), set up by the same first collective; nil otherwise.
	spread *spreadColl
}

const (
	segUnknown uint8 = iota
	segOn
	segOff
)

func (g *group) Rank() int                   { return g.me }
func (g *group) Size() int                   { return len(g.ranks) }
func (g *group) Name() string                { return g.name }
func (g *group) WorldRank(groupRank int) int { return g.ranks[groupRank] }

// SentBytes implements ByteCounter.
func (g *group) SentBytes() int64 { return g.sent.Load() }

// RankSentBytes implements ByteCounter.
func (g *group) RankSentBytes() int64 { return g.w.sent.Load() }

// op is one queued operation; it is also its own Handle.
type op struct {
	name string
	code uint8
	ch   uint16
	seq  uint64
	peer int // group rank of the other side, p2p only
	fp   fingerprint
	run  func(c *opCtx) error
	done chan struct{}
	err  error
}

func (o *op) Wait() error {
	<-o.done
	return o.err
}

// failed is the Handle of an operation rejected before it was queued.
type failed struct{ err error }

func (f failed) Wait() error { return f.err }

// opQueue runs operations one at a time in issue order. Its goroutine lives
// only while there is work, so idle groups cost nothing.
type opQueue struct {
	g       *group
	mu      sync.Mutex
	ops     []*op
	running bool
	idle    *sync.Cond
}

func (q *opQueue) push(o *op) {
	q.mu.Lock()
	q.ops = append(q.ops, o)
	if !q.running {
		q.running = true
		go q.drain()
	}
	q.mu.Unlock()
}

func (q *opQueue) drain() {
	for {
		q.mu.Lock()
		if len(q.ops) == 0 {
			q.running = false
			if q.idle != nil {
				q.idle.Broadcast()
			}
			q.mu.Unlock()
			return
		}
		o := q.ops[0]
		q.ops[0] = nil
		q.ops = q.ops[1:]
		q.mu.Unlock()
		q.g.execute(o)
		close(o.done)
	}
}

// wait blocks until the queue is empty.
func (q *opQueue) wait() {
	q.mu.Lock()
	if q.idle == nil {
		q.idle = sync.NewCond(&q.mu)
	}
	for q.running {
		q.idle.Wait()
	}
	q.mu.Unlock()
}

// submitColl queues a collective under the next group sequence number.
func (g *group) submitColl(name string, code uint8, fp fingerprint, run func(c *opCtx) error) Handle {
	o := &op{name: name, code: code, ch: chColl, fp: fp, run: run, done: make(chan struct{})}
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return failed{fmt.Errorf("comm: %s on group %q: %w", name, g.name, errClosed)}
	}
	g.seq++
	o.seq = g.seq
	g.mu.Unlock()
	g.coll.push(o)
	return o
}

// submitP2P queues a send or recv under the next sequence number of the
// (this rank, peer, direction) pair, which the other side counts the same way.
func (g *group) submitP2P(name string, code uint8, peer int, send bool, run func(c *opCtx) error) Handle {
	o := &op{name: name, code: code, ch: chP2P, peer: peer, run: run, done: make(chan struct{})}
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return failed{fmt.Errorf("comm: %s on group %q: %w", name, g.name, errClosed)}
	}
	if send {
		g.sendSeq[peer]++
		o.seq = g.sendSeq[peer]
	} else {
		g.recvSeq[peer]++
		o.seq = g.recvSeq[peer]
	}
	g.mu.Unlock()
	if send {
		g.sends.push(o)
	} else {
		g.recvs.push(o)
	}
	return o
}

// execute runs o on the queue's goroutine with its deadline, turning a
// failure into an error that names the operation and the missing ranks.
func (g *group) execute(o *op) {
	c := &opCtx{g: g, op: o, start: time.Now()}
	c.deadline = c.start.Add(g.w.opts.Timeout)
	if o.ch == chColl {
		c.deadline = c.deadline.Add(-probeShare(g.w.opts.Timeout))
		g.started.Store(o.seq)
		c.watch = make([]int, 0, len(g.ranks)-1)
		for r, wr := range g.ranks {
			if r != g.me {
				c.watch = append(c.watch, wr)
			}
		}
	} else {
		c.watch = []int{g.ranks[o.peer]}
	}
	g.mu.Lock()
	broken := g.broken
	g.mu.Unlock()
	if broken != nil {
		o.err = fmt.Errorf("comm: %s on group %q seq %d not run: the group failed earlier: %w", o.name, g.name, o.seq, broken)
		return
	}
	var err error
	if o.ch == chColl && g.w.opts.Debug && len(g.ranks) > 1 {
		err = c.checkFingerprints()
	}
	if err == nil {
		err = o.run(c)
	}
	if err != nil {
		var missing []int
		var whys []string
		o.err, missing, whys = c.explain(err)
		if o.ch == chColl && len(g.ranks) > 1 {
			c.tellOthers(o.err, missing, whys)
		}
		g.mu.Lock()
		if g.broken == nil {
			g.broken = o.err
		}
		g.mu.Unlock()
	}
}

// scratchBuf returns a per-group buffer of n bytes; safe because the
// collectives of a group run one at a time.
func (g *group) scratchBuf(n int) []byte {
	if cap(g.scratch) < n {
		g.scratch = make([]byte, n)
	}
	return g.scratch[:n]
}

// NewGroup implements Group.
func (g *group) NewGroup(ranks []int) (Group, error) {
	return g.NewNamedGroup(subGroupName(g.name, ranks), ranks)
}

// NewNamedGroup implements Group. The new group's id is derived from this
// group's id and how many sub-groups it made before, which is the same on
// every rank because every rank makes the same calls in the same order.
func (g *group) NewNamedGroup(name string, ranks []int) (Group, error) {
	me, world, err := checkSubGroup(name, g.name, g.ranks, g.me, ranks)
	if err != nil {
		return nil, err
	}
	g.mu.Lock()
	g.children++
	idx := g.children
	g.mu.Unlock()
	h := fnv.New64a()
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:], g.id)
	binary.LittleEndian.PutUint64(b[8:], idx)
	h.Write(b[:])
	id := h.Sum64() | 2 // never the world's id
	if me < 0 {
		return nil, nil
	}
	return g.w.newGroup(id, name, world, me), nil
}

// Close implements Group.
func (g *group) Close() error {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return nil
	}
	g.closed = true
	g.mu.Unlock()
	g.coll.wait()
	g.sends.wait()
	g.recvs.wait()
	g.w.mu.Lock()
	delete(g.w.groups, g.id)
	g.w.mu.Unlock()
	if g.seg != nil {
		g.seg.unmap()
		g.seg = nil
	}
	if g.spread != nil {
		g.spread.unmap()
	}
	if g.isWorld {
		return g.w.tr.close(true)
	}
	return nil
}

// abort drops the world's connections as a crash would; tests use it to
// stand for a rank that dies.
func (g *group) abort() error { return g.w.tr.close(false) }

func checkTensors(ts ...*tensor.Tensor) error {
	for _, t := range ts {
		if err := checkDType(t); err != nil {
			return err
		}
	}
	for _, t := range ts[1:] {
		if t.DType() != ts[0].DType() {
			return fmt.Errorf("dtype %s and %s differ", ts[0].DType(), t.DType())
		}
	}
	return nil
}
