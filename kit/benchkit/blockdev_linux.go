package benchkit

import "syscall"

// deviceOf is the major and minor number of the device holding path.
func deviceOf(path string) (major, minor uint64, ok bool) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return 0, 0, false
	}
	dev := uint64(st.Dev) // uint32 on some architectures
	// The encoding of glibc's gnu_dev_major and gnu_dev_minor.
	major = (dev>>8)&0xfff | (dev>>32)&^0xfff
	minor = dev&0xff | (dev>>12)&^0xff
	return major, minor, major != 0 // major 0: no block device (tmpfs, overlay, btrfs subvolumes)
}
