package config

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/knadh/koanf/providers/confmap"
	"github.com/knadh/koanf/providers/rawbytes"
	"github.com/knadh/koanf/v2"
)

// LoadText is Load with a YAML or JSON document in place of the file, for
// the bindings (a Python dict, C text): defaults < text < TINYACC_*
// environment < args, the same layers, checks and errors as the command
// line. Blank text is no layer. Values from the text report their source
// as "text".
func LoadText(text string, env []string, args []string) (*Resolved, error) {
	var layers []layer
	var errs []error
	if strings.TrimSpace(text) != "" {
		l, err := textLayer(text)
		if err != nil {
			errs = append(errs, err)
		} else {
			layers = append(layers, l)
		}
	}
	return loadOver(layers, errs, env, args, nil)
}

// textLayer reads a YAML or JSON document (text that starts with "{" is
// read as JSON, which keeps 64-bit integers exact) as one checked layer.
func textLayer(text string) (layer, error) {
	if len(text) > MaxTextBytes {
		return layer{}, fmt.Errorf("config: config text is %d bytes, over the limit of %d (1 MiB); a config needs a few KiB", len(text), MaxTextBytes)
	}
	k := koanf.New(".")
	var err error
	if strings.HasPrefix(strings.TrimSpace(text), "{") {
		var m map[string]any
		dec := json.NewDecoder(strings.NewReader(text))
		dec.UseNumber()
		err = dec.Decode(&m)
		if err == nil && dec.More() {
			err = errors.New("unexpected text after the JSON object")
		}
		if err == nil {
			err = k.Load(confmap.Provider(m, ""), nil)
		}
	} else {
		err = k.Load(rawbytes.Provider([]byte(text)), boundedYAML{})
	}
	if err != nil {
		return layer{}, fmt.Errorf("config: parsing config text: %w", err)
	}
	return checkedLayer(k, func(string) string { return "text" })
}
