package config

import (
	"errors"
	"fmt"
	"reflect"
	"sort"
	"strings"
	"time"
)

// Declared is a configuration key a process plugin declares in its
// handshake. It must lie under a section of its own, which names the plugin
// and cannot be one of Config's sections ("nonfinite_guard.max_skips"), so
// that a plugin can never shadow or collide with a built-in key.
type Declared struct {
	Key     string
	Type    string // "int", "float", "string", "bool", "duration" or "list"
	Default string // in the form a flag would take
	Plugin  string // the declaring plugin, for messages
}

// Declarer returns the keys that the plugin binaries at paths declare (it
// starts each one for its handshake). See LoadWith.
type Declarer func(paths []string) ([]Declared, error)

// pendingValue is a value of a key that no Config field has, kept until the
// plugins have declared their keys.
type pendingValue struct {
	raw    any
	origin string
}

// declaredTypes maps Declared.Type to the Go type its values convert to.
var declaredTypes = map[string]reflect.Type{
	"int":      reflect.TypeOf(int64(0)),
	"float":    reflect.TypeOf(float64(0)),
	"string":   reflect.TypeOf(""),
	"bool":     reflect.TypeOf(false),
	"duration": durationType,
	"list":     listType,
}

// maybeDeclared reports whether key could be a plugin's: dotted and under a
// top-level section Config does not have. Typos inside Config's own sections
// stay immediate errors.
func maybeDeclared(key string) bool {
	top, _, dotted := strings.Cut(key, ".")
	return dotted && top != "" && !isSection(top) && fieldByKey[top] == nil
}

// resolveDeclared resolves Config's own keys, then asks declare (when some
// plugin binaries are configured) for the plugins' keys and resolves their
// values from the same layers: default < file < env < flags. A value under
// a key nobody declared is the usual unknown-key error.
func resolveDeclared(layers []layer, declare Declarer) (*Resolved, error) {
	r, err := resolveBuiltin(layers)
	if err != nil {
		return nil, err
	}
	var decl []Declared
	if declare != nil && len(r.Config.Plugins.Process) > 0 {
		if decl, err = declare(r.Config.Plugins.Process); err != nil {
			return nil, err
		}
	}
	var errs []error
	byKey := map[string]Declared{}
	for _, d := range decl {
		typ, ok := declaredTypes[d.Type]
		switch {
		case !maybeDeclared(d.Key):
			errs = append(errs, fmt.Errorf("config: plugin %s declares key %q, which is not under a section of its own (use %s.NAME, outside the built-in sections)", d.Plugin, d.Key, d.Plugin))
			continue
		case !ok:
			errs = append(errs, fmt.Errorf("config: plugin %s declares key %q of type %q; types are int, float, string, bool, duration and list", d.Plugin, d.Key, d.Type))
			continue
		}
		if prev, dup := byKey[d.Key]; dup {
			errs = append(errs, fmt.Errorf("config: plugins %s and %s both declare key %q", prev.Plugin, d.Plugin, d.Key))
			continue
		}
		v, ok := convert(d.Default, typ)
		if !ok {
			errs = append(errs, fmt.Errorf("config: plugin %s declares key %q with default %q, which is not %s", d.Plugin, d.Key, d.Default, typeName(typ)))
			continue
		}
		byKey[d.Key] = d
		if r.Config.Declared == nil {
			r.Config.Declared = map[string]string{}
		}
		r.Config.Declared[d.Key] = formatDeclared(v)
		r.sources[d.Key] = "default (plugin " + d.Plugin + ")"
	}
	for _, l := range layers {
		keys := make([]string, 0, len(l.pending))
		for key := range l.pending {
			keys = append(keys, key)
		}
		sort.Strings(keys)
		for _, key := range keys {
			p := l.pending[key]
			d, ok := byKey[key]
			if !ok {
				errs = append(errs, unknownKeyError(key, p.origin))
				continue
			}
			v, ok := convert(p.raw, declaredTypes[d.Type])
			if !ok {
				errs = append(errs, fmt.Errorf("config: %s=%s (from %s) is not %s: use a value such as %s (key of plugin %s)",
					key, showRaw(p.raw), p.origin, typeName(declaredTypes[d.Type]), d.Default, d.Plugin))
				continue
			}
			r.Config.Declared[key] = formatDeclared(v)
			r.sources[key] = p.origin
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return r, nil
}

// formatDeclared is the canonical text of a plugin key's value, which the
// plugin parses back: strings unquoted, lists comma-separated.
func formatDeclared(v reflect.Value) string {
	switch {
	case v.Type() == listType:
		return strings.Join(v.Interface().([]string), ",")
	case v.Type() == durationType:
		return time.Duration(v.Int()).String()
	case v.Kind() == reflect.String:
		return v.String()
	}
	return formatValue(v)
}
