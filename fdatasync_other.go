//go:build !linux

package idem

import "os"

// fdatasync is f.Sync where the system has no fdatasync (macOS's F_FULLFSYNC
// is what Go's Sync issues there).
func fdatasync(f *os.File) error { return f.Sync() }
