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

// The stored response, the bytes handed to the engine: a version byte (1),
// the status (uvarint), the number of header fields (uvarint), each field as
// its name and its values (uvarint count, each value a uvarint length and
// its bytes), and the body, the rest.
const recordVersion = 1

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
// deterministic: the same answer always encodes the same.
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
	names := make([]string, 0, len(header))
	n := 1 + 2*binary.MaxVarintLen64 + len(body)
	for k, vs := range header {
		names = append(names, k)
		n += binary.MaxVarintLen64*(2+len(vs)) + len(k)
		for _, v := range vs {
			n += len(v)
		}
	}
	slices.Sort(names) // the same response always encodes the same
	b := make([]byte, 0, n)
	b = append(b, recordVersion)
	b = binary.AppendUvarint(b, uint64(status))
	b = binary.AppendUvarint(b, uint64(len(names)))
	for _, k := range names {
		b = appendString(b, k)
		vs := header[k]
		b = binary.AppendUvarint(b, uint64(len(vs)))
		for _, v := range vs {
			b = appendString(b, v)
		}
	}
	return append(b, body...)
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// decodeResponse decodes what encodeResponse wrote; it never panics, and
// fails with errBadRecord on anything else.
func decodeResponse(b []byte) (status int, header http.Header, body []byte, err error) {
	d := decoder{b: b}
	if len(b) == 0 || b[0] != recordVersion {
		return 0, nil, nil, errBadRecord
	}
	d.b = b[1:]
	st := d.uvarint()
	nh := d.uvarint()
	if d.err || st < 200 || st > 999 || nh > uint64(len(d.b)) {
		return 0, nil, nil, errBadRecord
	}
	header = make(http.Header, nh)
	for range nh {
		k := d.string()
		nv := d.uvarint()
		if d.err || nv > uint64(len(d.b)) {
			return 0, nil, nil, errBadRecord
		}
		vs := make([]string, 0, nv)
		for range nv {
			vs = append(vs, d.string())
		}
		if d.err {
			return 0, nil, nil, errBadRecord
		}
		header[k] = vs
	}
	return int(st), header, d.b, nil
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
