// Package netnstest gives tests two "hosts" on one machine: two network
// namespaces joined by a veth pair, each with a private address that
// exists inside these namespaces alone, so nothing outside them is ever
// reached. The tcp transport's tests and train's tests across hosts set
// them up here. It needs root and the ip command (iproute2); without
// them, or where the kernel refuses namespaces or veth links, the test
// is skipped with the reason.
package netnstest
