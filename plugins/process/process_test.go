package process_test

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/tensor"
	"github.com/tinyacc/tinyacc/core/trainer"
	"github.com/tinyacc/tinyacc/plugins/process"
	"github.com/tinyacc/tinyacc/plugins/ptest"
	"github.com/tinyacc/tinyacc/pluginsdk"
)

// The test binary doubles as the plugins under test: started with
// TINYACC_TEST_PLUGIN set, it serves one of them instead of testing.
const testPluginEnv = "TINYACC_TEST_PLUGIN"

func TestMain(m *testing.M) {
	process.ServeBuiltin()
	switch os.Getenv(testPluginEnv) {
	case "":
		os.Exit(m.Run())
	case "kill", "stop":
		sig := map[string]syscall.Signal{"kill": syscall.SIGKILL, "stop": syscall.SIGSTOP}[os.Getenv(testPluginEnv)]
		pluginsdk.Serve(pluginsdk.Info{Name: "faulty"}, func(*pluginsdk.Env) (trainer.Plugin, error) {
			return &faulty{sig: sig}, nil
		})
	case "gradkill", "gradstop", "graderr":
		sig := map[string]syscall.Signal{"gradkill": syscall.SIGKILL, "gradstop": syscall.SIGSTOP}[os.Getenv(testPluginEnv)]
		pluginsdk.Serve(pluginsdk.Info{Name: "faulty"}, func(*pluginsdk.Env) (trainer.Plugin, error) {
			return &faultyGrad{sig: sig}, nil
		})
	case "v2":
		pluginsdk.ServeHandshake(pluginsdk.Handshake(pluginsdk.ProtocolVersion+1), pluginsdk.Info{Name: "future"}, nil)
	case "cookie":
		hs := pluginsdk.Handshake(pluginsdk.ProtocolVersion)
		hs.MagicCookieValue = "another-host"
		pluginsdk.ServeHandshake(hs, pluginsdk.Info{Name: "stranger"}, nil)
	}
}

// faulty receives sig itself in the PreStep of step 2: mid-step, with the
// trainer waiting for its answer.
type faulty struct {
	sig   syscall.Signal
	steps int
}

func (f *faulty) Name() string { return "faulty" }
func (f *faulty) PreStep(*trainer.Trainer) error {
	f.steps++
	if f.steps == 2 {
		syscall.Kill(os.Getpid(), f.sig)
		select {} // never answer, whenever the signal lands
	}
	return nil
}

// faultyGrad receives sig itself (or, with none, fails) in the first
// GradReady of step 2, which the host sent as a notice without waiting.
type faultyGrad struct {
	sig   syscall.Signal
	calls int
}

func (f *faultyGrad) Name() string { return "faulty" }
func (f *faultyGrad) GradReady(t *trainer.Trainer, p *tensor.Tensor, _ tensor.PassInfo) error {
	f.calls++
	if f.calls != len(t.Model.Params())+1 {
		return nil
	}
	if f.sig != 0 {
		// The signal reaches every thread a little later; until then this
		// goroutine must not answer, or the host would read its reply.
		syscall.Kill(os.Getpid(), f.sig)
		select {}
	}
	return fmt.Errorf("faulty: a bad gradient in step 2")
}

func start(t *testing.T, variant string, env ...string) (*process.Plugin, error) {
	env = append([]string{testPluginEnv + "=" + variant}, env...)
	return process.Start(os.Args[0], process.Options{Env: env, Rank: 0, Deadline: 30 * time.Second})
}

// TestKilledOrStoppedPlugin ends a run whose plugin process is killed,
// stopped or fails mid-step (in a hook the host waits for, or in a
// GradReady it only notified), within comm.timeout, with an error naming the plugin,
// its binary and the hook, and leaves no process, no arena file and no
// socket file behind (the plugin process makes its socket in its TMPDIR).
func TestKilledOrStoppedPlugin(t *testing.T) {
	exe := os.Args[0]
	for variant, want := range map[string]string{
		"kill": "process plugin faulty (" + exe + "): PreStep: the plugin process died or closed its connection",
		"stop": "process plugin faulty (" + exe + "): PreStep did not answer within 1s (comm.timeout); the plugin process was killed",
		// GradReady is a notice; the host waits for it at PostGrad (or
		// finds the pipe closed when it sends the next one).
		"gradkill": "process plugin faulty (" + exe + "): GradReady: the plugin process died or closed its connection",
		"gradstop": "trainer: faulty post-grad: process plugin faulty (" + exe + "): GradReady did not answer within 1s (comm.timeout); the plugin process was killed",
		"graderr":  "trainer: faulty post-grad: process plugin faulty: GradReady: parameter ln_f.weight: faulty: a bad gradient in step 2",
	} {
		tmp := t.TempDir()
		p, err := start(t, variant, "TMPDIR="+tmp)
		require.NoError(t, err)
		sockets, _ := filepath.Glob(filepath.Join(tmp, "*"))
		require.Len(t, sockets, 1, "%s: the plugin serves on one socket in its TMPDIR", variant)
		cfg := ptest.Config()
		cfg.Comm.Timeout = time.Second
		tr, err := trainer.New(cfg, trainer.Options{Train: ptest.Corpus(), Plugins: []trainer.Plugin{p}})
		require.NoError(t, err)
		_, err = tr.Run(t.Context())
		require.ErrorContains(t, err, want, variant)
		require.NoError(t, p.Close())
		require.ErrorIs(t, syscall.Kill(p.Pid(), 0), syscall.ESRCH, "%s: the plugin process is gone", variant)
		left, _ := filepath.Glob(pluginsdk.ArenaPattern(os.Getpid()))
		require.Empty(t, left, "%s: no arena file is left", variant)
		left, _ = filepath.Glob(filepath.Join(tmp, "*"))
		require.Empty(t, left, "%s: no socket file is left", variant)
	}
}

// TestStartErrors: each bad binary is refused before training, saying why.
func TestStartErrors(t *testing.T) {
	exe := os.Args[0]
	_, err := start(t, "v2")
	require.EqualError(t, err, fmt.Sprintf("process plugin %s: it speaks plugin protocol version %d, this tinyacc speaks version %d: rebuild the plugin against this tinyacc's pluginsdk",
		exe, pluginsdk.ProtocolVersion+1, pluginsdk.ProtocolVersion))

	_, err = start(t, "cookie")
	require.ErrorContains(t, err, "process plugin "+exe+": it exited before the handshake; is it a tinyacc plugin (built with pluginsdk.Serve)?; its last output: This binary is a plugin.")

	_, err = process.Start("/bin/true", process.Options{})
	require.EqualError(t, err, "process plugin /bin/true: it exited before the handshake; is it a tinyacc plugin (built with pluginsdk.Serve)?")

	script := filepath.Join(t.TempDir(), "hello")
	require.NoError(t, os.WriteFile(script, []byte("#!/bin/sh\necho hello\n"), 0o755))
	_, err = process.Start(script, process.Options{})
	require.EqualError(t, err, "process plugin "+script+": not a tinyacc plugin (its first output \"hello\" is not a go-plugin handshake)")

	missing := filepath.Join(t.TempDir(), "nope")
	_, err = process.Start(missing, process.Options{})
	require.EqualError(t, err, "process plugin "+missing+": stat "+missing+": no such file or directory")

	_, err = process.Start(t.TempDir(), process.Options{})
	require.ErrorContains(t, err, "not an executable file")
}
