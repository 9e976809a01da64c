package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// cDecl is one function's C signature, normalised: return type and
// parameter types without names or const ("int64_t*", "char*").
type cDecl struct {
	ret    string
	params []string
}

var goToC = map[string]string{
	"C.int": "int", "C.int32_t": "int32_t", "C.int64_t": "int64_t", "C.double": "double",
	"C.float": "float", "C.char": "char",
}

// goCType maps a cgo type ("*C.int64_t") to its C spelling ("int64_t*").
func goCType(t *testing.T, s string) string {
	s = strings.TrimSpace(s)
	stars := strings.Count(s, "*")
	base, ok := goToC[strings.TrimLeft(s, "*")]
	require.True(t, ok, "export uses type %q, which the header test does not know; add it to goToC", s)
	return base + strings.Repeat("*", stars)
}

// exportedDecls parses the //export functions of capi/*.go.
func exportedDecls(t *testing.T) map[string]cDecl {
	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	re := regexp.MustCompile(`//export (\w+)\nfunc (\w+)\(([^)]*)\)\s*([^{]*)\{`)
	out := map[string]cDecl{}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		require.NoError(t, err)
		for _, m := range re.FindAllStringSubmatch(string(src), -1) {
			require.Equal(t, m[1], m[2], "%s: //export %s sits above func %s", f, m[1], m[2])
			var types []string
			pieces := strings.Split(m[3], ",")
			// Grouped parameters ("x, y *C.int32_t") take the type of the
			// next piece that has one, so walk backwards.
			carry := ""
			for i := len(pieces) - 1; i >= 0; i-- {
				fs := strings.Fields(pieces[i])
				switch len(fs) {
				case 0:
					continue
				case 1:
					types = append(types, carry)
				default:
					carry = goCType(t, fs[1])
					types = append(types, carry)
				}
			}
			for i, j := 0, len(types)-1; i < j; i, j = i+1, j-1 {
				types[i], types[j] = types[j], types[i]
			}
			out[m[1]] = cDecl{ret: goCType(t, m[4]), params: types}
		}
	}
	return out
}

// headerDecls parses the function declarations of tinyacc.h.
func headerDecls(t *testing.T) map[string]cDecl {
	src, err := os.ReadFile("tinyacc.h")
	require.NoError(t, err)
	text := regexp.MustCompile(`(?s)/\*.*?\*/`).ReplaceAllString(string(src), " ")
	text = regexp.MustCompile(`(?m)^\s*#.*$`).ReplaceAllString(text, " ")
	text = strings.ReplaceAll(text, "tinyacc_handle", "int64_t")
	re := regexp.MustCompile(`([A-Za-z_][\w \t\*]*?)\s*\b(tinyacc_\w+)\s*\(([^)]*)\)\s*;`)
	norm := func(s string) string {
		s = strings.ReplaceAll(s, "const ", "")
		stars := strings.Count(s, "*")
		return strings.Fields(strings.ReplaceAll(s, "*", " "))[0] + strings.Repeat("*", stars)
	}
	out := map[string]cDecl{}
	for _, m := range re.FindAllStringSubmatch(text, -1) {
		d := cDecl{ret: norm(m[1])}
		if p := strings.TrimSpace(m[3]); p != "void" && p != "" {
			for _, param := range strings.Split(p, ",") {
				fs := strings.Fields(strings.ReplaceAll(param, "*", " * "))
				require.GreaterOrEqual(t, len(fs), 2, "%s: parameter %q needs a type and a name", m[2], param)
				d.params = append(d.params, norm(strings.Join(fs[:len(fs)-1], " ")))
			}
		}
		out[m[2]] = d
	}
	return out
}

func keys(m map[string]cDecl) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// TestHeaderMatchesExports fails when tinyacc.h and the //export functions
// drift apart: a function on one side only, or different parameter counts
// or types.
func TestHeaderMatchesExports(t *testing.T) {
	exp, hdr := exportedDecls(t), headerDecls(t)
	require.NotEmpty(t, exp)
	require.Equal(t, keys(exp), keys(hdr), "functions exported from Go vs declared in tinyacc.h")
	for name, e := range exp {
		h := hdr[name]
		assert.Equal(t, len(e.params), len(h.params), "%s: parameter count (Go export vs tinyacc.h)", name)
		assert.Equal(t, e, h, "%s: signature (Go export vs tinyacc.h)", name)
	}
}

// TestHeaderABIVersion keeps the header's version equal to the library's.
func TestHeaderABIVersion(t *testing.T) {
	src, err := os.ReadFile("tinyacc.h")
	require.NoError(t, err)
	m := regexp.MustCompile(`#define TINYACC_ABI_VERSION (\d+)`).FindStringSubmatch(string(src))
	require.NotNil(t, m)
	assert.Equal(t, strconv.Itoa(ABIVersion), m[1])
	assert.Equal(t, 5, ABIVersion, "version 2 added the checkpoint calls; 3 counts tinyacc_metrics' step from 1, as steps completed; 4 adds registered buffers and the bucket reducer; 5 adds started reduce-scatters")
}

// TestHeaderStatusCodes keeps the header's status codes equal to the Go
// constants.
func TestHeaderStatusCodes(t *testing.T) {
	src, err := os.ReadFile("tinyacc.h")
	require.NoError(t, err)
	want := map[string]int{"OK": statusOK, "ERR_ARG": errInvalidArg, "ERR_HANDLE": errBadHandle, "ERR_CONFIG": errConfig,
		"ERR_SIZE": errSize, "ERR_IO": errIO, "ERR_STATE": errState, "ERR_COMM": errComm, "ERR_RUNTIME": errRuntime,
		"ERR_UNSUPPORTED": errUnsupported, "ERR_INTERNAL": errInternal}
	got := map[string]int{}
	for _, m := range regexp.MustCompile(`#define TINYACC_(OK|ERR_\w+) \(?(-?\d+)\)?`).FindAllStringSubmatch(string(src), -1) {
		var v int
		_, err := fmt.Sscan(m[2], &v)
		require.NoError(t, err)
		got[m[1]] = v
	}
	assert.Equal(t, want, got)
}
