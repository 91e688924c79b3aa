// Package layout names the buckets of an idem file and maps times to the
// time-slot buckets that hold done records.
//
// Everything the engine owns lives under one top-level bucket, Root:
//
//	idem/
//	  meta/     version → u32 big endian; slot_width → i64 nanoseconds, big endian
//	  slot:N/   one bucket per time slot, N its index (u64 big endian, so
//	            slots sort by time): key → record. Done records by completion
//	            time, started records by start time, so that every record in
//	            a slot expires by the slot's end plus the retention window, and
//	            the pruner drops the slot whole. A key has one version, in one
//	            slot. Slots sit directly under Root: one bucket level less to
//	            open on every lookup and to rewrite on every commit.
//	  outbox/   sequence (u64 big endian) → message
//	  dead/     sequence (u64 big endian) → message (dead letters)
//
// Users' DoTx buckets are any other top-level name.
package layout

import (
	"encoding/binary"
	"time"
)

// Version is the format version this code writes and reads.
const Version = 1

// Bucket and key names.
var (
	Root = []byte("idem")
	Meta = []byte("meta")
	// SlotPrefix starts the name of every slot bucket.
	SlotPrefix = []byte("slot:")
	Outbox     = []byte("outbox")
	Dead       = []byte("dead")
	VersionK   = []byte("version")
	SlotWidth  = []byte("slot_width")
)

// SlotName is the name of slot i's bucket.
func SlotName(i uint64) []byte { return append(append([]byte(nil), SlotPrefix...), U64(i)...) }

// ParseSlot returns the index of a slot bucket's name; ok is false for any
// other name.
func ParseSlot(name []byte) (i uint64, ok bool) {
	if len(name) != len(SlotPrefix)+8 || string(name[:len(SlotPrefix)]) != string(SlotPrefix) {
		return 0, false
	}
	return ParseU64(name[len(SlotPrefix):])
}

// SlotIndex is the index of the slot of width w that holds time t.
func SlotIndex(t time.Time, w time.Duration) uint64 {
	n := t.UnixNano()
	if n < 0 {
		return 0
	}
	return uint64(n / int64(w))
}

// SlotEnd is the first instant after slot i of width w.
func SlotEnd(i uint64, w time.Duration) time.Time {
	return time.Unix(0, int64(i+1)*int64(w))
}

// U64 encodes n as an 8-byte big-endian key, so keys sort numerically.
func U64(n uint64) []byte { return binary.BigEndian.AppendUint64(nil, n) }

// ParseU64 decodes a key made by U64; ok is false for any other length.
func ParseU64(b []byte) (n uint64, ok bool) {
	if len(b) != 8 {
		return 0, false
	}
	return binary.BigEndian.Uint64(b), true
}
