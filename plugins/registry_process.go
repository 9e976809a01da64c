package plugins

import (
	"github.com/tinyacc/tinyacc/core/trainer"
	"github.com/tinyacc/tinyacc/plugins/ddp"
	"github.com/tinyacc/tinyacc/plugins/process"
)

// placeProcesses puts the plugin processes of plugins.process into the
// order of the compiled plugins: one that serves ddp replaces the compiled
// DDP where it stands, the extensions follow everything else.
func placeProcesses(compiled []trainer.Plugin, ext []*process.Plugin) []trainer.Plugin {
	out := compiled
	for _, p := range ext {
		if p.Info.Serves == "ddp" {
			for i, c := range out {
				if _, ok := c.(*ddp.DDP); ok {
					out[i] = p
					p = nil
					break
				}
			}
		}
		if p != nil {
			out = append(out, p)
		}
	}
	return out
}

func asPlugins(ps []*process.Plugin) []trainer.Plugin {
	var out []trainer.Plugin
	for _, p := range ps {
		out = append(out, p)
	}
	return out
}
