package idemhttp

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/idemkit/idem/idemcore"
)

// errNotStored is the cause of the idemcore.Retryable outcome of a response the
// handler marked NotStored (or a 401 or 403).
var errNotStored = errors.New("idemhttp: response not stored")

// errStreamed is the stored error of a response over the size limit; it
// wraps idemcore.ErrResponseTooLarge, so the engine stores it with the code
// replays match idemcore.ErrResponseTooLarge by.
var errStreamed = fmt.Errorf("idemhttp: response over the size limit was streamed, not stored: %w", idemcore.ErrResponseTooLarge)

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
// response up to a limit, then streams the rest to the real writer.
type recorder struct {
	w      http.ResponseWriter
	limit  int
	header http.Header

	status    int // 0 until the handler writes a final status
	body      []byte
	streaming bool // over the limit: written through to w
	notStored bool
	finished  bool
}

func newRecorder(w http.ResponseWriter, limit int) *recorder {
	return &recorder{w: w, limit: limit, header: http.Header{}}
}

// Header returns the header map of the response being recorded.
func (rec *recorder) Header() http.Header { return rec.header }

// WriteHeader records the status. Informational (1xx) statuses are dropped:
// a replay could not repeat them.
func (rec *recorder) WriteHeader(code int) {
	if rec.status != 0 || code < 200 {
		return
	}
	rec.status = code
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
	copyHeader(rec.w.Header(), rec.header)
	rec.w.WriteHeader(rec.status)
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
func (rec *recorder) Flush() {
	if rec.streaming {
		if f, ok := rec.w.(http.Flusher); ok {
			f.Flush()
		}
	}
}

// outcome is fn's result for the engine: the encoded response, or the
// error that keeps it out of the store.
func (rec *recorder) outcome(headers []string) ([]byte, error) {
	if rec.status == 0 {
		rec.status = http.StatusOK
	}
	switch {
	case rec.notStored || rec.status == http.StatusUnauthorized || rec.status == http.StatusForbidden:
		return nil, idemcore.Retryable(errNotStored)
	case rec.streaming:
		return nil, errStreamed
	}
	stored := make(http.Header, len(headers))
	for _, h := range headers {
		if v, ok := rec.header[h]; ok {
			stored[h] = v
		}
	}
	return encodeResponse(rec.status, stored, rec.body), nil
}

// finish sends the recorded response to the client, once.
func (rec *recorder) finish() {
	if rec.finished || rec.streaming {
		return
	}
	rec.finished = true
	copyHeader(rec.w.Header(), rec.header)
	writeResponse(rec.w, rec.status, rec.body)
}

// replay writes a stored response with Idempotent-Replayed: true. Bytes
// not in the middleware's format (their first byte is not recordVersion:
// an operator's raw resolution) replay as 200 with the bytes as body,
// Content-Type application/octet-stream; bytes that start as the format
// but do not decode fail with errBadRecord.
func replay(w http.ResponseWriter, stored []byte) error {
	if len(stored) == 0 || stored[0] != recordVersion {
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set(HeaderReplayed, "true")
		writeResponse(w, http.StatusOK, stored)
		return nil
	}
	status, header, body, err := decodeResponse(stored)
	if err != nil {
		return err
	}
	copyHeader(w.Header(), header)
	w.Header().Set(HeaderReplayed, "true")
	writeResponse(w, status, body)
	return nil
}

// writeResponse writes status and body, with the body's Content-Length, the
// same way for a first answer and its replays.
func writeResponse(w http.ResponseWriter, status int, body []byte) {
	if bodyAllowed(status) {
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	} else {
		w.Header().Del("Content-Length")
	}
	w.WriteHeader(status)
	if bodyAllowed(status) && len(body) > 0 {
		w.Write(body)
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
