package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"

	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/comm/commbench"
	"github.com/tinyacc/tinyacc/core/launch"
)

// benchComm measures one collective over a range of sizes. With the tcp
// backend it launches --nproc processes of itself (each rank a real
// process); with the local backend the ranks are goroutines. Rank 0 prints
// size, time, algbw and busbw as nccl-tests defines them.
func benchComm(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench comm", flag.ContinueOnError)
	nproc := fs.Int("nproc", 4, "ranks")
	backend := fs.String("backend", "tcp", "tcp (processes), mpi (processes under mpirun) or local (goroutines)")
	op := fs.String("op", "all_reduce", "all_reduce, all_gather, reduce_scatter, broadcast, all_to_all, or memcpy (every rank copying at once: the memory's bandwidth)")
	sizesFlag := fs.String("sizes", "4K,64K,1M,16M,64M", "buffer sizes in bytes (K=KiB, M=MiB; for all_to_all the bytes each rank sends)")
	iters := fs.Int("iters", 20, "timed iterations per size (the median is reported)")
	warmup := fs.Int("warmup", 5, "untimed iterations per size")
	asJSON := fs.Bool("json", false, "one JSON object per size")
	if err := fs.Parse(args); err != nil {
		return err
	}
	sizes, err := commbench.ParseSizes(*sizesFlag)
	if err != nil {
		return err
	}
	if _, err := commbench.BusFactor(*op, 2); err != nil {
		return err
	}
	if *nproc < 1 {
		return fmt.Errorf("bench comm: --nproc %d: want at least 1 rank", *nproc)
	}
	run := func(g comm.Group) error {
		out := io.Discard
		if g.Rank() == 0 {
			out = stdout
		}
		return commbench.Run(g, *op, sizes, *iters, *warmup, out, *asJSON)
	}
	opts := comm.Options{Debug: os.Getenv("TINYACC_DEBUG") == "detail"}
	switch {
	case *backend == "local":
		return comm.RunLocal(*nproc, opts, run)
	case *backend != "tcp" && *backend != "mpi":
		return fmt.Errorf("bench comm: --backend %q: use tcp, mpi or local", *backend)
	case launched():
		opts.Backend = *backend
		g, err := comm.InitFromEnv(opts)
		if err != nil {
			return err
		}
		if err := run(g); err != nil {
			return err
		}
		return g.Close()
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	argv := append([]string{exe, "bench", "comm"}, args...)
	if *backend == "mpi" {
		return benchUnderMpirun(*nproc, argv, stdout, stderr)
	}
	lo := launch.Options{NProc: *nproc, Stdout: &stripRank0{w: stdout}, Stderr: stderr}
	if err := launch.Run(context.Background(), lo, argv); err != nil {
		return fmt.Errorf("bench comm: %w", err)
	}
	return nil
}

// stripRank0 removes the launcher's "[rank 0] " prefix so the table (or
// JSON) reads as if printed by one process.
type stripRank0 struct {
	w   io.Writer
	buf []byte
}

func (s *stripRank0) Write(p []byte) (int, error) {
	s.buf = append(s.buf, p...)
	for {
		i := bytes.IndexByte(s.buf, '\n')
		if i < 0 {
			return len(p), nil
		}
		line := s.buf[:i+1]
		line = bytes.TrimPrefix(line, []byte("[rank 0] "))
		if _, err := s.w.Write(line); err != nil {
			return 0, err
		}
		s.buf = s.buf[i+1:]
	}
}

// benchUnderMpirun starts the ranks of an mpi benchmark with mpirun, which
// must be on PATH; only rank 0 prints.
func benchUnderMpirun(nproc int, argv []string, stdout, stderr io.Writer) error {
	mpirun, err := exec.LookPath("mpirun")
	if err != nil {
		return fmt.Errorf("bench comm: --backend mpi needs mpirun on PATH (Debian: apt-get install openmpi-bin)")
	}
	args := []string{"--oversubscribe", "-np", strconv.Itoa(nproc)}
	if os.Geteuid() == 0 {
		args = append(args, "--allow-run-as-root")
	}
	cmd := exec.Command(mpirun, append(args, argv...)...)
	cmd.Stdout, cmd.Stderr = stdout, stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("bench comm: mpirun: %w", err)
	}
	return nil
}
