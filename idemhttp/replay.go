package idemhttp

import (
	"net/http"
	"slices"
	"strconv"
	"strings"
)

// How a response is written: a first answer and its replays alike.

// replay writes a stored response with Idempotent-Replayed: true. Bytes
// not in the middleware's format (their first byte is not one of its
// versions: an operator's raw resolution) replay as 200 with the bytes as
// body, Content-Type application/octet-stream; bytes that start as the
// format but do not decode fail with errBadRecord.
func replay(w http.ResponseWriter, stored []byte) error {
	if !isRecord(stored) {
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set(HeaderReplayed, "true")
		writeResponse(w, &storedResponse{status: http.StatusOK, body: stored})
		return nil
	}
	r, err := decodeResponse(stored)
	if err != nil {
		return err
	}
	w.Header().Set(HeaderReplayed, "true")
	writeResponse(w, r)
	return nil
}

// writeResponse writes r over what w's header holds: its header, its
// status, its body with its Content-Length (none when r has trailers, which
// HTTP/1.1 sends only in the chunked encoding), then its trailers; the same
// way for a first answer and its replays.
func writeResponse(w http.ResponseWriter, r *storedResponse) {
	copyHeader(w.Header(), r.header)
	n := len(r.body)
	if r.hasTrailers() {
		n = -1
	}
	writeHead(w, r.status, r.declared, n)
	if bodyAllowed(r.status) && len(r.body) > 0 {
		w.Write(r.body)
	}
	writeTrailers(w, r)
}

// writeHead writes the status, with the Trailer header declaring declared
// and a Content-Length of n (none when n < 0 or the status has no body).
func writeHead(w http.ResponseWriter, status int, declared []string, n int) {
	h := w.Header()
	h.Del("Trailer")
	if len(declared) > 0 {
		h.Set("Trailer", strings.Join(declared, ", "))
	}
	if bodyAllowed(status) && n >= 0 {
		h.Set("Content-Length", strconv.Itoa(n))
	} else {
		h.Del("Content-Length")
	}
	w.WriteHeader(status)
}

// writeTrailers sets r's trailers on w after its body: under their names
// when declared, through http.TrailerPrefix otherwise.
func writeTrailers(w http.ResponseWriter, r *storedResponse) {
	h := w.Header()
	for k, vs := range r.trailer {
		if slices.Contains(r.declared, k) {
			h[k] = append([]string(nil), vs...)
		} else {
			h[http.TrailerPrefix+k] = append([]string(nil), vs...)
		}
	}
}

// bodyAllowed reports whether a response with status may have a body (RFC
// 9110 sections 15.3.5 and 15.4.5).
func bodyAllowed(status int) bool {
	return status != http.StatusNoContent && status != http.StatusNotModified && status >= 200
}

// copyHeader sets dst's fields to src's, replacing what dst held under the
// same names.
func copyHeader(dst, src http.Header) {
	for k, v := range src {
		dst[k] = append([]string(nil), v...)
	}
}
