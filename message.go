package idem

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"math"
	"time"

	"github.com/idemkit/idem/idemcore"
)

// Message encoding, version 2 (little endian), stored under the message's
// sequence number (u64 big endian) in idem/outbox or idem/dead:
//
//	version   u8 = 2
//	flags     u8   (1: ordering key differs from key, 2: payload non-nil,
//	                4: last error stored, 8: dead-letter retention stored,
//	                16: trace context stored)
//	index     uvarint
//	attempts  uvarint  failed attempts so far
//	enqueued  i64  unix nanoseconds
//	next      i64  unix nanoseconds, 0 for at once
//	dead      i64  unix nanoseconds, 0 while pending
//	key       uvarint length, bytes
//	ordering  uvarint length, bytes   (if flag 1)
//	topic     uvarint length, bytes
//	payload   uvarint length, bytes   (if flag 2)
//	lasterr   uvarint length, bytes   (if flag 4)
//	deadret   uvarint nanoseconds     (if flag 8: the dead-letter retention
//	                                   in force when it died; format version 2)
//	trace     uvarint length, bytes   (if flag 16: Message.Trace, 1 to
//	                                   idemcore.MaxMessageTrace bytes)
//	crc       u32  CRC-32C of every byte before it
//
// Version 1 (format versions 1 and 2) is the same without flag 16: it still
// decodes, with no trace context. Version 2 is written from format version 3
// on, so a build that reads only version 1 refuses the file rather than
// quarantining its new messages as corrupt.
const (
	messageVersion   = 2
	messageVersionV1 = 1
	messageFixed     = 2 + 8*3

	msgFlagOrdering = 1 << 0
	msgFlagPayload  = 1 << 1
	msgFlagLastErr  = 1 << 2
	msgFlagDeadRet  = 1 << 3
	msgFlagTrace    = 1 << 4
)

// encodeMessage appends m's encoding to dst. Seq and DownstreamKey are not
// part of it: the first is the bbolt key, the second derived.
func encodeMessage(dst []byte, m *Message) []byte {
	start := len(dst)
	var flags byte
	if m.OrderingKey != m.Key {
		flags |= msgFlagOrdering
	}
	if m.Payload != nil {
		flags |= msgFlagPayload
	}
	if m.LastError != "" {
		flags |= msgFlagLastErr
	}
	if m.Dead && m.DeadLetterRetention > 0 {
		flags |= msgFlagDeadRet
	}
	if n := len(m.Trace); n > 0 && n <= idemcore.MaxMessageTrace {
		flags |= msgFlagTrace
	}
	dst = append(dst, messageVersion, flags)
	dst = binary.AppendUvarint(dst, uint64(m.Index))
	dst = binary.AppendUvarint(dst, uint64(m.Failures))
	dst = binary.LittleEndian.AppendUint64(dst, uint64(unixNano(m.EnqueuedAt)))
	dst = binary.LittleEndian.AppendUint64(dst, uint64(unixNano(m.NextAttemptAt)))
	dead := int64(0)
	if m.Dead {
		dead = unixNano(m.DeadAt)
		if dead == 0 {
			dead = 1
		}
	}
	dst = binary.LittleEndian.AppendUint64(dst, uint64(dead))
	dst = appendBytes(dst, []byte(m.Key))
	if flags&msgFlagOrdering != 0 {
		dst = appendBytes(dst, []byte(m.OrderingKey))
	}
	dst = appendBytes(dst, []byte(m.Topic))
	if flags&msgFlagPayload != 0 {
		dst = appendBytes(dst, m.Payload)
	}
	if flags&msgFlagLastErr != 0 {
		dst = appendBytes(dst, []byte(m.LastError))
	}
	if flags&msgFlagDeadRet != 0 {
		dst = binary.AppendUvarint(dst, uint64(m.DeadLetterRetention))
	}
	if flags&msgFlagTrace != 0 {
		dst = appendBytes(dst, m.Trace)
	}
	return binary.LittleEndian.AppendUint32(dst, crc32.Checksum(dst[start:], crcTable))
}

