package idemhttp

import (
	"encoding/binary"
	"errors"
	"net/http"
	"slices"
)

// The stored response, the bytes handed to the engine: a version byte (1),
// the status (uvarint), the number of header fields (uvarint), each field as
// its name and its values (uvarint count, each value a uvarint length and
// its bytes), and the body, the rest.
const recordVersion = 1

var errBadRecord = errors.New("idemhttp: stored response does not decode")

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
