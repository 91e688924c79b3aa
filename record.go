package idem

import (
	"encoding/binary"
	"errors"
	"fmt"
	"github.com/idemkit/idem/internal/core"
	"hash/crc32"
	"time"
)

// State is the state of a stored record.
type State = core.State

const (
	// StateStarted: the record was committed before fn ran and fn's outcome is
	// not recorded yet. Without a live call that owns it, it is an interrupted
	// execution.
	StateStarted = core.StateStarted
	// StateDone: fn returned and its response and error are recorded.
	StateDone = core.StateDone
)

// ParseState is the inverse of State.String ("started", "done").
func ParseState(s string) (State, error) {
	switch s {
	case "started":
		return StateStarted, nil
	case "done":
		return StateDone, nil
	}
	return 0, fmt.Errorf("idem: unknown state %q (want started or done)", s)
}

// Record is the stored outcome of one idempotency key, as Get returns it:
// its key, State, Fingerprint (the 64-bit xxhash of the fingerprint bytes of
// the call that created it), Attempt (executions of fn, from 1), StartedAt and
// CompletedAt (engine clock; CompletedAt zero while started), Response (nil
// and empty differ) and Err (the stored permanent error, nil if fn
// succeeded). Record.ExpiresAt(retention) is when it leaves the retention
// window. The type is the state machine's (internal/core), shared by every
// backend.
type Record = core.Record

// Record encoding, version 1 (little endian):
//
//	version  u8 = 1
//	state    u8
//	flags    u8   (1: response non-nil, 2: error stored)
//	fp       u64
//	started  i64  unix nanoseconds
//	done     i64  unix nanoseconds, 0 while started
//	attempt  uvarint
//	response uvarint length, bytes   (if flag 1)
//	code     uvarint length, bytes   (if flag 2)
//	message  uvarint length, bytes   (if flag 2)
//	crc      u32  CRC-32C of every byte before it
const (
	recordVersion = 1
	recordFixed   = 3 + 8 + 8 + 8

	flagResponse = 1 << 0
	flagError    = 1 << 1
)

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// encodedSize is the exact length encodeRecord produces for r.
func encodedSize(r *Record) int {
	n := recordFixed + uvarintLen(uint64(r.Attempt)) + 4
	if r.Response != nil {
		n += uvarintLen(uint64(len(r.Response))) + len(r.Response)
	}
	if r.Err != nil {
		n += uvarintLen(uint64(len(r.Err.Code))) + len(r.Err.Code)
		n += uvarintLen(uint64(len(r.Err.Message))) + len(r.Err.Message)
	}
	return n
}

// encodeRecord appends r's encoding to dst. The key is not part of it: it is
// the bbolt key the value is stored under.
func encodeRecord(dst []byte, r *Record) []byte {
	start := len(dst)
	var flags byte
	if r.Response != nil {
		flags |= flagResponse
	}
	if r.Err != nil {
		flags |= flagError
	}
	dst = append(dst, recordVersion, byte(r.State), flags)
	dst = binary.LittleEndian.AppendUint64(dst, r.Fingerprint)
	dst = binary.LittleEndian.AppendUint64(dst, uint64(unixNano(r.StartedAt)))
	dst = binary.LittleEndian.AppendUint64(dst, uint64(unixNano(r.CompletedAt)))
	dst = binary.AppendUvarint(dst, uint64(r.Attempt))
	if r.Response != nil {
		dst = appendBytes(dst, r.Response)
	}
	if r.Err != nil {
		dst = appendBytes(dst, []byte(r.Err.Code))
		dst = appendBytes(dst, []byte(r.Err.Message))
	}
	return binary.LittleEndian.AppendUint32(dst, crc32.Checksum(dst[start:], crcTable))
}

