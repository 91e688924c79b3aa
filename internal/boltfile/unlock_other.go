//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package boltfile

import "os"

// unlock does nothing here: closing f releases the lock.
func unlock(*os.File) {}
