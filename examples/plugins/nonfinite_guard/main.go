// Command nonfinite_guard is package guard served as a tinyacc plugin
// process. Build it and name it in the config:
//
//	go build -o build/nonfinite_guard ./examples/plugins/nonfinite_guard
//	build/tinyacc train --plugins.process=build/nonfinite_guard --nonfinite_guard.max_norm=5.5 --train.steps=30
package main

import (
	"github.com/tinyacc/tinyacc/core/trainer"
	"github.com/tinyacc/tinyacc/examples/plugins/nonfinite_guard/guard"
	"github.com/tinyacc/tinyacc/pluginsdk"
)

func main() {
	pluginsdk.Serve(pluginsdk.Info{Name: guard.Name, Keys: guard.Keys}, func(e *pluginsdk.Env) (trainer.Plugin, error) {
		return &guard.Guard{
			MaxSkips: e.IntKey(guard.Name + ".max_skips"),
			MaxNorm:  e.FloatKey(guard.Name + ".max_norm"),
			Log:      e.Log,
		}, nil
	})
}
