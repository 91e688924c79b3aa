package idemhttp

import (
	"errors"
	"fmt"
	"net/http"
	"net/textproto"
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
