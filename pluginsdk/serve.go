package pluginsdk

import (
	"errors"
	"fmt"
	"io"
	stdlog "log"
	"net/rpc"
	"os"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/tensor"
	"github.com/tinyacc/tinyacc/core/trainer"
)

// Env is what a plugin's constructor gets in the plugin process.
type Env struct {
	// Trainer mirrors the host's trainer (see the package doc); hooks
	// receive it too.
	Trainer *trainer.Trainer
	// Group joins the plugin processes of the data-parallel ranks; nil
	// unless Info.Comm.
	Group comm.Group
	// Log is the process's standard error, which the host shows line by
	// line with the plugin's name as a prefix.
	Log io.Writer
}

// Key returns the value of one of the plugin's declared keys in the form a
// flag takes ("" when it was not declared).
func (e *Env) Key(key string) string { return e.Trainer.Cfg.Declared[key] }

// IntKey is Key parsed as an integer (the loader has checked it).
func (e *Env) IntKey(key string) int {
	n, _ := strconv.Atoi(e.Key(key))
	return n
}

// FloatKey is Key parsed as a number (the loader has checked it).
func (e *Env) FloatKey(key string) float64 {
	f, _ := strconv.ParseFloat(e.Key(key), 64)
	return f
}

// Serve serves the plugin that newPlugin makes (once, at Prepare) to the
// tinyacc host that started this process, and exits when the host is done
// or gone. Started by hand, it says that it is a plugin and exits 1.
func Serve(info Info, newPlugin func(e *Env) (trainer.Plugin, error)) {
	ServeHandshake(Handshake(ProtocolVersion), info, newPlugin)
}

// ServeHandshake is Serve with another handshake; tests use it to check
// that a host refuses a plugin of another protocol version or cookie.
func ServeHandshake(hs plugin.HandshakeConfig, info Info, newPlugin func(e *Env) (trainer.Plugin, error)) {
	info.Protocol = int(hs.ProtocolVersion)
	for i := range info.Keys {
		if info.Keys[i].Plugin == "" {
			info.Keys[i].Plugin = info.Name
		}
	}
	// The host's stderr pipe is fd 2; go-plugin redirects os.Stderr.
	log := os.NewFile(2, "stderr")
	watchParent(log, info.Name)
	stdlog.SetOutput(io.Discard) // go-plugin's own notes on shutting down
	s := &server{info: info, newPlugin: newPlugin, log: log}
	s.ran = sync.NewCond(&s.mu)
	go s.readNotices(noticePipe())
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig: hs,
		Plugins:         plugin.PluginSet{dispenseName: &goPlugin{s: s}},
		Logger:          hclog.NewNullLogger(),
	})
	os.Exit(0)
}

// watchParent ends this process when the host dies, however it dies (the
// host also asks the kernel to kill its children, but only on Linux and
// only when the starting thread ends).
func watchParent(log io.Writer, name string) {
	parent := os.Getppid()
	go func() {
		for range time.Tick(200 * time.Millisecond) {
			if os.Getppid() != parent {
				fmt.Fprintf(log, "plugin %s: the tinyacc process that started it is gone; exiting\n", name)
				os.Exit(3)
			}
		}
	}()
}

// goPlugin adapts a server to go-plugin's net/rpc plugin interface.
type goPlugin struct{ s *server }

func (g *goPlugin) Server(*plugin.MuxBroker) (any, error) { return &RPC{s: g.s}, nil }
func (g *goPlugin) Client(_ *plugin.MuxBroker, c *rpc.Client) (any, error) {
	return c, nil
}

// RPC is the net/rpc service of a plugin process (exported for net/rpc).
type RPC struct{ s *server }

// Call runs one hook.
func (r *RPC) Call(req Msg, resp *Msg) error {
	out, err := r.s.call(req.Hook, req.Body)
	if err != nil {
		return err
	}
	resp.Hook = req.Hook
	resp.Body, err = msgpack.Marshal(out)
	return err
}

// server runs the hooks in the plugin process. net/rpc serves requests
// concurrently, while the host calls one hook at a time; the mutex also
// orders the calls with the GradReady notices, which readNotices runs from
// its own goroutine.
type server struct {
	mu        sync.Mutex
	info      Info
	newPlugin func(e *Env) (trainer.Plugin, error)
	log       io.Writer

	arena  *Arena
	env    *Env
	p      trainer.Plugin
	params []*tensor.Tensor

	// The notices run since the host's last GradReady call, the first
	// error among them, and why the pipe can no longer be read (nil while
	// it can). ran signals each notice run.
	notices int
	gradErr error
	pipeErr error
	ran     *sync.Cond
}

// noticePipe is the pipe the host writes the notices to, or nil when
// NoticeFD is not a pipe (a host that passed none: its handshake fails,
// and whatever else this process opened as that descriptor is not read).
func noticePipe() *os.File {
	var st syscall.Stat_t
	if err := syscall.Fstat(NoticeFD, &st); err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFIFO {
		return nil
	}
	return os.NewFile(NoticeFD, "notices")
}

