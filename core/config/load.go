package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"reflect"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/knadh/koanf/providers/confmap"
	envprovider "github.com/knadh/koanf/providers/env/v2"
	"github.com/knadh/koanf/providers/rawbytes"
	"github.com/knadh/koanf/v2"
)

// Resolved is a configuration together with the origin of every value.
type Resolved struct {
	Config  Config
	sources map[string]string
}

// layer is one source of values after its keys have been checked. origin
// maps each key to the text that Sources reports ("env TINYACC_TRAIN__LR").
type layer struct {
	values map[string]reflect.Value
	origin map[string]string
	// pending holds the values of keys under a section Config does not
	// have: they may belong to a process plugin (see LoadWith) and are
	// checked once the plugins have declared their keys.
	pending map[string]pendingValue
}

// Load resolves defaults < YAML file < environment < flags and validates the
// result. file may be "" for no file. env is an os.Environ-style list of
// "NAME=value" entries; only TINYACC_ names outside ReservedEnv are read.
// args are the flags left over after the CLI took its own, each
// "--key=value" or "--key value". All problems found in all layers are
// reported together, so one run shows every mistake in a config.
func Load(file string, env []string, args []string) (*Resolved, error) {
	return LoadWith(file, env, args, nil)
}

// LoadWith is Load for runs with process plugins: once the layers are read,
// declare is asked for the keys the binaries of plugins.process declare
// (see Declared), and values under those keys are checked and kept in
// Config.Declared like any other value. declare may be nil (no plugin keys).
func LoadWith(file string, env []string, args []string, declare Declarer) (*Resolved, error) {
	var layers []layer
	var errs []error
	if file != "" {
		l, err := fileLayer(file)
		if err != nil {
			errs = append(errs, err)
		} else {
			layers = append(layers, l)
		}
	}
	return loadOver(layers, errs, env, args, declare)
}

// loadOver lays the environment and the flags over the layers read so far
// (errs: the problems found reading them) and resolves the result.
func loadOver(layers []layer, errs []error, env []string, args []string, declare Declarer) (*Resolved, error) {
	errs = append(errs, CheckReservedEnv(env))
	l, err := envLayer(env)
	errs = append(errs, err)
	layers = append(layers, l)

	l, err = flagLayer(args)
	errs = append(errs, err)
	layers = append(layers, l)

	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	r, err := resolveDeclared(layers, declare)
	if err != nil {
		return nil, err
	}
	if err := capReadmeSteps(r, env); err != nil {
		return nil, err
	}
	return r, nil
}

// FromMap builds a validated Config from the defaults plus overrides. Keys
// may be flat ("train.lr") or nested maps ("train": {"lr": ...}); values may
// be typed or strings.
func FromMap(m map[string]any) (*Config, error) {
	k := koanf.New(".")
	if err := k.Load(confmap.Provider(m, "."), nil); err != nil {
		return nil, fmt.Errorf("config: reading override map: %w", err)
	}
	l, err := checkedLayer(k, func(string) string { return "map" })
	if err != nil {
		return nil, err
	}
	r, err := resolve([]layer{l})
	if err != nil {
		return nil, err
	}
	return &r.Config, nil
}

// FromText resolves defaults plus a YAML or JSON document (text that starts
// with "{" is read as JSON, which keeps 64-bit integers exact) and validates
// the result. Values from the text report their source as "text".
func FromText(text string) (*Resolved, error) {
	l, err := textLayer(text)
	if err != nil {
		return nil, err
	}
	return resolve([]layer{l})
}

// resolve is resolveDeclared with no plugin keys.
func resolve(layers []layer) (*Resolved, error) { return resolveDeclared(layers, nil) }

// resolveBuiltin lays the checked layers over the defaults, later layers
// winning, and validates the result.
func resolveBuiltin(layers []layer) (*Resolved, error) {
	r := &Resolved{Config: Defaults(), sources: make(map[string]string, len(fields))}
	for i := range fields {
		r.sources[fields[i].key] = "default"
	}
	for _, l := range layers {
		for key, v := range l.values {
			fieldOf(&r.Config, fieldByKey[key]).Set(v)
			r.sources[key] = l.origin[key]
		}
	}
	if err := r.Config.resolveTie(r.sources["model.tie_embeddings"]); err != nil { // llama.go
		return nil, err
	}
	r.Config.resolveLoRATargets(r.sources["lora.targets"]) // lora.go
	if err := r.Config.Validate(); err != nil {
		return nil, err
	}
	return r, nil
}

func fileLayer(path string) (layer, error) {
	k := koanf.New(".")
	b, err := readConfigFile(path)
	if err == nil {
		err = k.Load(rawbytes.Provider(b), boundedYAML{})
	}
	if err != nil {
		return layer{}, fmt.Errorf("config: reading config file %q: %w", path, err)
	}
	origin := "file " + path
	return checkedLayer(k, func(string) string { return origin })
}

// checkedLayer flattens a koanf tree and checks every key and value in it.
// YAML null and empty sections mean "not set here" and are skipped, so a
// file can keep a commented-out section header.
func checkedLayer(k *koanf.Koanf, originOf func(key string) string) (layer, error) {
	l := layer{values: map[string]reflect.Value{}, origin: map[string]string{}, pending: map[string]pendingValue{}}
	var errs []error
	flat := k.All()
	keys := make([]string, 0, len(flat))
	for key := range flat {
		keys = append(keys, key)
	}
	sort.Strings(keys)
	for _, key := range keys {
		raw := flat[key]
		if raw == nil {
			continue
		}
		if m, ok := raw.(map[string]any); ok && len(m) == 0 && (isSection(key) || key == "") {
			continue
		}
		if maybeDeclared(key) {
			l.pending[key] = pendingValue{raw: raw, origin: originOf(key)}
			continue
		}
		v, err := checkValue(key, raw, originOf(key))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		l.values[key] = v
		l.origin[key] = originOf(key)
	}
	return l, joinBounded(errs)
}

