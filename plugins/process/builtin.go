package process

import (
	"errors"
	"fmt"
	"os"

	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/trainer"
	"github.com/tinyacc/tinyacc/plugins/ddp"
	"github.com/tinyacc/tinyacc/pluginsdk"
)

// Executable is the binary that serves the compiled-in plugins as
// processes: tinyacc itself (a test binary serves them from its TestMain).
var Executable = os.Executable

// ServeBuiltin serves a compiled-in plugin when this process was started
// as one (TINYACC_PLUGIN_BUILTIN set by its host), and never returns then;
// otherwise it returns at once. Call it first thing in main (and in the
// TestMain of tests that start ddp.process runs).
func ServeBuiltin() {
	switch os.Getenv(pluginsdk.BuiltinEnv) {
	case "":
		return
	case "ddp":
		pluginsdk.Serve(pluginsdk.Info{Name: "ddp", Serves: "ddp", Comm: true}, func(e *pluginsdk.Env) (trainer.Plugin, error) {
			return ddp.FromConfig(e.Group, e.Trainer.Cfg)
		})
	default:
		fmt.Fprintf(os.Stderr, "tinyacc: %s=%q names no compiled-in plugin (ddp is the one there is)\n", pluginsdk.BuiltinEnv, os.Getenv(pluginsdk.BuiltinEnv))
	}
	os.Exit(1)
}

// NewDDP starts DDP as a plugin process for this rank (rank names it in
// the process's output) over the data-parallel group g.
func NewDDP(g comm.Group, rank int) (*Plugin, error) {
	exe, err := Executable()
	if err != nil {
		return nil, fmt.Errorf("ddp.process: finding the tinyacc binary to serve ddp: %w", err)
	}
	p, err := Start(exe, Options{Env: []string{pluginsdk.BuiltinEnv + "=ddp"}, Rank: rank})
	if err != nil {
		return nil, err
	}
	p.SetGroup(g)
	return p, nil
}

// Declare starts each plugin binary for its handshake and returns the keys
// they declare; it is the config.Declarer of the command line.
func Declare(paths []string) ([]config.Declared, error) {
	var out []config.Declared
	for _, path := range paths {
		p, err := Start(path, Options{Rank: -1})
		if err != nil {
			return nil, err
		}
		out = append(out, p.Info.Keys...)
		p.Close()
	}
	return out, nil
}

// StartAll starts the plugin binaries of plugins.process for this rank, in
// order. A plugin that serves ddp gets g as its group.
func StartAll(cfg config.Config, g comm.Group, rank int) ([]*Plugin, error) {
	var out []*Plugin
	for _, path := range cfg.Plugins.Process {
		p, err := Start(path, Options{Rank: rank})
		if err != nil {
			CloseAll(out)
			return nil, err
		}
		if p.Info.Serves != "" && p.Info.Serves != "ddp" {
			CloseAll(append(out, p))
			return nil, fmt.Errorf("process plugin %s (%s) serves %q; a plugin process may serve ddp or be an extension (serves nothing)", p.Info.Name, path, p.Info.Serves)
		}
		p.SetGroup(g)
		out = append(out, p)
	}
	return out, nil
}

// CloseAll ends the plugin processes among ps (a trainer's plugin list or
// the result of StartAll).
func CloseAll[T any](ps []T) error {
	var errs []error
	for _, x := range ps {
		if p, ok := any(x).(*Plugin); ok {
			errs = append(errs, p.Close())
		}
	}
	return errors.Join(errs...)
}