// readNotices runs the GradReady hooks of the host's notices, in order, as
// they arrive on the pipe f.
func (s *server) readNotices(f *os.File) {
	if f == nil {
		s.mu.Lock()
		s.pipeErr = fmt.Errorf("fd %d is not the notice pipe", NoticeFD)
		s.mu.Unlock()
		return
	}
	buf := make([]byte, NoticeBytes)
	for {
		if _, err := io.ReadFull(f, buf); err != nil {
			s.mu.Lock()
			s.pipeErr = fmt.Errorf("reading the GradReady notices on fd %d: %w", NoticeFD, err)
			s.ran.Broadcast()
			s.mu.Unlock()
			return
		}
		n := DecodeNotice(buf)
		s.mu.Lock()
		if err := s.gradReady(n); err != nil && s.gradErr == nil {
			s.gradErr = err
		}
		s.notices++
		s.ran.Broadcast()
		s.mu.Unlock()
	}
}

// gradReady runs the hook of one notice; s.mu is held.
func (s *server) gradReady(n Notice) error {
	if n.Param == -1 {
		return nil
	}
	if s.p == nil {
		return fmt.Errorf("a notice before Prepare")
	}
	r, ok := s.p.(trainer.GradReadier)
	if !ok {
		return fmt.Errorf("plugin %s does not implement GradReady", s.info.Name)
	}
	if n.Param < 0 || int(n.Param) >= len(s.params) {
		return fmt.Errorf("a notice for parameter %d; there are %d", n.Param, len(s.params))
	}
	q := s.params[n.Param]
	if err := r.GradReady(s.env.Trainer, q, tensor.PassInfo{Micro: int(n.Micro), Last: n.Last}); err != nil {
		return fmt.Errorf("parameter %s: %w", q.Name, err)
	}
	return nil
}

// awaitNotices answers the host's GradReady call: it waits until the
// count notices the host sent since its previous call have run and returns
// the first of their errors.
func (s *server) awaitNotices(count int) error {
	for s.notices < count && s.pipeErr == nil {
		s.ran.Wait()
	}
	if s.notices < count {
		return fmt.Errorf("%d of %d notices run: %w", s.notices, count, s.pipeErr)
	}
	err := s.gradErr
	s.notices -= count
	s.gradErr = nil
	return err
}

func (s *server) call(hook string, body []byte) (any, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if hook == HookDescribe {
		return s.info, nil
	}
	if hook == HookPing {
		return nil, nil
	}
	if hook == HookGradReady {
		var req GradsReq
		if err := msgpack.Unmarshal(body, &req); err != nil {
			return nil, fmt.Errorf("decoding %s: %w", hook, err)
		}
		return nil, s.awaitNotices(req.Notices)
	}
	if hook == HookPrepare {
		var req PrepareReq
		if err := msgpack.Unmarshal(body, &req); err != nil {
			return nil, fmt.Errorf("decoding %s: %w", hook, err)
		}
		return s.prepare(&req)
	}
	if s.p == nil {
		return nil, fmt.Errorf("%s before Prepare", hook)
	}
	t := s.env.Trainer
	if hook != HookFinish && hook != HookMemoryUsage && !slices.Contains(hooksOf(s.p), hook) {
		return nil, fmt.Errorf("plugin %s does not implement %s", s.info.Name, hook)
	}
	var pass PassReq
	switch hook {
	case HookPreForward, HookPostGrad:
		if err := msgpack.Unmarshal(body, &pass); err != nil {
			return nil, fmt.Errorf("decoding %s: %w", hook, err)
		}
	}
	switch hook {
	case HookPreForward:
		return nil, s.p.(trainer.PreForwarder).PreForward(t, pass.info())
	case HookPostGrad:
		return nil, s.p.(trainer.PostGrader).PostGrad(t, pass.info())
	case HookPreStep:
		return nil, s.p.(trainer.PreStepper).PreStep(t)
	case HookPostStep:
		var m trainer.StepMetrics
		if err := msgpack.Unmarshal(body, &m); err != nil {
			return nil, fmt.Errorf("decoding %s: %w", hook, err)
		}
		return nil, s.p.(trainer.PostStepper).PostStep(t, &m)
	case HookReduceLoss:
		var loss float64
		if err := msgpack.Unmarshal(body, &loss); err != nil {
			return nil, fmt.Errorf("decoding %s: %w", hook, err)
		}
		return s.p.(trainer.LossReducer).ReduceLoss(t, loss)
	case HookFinish:
		var err error
		if f, ok := s.p.(trainer.Finisher); ok {
			err = f.Finish(t)
		}
		if s.env.Group != nil {
			err = errors.Join(err, s.env.Group.Close())
			s.env.Group = nil
		}
		return nil, err
	case HookMemoryUsage:
		return t.Alloc.Usage().Total, nil
	}
	return nil, fmt.Errorf("unknown hook %q (host and plugin disagree on the protocol)", hook)
}
