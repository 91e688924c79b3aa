// Package goid identifies the calling goroutine, for the engine's
// re-entrance checks (idemcore) and the commit pipeline's and journal's
// single writer (the root package's commit.go, journal.go). It imports no
// storage driver.
package goid

import (
	"bytes"
	"runtime"
)

// ID identifies the calling goroutine among the live ones; never 0. On
// amd64 and arm64 it is the address of the runtime's goroutine descriptor
// (read in assembly: a few nanoseconds); a descriptor is reused only after
// its goroutine ended, so two live goroutines never share an ID, but an
// ended goroutine's ID may come back: keep one only while its goroutine
// runs (the engine clears every mark before that). Elsewhere it is the
// goroutine's number, read from its stack header ("goroutine 123
// [running]:") by runtime.Stack, which walks the whole stack: microseconds.
func ID() uint64 { return id() }

// stackID reads the goroutine's number from its stack header.
func stackID() uint64 {
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
