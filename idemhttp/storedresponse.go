package idemhttp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"net/textproto"
	"slices"
	"strings"
)

// The stored response, the bytes handed to the engine, in two versions.
// Version 1: a version byte (1), the status (uvarint), the number of header
// fields (uvarint), each field as its name and its values (uvarint count,
// each value a uvarint length and its bytes), and the body, the rest.
// Version 2, a response with trailers: a version byte (2), the status and
// the header fields as in version 1, then the trailer names the Trailer
// header declared (uvarint count, each a uvarint length and its bytes), the
// trailer fields (as the header fields), and the body, the rest. A response
// without trailers is written in version 1, so that a program of an earlier
// version sharing the store replays it; both versions are read.
const (
	recordVersion         = 1
	recordVersionTrailers = 2
)

// storedResponse is a response as stored and replayed.
type storedResponse struct {
	status int
	header http.Header
	// declared are the trailer names announced in the Trailer header,
	// canonical, sorted, each once.
	declared []string
	// trailer are the trailer fields, sent after the body: under their
	// names when declared, through http.TrailerPrefix otherwise.
	trailer http.Header
	body    []byte
}

// hasTrailers reports whether r is sent with trailers (and so without a
// Content-Length).
func (r *storedResponse) hasTrailers() bool { return len(r.declared) > 0 || len(r.trailer) > 0 }

var errBadRecord = errors.New("idemhttp: stored response does not decode")

// ErrInvalidResponse is returned, wrapped, by EncodeResponse for a response
// the middleware cannot replay.
var ErrInvalidResponse = errors.New("idemhttp: invalid response")

// EncodeResponse returns the stored form of an HTTP answer, the bytes the
// middleware records for a handler's response: what an operator gives
// Engine.Resolve (or idem resolve, or the admin handler's "http" form) to
// complete an interrupted key so that every retry with it replays this
// answer, with Idempotent-Replayed: true. status is 200 to 999 (a 1xx is not
// a final answer); header names are canonicalized (textproto), each a token
// of RFC 9110 section 5.1 with values free of CR, LF and NUL, and none may be
// a header the middleware never stores (Set-Cookie, Date, Content-Length,
// hop-by-hop ones, its own); body is sent as is (none for 204 and 304). Any
// other input fails with an error wrapping ErrInvalidResponse. The result is
// deterministic: the same answer always encodes the same, in the format's
// version 1 (no trailers), which every version of the middleware replays.
func EncodeResponse(status int, header http.Header, body []byte) ([]byte, error) {
	if status < 200 || status > 999 {
		return nil, fmt.Errorf("%w: status %d is not 200 to 999", ErrInvalidResponse, status)
	}
	canon := make(http.Header, len(header))
	for k, vs := range header {
		if !validHeaderName(k) {
			return nil, fmt.Errorf("%w: header name %q is not a token", ErrInvalidResponse, k)
		}
		ck := textproto.CanonicalMIMEHeaderKey(k)
		if neverStored[ck] {
			return nil, fmt.Errorf("%w: header %s is never stored", ErrInvalidResponse, ck)
		}
		for _, v := range vs {
			if strings.ContainsAny(v, "\r\n\x00") {
				return nil, fmt.Errorf("%w: header %s has a value with CR, LF or NUL", ErrInvalidResponse, ck)
			}
		}
		canon[ck] = append(canon[ck], vs...)
	}
	return encodeResponse(status, canon, body), nil
}

// validHeaderName reports whether k is an RFC 9110 token.
func validHeaderName(k string) bool {
	if k == "" {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0 {
			continue
		}
		return false
	}
	return true
}

func encodeResponse(status int, header http.Header, body []byte) []byte {
	return (&storedResponse{status: status, header: header, body: body}).encode()
}

// encode returns r's stored form: version 1 without trailers, 2 with.
// Header and trailer fields are sorted by name, so the same response always
// encodes the same.
func (r *storedResponse) encode() []byte {
	n := 1 + 2*binary.MaxVarintLen64 + len(r.body) + fieldsSize(r.header) + fieldsSize(r.trailer)
	for _, k := range r.declared {
		n += binary.MaxVarintLen64 + len(k)
	}
	b := make([]byte, 0, n)
	if r.hasTrailers() {
		b = append(b, recordVersionTrailers)
	} else {
		b = append(b, recordVersion)
	}
	b = binary.AppendUvarint(b, uint64(r.status))
	b = appendFields(b, r.header)
	if r.hasTrailers() {
		b = binary.AppendUvarint(b, uint64(len(r.declared)))
		for _, k := range r.declared {
			b = appendString(b, k)
		}
		b = appendFields(b, r.trailer)
	}
	return append(b, r.body...)
}

// fieldsSize bounds the encoded size of h's fields.
func fieldsSize(h http.Header) int {
	n := binary.MaxVarintLen64
	for k, vs := range h {
		n += binary.MaxVarintLen64*(2+len(vs)) + len(k)
		for _, v := range vs {
			n += len(v)
		}
	}
	return n
}

func appendFields(b []byte, h http.Header) []byte {
	names := make([]string, 0, len(h))
	for k := range h {
		names = append(names, k)
	}
	slices.Sort(names)
	b = binary.AppendUvarint(b, uint64(len(names)))
	for _, k := range names {
		b = appendString(b, k)
		vs := h[k]
		b = binary.AppendUvarint(b, uint64(len(vs)))
		for _, v := range vs {
			b = appendString(b, v)
		}
	}
	return b
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// isRecord reports whether stored is in the middleware's format: its first
// byte is one of the format's versions. Other bytes are an operator's raw
// resolution.
func isRecord(stored []byte) bool {
	return len(stored) > 0 && (stored[0] == recordVersion || stored[0] == recordVersionTrailers)
}

// decodeResponse decodes what encode wrote, in either version; it never
// panics, and fails with errBadRecord on anything else.
func decodeResponse(b []byte) (*storedResponse, error) {
	if !isRecord(b) {
		return nil, errBadRecord
	}
	d := decoder{b: b[1:]}
	st := d.uvarint()
	if d.err || st < 200 || st > 999 {
		return nil, errBadRecord
	}
	r := &storedResponse{status: int(st), header: d.fields()}
	if b[0] == recordVersionTrailers {
		nd := d.uvarint()
		if d.err || nd > uint64(len(d.b)) {
			return nil, errBadRecord
		}
		for range nd {
			r.declared = append(r.declared, d.string())
		}
		r.trailer = d.fields()
		if !d.err && !r.hasTrailers() {
			return nil, errBadRecord // version 2 holds trailers: encode would have written 1
		}
	}
	if d.err {
		return nil, errBadRecord
	}
	r.body = d.b
	return r, nil
}

// fields reads a field list as appendFields wrote it.
func (d *decoder) fields() http.Header {
	n := d.uvarint()
	if d.err || n > uint64(len(d.b)) {
		d.err = true
		return nil
	}
	h := make(http.Header, n)
	for range n {
		k := d.string()
		nv := d.uvarint()
		if d.err || nv > uint64(len(d.b)) {
			d.err = true
			return nil
		}
		vs := make([]string, 0, nv)
		for range nv {
			vs = append(vs, d.string())
		}
		if d.err {
			return nil
		}
		h[k] = vs
	}
	return h
}

type decoder struct {
	b   []byte
	err bool
}

func (d *decoder) uvarint() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = true
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) string() string {
	n := d.uvarint()
	if d.err || n > uint64(len(d.b)) {
		d.err = true
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}
