package idem

import (
	"os"
	"syscall"
)

// fdatasync flushes f's data to the disk, and its metadata only where a
// later read needs it (a size that grew): on a preallocated, zero-filled
// segment, one flush of the written sectors.
func fdatasync(f *os.File) error {
	for {
		err := syscall.Fdatasync(int(f.Fd()))
		if err != syscall.EINTR {
			if err != nil {
				return &os.PathError{Op: "fdatasync", Path: f.Name(), Err: err}
			}
			return nil
		}
	}
}
