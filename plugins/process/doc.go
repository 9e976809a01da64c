// Package process runs plugins as processes of their own: binaries named in
// plugins.process, and DDP when ddp.process is true (tinyacc itself, started
// as a plugin that serves the compiled ddp package). The plugin side is
// package pluginsdk, which also describes the protocol.
//
// A Plugin here stands in the trainer's plugin list for the process it
// started: every hook the process implements is forwarded to it as one
// msgpack message over go-plugin's net/rpc connection, except GradReady,
// which is sent one way on a pipe and waited for at PostGrad (see
// pluginsdk.Notice), and the tensors stay in the shared-memory arena both
// sides map. A process that crashes, exits
// or does not answer within comm.timeout ends the step with an error that
// names the plugin, its binary and the hook; it is then killed, and Close
// (which the command line defers) kills it in every other case. The plugin
// processes also end themselves when the trainer dies.
package process
