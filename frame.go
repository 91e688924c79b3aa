package idem

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
)

// The journal's frames and the batches of writes they carry.
//
// A frame is one group commit of the journal (journal.go): a 16-byte header,
// the payload, and zero padding to a multiple of 8 bytes:
//
//	length u32 little endian  the payload's length in bytes, never 0
//	crc    u32 little endian  CRC-32C (Castagnoli) of seq, length and payload,
//	                          seeded with the journal's salt
//	seq    u64 little endian  the frame's sequence number, from 1, one more
//	                          than the frame before it
//	payload                   a batch (below)
//
// The salt comes from the journal id the bbolt file records (layout.go), so a
// frame left by another file's journal (a file deleted and created again at
// the same path) fails its checksum and is never replayed into this one.
// Zeros (a preallocated segment) never make a valid frame: their length is 0.
//
// A batch is the writes of one group, in order: a uvarint count, then per
// write an op byte, the uvarint length and bytes of its bucket field, of its
// key field, and for the ops that carry one, of its value:
//
//	opPut, opDelete    a record write: bucket is the name of a bucket directly
//	                   under the engine's root bucket; key; opPut's value
//	opUserPut          a DoTx write (format version 4): bucket is a bucket's
//	opUserDelete       path from the top of the file (pathKey: uvarint length
//	                   and bytes of each name), never the engine's root
//	                   itself; key; opUserPut's value
//	opCreateBucket     bucket is the parent's path ("" for a top-level
//	opDeleteBucket     bucket), key the bucket's name; no value
//	opSetSequence      bucket is the bucket's path, key empty, value the
//	                   sequence, 8 bytes big endian
//
// A DoTx's outbox messages are opUserPut and opSetSequence on the path of
// the engine's outbox bucket (idem/outbox).

const (
	frameHeader = 16
	frameAlign  = 8
)

const (
	opPut          byte = 1
	opDelete       byte = 2
	opUserPut      byte = 3
	opUserDelete   byte = 4
	opCreateBucket byte = 5
	opDeleteBucket byte = 6
	opSetSequence  byte = 7
)

// castagnoli is CRC-32C's table (the checksum of ext4's journal, iSCSI and
// LevelDB's log), computed in hardware on amd64 and arm64.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// errBatch is the error of a payload that does not decode as a batch.
var errBatch = errors.New("journal: malformed batch")

// mutation is one write of a batch. A record write has op zero: value for
// opPut, del for opDelete. A DoTx write has its op (opUserPut, ...) and the
// fields that op gives them.
type mutation struct {
	bucket, key, value []byte
	del                bool
	op                 byte
}

// code is the op byte m is encoded with.
func (m *mutation) code() byte {
	switch {
	case m.op != 0:
		return m.op
	case m.del:
		return opDelete
	}
	return opPut
}

// hasValue reports whether an op carries a value field.
func hasValue(op byte) bool { return op == opPut || op == opUserPut || op == opSetSequence }

// frameSize is the bytes a frame of an n-byte payload takes in a segment.
func frameSize(n int) int { return (frameHeader + n + frameAlign - 1) &^ (frameAlign - 1) }

// frameCRC is the checksum of a frame's seq, length and payload.
func frameCRC(salt uint32, seq uint64, payload []byte) uint32 {
	var h [12]byte
	binary.LittleEndian.PutUint64(h[:8], seq)
	binary.LittleEndian.PutUint32(h[8:], uint32(len(payload)))
	return crc32.Update(crc32.Update(salt, castagnoli, h[:]), castagnoli, payload)
}

// appendFrame appends the frame of payload, numbered seq, to dst.
func appendFrame(dst []byte, salt uint32, seq uint64, payload []byte) []byte {
	n := frameSize(len(payload))
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(payload)))
	dst = binary.LittleEndian.AppendUint32(dst, frameCRC(salt, seq, payload))
	dst = binary.LittleEndian.AppendUint64(dst, seq)
	dst = append(dst, payload...)
	for range n - frameHeader - len(payload) {
		dst = append(dst, 0)
	}
	return dst
}

// parseFrame reads the frame at the start of b: its seq, payload (pointing
// into b) and size in b. ok is false for anything but a whole frame whose
// checksum holds: zeros, a torn write, another journal's frame.
func parseFrame(b []byte, salt uint32) (seq uint64, payload []byte, size int, ok bool) {
	if len(b) < frameHeader {
		return 0, nil, 0, false
	}
	n := binary.LittleEndian.Uint32(b)
	if n == 0 || uint64(n) > uint64(len(b)-frameHeader) {
		return 0, nil, 0, false
	}
	size = frameSize(int(n))
	if size > len(b) {
		return 0, nil, 0, false
	}
	seq = binary.LittleEndian.Uint64(b[8:])
	payload = b[frameHeader : frameHeader+int(n)]
	if frameCRC(salt, seq, payload) != binary.LittleEndian.Uint32(b[4:]) {
		return 0, nil, 0, false
	}
	return seq, payload, size, true
}

// appendBatch appends the encoding of ms to dst.
func appendBatch(dst []byte, ms []mutation) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(ms)))
	for i := range ms {
		m := &ms[i]
		op := m.code()
		dst = append(dst, op)
		dst = binary.AppendUvarint(dst, uint64(len(m.bucket)))
		dst = append(dst, m.bucket...)
		dst = binary.AppendUvarint(dst, uint64(len(m.key)))
		dst = append(dst, m.key...)
		if hasValue(op) {
			dst = binary.AppendUvarint(dst, uint64(len(m.value)))
			dst = append(dst, m.value...)
		}
	}
	return dst
}

// decodeBatch decodes a batch; its slices point into p.
func decodeBatch(p []byte) ([]mutation, error) {
	count, n := binary.Uvarint(p)
	if n <= 0 || count > uint64(len(p)) {
		return nil, errBatch
	}
	p = p[n:]
	field := func() ([]byte, bool) {
		l, n := binary.Uvarint(p)
		if n <= 0 || l > uint64(len(p)-n) {
			return nil, false
		}
		f := p[n : n+int(l) : n+int(l)]
		p = p[n+int(l):]
		return f, true
	}
	ms := make([]mutation, 0, count)
	for range count {
		if len(p) == 0 {
			return nil, errBatch
		}
		op := p[0]
		p = p[1:]
		var m mutation
		var ok bool
		if op < opPut || op > opSetSequence {
			return nil, errBatch
		}
		if m.bucket, ok = field(); !ok || (len(m.bucket) == 0 && op != opCreateBucket && op != opDeleteBucket) {
			return nil, errBatch
		}
		if m.key, ok = field(); !ok || (len(m.key) == 0) != (op == opSetSequence) {
			return nil, errBatch
		}
		if op >= opUserPut && !validPath(m.bucket) {
			return nil, errBatch
		}
		if hasValue(op) {
			if m.value, ok = field(); !ok || (op == opSetSequence && len(m.value) != 8) {
				return nil, errBatch
			}
			if m.value == nil {
				m.value = []byte{}
			}
		}
		switch op {
		case opDelete:
			m.del = true
		case opPut:
		default:
			m.op = op
		}
		ms = append(ms, m)
	}
	if len(p) != 0 {
		return nil, errBatch
	}
	return ms, nil
}
