package idemhttp

import (
	"errors"
	"fmt"
	"net/http"
	"net/textproto"
	"slices"
	"strconv"
	"strings"

	"github.com/idemkit/idem/idemcore"
)

// errNotStored is the cause of the idemcore.Retryable outcome of a response the
// handler marked NotStored (or a 401 or 403).
var errNotStored = errors.New("idemhttp: response not stored")

// errOverLimit is the stored error of a response over the size limit; it
// wraps idemcore.ErrResponseTooLarge, so the engine stores it with the code
// replays match idemcore.ErrResponseTooLarge by.
var errOverLimit = fmt.Errorf("idemhttp: response over the size limit was sent, not stored: %w", idemcore.ErrResponseTooLarge)

// NotStored marks the response being written to w as not to be stored: a
// transient failure (a 503 from a dependency, a lock timeout) whose effect
// did not happen. The handler's caller gets the response; the key is freed
// (idemcore.Retryable), so a retry with it runs the handler again. Call it from a
// handler behind Middleware, before or after writing; w may be the
// middleware's writer or any writer that wraps it and has an
// Unwrap() http.ResponseWriter method (as http.ResponseController expects).
// It reports false, and does nothing, when w is not behind Middleware.
//
// Responses with status 401 or 403 are never stored, without NotStored.
func NotStored(w http.ResponseWriter) bool {
	for {
		switch v := w.(type) {
		case *recorder:
			v.notStored = true
			return true
		case interface{ Unwrap() http.ResponseWriter }:
			w = v.Unwrap()
		default:
			return false
		}
	}
}

// recorder is the http.ResponseWriter the handler writes to: it buffers the
// response up to a limit, then streams the rest to the real writer. As
// net/http's own writer, it sends the header as it was when the status was
// written (later changes are lost, but for trailers) and sends trailers
// after the body: the names the Trailer header declared then, with their
// values at the end, and the fields set through http.TrailerPrefix.
type recorder struct {
	w      http.ResponseWriter
	limit  int
	header http.Header // the handler's map

	status    int         // 0 until the handler writes a final status
	sent      http.Header // header as it was when the status was written
	body      []byte
	streaming bool // over the limit: written through to w
	notStored bool
	finished  bool
	final     *storedResponse // the response as sent, once the handler returned
}

func newRecorder(w http.ResponseWriter, limit int) *recorder {
	return &recorder{w: w, limit: limit, header: http.Header{}}
}

// Header returns the header map of the response being recorded.
func (rec *recorder) Header() http.Header { return rec.header }

// WriteHeader records the status and the header as it is now.
// Informational (1xx) statuses are dropped: a replay could not repeat them.
func (rec *recorder) WriteHeader(code int) {
	if rec.status != 0 || code < 200 {
		return
	}
	rec.status = code
	rec.sent = rec.header.Clone()
}

// Write buffers p; once the body passes the limit, the buffered response is
// written to the client and the rest streams through.
func (rec *recorder) Write(p []byte) (int, error) {
	if rec.status == 0 {
		rec.WriteHeader(http.StatusOK)
	}
	if rec.streaming {
		return rec.w.Write(p)
	}
	if len(rec.body)+len(p) <= rec.limit {
		rec.body = append(rec.body, p...)
		return len(p), nil
	}
	rec.streaming = true
	copyHeader(rec.w.Header(), responseHeader(rec.sent))
	writeHead(rec.w, rec.status, declaredTrailers(rec.sent), -1)
	if len(rec.body) > 0 {
		if _, err := rec.w.Write(rec.body); err != nil {
			return 0, err
		}
	}
	rec.body = nil
	return rec.w.Write(p)
}

// Flush does nothing while the response is buffered (it is sent whole when
// the handler returns) and flushes the client's connection once it streams.
func (rec *recorder) Flush() { rec.FlushError() }

// FlushError is Flush for http.ResponseController: it returns the error of
// flushing the client's connection once the response streams, nil before.
func (rec *recorder) FlushError() error {
	if !rec.streaming {
		return nil
	}
	return http.NewResponseController(rec.w).Flush()
}

