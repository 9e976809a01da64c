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
	"TINYACC_SHM":         {"", "0", "1", "true", "false"},
	"TINYACC_DEBUG":       {"", "0", "off", "detail"},
	"TINYACC_BF16_KERNEL": {"", "on", "off"},
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

// withEnvSuggestion adds to the error about an unknown TINYACC_ variable
// the nearest name that means something, spelled as a variable: the usual
// mistake is one underscore where a section needs two
// (TINYACC_COMM_TIMEOUT for TINYACC_COMM__TIMEOUT), or a reserved name
// misspelled.
func withEnvSuggestion(err error, name string) error {
	key := strings.ToLower(strings.ReplaceAll(strings.TrimPrefix(name, EnvPrefix), "__", "."))
	if isSection(key) {
		return err // the message already lists the section's keys
	}
	best, bestD := "", -1
	upper := strings.ToUpper(name)
	consider := func(cand string) {
		d := editDistance(strings.TrimPrefix(upper, EnvPrefix), strings.TrimPrefix(cand, EnvPrefix))
		if bestD < 0 || d < bestD {
			best, bestD = cand, d
		}
	}
	for i := range fields {
		consider(EnvName(fields[i].key))
	}
	for _, r := range Reserved {
		consider(r.Name)
	}
	// A suggestion further than a third of the name away is noise.
	if bestD < 0 || bestD > max(1, (len(upper)-len(EnvPrefix))/3) {
		return fmt.Errorf("%w; TINYACC_ variables are config keys (TINYACC_TRAIN__LR sets train.lr) or one of %s", err, strings.Join(ReservedEnv, ", "))
	}
	return fmt.Errorf("%w; did you mean %s?", err, best)
}

// EnvName spells a config key as its environment variable:
// "comm.timeout" -> "TINYACC_COMM__TIMEOUT".
func EnvName(key string) string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(key, ".", "__"))
}

// editDistance is the Levenshtein distance between a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
