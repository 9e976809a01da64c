package pluginsdk

import (
	"fmt"

	"github.com/hashicorp/go-plugin"

	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/tensor"
	"github.com/tinyacc/tinyacc/core/trainer"
)

// ProtocolVersion is the version of the messages below. A host and a
// plugin built against different versions refuse each other in the
// handshake, naming both.
const ProtocolVersion = 1

// CookieKey and CookieValue are the handshake's magic cookie: the host sets
// the variable in the plugin's environment, and a plugin binary started
// any other way says that it is a plugin and exits.
const (
	CookieKey   = "TINYACC_PLUGIN"
	CookieValue = "tinyacc-plugin-process"
)

// BuiltinEnv names the compiled-in plugin a tinyacc binary serves when its
// host starts it as a plugin process (ddp.process: true starts tinyacc
// itself with TINYACC_PLUGIN_BUILTIN=ddp).
const BuiltinEnv = "TINYACC_PLUGIN_BUILTIN"

// Handshake is the go-plugin handshake of protocol version v.
func Handshake(v int) plugin.HandshakeConfig {
	return plugin.HandshakeConfig{ProtocolVersion: uint(v), MagicCookieKey: CookieKey, MagicCookieValue: CookieValue}
}

// dispenseName is the one go-plugin plugin a binary serves.
const dispenseName = "hooks"

// Hook names, as messages and errors spell them.
const (
	HookDescribe    = "Describe"
	HookPrepare     = "Prepare"
	HookPreForward  = "PreForward"
	HookGradReady   = "GradReady"
	HookPostGrad    = "PostGrad"
	HookPreStep     = "PreStep"
	HookPostStep    = "PostStep"
	HookReduceLoss  = "ReduceLoss"
	HookFinish      = "Finish"
	HookPing        = "Ping" // an empty round trip, for measuring the hook cost
	HookMemoryUsage = "MemoryUsage"
)

// Msg is one request or reply: a hook name and its msgpack body.
type Msg struct {
	Hook string
	Body []byte
}

// Info is what a plugin says about itself in the handshake.
type Info struct {
	// Name names the plugin in logs, errors and its keys' section.
	Name string
	// Serves is the strategy whose place the plugin takes in the
	// registry's order ("ddp"); "" for an extension, which runs after the
	// built-in strategies.
	Serves string
	// Comm asks for a communication group over the data-parallel ranks.
	Comm bool
	// Keys are the configuration keys the plugin reads, each under the
	// plugin's name ("nonfinite_guard.max_skips"); Key.Plugin may be left
	// empty.
	Keys []config.Declared
	// Protocol is filled in by Serve.
	Protocol int
}

// Param describes one parameter in the Prepare message: its global name
// and shape, and where its value and its gradient lie in the arena (byte
// offsets; float32 elements).
type Param struct {
	Name         string
	Shape        []int
	Value, Grad  int64
	DTypeFloat32 bool
}

// CommInfo is where the plugin processes of the data-parallel ranks meet:
// rank 0's plugin serves the rendezvous at Addr:Port.
type CommInfo struct {
	Rank, Size int
	Addr       string
	Port       int
	Token      string
}

// PrepareReq is the host's Prepare message.
type PrepareReq struct {
	Config     config.Config
	Rank       int
	World      int
	Arena      string // path of the arena file, to map once
	ArenaBytes int64
	Used       int64 // bytes of the arena the host's layout takes
	Params     []Param
	Comm       *CommInfo
	HostPID    int
}

// PrepareResp is the plugin's answer: where the gradients lie now, the
// data slice it chose (DataSize 0: unchanged), and the hooks it implements.
type PrepareResp struct {
	Grads              []int64
	DataRank, DataSize int
	Hooks              []string
}

// PassReq is the message of the per-micro-batch hooks.
type PassReq struct {
	Param int // GradReady: index in PrepareReq.Params
	Micro int
	Last  bool
}

func (p PassReq) info() tensor.PassInfo { return tensor.PassInfo{Micro: p.Micro, Last: p.Last} }

// hooksOf lists the hook interfaces p implements.
func hooksOf(p trainer.Plugin) []string {
	var out []string
	add := func(ok bool, name string) {
		if ok {
			out = append(out, name)
		}
	}
	_, ok := p.(trainer.PreForwarder)
	add(ok, HookPreForward)
	_, ok = p.(trainer.GradReadier)
	add(ok, HookGradReady)
	_, ok = p.(trainer.PostGrader)
	add(ok, HookPostGrad)
	_, ok = p.(trainer.PreStepper)
	add(ok, HookPreStep)
	_, ok = p.(trainer.PostStepper)
	add(ok, HookPostStep)
	_, ok = p.(trainer.LossReducer)
	add(ok, HookReduceLoss)
	_, ok = p.(trainer.Finisher)
	add(ok, HookFinish)
	return out
}

// checkUnsupported rejects hook interfaces a plugin process cannot serve.
func checkUnsupported(p trainer.Plugin) error {
	if _, ok := p.(trainer.StepOwner); ok {
		return fmt.Errorf("plugin %s owns the step (trainer.StepOwner); a step owner rewrites the model and must stay compiled", p.Name())
	}
	if _, ok := p.(trainer.Holder); ok {
		return fmt.Errorf("plugin %s holds parameters elsewhere (trainer.Holder); such a plugin must stay compiled", p.Name())
	}
	return nil
}
