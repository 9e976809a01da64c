package main

import (
	"strconv"
	"strings"

	"github.com/tinyacc/tinyacc/core/config"
)

// apiConfigGet is one key of a config as text, written as `tinyacc config
// show` writes it but with a string's quotes taken off ("cosine", "300",
// "0.0003", "30s"), so a C caller reads a key without parsing the JSON.
func apiConfigGet(h int64, key string) (string, error) {
	c, err := get[configObj](h)
	if err != nil {
		return "", err
	}
	v, ok := config.Values(c.cfg)[key]
	if !ok {
		return "", fail(errConfig, "config: unknown key %q ('tinyacc config show' lists every key)", key)
	}
	if strings.HasPrefix(v, `"`) {
		if s, err := strconv.Unquote(v); err == nil {
			v = s
		}
	}
	return v, nil
}

// apiConfigGetInt is one integer key of a config (train.steps,
// model.n_layer, ...); any other key is refused naming its value.
func apiConfigGetInt(h int64, key string) (int64, error) {
	v, err := apiConfigGet(h, key)
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, fail(errConfig, "config: %s is %q, not an integer; read it with tinyacc_config_get", key, v)
	}
	return n, nil
}
