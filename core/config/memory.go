package config

import (
	"fmt"
	"strconv"
	"strings"
)

// ParseMemoryLimit reads memory.limit: "auto" gives -1 (the caller finds
// the host's limit), "0" gives 0 (no check), and a size gives its bytes. A
// size is a whole number with an optional unit, binary (KiB, MiB, GiB,
// TiB) or decimal (KB, MB, GB, TB), or none for bytes.
func ParseMemoryLimit(s string) (int64, error) {
	v := strings.TrimSpace(s)
	if v == "auto" {
		return -1, nil
	}
	units := []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
		{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}, {"B", 1}}
	mult := int64(1)
	for _, u := range units {
		if n, ok := strings.CutSuffix(v, u.suffix); ok {
			v, mult = strings.TrimSpace(n), u.mult
			break
		}
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || !(f >= 0) || f*float64(mult) > 1<<62 {
		return 0, fmt.Errorf("config: memory.limit=%q is not a size: use auto, 0 (no check) or a size such as 4GiB or 512MiB", s)
	}
	return int64(f * float64(mult)), nil
}
