package config

import (
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"time"
)

// field describes one leaf key of Config: its dotted name, where it lives in
// the struct, and its Go type (which decides how values are parsed).
type field struct {
	key   string
	index []int
	typ   reflect.Type
}

var (
	durationType = reflect.TypeOf(time.Duration(0))
	listType     = reflect.TypeOf([]string(nil))
)

// The key table is built once from the Config type, so it can never drift
// from the struct.
var (
	fields     = buildFields(reflect.TypeOf(Config{}))
	fieldByKey = indexFields(fields)
	// children maps a section ("" for the top level) to the sorted names
	// directly inside it; it feeds the "known keys in ..." hint.
	children = buildChildren(fields)
)

// buildFields walks t depth-first and returns its leaf keys sorted by name. A
// field type the loader cannot parse is a programming error in Config, so it
// panics at package initialization rather than surfacing at run time.
func buildFields(t reflect.Type) []field {
	var out []field
	var walk func(t reflect.Type, prefix string, index []int)
	walk = func(t reflect.Type, prefix string, index []int) {
		for i := 0; i < t.NumField(); i++ {
			sf := t.Field(i)
			name := sf.Tag.Get("koanf")
			if name == "" || name == "-" || !sf.IsExported() {
				continue
			}
			key := prefix + name
			idx := append(append([]int(nil), index...), i)
			if sf.Type.Kind() == reflect.Struct {
				walk(sf.Type, key+".", idx)
				continue
			}
			if typeName(sf.Type) == "" {
				panic(fmt.Sprintf("config: field %s (key %q) has type %s, which the loader cannot parse; use int, int64, float64, string, bool or time.Duration", sf.Name, key, sf.Type))
			}
			out = append(out, field{key: key, index: idx, typ: sf.Type})
		}
	}
	walk(t, "", nil)
	sort.Slice(out, func(i, j int) bool { return out[i].key < out[j].key })
	return out
}

func indexFields(fs []field) map[string]*field {
	m := make(map[string]*field, len(fs))
	for i := range fs {
		m[fs[i].key] = &fs[i]
	}
	return m
}

func buildChildren(fs []field) map[string][]string {
	sets := map[string]map[string]bool{}
	for _, f := range fs {
		parts := strings.Split(f.key, ".")
		for i := range parts {
			section := strings.Join(parts[:i], ".")
			if sets[section] == nil {
				sets[section] = map[string]bool{}
			}
			sets[section][parts[i]] = true
		}
	}
	out := make(map[string][]string, len(sets))
	for section, names := range sets {
		list := make([]string, 0, len(names))
		for n := range names {
			list = append(list, n)
		}
		sort.Strings(list)
		out[section] = list
	}
	return out
}

// Keys returns every known configuration key, sorted.
func Keys() []string {
	out := make([]string, len(fields))
	for i, f := range fields {
		out[i] = f.key
	}
	return out
}

// isSection reports whether key names a section rather than a value.
func isSection(key string) bool {
	_, ok := children[key]
	return ok && key != ""
}

// unknownKeyError explains an unknown key and lists what the closest existing
// section does contain, which is usually enough to spot the typo.
func unknownKeyError(key, origin string) error {
	section := key
	for {
		i := strings.LastIndex(section, ".")
		if i < 0 {
			section = ""
			break
		}
		section = section[:i]
		if isSection(section) {
			break
		}
	}
	if section == "" {
		return fmt.Errorf("config: unknown key %q (from %s); known top-level keys: %s",
			key, origin, strings.Join(children[""], ", "))
	}
	return fmt.Errorf("config: unknown key %q (from %s); known keys in %q: %s",
		key, origin, section, strings.Join(children[section], ", "))
}

// sectionValueError rejects a plain value given for a whole section.
func sectionValueError(key string, raw any, origin string) error {
	return fmt.Errorf("config: key %q (from %s) is a section, not a value (got %s); set its keys instead: %s",
		key, origin, showRaw(raw), strings.Join(children[key], ", "))
}

// typeName is the human name of the values a type accepts, or "" for types
// the loader does not support.
func typeName(t reflect.Type) string {
	if t == durationType {
		return "a duration"
	}
	if t == listType {
		return "a list of strings"
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	}
	return ""
}

// convert turns a raw layer value into a value of type t. Layers hand over
// either strings (environment, flags) or typed scalars (YAML, JSON, maps);
// both are accepted, but nothing is coerced across kinds silently: a bool is
// never an integer and a fractional number is never truncated.
func convert(raw any, t reflect.Type) (reflect.Value, bool) {
	v := reflect.New(t).Elem()
	if n, ok := raw.(json.Number); ok {
		raw = string(n)
	}
	if t == durationType {
		switch x := raw.(type) {
		case string:
			d, err := time.ParseDuration(strings.TrimSpace(x))
			if err != nil {
				return v, false
			}
			v.SetInt(int64(d))
			return v, true
		case time.Duration:
			v.SetInt(int64(x))
			return v, true
		}
		return v, false
	}
	if t == listType {
		l, ok := toList(raw)
		if ok {
			v.Set(reflect.ValueOf(l))
		}
		return v, ok
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		i, ok := toInt(raw)
		if !ok || v.OverflowInt(i) {
			return v, false
		}
		v.SetInt(i)
	case reflect.Float32, reflect.Float64:
		f, ok := toFloat(raw)
		if !ok || math.IsNaN(f) || math.IsInf(f, 0) || v.OverflowFloat(f) {
			return v, false
		}
		v.SetFloat(f)
	case reflect.String:
		s, ok := raw.(string)
		if !ok {
			return v, false
		}
		v.SetString(s)
	case reflect.Bool:
		switch x := raw.(type) {
		case bool:
			v.SetBool(x)
		case string:
			b, err := strconv.ParseBool(strings.TrimSpace(x))
			if err != nil {
				return v, false
			}
			v.SetBool(b)
		default:
			return v, false
		}
	default:
		return v, false
	}
	return v, true
}

