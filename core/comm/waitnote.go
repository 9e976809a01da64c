package comm

import (
	"fmt"
	"io"
	"sync"
	"time"
)

// A rank started by hand (RANK=1 WORLD_SIZE=2 with no rank 0 anywhere) would
// otherwise wait out its whole deadline without a word. While a rank joins
// its job it says what it waits for: once soon after it starts waiting, then
// every waitNoteEvery. The first note waits waitNoteFirst because a launcher
// starts every rank at once and rank 0 normally listens within
// milliseconds: a note for each of those short waits would only be noise.
const (
	waitNoteFirst = time.Second
	waitNoteEvery = 10 * time.Second
)

// waitNote reports what a joining rank waits for until it is ended. The
// text is asked for at each report, so it can name what is still missing.
type waitNote struct {
	log   io.Writer
	start time.Time
	total time.Duration // the deadline the rank waits under

	mu   sync.Mutex
	what func() string
	stop chan struct{}
	done chan struct{}
}

// startWaitNote starts reporting to log; total is the rendezvous deadline.
func startWaitNote(log io.Writer, total time.Duration, first, every time.Duration) *waitNote {
	n := &waitNote{log: log, start: time.Now(), total: total, stop: make(chan struct{}), done: make(chan struct{})}
	go n.loop(first, every)
	return n
}

// set says what the rank waits for from now on.
func (n *waitNote) set(what func() string) {
	n.mu.Lock()
	n.what = what
	n.mu.Unlock()
}

// end stops the reports; no note is written after it returns.
func (n *waitNote) end() {
	close(n.stop)
	<-n.done
}

func (n *waitNote) loop(first, every time.Duration) {
	defer close(n.done)
	t := time.NewTimer(first)
	defer t.Stop()
	for {
		select {
		case <-n.stop:
			return
		case <-t.C:
		}
		n.mu.Lock()
		what := n.what
		n.mu.Unlock()
		if what != nil {
			waited := time.Since(n.start).Round(time.Second)
			fmt.Fprintf(n.log, "comm: %s (waited %s of %s)\n", what(), waited, n.total)
		}
		t.Reset(every)
	}
}