// decodeMessage decodes b, which may point into bbolt's mmap: everything kept
// is copied. It never panics; every failure wraps ErrCorrupt.
func decodeMessage(seq uint64, b []byte) (*Message, error) {
	corrupt := func(why string) error {
		return &OpError{Op: "decode message", Err: fmt.Errorf("%w: message %d: %s", ErrCorrupt, seq, why)}
	}
	version := byte(messageVersion)
	if len(b) > 0 && b[0] == messageVersionV1 {
		version = messageVersionV1
	}
	body, why := unframe(b, "message", version, messageFixed+2+1+1)
	if why != "" {
		return nil, corrupt(why)
	}
	flags := body[1]
	known := byte(msgFlagOrdering | msgFlagPayload | msgFlagLastErr | msgFlagDeadRet | msgFlagTrace)
	if version == messageVersionV1 {
		known &^= msgFlagTrace
	}
	if flags&^known != 0 {
		return nil, corrupt(fmt.Sprintf("unknown flags %#x", flags))
	}
	rest := body[2:]
	var vals [2]uint64
	for i := range vals {
		v, n := binary.Uvarint(rest)
		if n <= 0 || v > 1<<31 {
			return nil, corrupt("bad index or attempt count")
		}
		vals[i], rest = v, rest[n:]
	}
	if len(rest) < 24 {
		return nil, corrupt("truncated times")
	}
	m := &Message{Seq: seq, Index: int(vals[0]), Failures: int(vals[1])}
	m.EnqueuedAt = fromUnixNano(int64(binary.LittleEndian.Uint64(rest)))
	m.NextAttemptAt = fromUnixNano(int64(binary.LittleEndian.Uint64(rest[8:])))
	if dead := int64(binary.LittleEndian.Uint64(rest[16:])); dead != 0 {
		m.Dead, m.DeadAt = true, fromUnixNano(dead)
	}
	rest = rest[24:]
	field := func(name string) (string, error) {
		var f []byte
		var err error
		if f, rest, err = readBytes(rest); err != nil {
			return "", corrupt(name + ": " + err.Error())
		}
		return string(f), nil
	}
	var err error
	if m.Key, err = field("key"); err != nil {
		return nil, err
	}
	m.OrderingKey = m.Key
	if flags&msgFlagOrdering != 0 {
		if m.OrderingKey, err = field("ordering key"); err != nil {
			return nil, err
		}
	}
	if m.Topic, err = field("topic"); err != nil {
		return nil, err
	}
	if flags&msgFlagPayload != 0 {
		if m.Payload, rest, err = readBytes(rest); err != nil {
			return nil, corrupt("payload: " + err.Error())
		}
	}
	if flags&msgFlagLastErr != 0 {
		if m.LastError, err = field("last error"); err != nil {
			return nil, err
		}
	}
	if flags&msgFlagDeadRet != 0 {
		v, n := binary.Uvarint(rest)
		if n <= 0 || v == 0 || v > math.MaxInt64 || !m.Dead {
			return nil, corrupt("bad dead-letter retention")
		}
		m.DeadLetterRetention, rest = time.Duration(v), rest[n:]
	}
	if flags&msgFlagTrace != 0 {
		if m.Trace, rest, err = readBytes(rest); err != nil {
			return nil, corrupt("trace: " + err.Error())
		}
		if len(m.Trace) == 0 || len(m.Trace) > idemcore.MaxMessageTrace {
			return nil, corrupt(fmt.Sprintf("trace context of %d bytes", len(m.Trace)))
		}
	}
	if len(rest) != 0 {
		return nil, corrupt(fmt.Sprintf("%d trailing bytes", len(rest)))
	}
	if m.Key == "" || m.Topic == "" {
		return nil, corrupt("empty key or topic")
	}
	m.DownstreamKey = DownstreamKey(m.Key, m.Index)
	return m, nil
}
