package pluginsdk

import (
	"encoding/binary"
	"fmt"

	"github.com/hashicorp/go-plugin"

	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/tensor"
	"github.com/tinyacc/tinyacc/core/trainer"
)

// ProtocolVersion is the version of the messages below. A host and a
// plugin built against different versions refuse each other in the
// handshake, naming both. Version 2 made GradReady a one-way notice (see
// Notice).
const ProtocolVersion = 2

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
	Micro int
	Last  bool
}

// NoticeFD is the plugin process's file descriptor on which the host
// writes its GradReady notices: the read end of a pipe, the first of the
// command's extra files.
const NoticeFD = 3

// NoticeBytes is the size of one notice on the pipe (below PIPE_BUF, so
// each write is atomic).
const NoticeBytes = 12

// Notice is one GradReady, sent one way. A GradReady answered over RPC
// would stop backward for a round trip per parameter (most of a step's
// cost over a plugin process's own compute, for DDP), so the host writes
// the notice to the pipe and goes on; the plugin runs its GradReady hooks
// in the order of the notices while backward continues (DDP's buckets
// start their all-reduce from there, overlapping backward as when
// compiled). Before its next call of any other hook the host makes a
// GradReady call whose GradsReq says how many notices it sent since the
// previous one: the plugin answers once it has run that many, with the
// first of their errors, so an error or a hang is still reported within
// the step, naming GradReady.
type Notice struct {
	// Param is the index in PrepareReq.Params; -1 is a notice that only
	// counts (it measures the cost of one).
	Param int32
	Micro int32
	Last  bool
}

// Encode writes n to b (NoticeBytes long).
func (n Notice) Encode(b []byte) {
	binary.LittleEndian.PutUint32(b[0:], uint32(n.Param))
	binary.LittleEndian.PutUint32(b[4:], uint32(n.Micro))
	var last uint32
	if n.Last {
		last = 1
	}
	binary.LittleEndian.PutUint32(b[8:], last)
}

// DecodeNotice reads a notice from b (NoticeBytes long).
func DecodeNotice(b []byte) Notice {
	return Notice{
		Param: int32(binary.LittleEndian.Uint32(b[0:])),
		Micro: int32(binary.LittleEndian.Uint32(b[4:])),
		Last:  binary.LittleEndian.Uint32(b[8:]) != 0,
	}
}

// GradsReq is the body of a GradReady call: the number of notices sent
// since the previous GradReady call.
type GradsReq struct {
	Notices int
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
