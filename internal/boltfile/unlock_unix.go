//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package boltfile

import (
	"os"
	"syscall"
)

// unlock releases bbolt's flock on f: the lock belongs to the open file
// description, which bbolt's memory map keeps alive after f is closed.
func unlock(f *os.File) { _ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN) }
