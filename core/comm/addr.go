package comm

import (
	"fmt"
	"io"
	"net"
)

// Which address the rendezvous store and the peer listeners bind and
// advertise. A job names one address, MASTER_ADDR: rank 0 hosts the store
// there, and every rank reaches the others through the interface it uses to
// reach that address, so a job on a private cluster network stays on it.

// storeBindHost is the host rank 0's store listens on for the job's master
// address: an IP address is bound exactly (loopback keeps a one-host job
// unreachable from outside); "localhost" is loopback; any other name is
// bound on every interface, because a host often resolves its own name to
// a loopback address that the other hosts cannot use.
func storeBindHost(master string) string {
	if master == "localhost" {
		return "127.0.0.1"
	}
	if ip := net.ParseIP(master); ip != nil {
		return ip.String()
	}
	return ""
}

// peerHost is the address a rank's peer listener binds and advertises: the
// local end of its connection to the store, that is, its address on the
// network that reaches the master. A loopback local end with a master that
// is not loopback means this host resolved the master's name to itself
// through loopback; the other hosts could not connect, so it says so.
func peerHost(storeConn net.Conn, master string, rank int, log io.Writer) string {
	ip := storeConn.LocalAddr().(*net.TCPAddr).IP
	if ip.IsLoopback() && !isLoopback(master) {
		fmt.Fprintf(log, "comm: warning: rank %d reaches MASTER_ADDR=%s over loopback (%s), so ranks on other hosts cannot connect to it; set MASTER_ADDR to an IP address of rank 0's host\n", rank, master, ip)
	}
	return ip.String()
}