// decodeRecord decodes b, which may point into bbolt's mmap: everything kept
// is copied. It never panics; every failure wraps ErrCorrupt.
func decodeRecord(key string, b []byte) (*Record, error) {
	corrupt := func(why string) error {
		return &OpError{Op: "decode", Key: key, Err: fmt.Errorf("%w: %s", ErrCorrupt, why)}
	}
	body, why := unframe(b, "record", recordVersion, recordFixed+1)
	if why != "" {
		return nil, corrupt(why)
	}
	r := &Record{Key: key, State: State(body[1])}
	if r.State != StateStarted && r.State != StateDone {
		return nil, corrupt(fmt.Sprintf("unknown state %d", body[1]))
	}
	flags := body[2]
	r.Fingerprint = binary.LittleEndian.Uint64(body[3:])
	r.StartedAt = fromUnixNano(int64(binary.LittleEndian.Uint64(body[11:])))
	r.CompletedAt = fromUnixNano(int64(binary.LittleEndian.Uint64(body[19:])))
	rest := body[recordFixed:]
	attempt, n := binary.Uvarint(rest)
	if n <= 0 || attempt > 1<<31 {
		return nil, corrupt("bad attempt")
	}
	r.Attempt, rest = int(attempt), rest[n:]
	var err error
	if flags&flagResponse != 0 {
		if r.Response, rest, err = readBytes(rest); err != nil {
			return nil, corrupt("response: " + err.Error())
		}
	}
	if flags&flagError != 0 {
		var code, msg []byte
		if code, rest, err = readBytes(rest); err != nil {
			return nil, corrupt("error code: " + err.Error())
		}
		if msg, rest, err = readBytes(rest); err != nil {
			return nil, corrupt("error message: " + err.Error())
		}
		r.Err = &Error{Code: string(code), Message: string(msg), Replayed: true}
	}
	if len(rest) != 0 {
		return nil, corrupt(fmt.Sprintf("%d trailing bytes", len(rest)))
	}
	return r, nil
}

// peekRecord reads what the fast path needs without copying the response:
// the state, the fingerprint and the completion time, once the checksum holds
// (a damaged header must not pass for another fingerprint).
func peekRecord(b []byte) (state State, fp uint64, completed time.Time, ok bool) {
	if _, why := unframe(b, "record", recordVersion, recordFixed+1); why != "" {
		return 0, 0, time.Time{}, false
	}
	return State(b[1]), binary.LittleEndian.Uint64(b[3:]),
		fromUnixNano(int64(binary.LittleEndian.Uint64(b[19:]))), true
}

// unframe checks the frame shared by records and outbox messages (a version
// byte first, a CRC-32C of the rest last) and returns the body, without the
// checksum; why says what is wrong, "" if nothing. min is the least body
// length a valid value of that kind has.
func unframe(b []byte, kind string, version byte, min int) (body []byte, why string) {
	if len(b) < min+4 {
		return nil, fmt.Sprintf("%d bytes is too short", len(b))
	}
	if b[0] != version {
		return nil, fmt.Sprintf("unknown %s version %d", kind, b[0])
	}
	body = b[:len(b)-4]
	if crc32.Checksum(body, crcTable) != binary.LittleEndian.Uint32(b[len(b)-4:]) {
		return nil, "checksum mismatch"
	}
	return body, ""
}

func appendBytes(dst, b []byte) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(b)))
	return append(dst, b...)
}

var errShort = errors.New("length exceeds the record")

// readBytes reads a length-prefixed field and returns a copy of it (non-nil,
// even when empty).
func readBytes(b []byte) (field, rest []byte, err error) {
	l, n := binary.Uvarint(b)
	if n <= 0 {
		return nil, nil, errors.New("bad length")
	}
	b = b[n:]
	if l > uint64(len(b)) {
		return nil, nil, errShort
	}
	field = make([]byte, l)
	copy(field, b)
	return field, b[l:], nil
}

func uvarintLen(x uint64) int {
	n := 1
	for x >= 0x80 {
		x >>= 7
		n++
	}
	return n
}

func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func fromUnixNano(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}
