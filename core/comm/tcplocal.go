package comm

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"sync"
)

// RunTCPLocal runs fn on n ranks of the tcp backend inside this process:
// each rank is a goroutine with its own listener, store connection and
// peer sockets over loopback, exactly as n processes on one host would be.
// Plugin tests use it to run the tcp code path without starting processes.
// A rank whose fn fails drops its connections, as a crashed process would.
func RunTCPLocal(n int, opts Options, fn func(g Group) error) error {
	return runTCPLocalHosts(n, nil, opts, fn)
}

// runTCPLocalHosts is RunTCPLocal with hosts[r] as the host identity
// override of rank r (nil: every rank on this host).
func runTCPLocalHosts(n int, hosts []string, opts Options, fn func(g Group) error) error {
	if n < 1 {
		return fmt.Errorf("comm: RunTCPLocal needs at least one rank, got %d", n)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("comm: rendezvous listener: %w", err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	var secret [16]byte
	if _, err := rand.Read(secret[:]); err != nil {
		return err
	}
	token := hex.EncodeToString(secret[:])
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := 0; r < n; r++ {
		wg.Add(1)
		go func(r int) {
			defer wg.Done()
			env := EnvInfo{Rank: r, Size: n, LocalRank: r, LocalSize: n, MasterAddr: "127.0.0.1", MasterPort: port,
				Token: token, Source: "local-tcp"}
			if hosts != nil {
				env.HostID = hosts[r]
			}
			var storeLn net.Listener
			if r == 0 {
				storeLn = ln
			}
			g, err := newTCP(env, opts, storeLn)
			if err != nil {
				errs[r] = fmt.Errorf("rank %d: %w", r, err)
				return
			}
			if err := runGuarded(g, fn); err != nil {
				errs[r] = fmt.Errorf("rank %d: %w", r, err)
				_ = g.(*group).abort()
				return
			}
			if err := g.Close(); err != nil {
				errs[r] = fmt.Errorf("rank %d: close: %w", r, err)
			}
		}(r)
	}
	wg.Wait()
	return errors.Join(errs...)
}
