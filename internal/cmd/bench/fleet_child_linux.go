package main

import "syscall"

// fleetChildAttr makes a relay process die with the bench, however the bench ends, so that no
// relay outlives it (and its database can be dropped).
func fleetChildAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
