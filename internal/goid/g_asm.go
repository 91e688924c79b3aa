//go:build (amd64 || arm64) && !purego

package goid

// getg returns the calling goroutine's descriptor (g_amd64.s, g_arm64.s).
func getg() uintptr

func id() uint64 { return uint64(getg()) }
