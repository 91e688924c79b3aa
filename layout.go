package idem

import (
	"encoding/binary"
	"time"
)

// The bbolt file's layout: the names of the engine's buckets, and the
// time-slot buckets that hold the records.
//
// Everything the engine owns lives under one top-level bucket, Root:
//
//	idem/
//	  meta/     version → u32 big endian
//	            journal → the journal id (u64 big endian, random, made with the
//	            file) and the checkpoint: the sequence number of the last
//	            journal frame the file holds (u64 big endian); see journal.go
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

// formatVersion is the format version this code writes; it reads oldestFormatVersion
// to formatVersion, and Open migrates an older file to formatVersion.
//
// Version 4's journal carries DoTx's writes too (frame.go: opUserPut and
// the other user ops; a DoTx's writes to its buckets, the outbox messages
// it enqueues): a build of version 3 would fail on those frames as damage,
// so it refuses the file instead. Its file is version 3's.
//
// Version 3 has a write-ahead journal beside the file (<path>.journal/,
// journal.go), whose frames after the checkpoint hold acknowledged writes the
// file does not, and writes outbox messages in message encoding version 2,
// which carries the trace context of the call that enqueued them
// (Message.Trace; see message.go): a build before it, which would ignore the
// journal and quarantine those messages as corrupt, refuses the file. Its
// records and buckets are version 2's; versions 1 and 2 hold version-1
// messages, which still decode.
//
// Version 2 records with every record the retention window in force when it
// was written, and marks started records written under RecoverRefuse (record
// encoding version 2, see record.go). Version 1 recorded the window only as
// the width of the slot a record sits in, and not the policy.
const (
	formatVersion       = 4
	oldestFormatVersion = 1
)

// Bucket and key names.
var (
	rootName = []byte("idem")
	metaName = []byte("meta")
	// slotPrefix starts the name of every slot bucket.
	slotPrefix = []byte("slot:")
	outboxName = []byte("outbox")
	deadName   = []byte("dead")
	versionKey = []byte("version")
	journalKey = []byte("journal")
)

// timeSlot is a time slot: the records slotted at times in [Start, End), unix
// nanoseconds. Its span is part of its name, so a file whose retention (and so
// slot width) changes keeps reading its older slots right.
type timeSlot struct{ Start, End int64 }

// slotAt is the slot of width w that holds time t (aligned to multiples of w).
func slotAt(t time.Time, w time.Duration) timeSlot {
	n, width := t.UnixNano(), int64(w)
	start := n - ((n%width)+width)%width // floor, also for times before 1970
	return timeSlot{Start: start, End: start + width}
}

// Covers reports whether t falls in the slot.
func (s timeSlot) Covers(t time.Time) bool {
	n := t.UnixNano()
	return s.Start <= n && n < s.End
}

// EndTime is the first instant after the slot.
func (s timeSlot) EndTime() time.Time { return time.Unix(0, s.End) }

// Width is the slot's span: the retention window of the records in it.
func (s timeSlot) Width() time.Duration { return time.Duration(s.End - s.Start) }

// Name is the slot's bucket name: slotPrefix, Start and End as 8-byte big
// endian (offset so that they sort as signed numbers).
func (s timeSlot) Name() []byte {
	b := append([]byte(nil), slotPrefix...)
	b = binary.BigEndian.AppendUint64(b, uint64(s.Start)^1<<63)
	return binary.BigEndian.AppendUint64(b, uint64(s.End)^1<<63)
}

// parseSlot reads a slot bucket's name; ok is false for any other name.
func parseSlot(name []byte) (s timeSlot, ok bool) {
	if len(name) != len(slotPrefix)+16 || string(name[:len(slotPrefix)]) != string(slotPrefix) {
		return timeSlot{}, false
	}
	b := name[len(slotPrefix):]
	s = timeSlot{Start: int64(binary.BigEndian.Uint64(b) ^ 1<<63), End: int64(binary.BigEndian.Uint64(b[8:]) ^ 1<<63)}
	return s, s.Start < s.End
}

// u64Key encodes n as an 8-byte big-endian key, so keys sort numerically.
func u64Key(n uint64) []byte { return binary.BigEndian.AppendUint64(nil, n) }

// parseU64Key decodes a key made by u64Key; ok is false for any other length.
func parseU64Key(b []byte) (n uint64, ok bool) {
	if len(b) != 8 {
		return 0, false
	}
	return binary.BigEndian.Uint64(b), true
}
