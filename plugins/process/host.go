package process

import (
	"errors"
	"fmt"
	"io"
	"net/rpc"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/pluginsdk"
)

// Options say how to start a plugin process.
type Options struct {
	// Env is added to the process's environment (the host's own is
	// inherited).
	Env []string
	// Stderr receives the plugin's standard error, each line prefixed
	// with "[plugin NAME] " (rank-qualified when Rank >= 0); os.Stderr
	// when nil.
	Stderr io.Writer
	Rank   int
	// Deadline bounds the handshake and, until Prepare sets comm.timeout
	// instead, every call (default 1m).
	Deadline time.Duration
	// Protocol is the protocol version the host speaks (tests ask for a
	// wrong one); 0 means pluginsdk.ProtocolVersion.
	Protocol int
}

// Plugin is a plugin process seen from the trainer. It implements every
// hook interface and forwards the hooks the process implements.
type Plugin struct {
	Info pluginsdk.Info
	Path string

	client   *plugin.Client
	cmd      *exec.Cmd
	rpc      *rpc.Client
	stderr   *prefixWriter
	socket   string // the Unix socket the process serves on; "" before the handshake
	deadline time.Duration
	dead     error // set once the process failed; every later call returns it
	group    comm.Group

	// notices is the write end of the pipe that carries GradReady to the
	// process one way (pluginsdk.Notice); sent counts the notices written
	// since the last GradReady call, which waits for them.
	notices *os.File
	sent    int
	notice  [pluginsdk.NoticeBytes]byte

	// Set by Prepare.
	arena *pluginsdk.Arena
	state *prepared
}

// Start starts the plugin binary at path and runs the handshake and the
// Describe call. Errors say what is wrong with the binary.
func Start(path string, o Options) (*Plugin, error) {
	if o.Deadline <= 0 {
		o.Deadline = time.Minute
	}
	if o.Protocol == 0 {
		o.Protocol = pluginsdk.ProtocolVersion
	}
	if o.Stderr == nil {
		o.Stderr = os.Stderr
	}
	st, err := os.Stat(path)
	switch {
	case err != nil:
		return nil, fmt.Errorf("process plugin %s: %w", path, err)
	case st.IsDir() || st.Mode()&0o111 == 0:
		return nil, fmt.Errorf("process plugin %s: not an executable file", path)
	}
	p := &Plugin{Path: path, deadline: o.Deadline}
	name := filepath.Base(path)
	prefix := func(name string) string {
		if o.Rank >= 0 {
			return fmt.Sprintf("[plugin %s rank %d] ", name, o.Rank)
		}
		return "[plugin " + name + "] "
	}
	p.stderr = newPrefixWriter(o.Stderr, prefix(name))
	p.cmd = exec.Command(path)
	p.cmd.Env = append(os.Environ(), o.Env...)
	p.cmd.SysProcAttr = pluginProcAttr()
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("process plugin %s: making the notice pipe: %w", path, err)
	}
	p.notices = w
	p.cmd.ExtraFiles = []*os.File{r} // the process's pluginsdk.NoticeFD
	p.client = plugin.NewClient(&plugin.ClientConfig{
		HandshakeConfig:  pluginsdk.Handshake(o.Protocol),
		Plugins:          plugin.PluginSet{"hooks": &clientPlugin{}},
		Cmd:              p.cmd,
		AllowedProtocols: []plugin.Protocol{plugin.ProtocolNetRPC},
		StartTimeout:     o.Deadline,
		Stderr:           p.stderr,
		SyncStderr:       p.stderr,
		SyncStdout:       p.stderr,
		Logger:           hclog.NewNullLogger(),
	})
	proto, err := p.client.Client()
	r.Close() // the process has its own copy, or never will
	if err != nil {
		p.kill()
		return nil, p.startError(o.Protocol, err)
	}
	if rc := p.client.ReattachConfig(); rc != nil && rc.Addr != nil && rc.Addr.Network() == "unix" {
		p.socket = rc.Addr.String()
	}
	raw, err := proto.Dispense("hooks")
	if err != nil {
		p.kill()
		return nil, fmt.Errorf("process plugin %s: %w", path, err)
	}
	p.rpc = raw.(*rpc.Client)
	p.Info.Name = name
	if err := p.call(pluginsdk.HookDescribe, nil, &p.Info); err != nil {
		p.kill()
		return nil, err
	}
	if p.Info.Protocol != o.Protocol {
		p.kill()
		return nil, fmt.Errorf("process plugin %s (%s): it speaks plugin protocol version %d, this tinyacc speaks version %d: rebuild the plugin against this tinyacc's pluginsdk",
			p.Info.Name, path, p.Info.Protocol, o.Protocol)
	}
	p.stderr.setPrefix(prefix(p.Info.Name))
	return p, nil
}

