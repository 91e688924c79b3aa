package main

import "encoding/binary"

// The bbolt file's layout as the tests that damage a file by hand need it:
// the engine's top-level bucket, its outbox and dead-letter buckets, the
// prefix of its time-slot buckets, and a message's key (the root package's
// layout.go, which the tool reaches only through the engine).
var (
	rootBucket   = []byte("idem")
	outboxBucket = []byte("outbox")
	deadBucket   = []byte("dead")
	slotPrefix   = []byte("slot:")
)

// seqKey is a message's key: its sequence number, 8 bytes big endian.
func seqKey(n uint64) []byte { return binary.BigEndian.AppendUint64(nil, n) }
