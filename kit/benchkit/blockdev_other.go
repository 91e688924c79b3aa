//go:build !linux

package benchkit

// deviceOf finds no device outside Linux: bytes written are n/a there.
func deviceOf(string) (major, minor uint64, ok bool) { return 0, 0, false }
