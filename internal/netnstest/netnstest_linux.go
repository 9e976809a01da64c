package netnstest

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// AddrA and AddrB are the addresses of the pair's ends in namespaces A
// and B.
const AddrA, AddrB = "10.200.0.1", "10.200.0.2"

// Pair is the two namespaces and the veth end in A, which set down cuts
// A off from B.
type Pair struct {
	A, B  string
	LinkA string
}

// New creates the namespaces and the link, both ends and both loopbacks
// up, or skips t with the reason. Cleanup removes both namespaces (and
// with them the link) however the test ends. The names carry the test
// process's id, so that packages tested at once do not collide.
func New(t testing.TB) Pair {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to create network namespaces")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs the ip command (iproute2) to create network namespaces")
	}
	tag := strconv.Itoa(os.Getpid())
	p := Pair{A: "tinyacc-" + tag + "-a", B: "tinyacc-" + tag + "-b", LinkA: "tac" + tag + "a"}
	linkB := "tac" + tag + "b"
	for _, ns := range []string{p.A, p.B} {
		if err := IP("netns", "add", ns); err != nil {
			t.Skipf("network namespaces are unavailable here: %v", err)
		}
		t.Cleanup(func() { _ = IP("netns", "delete", ns) })
	}
	if err := IP("link", "add", p.LinkA, "netns", p.A, "type", "veth", "peer", "name", linkB, "netns", p.B); err != nil {
		t.Skipf("veth links are unavailable here: %v", err)
	}
	for _, c := range [][]string{
		{"-n", p.A, "addr", "add", AddrA + "/24", "dev", p.LinkA},
		{"-n", p.B, "addr", "add", AddrB + "/24", "dev", linkB},
		{"-n", p.A, "link", "set", "lo", "up"},
		{"-n", p.B, "link", "set", "lo", "up"},
		{"-n", p.A, "link", "set", p.LinkA, "up"},
		{"-n", p.B, "link", "set", linkB, "up"},
	} {
		if err := IP(c...); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

// IP runs the ip command with args, or says why it failed.
func IP(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// Exec is the command line that runs argv inside namespace ns.
func Exec(ns string, argv ...string) []string {
	return append([]string{"ip", "netns", "exec", ns}, argv...)
}