// checkKey rejects keys that are not values of Config: unknown names and
// whole sections.
func checkKey(key string, raw any, origin string) error {
	if _, ok := fieldByKey[key]; ok {
		return nil
	}
	if isSection(key) {
		return sectionValueError(key, raw, origin)
	}
	return unknownKeyError(key, origin)
}

// checkValue validates one key and converts its value to the field's type.
func checkValue(key string, raw any, origin string) (reflect.Value, error) {
	if err := checkKey(key, raw, origin); err != nil {
		return reflect.Value{}, err
	}
	f := fieldByKey[key]
	v, ok := convert(raw, f.typ)
	if !ok {
		return reflect.Value{}, typeError(f, raw, origin)
	}
	return v, nil
}

// envLayer reads TINYACC_ variables through koanf's env provider. The
// transform maps names to keys and drops reserved and unknown names before
// the provider unflattens its result, where an unchecked name such as
// TINYACC_TRAIN would collide with the train section.
func envLayer(environ []string) (layer, error) {
	var problems []error
	names := map[string]string{}
	p := envprovider.Provider(".", envprovider.Opt{
		Prefix:      EnvPrefix,
		EnvironFunc: func() []string { return environ },
		TransformFunc: func(name, value string) (string, any) {
			if slices.Contains(ReservedEnv, name) {
				return "", nil
			}
			key := strings.ToLower(strings.ReplaceAll(strings.TrimPrefix(name, EnvPrefix), "__", "."))
			if err := checkKey(key, value, "env "+name); err != nil && !maybeDeclared(key) {
				problems = append(problems, withEnvSuggestion(err, name))
				return "", nil
			}
			if prev, dup := names[key]; dup {
				problems = append(problems, fmt.Errorf("config: both %s and %s set %q: unset one of them", prev, name, key))
				return "", nil
			}
			names[key] = name
			return key, value
		},
	})
	k := koanf.New(".")
	if err := k.Load(p, nil); err != nil {
		return layer{}, fmt.Errorf("config: reading environment: %w", err)
	}
	l, err := checkedLayer(k, func(key string) string { return "env " + names[key] })
	// The environment has no meaningful order; sorting keeps messages stable.
	sort.Slice(problems, func(i, j int) bool { return problems[i].Error() < problems[j].Error() })
	return l, errors.Join(append(problems, err)...)
}

// flagLayer parses "--key=value" and "--key value" arguments. A bool key may
// also stand alone ("--x.enabled") to mean true. When a flag is repeated the
// last one wins, as with most command-line tools.
func flagLayer(args []string) (layer, error) {
	var errs []error
	flat := map[string]any{}
	for i := 0; i < len(args); i++ {
		arg := args[i]
		name, value, hasValue := strings.Cut(strings.TrimPrefix(arg, "--"), "=")
		if !strings.HasPrefix(arg, "--") || name == "" {
			errs = append(errs, fmt.Errorf("config: unexpected argument %q: config flags look like --key=value (e.g. --train.lr=1e-3)", arg))
			continue
		}
		f := fieldByKey[name]
		nextIsValue := i+1 < len(args) && !strings.HasPrefix(args[i+1], "--")
		if !hasValue {
			switch {
			case f != nil && f.typ.Kind() == reflect.Bool:
				value = "true"
				if nextIsValue {
					if _, ok := convert(args[i+1], f.typ); ok {
						value = args[i+1]
						i++
					}
				}
			case nextIsValue:
				value = args[i+1]
				i++
			case f != nil:
				errs = append(errs, fmt.Errorf("config: flag --%s needs a value: write --%s=VALUE", name, name))
				continue
			}
		}
		if err := checkKey(name, value, "flag --"+name); err != nil && !maybeDeclared(name) {
			errs = append(errs, err)
			continue
		}
		flat[name] = value
	}
	// The values go through koanf like every other layer, so all layers are
	// flattened and checked by the same code.
	k := koanf.New(".")
	if err := k.Load(confmap.Provider(flat, "."), nil); err != nil {
		return layer{}, fmt.Errorf("config: reading flags: %w", err)
	}
	l, err := checkedLayer(k, func(key string) string { return "flag --" + key })
	return l, errors.Join(append(errs, err)...)
}

// Sources maps every key to where its resolved value came from: "default",
// "file FILE", "env TINYACC_X__Y", "flag --x.y" (or "text"/"map" for
// FromText/FromMap). The map is a copy.
func (r *Resolved) Sources() map[string]string {
	out := make(map[string]string, len(r.sources))
	for k, v := range r.sources {
		out[k] = v
	}
	return out
}

// Show writes every key with its value and source, sorted by key, in aligned
// columns, so a user can see exactly which layer set what.
func (r *Resolved) Show(w io.Writer) error {
	var buf bytes.Buffer
	tw := tabwriter.NewWriter(&buf, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tVALUE\tSOURCE")
	rows := make([][3]string, 0, len(fields)+len(r.Config.Declared))
	for i := range fields {
		f := &fields[i]
		rows = append(rows, [3]string{f.key, formatValue(fieldOf(&r.Config, f)), r.sources[f.key]})
	}
	for key, v := range r.Config.Declared {
		rows = append(rows, [3]string{key, v, r.sources[key]})
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i][0] < rows[j][0] })
	for _, row := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", row[0], row[1], row[2])
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("config: formatting: %w", err)
	}
	if _, err := w.Write(buf.Bytes()); err != nil {
		return fmt.Errorf("config: writing configuration: %w", err)
	}
	return nil
}
