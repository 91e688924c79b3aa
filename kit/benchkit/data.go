package benchkit

import (
	"cmp"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"slices"
)

// Sizes of what a call carries, as in the measurements.
const (
	// KeySize is the length of every key: a UUID in its 36-character form.
	KeySize = 36
	// FingerprintSize is the length of every fingerprint: a SHA-256 of the
	// request's canonical arguments.
	FingerprintSize = 32
	// ResponseSize is the length of every response.
	ResponseSize = 200
	// EffectSize is the length of the row a DoTx call writes beside its record.
	EffectSize = 100
)

var (
	response    = pad(`{"id":"ch_3PqR8x2eZvKYlo2C1gH7Vb9X","object":"charge","amount":2000,"currency":"usd","status":"succeeded"}`, ResponseSize)
	effectValue = pad(`{"order":"ord_1","sku":"A-113","qty":1,"state":"paid"}`, EffectSize)
)

// pad returns s padded with spaces to n bytes.
func pad(s string, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = ' '
	}
	copy(b, s)
	return b
}

// Response is the response every fn returns: ResponseSize bytes, shared by
// every call. Callers must not modify it.
func Response() []byte { return response }

// mix is splitmix64's finalizer: a bijection on uint64 that scatters bits, so
// distinct indexes make distinct, random-looking keys.
func mix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// Key is the idempotency key of index i: a UUID-shaped string of KeySize
// bytes (version 4 layout), distinct for distinct i, scattered over the key
// space as random UUIDs are.
func Key(i int) string {
	var raw [16]byte
	hi := mix(uint64(i))
	binary.BigEndian.PutUint64(raw[:8], hi)
	binary.BigEndian.PutUint64(raw[8:], mix(hi^0x5bd1e995))
	raw[6] = raw[6]&0x0f | 0x40 // version 4
	raw[8] = raw[8]&0x3f | 0x80 // RFC 4122 variant
	var s [KeySize]byte
	hex.Encode(s[0:8], raw[0:4])
	s[8] = '-'
	hex.Encode(s[9:13], raw[4:6])
	s[13] = '-'
	hex.Encode(s[14:18], raw[6:8])
	s[18] = '-'
	hex.Encode(s[19:23], raw[8:10])
	s[23] = '-'
	hex.Encode(s[24:36], raw[10:16])
	return string(s[:])
}

// Fingerprint is the fingerprint of the request with key index i:
// FingerprintSize bytes.
func Fingerprint(i int) []byte {
	fp := make([]byte, FingerprintSize)
	x := uint64(i) ^ 0xa0761d6478bd642f
	for j := 0; j < FingerprintSize; j += 8 {
		x = mix(x)
		binary.BigEndian.PutUint64(fp[j:], x)
	}
	return fp
}

// OtherFingerprint is a fingerprint that differs from Fingerprint(i): the
// same key with other arguments.
func OtherFingerprint(i int) []byte {
	fp := Fingerprint(i)
	fp[len(fp)-1] ^= 0xff
	return fp
}

// effectFor is the effect of the DoTx call with key: a row keyed by the
// idempotency key, holding EffectSize bytes.
func effectFor(key string) Effect {
	return Effect{Key: []byte(key), Value: effectValue}
}

// seqEffectFor is the effect of the DoTx call with key index k when effects
// are keyed by a sequence number: "seq-" and k in 16 decimal digits, so that
// keys sort in the order of k (and after every UUID), holding EffectSize
// bytes. Concurrent callers take indexes in nearly increasing order.
func seqEffectFor(k int) Effect {
	return Effect{Key: fmt.Appendf(nil, "seq-%016d", k), Value: effectValue}
}

// Keyed is a key index with its key.
type Keyed struct {
	Index int
	Key   string
}

// SortedKeys returns the keys of indexes first … first+n-1 in key order, for
// bulk loads (Preloader): inserting sorted keys touches each page of a B-tree
// once.
func SortedKeys(first, n int) []Keyed {
	ks := make([]Keyed, n)
	for j := range ks {
		ks[j] = Keyed{first + j, Key(first + j)}
	}
	slices.SortFunc(ks, func(a, b Keyed) int { return cmp.Compare(a.Key, b.Key) })
	return ks
}
