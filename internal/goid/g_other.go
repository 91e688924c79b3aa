//go:build !(amd64 || arm64) || purego

package goid

func id() uint64 { return stackID() }
