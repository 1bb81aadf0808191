//go:build !linux

package main

import "syscall"

// fleetChildAttr is nil off Linux: a relay process stops when the bench closes its stdin.
func fleetChildAttr() *syscall.SysProcAttr { return nil }
