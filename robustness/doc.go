// Package robustness holds the robustness tests of the idem engine that need
// more than the root module may require: faults of the environment (a full
// disk, a read-only mount, a file locked by another process, damaged files)
// and a FUSE layer of its own (github.com/hanwen/go-fuse/v2) that fails
// writes and fsyncs on command and simulates a power failure by dropping the
// writes that were not synced: all of them or a suffix (a disk that writes
// back in order), or harshly, an arbitrary subset kept and writes torn at
// 512-byte sectors. It is a module of its own so that users of the
// engine never download go-fuse. ROBUSTNESS.md, at the repository's root,
// lists what is tried, with figures and commands.
package robustness
