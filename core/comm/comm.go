// Package comm is tinyacc's communication layer: process groups and the
// collectives every parallel strategy is built from.
//
// A Group is an ordered set of ranks. Collectives issued on one group run one
// after another, in the order they were issued, on a queue owned by the group;
// the async forms return a Handle so data parallel can overlap gradient
// reduction with the rest of backward. Point-to-point sends and receives run
// on two more queues of the group, so a pending Recv holds up neither a
// collective nor a Send.
//
// The algorithms (ring reduce-scatter/all-gather, chain broadcast, direct
// exchange for small buffers) are written once against a small transport
// interface; a backend only moves tagged byte messages between ranks. The
// local backend moves them between goroutines of one process, the tcp backend
// between processes over a full mesh of TCP connections. A device backend
// such as NCCL implements Group itself and registers under its name, so
// callers never change.
//
// Nothing blocks forever: every operation has a deadline (Options.Timeout) and
// a failure names the operation, the group, its sequence number and the ranks
// that did not arrive.
package comm

import (
	"fmt"
	"io"
	"os"
	"sort"
	"sync"
	"time"

	"github.com/tinyacc/tinyacc/core/tensor"
)

// ReduceOp is the elementwise reduction of AllReduce, ReduceScatter and Reduce.
type ReduceOp int

const (
	Sum ReduceOp = iota
	Avg          // sum divided by the group size; float dtypes only
	Max
	Min
)

func (o ReduceOp) String() string {
	switch o {
	case Sum:
		return "sum"
	case Avg:
		return "avg"
	case Max:
		return "max"
	case Min:
		return "min"
	}
	return fmt.Sprintf("reduce_op(%d)", int(o))
}

// Handle is an operation in flight. Wait blocks until it finished and returns
// its error; it may be called any number of times, from any goroutine, and
// handles may be waited in any order.
type Handle interface {
	Wait() error
}

// Group is a set of ranks that communicate. All tensors must be contiguous
// CPU tensors of a supported dtype (float32, float64, int32, bfloat16,
// float16; half-precision reductions sum in float32 and round once, half.go)
// and every member must pass tensors of matching sizes; the Debug option
// checks the latter.
type Group interface {
	// Rank is this process's position in the group, 0..Size()-1.
	Rank() int
	// Size is the number of ranks in the group.
	Size() int
	// Name names the group in errors and traces ("world", "tp", ...).
	Name() string
	// WorldRank maps a rank of this group to its rank in the world group.
	WorldRank(groupRank int) int

	// AllReduce replaces t on every rank with the reduction over ranks.
	AllReduce(t *tensor.Tensor, op ReduceOp) error
	AllReduceAsync(t *tensor.Tensor, op ReduceOp) Handle
	// ReduceScatter reduces in (Size()*n elements) over ranks and leaves block
	// Rank() of the result (n elements) in out. in is not modified.
	ReduceScatter(in, out *tensor.Tensor, op ReduceOp) error
	ReduceScatterAsync(in, out *tensor.Tensor, op ReduceOp) Handle
	// AllGather concatenates every rank's in (n elements each) into out
	// (Size()*n elements) in rank order.
	AllGather(in, out *tensor.Tensor) error
	AllGatherAsync(in, out *tensor.Tensor) Handle
	// AllGatherV is AllGather with counts[r] elements from rank r;
	// in.Numel() must equal counts[Rank()] and out holds their sum.
	AllGatherV(in, out *tensor.Tensor, counts []int) error
	AllGatherVAsync(in, out *tensor.Tensor, counts []int) Handle
	// AllToAll sends block p of in (Size() equal blocks) to rank p and
	// leaves the block rank r sent this rank at block r of out, which has
	// in's size and does not overlap it.
	AllToAll(in, out *tensor.Tensor) error
	AllToAllAsync(in, out *tensor.Tensor) Handle
	// AllToAllV is AllToAll with blocks of sendCounts[p] elements for rank
	// p (in is their concatenation in rank order) and recvCounts[r] from
	// rank r (out likewise); recvCounts[r] must equal rank r's
	// sendCounts[Rank()]. Counts may be zero.
	AllToAllV(in, out *tensor.Tensor, sendCounts, recvCounts []int) error
	AllToAllVAsync(in, out *tensor.Tensor, sendCounts, recvCounts []int) Handle
	// Broadcast copies root's t into t on every rank.
	Broadcast(t *tensor.Tensor, root int) error
	BroadcastAsync(t *tensor.Tensor, root int) Handle
	// Reduce leaves the reduction over ranks in root's t; the other ranks'
	// t is used as scratch and holds unspecified values afterwards.
	Reduce(t *tensor.Tensor, root int, op ReduceOp) error
	ReduceAsync(t *tensor.Tensor, root int, op ReduceOp) Handle
	// Barrier returns once every rank has entered it.
	Barrier() error

	// Send delivers t to rank to, which must post a Recv of the same size.
	// Sends are eager: they complete once the data left this rank, so a
	// ring of Send-then-Recv does not deadlock.
	Send(t *tensor.Tensor, to int) error
	SendAsync(t *tensor.Tensor, to int) Handle
	// Recv fills t with the matching Send of rank from.
	Recv(t *tensor.Tensor, from int) error
	RecvAsync(t *tensor.Tensor, from int) Handle

	// NewGroup makes a sub-group of the given ranks of this group; group
	// ranks follow the order of the list. Every rank of this group must
	// call it, with the same list, in the same order relative to its other
	// NewGroup calls; ranks not in the list get a nil Group.
	NewGroup(ranks []int) (Group, error)
	// NewNamedGroup is NewGroup with a name for errors and traces.
	NewNamedGroup(name string, ranks []int) (Group, error)

	// Close waits for queued operations and releases the group. Closing the
	// world group also closes its connections.
	Close() error
}

