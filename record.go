package idem

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"time"

	"github.com/idemkit/idem/idemcore"
)

// State is the state of a stored record (idemcore.State): StateStarted or
// StateDone; String gives "started" or "done".
type State = idemcore.State

const (
	// StateStarted: committed before fn ran; fn's outcome is not recorded
	// yet (without a live call that owns it, an interrupted execution).
	StateStarted = idemcore.StateStarted
	// StateDone: fn returned and its response and error are recorded.
	StateDone = idemcore.StateDone
)

// Record is the stored outcome of one idempotency key, as Get returns it
// (idemcore.Record documents its fields: Key, State, Fingerprint, Attempt,
// StartedAt, CompletedAt, Response, Err, Retention, KeptUntilResolved).
type Record = idemcore.Record

// Record encoding, version 2 (little endian):
//
//	version   u8 = 2
//	state     u8
//	flags     u8   (1: response non-nil, 2: error stored, 4: kept until resolved)
//	fp        u64
//	started   i64  unix nanoseconds
//	done      i64  unix nanoseconds, 0 while started
//	attempt   uvarint
//	retention uvarint nanoseconds: the window in force when it was written
//	response  uvarint length, bytes   (if flag 1)
//	code      uvarint length, bytes   (if flag 2)
//	message   uvarint length, bytes   (if flag 2)
//	crc       u32  CRC-32C of every byte before it
//
// Version 1 is the same without retention and without flag 4: it decodes with
// Retention zero (the store fills in its slot's width) and, when started,
// KeptUntilResolved set (its policy is unknown: kept, never dropped early).
const (
	recordVersion   = 2
	recordVersionV1 = 1
	recordFixed     = 3 + 8 + 8 + 8

	flagResponse = 1 << 0
	flagError    = 1 << 1
	flagKept     = 1 << 2
)

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// encodedSize is the exact length encodeRecord produces for r.
func encodedSize(r *Record) int {
	n := recordFixed + uvarintLen(uint64(r.Attempt)) + uvarintLen(uint64(r.Retention)) + 4
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
	if r.KeptUntilResolved && r.State == StateStarted {
		flags |= flagKept
	}
	dst = append(dst, recordVersion, byte(r.State), flags)
	dst = binary.LittleEndian.AppendUint64(dst, r.Fingerprint)
	dst = binary.LittleEndian.AppendUint64(dst, uint64(unixNano(r.StartedAt)))
	dst = binary.LittleEndian.AppendUint64(dst, uint64(unixNano(r.CompletedAt)))
	dst = binary.AppendUvarint(dst, uint64(r.Attempt))
	dst = binary.AppendUvarint(dst, uint64(max(r.Retention, 0)))
	if r.Response != nil {
		dst = appendBytes(dst, r.Response)
	}
	if r.Err != nil {
		dst = appendBytes(dst, []byte(r.Err.Code))
		dst = appendBytes(dst, []byte(r.Err.Message))
	}
	return binary.LittleEndian.AppendUint32(dst, crc32.Checksum(dst[start:], crcTable))
}

// decodeRecord decodes b (version 2, or version 1), which may point into
// bbolt's mmap: everything kept is copied. It never panics; every failure
// wraps ErrCorrupt.
func decodeRecord(key string, b []byte) (*Record, error) {
	corrupt := func(why string) error {
		return &OpError{Op: "decode", Key: key, Err: fmt.Errorf("%w: %s", ErrCorrupt, why)}
	}
	version := byte(recordVersion)
	if len(b) > 0 && b[0] == recordVersionV1 {
		version = recordVersionV1
	}
	body, why := unframe(b, "record", version, recordFixed+1)
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
	if version == recordVersionV1 {
		r.KeptUntilResolved = r.State == StateStarted
	} else {
		retention, n := binary.Uvarint(rest)
		if n <= 0 || retention > math.MaxInt64 {
			return nil, corrupt("bad retention")
		}
		r.Retention, rest = time.Duration(retention), rest[n:]
		if flags&flagKept != 0 && r.State != StateStarted {
			return nil, corrupt("a done record marked kept until resolved")
		}
		r.KeptUntilResolved = flags&flagKept != 0
	}
	if known := byte(flagResponse | flagError | flagKept); flags&^known != 0 || (version == recordVersionV1 && flags&flagKept != 0) {
		return nil, corrupt(fmt.Sprintf("unknown flags %#x", flags))
	}
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
// (a damaged header must not pass for another fingerprint). A version-1
// record is not ok: the caller decodes it.
func peekRecord(b []byte) (state State, fp uint64, completed time.Time, ok bool) {
	if _, why := unframe(b, "record", recordVersion, recordFixed+1); why != "" {
		return 0, 0, time.Time{}, false
	}
	return State(b[1]), binary.LittleEndian.Uint64(b[3:]),
		fromUnixNano(int64(binary.LittleEndian.Uint64(b[19:]))), true
}

// peekLife reads what the retention rule needs of the record in b (its
// state, times, window and mark, in a Record without key, fingerprint,
// attempt or outcome), without copying its response, once the checksum holds;
// width is the width of the slot it sits in, the window of a version-1
// record. ok is false for a value that does not decode.
func peekLife(b []byte, width time.Duration) (l Record, ok bool) {
	version := byte(recordVersion)
	if len(b) > 0 && b[0] == recordVersionV1 {
		version = recordVersionV1
	}
	body, why := unframe(b, "record", version, recordFixed+1)
	if why != "" {
		return l, false
	}
	l.State = State(body[1])
	l.StartedAt = fromUnixNano(int64(binary.LittleEndian.Uint64(body[11:])))
	l.CompletedAt = fromUnixNano(int64(binary.LittleEndian.Uint64(body[19:])))
	if l.State != StateStarted && l.State != StateDone {
		return l, false
	}
	if version == recordVersionV1 {
		l.Retention, l.KeptUntilResolved = width, l.State == StateStarted
		return l, true
	}
	_, n := binary.Uvarint(body[recordFixed:])
	if n <= 0 {
		return l, false
	}
	retention, m := binary.Uvarint(body[recordFixed+n:])
	if m <= 0 || retention > math.MaxInt64 {
		return l, false
	}
	l.Retention = time.Duration(retention)
	l.KeptUntilResolved = body[2]&flagKept != 0 && l.State == StateStarted
	return l, true
}

// upgradeRecord re-encodes a version-1 value b found in a slot of width
// width as version 2, with that width as its retention window; any other
// value comes back as it is (a value that fails to decode too: the caller's
// decoding reports it).
func upgradeRecord(key, b []byte, width time.Duration) []byte {
	if len(b) == 0 || b[0] != recordVersionV1 {
		return b
	}
	r, err := decodeRecord(string(key), b)
	if err != nil {
		return b
	}
	r.Retention = width
	return encodeRecord(make([]byte, 0, encodedSize(r)), r)
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