// startError explains a failed handshake.
func (p *Plugin) startError(host int, err error) error {
	msg := err.Error()
	if _, rest, ok := strings.Cut(msg, "incompatible API version with plugin. Plugin version: "); ok {
		v, _, _ := strings.Cut(rest, ",")
		return fmt.Errorf("process plugin %s: it speaks plugin protocol version %s, this tinyacc speaks version %d: rebuild the plugin against this tinyacc's pluginsdk",
			p.Path, v, host)
	}
	tail := p.stderr.tail()
	if tail != "" {
		tail = "; its last output: " + tail
	}
	first, unrecognized := strings.CutPrefix(msg, "Unrecognized remote plugin message: ")
	first = strings.TrimSpace(firstLine(first))
	switch {
	case msg == "plugin exited before we could connect" || unrecognized && first == "":
		return fmt.Errorf("process plugin %s: it exited before the handshake; is it a tinyacc plugin (built with pluginsdk.Serve)?%s", p.Path, tail)
	case unrecognized:
		return fmt.Errorf("process plugin %s: not a tinyacc plugin (its first output %q is not a go-plugin handshake)%s", p.Path, first, tail)
	}
	return fmt.Errorf("process plugin %s: handshake failed: %v%s", p.Path, err, tail)
}

// call runs one hook in the process within the deadline. in and out are
// msgpack-encoded; out may be nil.
func (p *Plugin) call(hook string, in, out any) error {
	if p.dead != nil {
		return p.dead
	}
	if p.sent > 0 && hook != pluginsdk.HookGradReady {
		if err := p.awaitNotices(); err != nil {
			return err
		}
	}
	body, err := msgpack.Marshal(in)
	if err != nil {
		return err
	}
	var resp pluginsdk.Msg
	c := p.rpc.Go("Plugin.Call", pluginsdk.Msg{Hook: hook, Body: body}, &resp, make(chan *rpc.Call, 1))
	timer := time.NewTimer(p.deadline)
	defer timer.Stop()
	select {
	case <-c.Done:
	case <-timer.C:
		p.kill()
		p.dead = fmt.Errorf("process plugin %s (%s): %s did not answer within %s (comm.timeout); the plugin process was killed%s",
			p.Info.Name, p.Path, hook, p.deadline, p.lastOutput())
		return p.dead
	}
	var serverErr rpc.ServerError
	switch {
	case errors.As(c.Error, &serverErr):
		return fmt.Errorf("process plugin %s: %s: %s", p.Info.Name, hook, string(serverErr))
	case c.Error != nil:
		p.kill()
		p.dead = fmt.Errorf("process plugin %s (%s): %s: the plugin process died or closed its connection (%v)%s",
			p.Info.Name, p.Path, hook, c.Error, p.lastOutput())
		return p.dead
	}
	if out == nil {
		return nil
	}
	if err := msgpack.Unmarshal(resp.Body, out); err != nil {
		return fmt.Errorf("process plugin %s: decoding the answer to %s: %w", p.Info.Name, hook, err)
	}
	return nil
}

