//go:build cgo && linux

package comm

import (
	"fmt"
	"net"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tinyacc/tinyacc/core/tensor"
)

// MPI reports a dead peer, if at all, as an opaque error, and one that
// stopped not at all, and mpirun then ends the job with its own message. So
// that an mpi job's failures are named as the tcp backend names them, the
// ranks keep a side channel beside MPI: rank 0 hosts a store (the tcp
// backend's), every rank holds two connections to it, and
//
//   - the store notes the first rank whose connection ends without a
//     goodbye: its process ended. Every rank waits on that note, so an
//     operation in flight fails at once naming the rank;
//   - every rank publishes which operation it started last on each group,
//     so a rank whose operation timed out names the ranks that never
//     arrived at it.

// mpiProgressEvery is how often a rank publishes its progress when it
// changed: often enough that a timeout (seconds at least) sees it current.
const mpiProgressEvery = 200 * time.Millisecond

// mpiWatch is one rank's end of the side channel.
type mpiWatch struct {
	rank, size int
	server     *storeServer // rank 0's
	ctl        *storeClient // progress, goodbye, reading the others' progress
	waiter     *storeClient // only waits for deadKey
	dead       atomic.Pointer[mpiDeath]
	closing    atomic.Bool
	progress   func() string
	stop       chan struct{}
	wg         sync.WaitGroup
}

// mpiDeath is a rank that left the job without a goodbye, and how it was
// learned.
type mpiDeath struct {
	rank int
	why  string
}

func mpiProgressKey(rank int) string { return "tinyacc/progress/" + strconv.Itoa(rank) }

// startMPIWatch opens the side channel for world. Rank 0 draws a free port
// and MPI broadcasts it, so no port needs to be agreed on beforehand. It
// returns nil, with no error, where no address is known that every rank
// can reach (ranks on several hosts without MASTER_ADDR): the job then runs
// with MPI's own messages.
func startMPIWatch(env EnvInfo, opts Options, world *mpiGroup, progress func() string) (*mpiWatch, error) {
	host := env.MasterAddr
	if env.MasterVar == "" {
		if env.Hosts >= 2 {
			if env.Rank == 0 {
				fmt.Fprintf(opts.Log, "comm: note: the mpi ranks span several hosts and MASTER_ADDR is not set, so failures are reported by MPI alone; set MASTER_ADDR to rank 0's host for tinyacc to name the rank and operation that failed\n")
			}
			return nil, nil
		}
		host = "127.0.0.1"
	}
	var ln net.Listener
	port := tensor.Default.New(tensor.Comm, tensor.Int32, 1)
	if env.Rank == 0 {
		var err error
		ln, err = net.Listen("tcp", net.JoinHostPort(storeBindHost(host), "0"))
		if err != nil {
			fmt.Fprintf(opts.Log, "comm: note: rank 0 cannot listen on %s for the mpi side channel (%v), so failures are reported by MPI alone\n", host, err)
		} else {
			port.Set(0, float64(ln.Addr().(*net.TCPAddr).Port))
		}
	}
	if err := world.Broadcast(port, 0); err != nil {
		if ln != nil {
			ln.Close()
		}
		return nil, fmt.Errorf("comm: mpi backend: sharing the side channel's port: %w", err)
	}
	p := int(port.At(0))
	if p == 0 {
		return nil, nil
	}
	w := &mpiWatch{rank: env.Rank, size: env.Size, progress: progress, stop: make(chan struct{})}
	if env.Rank == 0 {
		if env.Token == "" {
			warnNoToken(opts.Log, EnvInfo{MasterAddr: host, MasterPort: p})
		}
		w.server = startStoreWatching(ln, env.Token, env.Size, opts.Log, true)
	}
	addr := net.JoinHostPort(host, strconv.Itoa(p))
	deadline := time.Now().Add(opts.Timeout)
	var err error
	if w.ctl, err = dialStore(addr, env.Token, env.Rank, env.Size, deadline); err == nil {
		w.waiter, err = dialStore(addr, env.Token, env.Rank, env.Size, deadline)
	}
	if err != nil {
		w.shut()
		return nil, fmt.Errorf("comm: mpi backend: rank %d joining the side channel: %w", env.Rank, err)
	}
	w.wg.Add(2)
	go w.watch()
	go w.publish()
	return w, nil
}

