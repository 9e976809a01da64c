package launch

import (
	"flag"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
)

// DefaultPython runs a .py program given without "--" when --python does not
// name another interpreter.
const DefaultPython = "/usr/bin/python3"

// torchrunAliases are torchrun's spellings (both its underscore and its dash
// forms) of the launcher's own flags, so a torchrun command line runs
// unchanged: each alias sets the same value as the flag it names.
var torchrunAliases = map[string]string{
	"nproc_per_node": "nproc",
	"nproc-per-node": "nproc",
	"node_rank":      "node-rank",
	"master_addr":    "master-addr",
	"master_port":    "master-port",
	"max_restarts":   "max-restarts",
}

// torchrunUnsupported are torchrun's flags the launcher has no counterpart
// for, with what to do instead; each is refused with that advice rather
// than with "flag provided but not defined". Boolean ones take no value.
var torchrunUnsupported = []struct {
	name    string
	boolean bool
	why     string
}{
	{"rdzv_conf", false, "the rendezvous has no options; drop the flag"},
	{"monitor_interval", false, "the launcher watches its ranks continuously; drop the flag"},
	{"start_method", false, "every rank is a process of its own; drop the flag"},
	{"role", false, "all ranks run the same program; drop the flag"},
	{"log_dir", false, "every rank's output lines come prefixed with its rank on the launcher's stdout and stderr; redirect those"},
	{"redirects", false, "every rank's output lines come prefixed with its rank on the launcher's stdout and stderr; redirect those"},
	{"r", false, "every rank's output lines come prefixed with its rank on the launcher's stdout and stderr; redirect those"},
	{"tee", false, "every rank's output lines come prefixed with its rank on the launcher's stdout and stderr; redirect those"},
	{"t", false, "every rank's output lines come prefixed with its rank on the launcher's stdout and stderr; redirect those"},
	{"local_ranks_filter", false, "every rank's output lines come prefixed with its rank on the launcher's stdout and stderr; filter those"},
	{"local_addr", false, "each rank finds its own address on the network that reaches rank 0; drop the flag"},
	{"logs_specs", false, "drop the flag"},
	{"run_path", true, "give the script: tinyacc launch [flags] SCRIPT.py [ARGS...]"},
	{"no_python", true, `put the program after "--": tinyacc launch [flags] -- PROGRAM [ARGS...]`},
	{"module", true, `put the module after "--": tinyacc launch [flags] -- python3 -m MODULE [ARGS...]`},
	{"m", true, `put the module after "--": tinyacc launch [flags] -- python3 -m MODULE [ARGS...]`},
}

// refusal keeps the first error a flag value of this file reported, so
// that ParseArgs returns it as written rather than wrapped in the flag
// package's "invalid value" sentence.
type refusal struct{ err error }

func (r *refusal) refuse(err error) error {
	if r.err == nil {
		r.err = err
	}
	return err
}

// unsupportedFlag refuses a torchrun flag the launcher does not have.
type unsupportedFlag struct {
	name, why string
	boolean   bool
	r         *refusal
}

func (u unsupportedFlag) String() string   { return "" }
func (u unsupportedFlag) IsBoolFlag() bool { return u.boolean }
func (u unsupportedFlag) Set(string) error {
	dashes := "--"
	if len(u.name) == 1 {
		dashes = "-"
	}
	return u.r.refuse(fmt.Errorf("launch: torchrun's %s%s is not supported: %s", dashes, u.name, u.why))
}

// countValue is a flag holding a count that must be a plain integer; it
// names the torchrun forms the launcher does not take (elastic ranges, "auto").
type countValue struct {
	p    *int
	name string
	r    *refusal
}

func (c countValue) String() string {
	if c.p == nil {
		return ""
	}
	return strconv.Itoa(*c.p)
}

