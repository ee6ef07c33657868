package main

import "syscall"

// childAttr makes a child process that this program starts die with it,
// even when it is killed without a chance to stop the child.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
