// Package layout names the buckets of an idem file and maps times to the
// time-slot buckets that hold done records.
//
// Everything the engine owns lives under one top-level bucket, Root:
//
//	idem/
//	  meta/     version → u32 big endian
//	  slot:SE/  one bucket per time slot [S, E), unix nanoseconds (8 bytes
//	            big endian each, sign bit flipped, so slots sort by start):
//	            key → record. A slot is as wide as the retention window of
//	            the records in it (each record also carries its window). Done
//	            records by completion time, started records by start time (or
//	            a later slot: a record put back goes to the slot of the one it
//	            replaces), so that every record in a slot expires by the slot's
//	            end plus its width, and the pruner drops the slot whole, unless
//	            it holds a record kept until resolved. A key has one version, in one
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

// Version is the format version this code writes; it reads OldestVersion
// to Version, and Open migrates an older file to Version.
//
// Version 2 records with every record the retention window in force when it
// was written, and marks started records written under RecoverRefuse (record
// encoding version 2, see record.go). Version 1 recorded the window only as
// the width of the slot a record sits in, and not the policy.
const (
	Version       = 2
	OldestVersion = 1
)

// Bucket and key names.
var (
	Root = []byte("idem")
	Meta = []byte("meta")
	// SlotPrefix starts the name of every slot bucket.
	SlotPrefix = []byte("slot:")
	Outbox     = []byte("outbox")
	Dead       = []byte("dead")
	VersionK   = []byte("version")
)

// Slot is a time slot: the records slotted at times in [Start, End), unix
// nanoseconds. Its span is part of its name, so a file whose retention (and so
// slot width) changes keeps reading its older slots right.
type Slot struct{ Start, End int64 }

// SlotAt is the slot of width w that holds time t (aligned to multiples of w).
func SlotAt(t time.Time, w time.Duration) Slot {
	n, width := t.UnixNano(), int64(w)
	start := n - ((n%width)+width)%width // floor, also for times before 1970
	return Slot{Start: start, End: start + width}
}

// Covers reports whether t falls in the slot.
func (s Slot) Covers(t time.Time) bool {
	n := t.UnixNano()
	return s.Start <= n && n < s.End
}

// EndTime is the first instant after the slot.
func (s Slot) EndTime() time.Time { return time.Unix(0, s.End) }

// Width is the slot's span: the retention window of the records in it.
func (s Slot) Width() time.Duration { return time.Duration(s.End - s.Start) }

// Name is the slot's bucket name: SlotPrefix, Start and End as 8-byte big
// endian (offset so that they sort as signed numbers).
func (s Slot) Name() []byte {
	b := append([]byte(nil), SlotPrefix...)
	b = binary.BigEndian.AppendUint64(b, uint64(s.Start)^1<<63)
	return binary.BigEndian.AppendUint64(b, uint64(s.End)^1<<63)
}

// ParseSlot reads a slot bucket's name; ok is false for any other name.
func ParseSlot(name []byte) (s Slot, ok bool) {
	if len(name) != len(SlotPrefix)+16 || string(name[:len(SlotPrefix)]) != string(SlotPrefix) {
		return Slot{}, false
	}
	b := name[len(SlotPrefix):]
	s = Slot{Start: int64(binary.BigEndian.Uint64(b) ^ 1<<63), End: int64(binary.BigEndian.Uint64(b[8:]) ^ 1<<63)}
	return s, s.Start < s.End
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