// sentResponse is the response as the handler made it, once it returned:
// every header it set (as when the status was written) and every trailer.
func (rec *recorder) sentResponse() *storedResponse {
	if rec.final != nil {
		return rec.final
	}
	if rec.status == 0 {
		rec.WriteHeader(http.StatusOK)
	}
	r := &storedResponse{status: rec.status, header: responseHeader(rec.sent), declared: declaredTrailers(rec.sent), body: rec.body}
	for k, vs := range rec.header {
		if name, ok := strings.CutPrefix(k, http.TrailerPrefix); ok {
			if name = textproto.CanonicalMIMEHeaderKey(name); validTrailer(name) {
				r.trailer = addFields(r.trailer, name, vs)
			}
		}
	}
	for _, k := range r.declared {
		if vs, ok := rec.header[k]; ok {
			r.trailer = addFields(r.trailer, k, vs)
		}
	}
	rec.final = r
	return r
}

// outcome is fn's result for the engine: the encoded response, or the
// error that keeps it out of the store. Trailers count in the size limit
// with the body.
func (rec *recorder) outcome(headers []string) ([]byte, error) {
	r := rec.sentResponse()
	switch {
	case rec.notStored || r.status == http.StatusUnauthorized || r.status == http.StatusForbidden:
		return nil, idemcore.Retryable(errNotStored)
	case rec.streaming:
		return nil, errOverLimit
	}
	stored := &storedResponse{status: r.status, header: make(http.Header, len(headers)), body: r.body}
	for _, h := range headers {
		if v, ok := r.header[h]; ok {
			stored.header[h] = v
		}
	}
	size := len(r.body)
	for _, k := range r.declared {
		if !neverStored[k] {
			stored.declared = append(stored.declared, k)
			size += len(k)
		}
	}
	for k, vs := range r.trailer {
		if neverStored[k] {
			continue
		}
		stored.trailer = addFields(stored.trailer, k, vs)
		size += len(k)
		for _, v := range vs {
			size += len(v)
		}
	}
	if size > rec.limit {
		return nil, errOverLimit // the trailers pass the limit: sent by finish, not stored
	}
	return stored.encode(), nil
}

// finish sends the recorded response to the client, once: whole, or, when
// it streamed, its trailers.
func (rec *recorder) finish() {
	if rec.finished {
		return
	}
	rec.finished = true
	r := rec.sentResponse()
	if rec.streaming {
		writeTrailers(rec.w, r)
		return
	}
	writeResponse(rec.w, r)
}

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

// responseHeader is h without what net/http does not send as a header: the
// Trailer declaration (writeHead sends it) and http.TrailerPrefix fields.
func responseHeader(h http.Header) http.Header {
	out := make(http.Header, len(h))
	for k, vs := range h {
		if k != "Trailer" && !strings.HasPrefix(k, http.TrailerPrefix) {
			out[k] = vs
		}
	}
	return out
}

// declaredTrailers are the trailer names h's Trailer header declares, as
// net/http reads them: comma-separated, canonical, each once (sorted), not
// those RFC 9110 section 6.5.1 forbids in trailers.
func declaredTrailers(h http.Header) []string {
	var names []string
	for _, v := range h["Trailer"] {
		for _, k := range strings.Split(v, ",") {
			k = textproto.CanonicalMIMEHeaderKey(strings.Trim(k, " \t"))
			if k != "" && validTrailer(k) && !slices.Contains(names, k) {
				names = append(names, k)
			}
		}
	}
	slices.Sort(names)
	return names
}

// validTrailer reports whether net/http sends a field named k (canonical)
// in trailers (golang.org/x/net/http/httpguts.ValidTrailerHeader).
func validTrailer(k string) bool {
	return validHeaderName(k) && !strings.HasPrefix(k, "If-") && !badTrailer[k]
}

// badTrailer are the fields net/http refuses in trailers (httpguts).
var badTrailer = map[string]bool{
	"Authorization": true, "Cache-Control": true, "Connection": true, "Content-Encoding": true,
	"Content-Length": true, "Content-Range": true, "Content-Type": true, "Expect": true,
	"Host": true, "Keep-Alive": true, "Max-Forwards": true, "Pragma": true,
	"Proxy-Authenticate": true, "Proxy-Authorization": true, "Proxy-Connection": true,
	"Range": true, "Realm": true, "Te": true, "Trailer": true, "Transfer-Encoding": true,
	"Www-Authenticate": true,
}

// addFields appends vs to h[k], making h when it is nil.
func addFields(h http.Header, k string, vs []string) http.Header {
	if h == nil {
		h = http.Header{}
	}
	h[k] = append(h[k], vs...)
	return h
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
