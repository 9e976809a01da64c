//go:build !linux

package comm

import (
	"fmt"
	"time"
)

// Shared memory between ranks is implemented for Linux only (/dev/shm,
// futexes); elsewhere every transfer uses TCP.

type shmRing struct{}

// RingBytes is 0: no rings without shared memory.
func RingBytes(int, Options) int64 { return 0 }

func (*shmRing) fits(int) bool { return false }

func (t *tcpTransport) setupShm(time.Time) error { return nil }
func (t *tcpTransport) unlinkShm()               {}
func (t *tcpTransport) releaseShm()              {}

func (t *tcpTransport) readShm(peer int, _ []byte) error {
	return fmt.Errorf("%w: rank %d sent a shared-memory payload, which this platform does not support", errFrame, peer)
}

func (t *tcpTransport) sendShm(*peerConn, *shmRing, *header, []byte, time.Time) error {
	panic("unreachable: no rings without shared memory")
}