func (c countValue) Set(s string) error {
	n, err := strconv.Atoi(s)
	if err == nil {
		*c.p = n
		return nil
	}
	if lo, hi, ok := strings.Cut(s, ":"); ok {
		if lo == hi {
			return c.Set(lo)
		}
		return c.r.refuse(fmt.Errorf("launch: --%s %s is an elastic range; the number of nodes is fixed: give one number", c.name, s))
	}
	return c.r.refuse(fmt.Errorf("launch: --%s %s is not a number; give a count", c.name, s))
}

// endpointValue is torchrun's --rdzv_endpoint HOST:PORT: rank 0's address
// and port, the same as --master-addr and --master-port.
type endpointValue struct {
	o *Options
	r *refusal
}

func (e endpointValue) String() string { return "" }
func (e endpointValue) Set(s string) error {
	host, port, err := net.SplitHostPort(s)
	p, perr := strconv.Atoi(port)
	if err != nil || perr != nil {
		return e.r.refuse(fmt.Errorf("launch: --rdzv_endpoint %s is not HOST:PORT", s))
	}
	e.o.MasterAddr, e.o.MasterPort = host, p
	return nil
}

// backendValue is torchrun's --rdzv_backend: static and c10d mean what the
// launcher does (a fixed set of nodes meeting at rank 0's endpoint).
type backendValue struct{ r *refusal }

func (backendValue) String() string { return "" }
func (b backendValue) Set(s string) error {
	if s == "static" || s == "c10d" {
		return nil
	}
	return b.r.refuse(fmt.Errorf("launch: --rdzv_backend %s is not supported: the rendezvous is rank 0's --master_addr:--master_port (static or c10d)", s))
}

// addTorchrunFlags registers torchrun's spellings on fs, whose own flags
// must already be defined. --standalone (one node, a free port: the
// default) and --rdzv_id (jobs are told apart by TINYACC_JOB_TOKEN) are
// accepted and change nothing.
func addTorchrunFlags(fs *flag.FlagSet, o *Options, r *refusal) {
	both := func(name string, v flag.Value, usage string) {
		fs.Var(v, name, usage)
		if dash := strings.ReplaceAll(name, "_", "-"); dash != name && fs.Lookup(dash) == nil {
			fs.Var(v, dash, usage)
		}
	}
	for alias, own := range torchrunAliases {
		f := fs.Lookup(own)
		v := f.Value
		if c, ok := v.(countValue); ok {
			c.name = alias
			v = c
		}
		fs.Var(v, alias, f.Usage)
	}
	both("rdzv_endpoint", endpointValue{o, r}, "torchrun's HOST:PORT of rank 0")
	both("rdzv_backend", backendValue{r}, "static or c10d")
	var id string
	both("rdzv_id", stringValue{&id}, "accepted; jobs are told apart by TINYACC_JOB_TOKEN")
	var standalone bool
	fs.BoolVar(&standalone, "standalone", false, "one node with a free port (the default)")
	for _, u := range torchrunUnsupported {
		both(u.name, unsupportedFlag{name: u.name, why: u.why, boolean: u.boolean, r: r}, u.why)
	}
}

type stringValue struct{ p *string }

func (s stringValue) String() string {
	if s.p == nil {
		return ""
	}
	return *s.p
}
func (s stringValue) Set(v string) error { *s.p = v; return nil }

// programArgv is the program a launch runs when no "--" came before it:
// a .py script runs with python (torchrun's rule); anything else must come
// after "--", so that its flags can never be mistaken for the launcher's.
func programArgv(rest []string, python string) ([]string, error) {
	if len(rest) == 0 {
		return nil, fmt.Errorf(`launch: no program; use tinyacc launch --nproc N SCRIPT.py [ARGS...] or tinyacc launch --nproc N -- PROGRAM [ARGS...]`)
	}
	script := rest[0]
	if !strings.HasSuffix(script, ".py") {
		return nil, fmt.Errorf(`launch: %q is not a .py script; put a program after "--": tinyacc launch [flags] -- %s`, script, script)
	}
	if st, err := os.Stat(script); err != nil || st.IsDir() {
		return nil, fmt.Errorf("launch: script %s: no such file", script)
	}
	return append([]string{python}, rest...), nil
}
