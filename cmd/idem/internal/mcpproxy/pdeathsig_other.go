//go:build !linux

package mcpproxy

import "os/exec"

// setPdeathsig does nothing outside Linux, which alone has Pdeathsig: there
// the server outlives a proxy that is killed (it sees EOF on stdin and should
// exit).
func setPdeathsig(*exec.Cmd) {}