// toList accepts a YAML list of strings, or one string of comma-separated
// items (environment, flags), in brackets or not ("[a, b]" is how `config
// show` prints a list, so its output can be given back); blanks around
// items and empty items are dropped, so "" and "[]" are the empty list.
func toList(raw any) ([]string, bool) {
	out := []string{}
	switch x := raw.(type) {
	case string:
		if t := strings.TrimSpace(x); strings.HasPrefix(t, "[") && strings.HasSuffix(t, "]") {
			x = t[1 : len(t)-1]
		}
		for _, item := range strings.Split(x, ",") {
			if item = strings.TrimSpace(item); item != "" {
				out = append(out, item)
			}
		}
	case []string:
		return toList(strings.Join(x, ","))
	case []any:
		for _, item := range x {
			s, ok := item.(string)
			if !ok {
				return nil, false
			}
			if s = strings.TrimSpace(s); s != "" {
				out = append(out, s)
			}
		}
	default:
		return nil, false
	}
	return out, true
}

// toInt accepts integers of any width, decimal strings, and floats that hold
// a whole number (JSON has only one number type).
func toInt(raw any) (int64, bool) {
	rv := reflect.ValueOf(raw)
	switch rv.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return rv.Int(), true
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		u := rv.Uint()
		if u > math.MaxInt64 {
			return 0, false
		}
		return int64(u), true
	case reflect.Float32, reflect.Float64:
		f := rv.Float()
		if f != math.Trunc(f) || f < math.MinInt64 || f >= math.MaxInt64 {
			return 0, false
		}
		return int64(f), true
	case reflect.String:
		i, err := strconv.ParseInt(strings.TrimSpace(rv.String()), 10, 64)
		return i, err == nil
	}
	return 0, false
}

func toFloat(raw any) (float64, bool) {
	rv := reflect.ValueOf(raw)
	switch rv.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return float64(rv.Int()), true
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return float64(rv.Uint()), true
	case reflect.Float32, reflect.Float64:
		return rv.Float(), true
	case reflect.String:
		f, err := strconv.ParseFloat(strings.TrimSpace(rv.String()), 64)
		return f, err == nil
	}
	return 0, false
}

// typeError names the key, the offending value and its layer, and says what a
// well-formed value looks like (for numbers, the key's default).
func typeError(f *field, raw any, origin string) error {
	var hint string
	switch {
	case f.typ == durationType:
		hint = "use a number with a unit such as 30s or 2m"
	case f.typ.Kind() == reflect.String:
		hint = "quote it in YAML"
	case f.typ.Kind() == reflect.Bool:
		hint = "use true or false"
	case f.typ == listType:
		hint = "use a YAML list of strings, or items separated by commas"
	default:
		hint = "use a value such as " + formatValue(fieldOf(defaultConfig(), f))
	}
	return fmt.Errorf("config: %s=%s (from %s) is not %s: %s",
		f.key, showRaw(raw), origin, typeName(f.typ), hint)
}

// showRaw prints a layer value the way the user wrote it: strings quoted,
// everything else as Go prints it.
func showRaw(raw any) string {
	var s string
	switch x := raw.(type) {
	case string:
		s = strconv.Quote(x)
	case json.Number:
		s = string(x)
	case float64:
		s = strconv.FormatFloat(x, 'g', -1, 64)
	default:
		s = fmt.Sprint(raw)
	}
	if len(s) > maxShownValue { // a message names a value, it need not hold all of it
		s = s[:maxShownValue] + "..."
	}
	return s
}

// formatValue prints a resolved value for Show: strings quoted so that an
// empty string is visible, floats in their shortest exact form.
func formatValue(v reflect.Value) string {
	if v.Type() == durationType {
		return time.Duration(v.Int()).String()
	}
	if v.Type() == listType {
		return "[" + strings.Join(v.Interface().([]string), ", ") + "]"
	}
	switch v.Kind() {
	case reflect.String:
		return strconv.Quote(v.String())
	case reflect.Float32, reflect.Float64:
		return strconv.FormatFloat(v.Float(), 'g', -1, 64)
	}
	return fmt.Sprint(v.Interface())
}

func defaultConfig() *Config {
	c := Defaults()
	return &c
}

func fieldOf(c *Config, f *field) reflect.Value {
	return reflect.ValueOf(c).Elem().FieldByIndex(f.index)
}

// Values returns every key of c with its value as `config show` prints it,
// so two configurations can be compared key by key (a checkpoint records
// its run's values; a resumed run names the keys that differ).
func Values(c Config) map[string]string {
	out := make(map[string]string, len(fields))
	for i := range fields {
		f := &fields[i]
		out[f.key] = formatValue(fieldOf(&c, f))
	}
	return out
}