// notify writes one GradReady notice to the process without waiting for
// it. A process that stopped reading fills the pipe: the write then waits
// at most the deadline.
func (p *Plugin) notify(n pluginsdk.Notice) error {
	if p.dead != nil {
		return p.dead
	}
	n.Encode(p.notice[:])
	p.notices.SetWriteDeadline(time.Now().Add(p.deadline))
	_, err := p.notices.Write(p.notice[:])
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		p.kill()
		p.dead = fmt.Errorf("process plugin %s (%s): %s did not answer within %s (comm.timeout): the process stopped reading its notices; the plugin process was killed%s",
			p.Info.Name, p.Path, pluginsdk.HookGradReady, p.deadline, p.lastOutput())
		return p.dead
	case err != nil:
		p.kill()
		p.dead = fmt.Errorf("process plugin %s (%s): %s: the plugin process died or closed its connection (%v)%s",
			p.Info.Name, p.Path, pluginsdk.HookGradReady, err, p.lastOutput())
		return p.dead
	}
	p.sent++
	return nil
}

// awaitNotices waits until the process has run the notices sent since the
// last wait, and returns the first of their errors.
func (p *Plugin) awaitNotices() error {
	n := p.sent
	p.sent = 0
	return p.call(pluginsdk.HookGradReady, pluginsdk.GradsReq{Notices: n}, nil)
}

func (p *Plugin) lastOutput() string {
	if t := p.stderr.tail(); t != "" {
		return "; its last output: " + t
	}
	return ""
}

// Ping is an empty round trip to the process (it measures the cost of a
// hook call). It first waits for the notices sent before it.
func (p *Plugin) Ping() error { return p.call(pluginsdk.HookPing, nil, nil) }

// Notice sends the process a notice that only counts (it measures the
// cost of one GradReady); the next call waits until it was read.
func (p *Plugin) Notice() error { return p.notify(pluginsdk.Notice{Param: -1}) }

// kill ends the process at once (SIGKILL also ends a stopped process),
// lets go-plugin reap it and closes the notice pipe.
func (p *Plugin) kill() {
	if p.cmd != nil && p.cmd.Process != nil {
		_ = p.cmd.Process.Kill()
	}
	if p.client != nil {
		p.client.Kill()
	}
	if p.notices != nil {
		p.notices.Close()
	}
	p.removeSocket()
}

// removeSocket deletes the socket file the process served on. A process
// that exits on its own removes it; a killed one cannot, and every killed
// plugin would leave one more file in the temporary directory. Only a
// socket is removed: a name reused by anything else is left alone.
func (p *Plugin) removeSocket() {
	if p.socket == "" {
		return
	}
	if st, err := os.Lstat(p.socket); err == nil && st.Mode()&os.ModeSocket != 0 {
		_ = os.Remove(p.socket)
	}
	p.socket = ""
}

// Close ends the process and removes its arena. It is safe to call more
// than once and after a failure.
func (p *Plugin) Close() error {
	if p.rpc != nil && p.dead == nil {
		p.client.Kill() // asks the process to exit, then kills it
	}
	p.kill()
	if p.arena != nil {
		p.arena.Remove()
	}
	if p.dead == nil {
		p.dead = fmt.Errorf("process plugin %s (%s) was closed", p.Info.Name, p.Path)
	}
	return nil
}

// Pid is the process id of the plugin process.
func (p *Plugin) Pid() int { return p.cmd.Process.Pid }

// clientPlugin is the host's half of go-plugin's net/rpc plugin: the raw
// rpc client, on which Plugin.call runs the hooks.
type clientPlugin struct{}

func (clientPlugin) Server(*plugin.MuxBroker) (any, error) {
	return nil, errors.New("the host serves no plugin")
}
func (clientPlugin) Client(_ *plugin.MuxBroker, c *rpc.Client) (any, error) { return c, nil }

func firstLine(s string) string {
	for i, r := range s {
		if r == '\n' {
			return s[:i]
		}
	}
	return s
}