// ByteCounter is a Group that counts the payload bytes this rank sends:
// the data of collectives and of point-to-point sends as the algorithms
// move it (a ring all-reduce of n bytes over N ranks sends 2(N-1)/N·n, a
// direct one (N-1)·n), without frame headers or TINYACC_DEBUG=detail's
// fingerprints; through a shared-memory segment, the bytes of this rank's
// data the others read, the same amounts. The groups of the local and tcp
// backends count; a device
// backend may not. Benchmarks hold these counts to the formulas of
// docs/formulas.md.
type ByteCounter interface {
	// SentBytes is what this rank has sent on this group so far.
	SentBytes() int64
	// RankSentBytes is what this rank has sent on every group so far.
	RankSentBytes() int64
}

// Options configure a backend.
type Options struct {
	// Backend selects the implementation for InitFromEnv: "tcp" (the
	// default) or any name added with RegisterBackend.
	Backend string
	// Timeout bounds every blocking operation, rendezvous included
	// (default 5 minutes).
	Timeout time.Duration
	// Debug makes ranks agree on a fingerprint of each collective before
	// running it, so a mismatch is reported with both sides instead of
	// corrupting data or hanging. TINYACC_DEBUG=detail turns it on.
	Debug bool
	// ChunkBytes is the largest payload of one frame; big buffers stream in
	// chunks of this size so the receiver reduces one while the next is on
	// the wire (default 512 KiB).
	ChunkBytes int
	// Log receives refused connections and warnings (default os.Stderr).
	Log io.Writer
}

const (
	defaultTimeout = 5 * time.Minute
	defaultChunk   = 512 << 10
)

func (o Options) withDefaults() Options {
	if o.Timeout <= 0 {
		o.Timeout = defaultTimeout
	}
	if o.ChunkBytes <= 0 {
		o.ChunkBytes = defaultChunk
	}
	if o.ChunkBytes > maxDataPayload {
		o.ChunkBytes = maxDataPayload
	}
	o.ChunkBytes &^= 7 // keep chunks on element boundaries of every dtype
	if o.Log == nil {
		o.Log = os.Stderr
	}
	return o
}

// BackendFunc creates the world group of one rank from its environment.
type BackendFunc func(env EnvInfo, opts Options) (Group, error)

var (
	backendsMu sync.Mutex
	backends   = map[string]BackendFunc{}
)

// RegisterBackend makes a backend available to InitFromEnv under name. It is
// how a device backend plugs in without callers changing.
func RegisterBackend(name string, f BackendFunc) {
	backendsMu.Lock()
	defer backendsMu.Unlock()
	backends[name] = f
}

func backendNames() []string {
	backendsMu.Lock()
	defer backendsMu.Unlock()
	var names []string
	for n := range backends {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

func init() {
	RegisterBackend("tcp", newTCPFromEnv)
}
