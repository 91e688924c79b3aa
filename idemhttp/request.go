package idemhttp

import (
	"bytes"
	"encoding/binary"
	"io"
	"net/http"
)

// The request as the middleware reads it: its body, read once, and its fingerprint.

// readBody reads r's body, at most limit bytes.
func readBody(r *http.Request, limit int64) (body []byte, tooLarge bool, err error) {
	if r.ContentLength > limit {
		return nil, true, nil
	}
	if r.Body == nil || r.Body == http.NoBody {
		return []byte{}, false, nil
	}
	body, err = io.ReadAll(io.LimitReader(r.Body, limit+1))
	if err != nil {
		return nil, false, err
	}
	if int64(len(body)) > limit {
		return nil, true, nil
	}
	return body, false, nil
}

// withBody returns a shallow copy of r whose body reads body.
func withBody(r *http.Request, body []byte) *http.Request {
	r2 := *r
	r2.Body = io.NopCloser(bytes.NewReader(body))
	r2.ContentLength = int64(len(body))
	r2.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	return &r2
}

// fingerprint is what defines "the same request": the method, the escaped
// path, the raw query and the raw body, each prefixed with its length. The
// scope is in the key, not here; headers are not part of it.
func fingerprint(r *http.Request, body []byte) []byte {
	parts := [...][]byte{[]byte(r.Method), []byte(r.URL.EscapedPath()), []byte(r.URL.RawQuery), body}
	n := 0
	for _, p := range parts {
		n += binary.MaxVarintLen64 + len(p)
	}
	fp := make([]byte, 0, n)
	for _, p := range parts {
		fp = binary.AppendUvarint(fp, uint64(len(p)))
		fp = append(fp, p...)
	}
	return fp
}
