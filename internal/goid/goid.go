// Package goid reads the id of the calling goroutine, for the engine's
// re-entrance checks (idemcore) and the commit pipeline's single writer
// (the root package's commit.go). It imports no storage driver.
package goid

import (
	"bytes"
	"runtime"
)

// ID is the id of the calling goroutine, read from its stack header
// ("goroutine 123 [running]:"); never 0. It costs a runtime.Stack call, small
// beside a commit but not free: it is read once per commit, once per
// execution of a Do fn, and by re-entrance checks before a wait, never per
// replay.
func ID() uint64 {
	var buf [32]byte
	b := buf[:runtime.Stack(buf[:], false)]
	b = bytes.TrimPrefix(b, []byte("goroutine "))
	var id uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			break
		}
		id = id*10 + uint64(c-'0')
	}
	return id
}
