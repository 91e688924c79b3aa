package mcpproxy

import (
	"os/exec"
	"syscall"
)

// setPdeathsig has the kernel SIGKILL the server when the proxy's thread that
// started it exits (with the proxy, since that thread stays locked until the
// server exits).
func setPdeathsig(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
