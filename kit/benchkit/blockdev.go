package benchkit

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// diskCounter reads how many bytes the block device holding a directory has
// written, from the device's stat file in /sys (sectors written, in units of
// 512 bytes whatever the device's block size). It counts what reaches the
// device: the stores' pages and journal, but also every other process's
// writes to that device. /proc/self/io would count only ours, but it
// overstates them on some kernels, so the harness does not use it.
type diskCounter struct {
	stat string // for example /sys/dev/block/254:0/stat
	dev  string // "254:0 (vda)", for the header
}

// newDiskCounter finds the block device holding dir, or returns nil when
// there is none to read (not Linux, a file system on no block device, no
// /sys).
func newDiskCounter(dir string) *diskCounter {
	major, minor, ok := deviceOf(dir)
	if !ok {
		return nil
	}
	id := fmt.Sprintf("%d:%d", major, minor)
	c := &diskCounter{stat: "/sys/dev/block/" + id + "/stat", dev: id}
	if _, ok := c.written(); !ok {
		return nil
	}
	if target, err := os.Readlink("/sys/dev/block/" + id); err == nil {
		c.dev += " (" + target[strings.LastIndexByte(target, '/')+1:] + ")"
	}
	return c
}

// written is the device's count of bytes written since boot; false when it
// cannot be read (a nil counter, a device gone).
func (c *diskCounter) written() (uint64, bool) {
	if c == nil {
		return 0, false
	}
	b, err := os.ReadFile(c.stat)
	if err != nil {
		return 0, false
	}
	// Fields: reads, reads merged, sectors read, ms reading, writes, writes
	// merged, sectors written, … (Documentation/block/stat.rst).
	f := strings.Fields(string(b))
	if len(f) < 7 {
		return 0, false
	}
	sectors, err := strconv.ParseUint(f[6], 10, 64)
	if err != nil {
		return 0, false
	}
	return sectors * 512, true
}

// DiskDevice names the block device whose writes the workloads count for
// stores under dir, for example "254:0 (vda)", or says that none was found.
func DiskDevice(dir string) string {
	if c := newDiskCounter(dir); c != nil {
		return c.dev
	}
	return "not found: bytes written are n/a"
}
