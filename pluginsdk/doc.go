// Package pluginsdk serves a tinyacc plugin from a process of its own, and
// holds the protocol its host (plugins/process) speaks to it.
//
// A plugin written for the compiled form (a trainer.Plugin implementing
// some of the hook interfaces of core/trainer/plugin.go) becomes a binary
// with a main that calls Serve:
//
//	func main() {
//		pluginsdk.Serve(pluginsdk.Info{Name: "guard", Keys: ...}, func(e *pluginsdk.Env) (trainer.Plugin, error) {
//			return &Guard{...}, nil
//		})
//	}
//
// and tinyacc runs it with plugins.process: [path/to/binary]. The host
// starts the binary through hashicorp/go-plugin (net/rpc over a local
// socket) with a versioned handshake; the messages are msgpack and small.
// GradReady alone is a one-way notice on a pipe (fd 3 of the plugin
// process), so that backward does not wait a round trip per parameter;
// see Notice.
// Tensors never travel over RPC: the host lays the parameters and their
// gradients out in a shared-memory arena (a /dev/shm file named
// tinyacc-<host pid>-*, removed as soon as the plugin has mapped it), and
// messages name them by index in the parameter list (whose order and
// global names the Prepare message carries) and by byte offset in the
// arena.
//
// In the plugin process the hooks receive a *trainer.Trainer that mirrors
// the host's: the same config, a model of the same shape whose parameters
// and gradients are the arena's memory (so a hook that changes them in
// place changes the host's), this rank's place, and, for a plugin that
// asks for one (Info.Comm), a communication group of its own over the tcp
// backend joining the plugin processes of the other data-parallel ranks.
// What a plugin allocates from Trainer.Alloc during Prepare also lies in
// the arena; gradients it re-lays there (DDP's buckets) are adopted by the
// host. A plugin that rewrites the model or re-lays the parameters (tensor,
// context or pipeline parallel, ZeRO) must stay compiled.
package pluginsdk
