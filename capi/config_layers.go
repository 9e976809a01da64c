package main

import (
	"os"
	"strings"

	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/config"
)

// apiConfigResolve resolves the layers of the command line, every one of
// them in core/config's loader: the defaults, a YAML file or YAML/JSON
// text (at most one of the two), the TINYACC_* environment, then flags,
// one "--key=value" per line of args (the top layer: the explicit
// arguments of a binding, as a Python keyword argument). The same file,
// environment and flags give the config `tinyacc config show` prints.
func apiConfigResolve(file, text, args string) (int64, error) {
	if file != "" && strings.TrimSpace(text) != "" {
		return 0, fail(errInvalidArg, "config: give a file or text, not both")
	}
	var flags []string
	for _, line := range strings.Split(args, "\n") {
		if line = strings.TrimSpace(line); line != "" {
			flags = append(flags, line)
		}
	}
	var r *config.Resolved
	var err error
	if file != "" {
		r, err = config.Load(file, os.Environ(), flags)
	} else {
		r, err = config.LoadText(text, os.Environ(), flags)
	}
	if err != nil {
		return 0, wrap(errConfig, err)
	}
	return register(&configObj{cfg: r.Config}), nil
}

// worldOptions are the options the world group is joined with: the
// comm.timeout of the config the environment resolves (defaults <
// TINYACC_*), so that TINYACC_COMM__TIMEOUT bounds every collective and
// barrier of a program on the C ABI, as it bounds the command line's. An
// environment the loader refuses (an unknown TINYACC_ variable) is that
// error, before any connection.
func worldOptions() (comm.Options, error) {
	r, err := config.Load("", os.Environ(), nil)
	if err != nil {
		return comm.Options{}, wrap(errConfig, err)
	}
	return comm.Options{Timeout: r.Config.Comm.Timeout}, nil
}
