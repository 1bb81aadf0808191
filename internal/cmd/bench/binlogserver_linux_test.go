package main

import (
	"net"
	"testing"
	"time"
)

// ownPorts finds a connection this process opened by its local port.
func TestOwnPorts(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ports, err := ownPorts()
	if err != nil {
		t.Fatal(err)
	}
	local := conn.LocalAddr().(*net.TCPAddr).Port
	if !ports[local] {
		t.Fatalf("this process's connection from port %d not among its ports %v", local, ports)
	}
}

func TestProcStatCPUOfThisProcess(t *testing.T) {
	self, err := procStatCPU("/proc/self/stat")
	if err != nil {
		t.Fatal(err)
	}
	if self < 0 || self > time.Hour {
		t.Fatalf("this process's CPU read as %s", self)
	}
}