// watch waits for the store's note of a rank that left without a goodbye;
// the store itself going away means rank 0 left.
func (w *mpiWatch) watch() {
	defer w.wg.Done()
	for {
		resp, err := w.waiter.do(storeReq{Op: "get", Key: deadKey, TimeoutMs: time.Hour.Milliseconds()}, time.Now().Add(time.Hour))
		if w.closing.Load() {
			return
		}
		switch {
		case err == nil:
			r, perr := strconv.Atoi(string(resp.Value))
			if perr != nil || r < 0 || r >= w.size {
				return
			}
			w.dead.Store(&mpiDeath{rank: r, why: "its process ended (its connection to the job's store closed)"})
			return
		case resp.Err != "" && strings.HasPrefix(resp.Err, "timed out"):
			continue // an hour without news
		default:
			w.dead.Store(&mpiDeath{rank: 0, why: "its process ended (the job's store, which it hosts, closed)"})
			return
		}
	}
}

// publish writes this rank's progress whenever it changed.
func (w *mpiWatch) publish() {
	defer w.wg.Done()
	tick := time.NewTicker(mpiProgressEvery)
	defer tick.Stop()
	last := ""
	for {
		if p := w.progress(); p != last {
			if err := w.ctl.set(mpiProgressKey(w.rank), []byte(p), time.Now().Add(time.Second)); err != nil {
				return
			}
			last = p
		}
		select {
		case <-w.stop:
			return
		case <-tick.C:
		}
	}
}

// failure is the rank that left, if one did.
func (w *mpiWatch) failure() *mpiDeath { return w.dead.Load() }

// missing names the ranks that had not started operation seq of group
// (by their last published progress), for a timeout's message.
func (w *mpiWatch) missing(group string, seq uint64) string {
	deadline := time.Now().Add(2 * time.Second)
	var ranks []int
	var details []string
	for r := range w.size {
		if r == w.rank {
			continue
		}
		if d := w.failure(); d != nil && d.rank == r {
			ranks = append(ranks, r)
			details = append(details, fmt.Sprintf("rank %d: %s", r, d.why))
			continue
		}
		v, err := w.ctl.get(mpiProgressKey(r), deadline)
		if err != nil {
			ranks = append(ranks, r)
			details = append(details, fmt.Sprintf("rank %d: reported no progress", r))
			continue
		}
		if got := progressOf(string(v), group); got < seq {
			ranks = append(ranks, r)
			details = append(details, fmt.Sprintf("rank %d: last started seq %d", r, got))
		}
	}
	if len(ranks) == 0 {
		return "every rank reported starting it; MPI itself did not finish it"
	}
	return fmt.Sprintf("ranks %v did not arrive (%s)", ranks, strings.Join(details, "; "))
}

// progressOf reads one group's sequence number from a published progress.
func progressOf(p, group string) uint64 {
	for _, line := range strings.Split(p, "\n") {
		if name, seq, ok := strings.Cut(line, "\x00"); ok && name == group {
			n, _ := strconv.ParseUint(seq, 10, 64)
			return n
		}
	}
	return 0
}

// formatProgress writes each group's last started sequence number, one
// group a line, sorted so that equal progress reads equal.
func formatProgress(seqs map[string]uint64) string {
	lines := make([]string, 0, len(seqs))
	for name, seq := range seqs {
		lines = append(lines, name+"\x00"+strconv.FormatUint(seq, 10))
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

// close says goodbye, so that leaving is not taken for a death. Rank 0
// keeps the store until every rank said goodbye (or the deadline passed):
// a rank still working must not see the store close under it.
func (w *mpiWatch) close(timeout time.Duration) {
	w.closing.Store(true)
	close(w.stop)
	deadline := time.Now().Add(timeout)
	if err := w.ctl.set(byePrefix+strconv.Itoa(w.rank), []byte("1"), deadline); err == nil {
		if _, err := w.ctl.add(byeCount, 1, deadline); err == nil && w.server != nil {
			_ = w.ctl.waitGE(byeCount, int64(w.size), deadline)
		}
	}
	w.shut()
	w.wg.Wait()
}

// shut closes the connections and, on rank 0, the store.
func (w *mpiWatch) shut() {
	w.closing.Store(true)
	if w.ctl != nil {
		w.ctl.close()
	}
	if w.waiter != nil {
		w.waiter.close()
	}
	if w.server != nil {
		w.server.close()
	}
}
