package idemhttp

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// What Transport retries, and after how long.

// transient reports whether err, from sending a request, may go away on a
// retry: a timeout, or the connection refused, reset or closed.
func transient(err error) bool {
	var ne net.Error
	switch {
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.ECONNREFUSED),
		errors.Is(err, syscall.ECONNABORTED), errors.Is(err, syscall.EPIPE):
		return true
	case errors.As(err, &ne) && ne.Timeout():
		return true
	}
	return false
}

// retryStatus reports whether resp may change when the request is sent
// again with the same key: the in-progress 409 (Middleware's
// ProblemInProgress, Stripe's idempotency_key_in_use), and 429, 502, 503
// and 504 that were not replayed. A replay (Idempotent-Replayed: true) is a
// stored answer, final whatever its status and its Retry-After; any other
// 409 is the handler's own answer (a conflict of the resource, or
// ProblemIncomplete, which waiting does not change).
func retryStatus(resp *http.Response) bool {
	if strings.EqualFold(strings.TrimSpace(resp.Header.Get(HeaderReplayed)), "true") {
		return false
	}
	switch resp.StatusCode {
	case http.StatusConflict:
		return inProgress(resp)
	case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	}
	return false
}

// inProgress reports whether resp's body says a request with the key is in
// progress: problem details of type ProblemInProgress, or a Stripe error
// with code idempotency_key_in_use (Stripe sends application/json, so the
// Content-Type is not asked). It reads at most 4 KiB of the body and puts
// them back in front of the rest.
func inProgress(resp *http.Response) bool {
	head, err := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	resp.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(head), resp.Body), resp.Body}
	if err != nil {
		return false
	}
	var p struct {
		Type  any `json:"type"`
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	if json.Unmarshal(head, &p) != nil {
		return false
	}
	return p.Type == ProblemInProgress || p.Error.Code == stripeKeyInUse
}

// retryAfter parses a Retry-After value (RFC 9110 section 10.2.3):
// delay-seconds or an HTTP date.
func retryAfter(v string, now time.Time) (time.Duration, bool) {
	if v == "" {
		return 0, false
	}
	if s, err := strconv.ParseInt(v, 10, 64); err == nil && s >= 0 {
		return time.Duration(s) * time.Second, true
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(t.Sub(now), 0), true
	}
	return 0, false
}

type statusError struct{ status int }

// drain reads a little of a response that is not returned, so its connection
// can be reused, and closes it.
func drain(resp *http.Response) {
	io.CopyN(io.Discard, resp.Body, 64<<10)
	resp.Body.Close()
}

func or(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}
