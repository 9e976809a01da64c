package config

import (
	"errors"
	"fmt"
	"strings"
)

// reservedValues lists the values a reserved variable with a fixed set of
// settings accepts ("" = unset). A value outside it is a mistake that would
// otherwise be read as some default (TINYACC_SHM=maybe meant "on").
var reservedValues = map[string][]string{
	"TINYACC_SHM":   {"", "0", "1", "true", "false"},
	"TINYACC_DEBUG": {"", "0", "off", "detail"},
}

// CheckReservedEnv refuses reserved variables set to values they do not
// document, naming the variable, the value and what it accepts.
func CheckReservedEnv(environ []string) error {
	var errs []error
	for _, kv := range environ {
		name, value, ok := strings.Cut(kv, "=")
		allowed, known := reservedValues[name]
		if !ok || !known {
			continue
		}
		good := false
		for _, a := range allowed {
			good = good || value == a
		}
		if !good {
			errs = append(errs, fmt.Errorf("config: %s=%q is not one of %s (or unset)", name, value, strings.Join(quoteAll(allowed[1:]), ", ")))
		}
	}
	return errors.Join(errs...)
}

func quoteAll(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = fmt.Sprintf("%q", s)
	}
	return out
}
