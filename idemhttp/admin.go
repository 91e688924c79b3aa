package idemhttp

import (
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idem/idemcore"
)

// Operator is the part of an engine the admin handler drives: the operator
// API every engine offers (the bbolt *idem.Engine, idempg's *Engine, any
// backend's engine over idemcore). See the Engine methods of the same names
// for their errors. An Operator that is also a FileScanner (*idem.Engine)
// has GET /stats count its store in one scan.
type Operator interface {
	// Get returns key's live record (idemcore.ErrNotFound if none).
	Get(key string) (*idemcore.Record, error)
	// Forget deletes key's record in any state.
	Forget(key string) error
	// Resolve completes an interrupted execution by hand.
	Resolve(key string, response []byte, outcome *idemcore.Error) error
	// Messages walks the outbox: pending messages, then dead letters.
	Messages(fn func(m *idemcore.Message, err error) error) error
	// RetryDead puts a dead letter back in the outbox.
	RetryDead(seq uint64) error
	// DropDead deletes a dead letter.
	DropDead(seq uint64) error
	// Records walks the live records.
	Records(fn func(r *idemcore.Record, err error) error) error
	// Stats returns the counters since Open.
	Stats() idemcore.Stats
	// Retention is the retention window, wall-clock.
	Retention() time.Duration
}

// FileScanner is the optional part of an Operator that counts what its
// store holds in one read (*idem.Engine's ScanFile, over the bbolt file).
// For an Operator without it (idempg's engine), GET /stats counts by
// walking Records and Messages: live records only (ExpiredPending 0), no
// store size (FileSize 0), and no Waiting messages (which handlers the
// program registered is its dispatcher's to know).
type FileScanner interface {
	// ScanFile counts the records and messages in the store.
	ScanFile() (idemcore.FileStats, error)
}

// AdminAction is what an admin request asks to do, as passed to
// AdminOptions.Authorize.
type AdminAction string

const (
	// AdminRead is every GET route: the index, counters, records and outbox
	// messages (their stored responses and payloads only under
	// AdminOptions.ShowResponses).
	AdminRead AdminAction = "read"
	// AdminWrite is every route that changes state, all POST or DELETE:
	// forget and resolve a key, retry and drop a dead letter.
	AdminWrite AdminAction = "write"
)

// DefaultAdminMaxBody is the largest request body the admin handler reads
// (a resolve's JSON), in bytes: 4 MiB, room for idemcore.DefaultMaxResponseSize
// in base64.
const DefaultAdminMaxBody = 4 << 20

// AdminOptions configure Admin. A nil *AdminOptions refuses every request.
type AdminOptions struct {
	// Authorize decides whether r may do action; false answers 403 and does
	// nothing. It runs before anything is read or changed. Nil refuses
	// every request. AllowBearer builds one from a token. Browsers send
	// cookies with cross-site POSTs: base the decision on a credential a
	// browser does not attach by itself (a bearer token, a client
	// certificate), not on a session cookie alone.
	Authorize func(r *http.Request, action AdminAction) bool

	// ShowResponses includes stored responses (records) and payloads (outbox
	// messages) in the answers: they are user data, so by default the
	// handler shows only their sizes, with response_hidden or payload_hidden
	// set to true.
	ShowResponses bool

	// MaxBody is the largest request body read, in bytes; a larger one is
	// refused with 413 and changes nothing. Zero means DefaultAdminMaxBody.
	MaxBody int64
}

// AllowBearer returns an AdminOptions.Authorize that allows every action to
// requests carrying "Authorization: Bearer <token>" (RFC 6750), compared in
// constant time, and refuses all others. An empty token refuses everything.
// For finer rules (read-only tokens), write the function yourself.
func AllowBearer(token string) func(*http.Request, AdminAction) bool {
	want := []byte(token)
	return func(r *http.Request, _ AdminAction) bool {
		got, ok := adminBearer(r)
		return ok && len(want) > 0 && subtle.ConstantTimeCompare([]byte(got), want) == 1
	}
}

// adminBearer returns the token of an "Authorization: Bearer" header.
func adminBearer(r *http.Request) (string, bool) {
	scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimSpace(token)
	return token, token != ""
}

// Admin returns the admin handler: a JSON API over op for operators of a
// running program, which holds the idem file (the idem CLI talks to it with
// --url). Mount it under a prefix of its own, behind your authentication:
//
//	mux.Handle("/admin/idem/", http.StripPrefix("/admin/idem", idemhttp.Admin(e, &idemhttp.AdminOptions{
//		Authorize: idemhttp.AllowBearer(os.Getenv("IDEM_ADMIN_TOKEN")),
//	})))
//
// Routes, relative to the mount point (KEY in the query string, escaped, so
// that any key fits; SEQ a message's sequence number):
//
//	GET    /                        the retention window and whether responses are shown
//	GET    /stats                   counts and counters (FileScanner's scan, or walks; and Engine.Stats)
//	GET    /records?key=KEY         KEY's live record
//	DELETE /records?key=KEY         forget KEY: the next call runs as new
//	POST   /records/resolve?key=KEY complete KEY's interrupted execution (JSON body)
//	GET    /outbox                  messages; ?state=pending|dead|all (default all), &topic=T, &limit=N
//	GET    /outbox/SEQ              one message, pending or dead
//	POST   /outbox/SEQ/retry        put dead letter SEQ back in the outbox
//	DELETE /outbox/SEQ              drop dead letter SEQ
//
// Every route asks opts.Authorize first, with AdminRead for GET (and HEAD)
// and AdminWrite for the others; a refusal is 403. Nothing that changes state
// answers a GET: another method on a route is 405 with an Allow header.
// A resolve's body is a JSON object (Content-Type application/json, else
// 415) with optional members "response" (a string; absent or null: no
// response, which differs from ""), "response_encoding" ("utf-8", the
// default, or "base64") and "error" ({"code", "message"}: a stored
// *idemcore.Error), or, instead of those three, "http": {"status", "headers",
// "body", "body_encoding"}, an HTTP answer stored in Middleware's format
// (EncodeResponse: status 200 to 999, headers an object of arrays of
// strings as http.Header, body a string in body_encoding, "utf-8" by
// default or "base64"), which Middleware then replays to every retry with
// the key; a bad one is 400 and stores nothing. What Middleware replays
// for a raw "response" or an "error" is in its package documentation's
// table. Answers are JSON (Cache-Control: no-store); the shapes are
// AdminIndex, AdminStats, AdminRecord, AdminMessage and AdminMessages.
//
// Errors are RFC 9457 problem details (application/problem+json) whose
// "code" member names the case: invalid_key and bad_request (400),
// forbidden (403), not_found and message_not_found (404), wrong_state and in_progress (409, the
// latter with Retry-After), unsupported_media_type (415), too_large (413: a
// body over MaxBody, or a resolution over the engine's MaxResponseSize),
// closed (503), corrupt and internal (500). "op" and "key" name the
// engine's operation and key when it reported them (idemcore.OpError), and
// "detail" says why. The handler logs nothing: keys and responses go only
// to authorized callers. Keys travel in the query string, so an access log
// in front of the handler sees them: keep such logs off the admin routes, or
// use keys that carry no personal data (idemcore.KeyOf).
func Admin(op Operator, opts *AdminOptions) http.Handler {
	a := &admin{op: op}
	if opts != nil {
		a.opts = *opts
	}
	if a.opts.MaxBody <= 0 {
		a.opts.MaxBody = DefaultAdminMaxBody
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", a.guard(AdminRead, a.index))
	mux.HandleFunc("GET /stats", a.guard(AdminRead, a.stats))
	mux.HandleFunc("GET /records", a.guard(AdminRead, a.getRecord))
	mux.HandleFunc("DELETE /records", a.guard(AdminWrite, a.forget))
	mux.HandleFunc("POST /records/resolve", a.guard(AdminWrite, a.resolve))
	mux.HandleFunc("GET /outbox", a.guard(AdminRead, a.listMessages))
	mux.HandleFunc("GET /outbox/{seq}", a.guard(AdminRead, a.getMessage))
	mux.HandleFunc("POST /outbox/{seq}/retry", a.guard(AdminWrite, a.retryDead))
	mux.HandleFunc("DELETE /outbox/{seq}", a.guard(AdminWrite, a.dropDead))
	return mux
}

type admin struct {
	op   Operator
	opts AdminOptions
}

// guard asks Authorize before h runs.
func (a *admin) guard(action AdminAction, h func(http.ResponseWriter, *http.Request) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-store")
		if a.opts.Authorize == nil || !a.opts.Authorize(r, action) {
			adminWriteProblem(w, &adminError{status: http.StatusForbidden, code: "forbidden",
				detail: fmt.Sprintf("not authorized to %s", action)})
			return
		}
		if err := h(w, r); err != nil {
			adminWriteProblem(w, toAdminError(err))
		}
	}
}

func (a *admin) index(w http.ResponseWriter, _ *http.Request) error {
	ret := a.op.Retention()
	return adminWriteJSON(w, http.StatusOK, AdminIndex{
		Retention:        ret.String(),
		RetentionSeconds: ret.Seconds(),
		ShowResponses:    a.opts.ShowResponses,
	})
}

func (a *admin) stats(w http.ResponseWriter, _ *http.Request) error {
	fs, err := a.scan()
	if err != nil {
		return err
	}
	return adminWriteJSON(w, http.StatusOK, newAdminStats(fs, a.op.Stats(), a.op.Retention()))
}

// scan counts what the store holds: FileScanner's scan, else walks of the
// records and the messages (see FileScanner).
func (a *admin) scan() (idemcore.FileStats, error) {
	if fs, ok := a.op.(FileScanner); ok {
		return fs.ScanFile()
	}
	var s idemcore.FileStats
	err := a.op.Records(func(r *idemcore.Record, err error) error {
		switch {
		case err != nil && errors.Is(err, idemcore.ErrCorrupt):
			s.Corrupt++
		case err != nil:
			return err
		case r.State == idemcore.StateStarted:
			s.Started++
		default:
			s.Done++
		}
		return nil
	})
	if err != nil {
		return s, err
	}
	err = a.op.Messages(func(m *idemcore.Message, err error) error {
		switch {
		case err != nil && errors.Is(err, idemcore.ErrCorrupt):
			s.Outbox.Corrupt++
		case err != nil:
			return err
		case m.Dead:
			s.Outbox.Dead++
		default:
			s.Outbox.Pending++
			if m.Failures > 0 {
				s.Outbox.Retrying++
			}
		}
		return nil
	})
	s.Outbox.Delivered = a.op.Stats().Delivered
	return s, err
}

// adminQueryKey returns the key parameter: present and unique.
func adminQueryKey(r *http.Request) (string, error) {
	keys, ok := r.URL.Query()["key"]
	if !ok || len(keys) != 1 {
		return "", adminBadRequest("give one key parameter: ?key=KEY (query-escaped)")
	}
	return keys[0], nil
}

func (a *admin) getRecord(w http.ResponseWriter, r *http.Request) error {
	key, err := adminQueryKey(r)
	if err != nil {
		return err
	}
	rec, err := a.op.Get(key)
	if err != nil {
		return err
	}
	return adminWriteJSON(w, http.StatusOK, a.record(rec))
}

func (a *admin) forget(w http.ResponseWriter, r *http.Request) error {
	key, err := adminQueryKey(r)
	if err != nil {
		return err
	}
	if err := a.op.Forget(key); err != nil {
		return err
	}
	return adminWriteJSON(w, http.StatusOK, adminForgotten{Key: key, Forgotten: true})
}

// adminResolveBody is the JSON body of POST /records/resolve.
type adminResolveBody struct {
	Response         *string          `json:"response"`
	ResponseEncoding string           `json:"response_encoding"`
	Error            *AdminErrorJSON  `json:"error"`
	HTTP             *adminHTTPAnswer `json:"http"`
}

// adminHTTPAnswer is a resolve's "http" member: an HTTP answer, stored in
// Middleware's format (EncodeResponse).
type adminHTTPAnswer struct {
	Status       int         `json:"status"`
	Headers      http.Header `json:"headers"`
	Body         string      `json:"body"`
	BodyEncoding string      `json:"body_encoding"`
}

// decodeText decodes s as encoding names it: "utf-8" (or "") or "base64".
func decodeText(s, encoding, member string) ([]byte, error) {
	switch encoding {
	case "", "utf-8":
		return []byte(s), nil
	case "base64":
		b, err := base64.StdEncoding.DecodeString(s)
		if err != nil {
			return nil, adminBadRequest(member + " is not valid base64: " + err.Error())
		}
		return b, nil
	default:
		return nil, adminBadRequest(fmt.Sprintf("%s_encoding must be utf-8 or base64, not %q", member, encoding))
	}
}

func (a *admin) resolve(w http.ResponseWriter, r *http.Request) error {
	key, err := adminQueryKey(r)
	if err != nil {
		return err
	}
	var body adminResolveBody
	if err := a.readJSON(w, r, &body); err != nil {
		return err
	}
	var resp []byte
	if body.HTTP != nil {
		if body.Response != nil || body.Error != nil || body.ResponseEncoding != "" {
			return adminBadRequest(`"http" excludes "response", "response_encoding" and "error"`)
		}
		b, err := decodeText(body.HTTP.Body, body.HTTP.BodyEncoding, "body")
		if err != nil {
			return err
		}
		if resp, err = EncodeResponse(body.HTTP.Status, body.HTTP.Headers, b); err != nil {
			return adminBadRequest(err.Error())
		}
	}
	if body.Response != nil {
		if resp, err = decodeText(*body.Response, body.ResponseEncoding, "response"); err != nil {
			return err
		}
		if resp == nil {
			resp = []byte{} // "" is an empty response, not none
		}
	}
	var outcome *idemcore.Error
	if body.Error != nil {
		outcome = &idemcore.Error{Code: body.Error.Code, Message: body.Error.Message}
	}
	if err := a.op.Resolve(key, resp, outcome); err != nil {
		return err
	}
	rec, err := a.op.Get(key)
	if err != nil {
		return err
	}
	return adminWriteJSON(w, http.StatusOK, a.record(rec))
}

// readJSON decodes r's body into v: application/json, at most MaxBody
// bytes, one object with no unknown members.
func (a *admin) readJSON(w http.ResponseWriter, r *http.Request, v any) error {
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		return &adminError{status: http.StatusUnsupportedMediaType, code: "unsupported_media_type",
			detail: "the body must be JSON, with Content-Type: application/json"}
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, a.opts.MaxBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if errors.As(err, new(*http.MaxBytesError)) {
			return &adminError{status: http.StatusRequestEntityTooLarge, code: "too_large",
				detail: fmt.Sprintf("the body exceeds %d bytes", a.opts.MaxBody)}
		}
		return adminBadRequest("the body is not the JSON object expected: " + err.Error())
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return adminBadRequest("the body holds more than one JSON value")
	}
	return nil
}

func (a *admin) listMessages(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	state := q.Get("state")
	switch state {
	case "":
		state = "all"
	case "all", "pending", "dead":
	default:
		return adminBadRequest(fmt.Sprintf("state must be pending, dead or all, not %q", state))
	}
	limit := 0
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			return adminBadRequest(fmt.Sprintf("limit must be a non-negative integer, not %q", s))
		}
		limit = n
	}
	_, byTopic := q["topic"]
	topic := q.Get("topic")
	out := AdminMessages{Messages: []AdminMessage{}, Corrupt: []AdminCorrupt{}}
	err := a.op.Messages(func(m *idemcore.Message, merr error) error {
		switch {
		case state == "pending" && m.Dead, state == "dead" && !m.Dead:
		case merr != nil && errors.Is(merr, idemcore.ErrCorrupt):
			out.Corrupt = append(out.Corrupt, AdminCorrupt{Seq: m.Seq, Dead: m.Dead})
		case merr != nil:
			return merr
		case !byTopic || m.Topic == topic:
			out.Matched++
			if limit == 0 || len(out.Messages) < limit {
				out.Messages = append(out.Messages, a.message(m))
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	return adminWriteJSON(w, http.StatusOK, out)
}

// adminPathSeq parses the {seq} path segment.
func adminPathSeq(r *http.Request) (uint64, error) {
	s := r.PathValue("seq")
	seq, err := strconv.ParseUint(s, 10, 64)
	if err != nil || seq == 0 {
		return 0, adminBadRequest(fmt.Sprintf("%q is not a message sequence number (a positive integer)", s))
	}
	return seq, nil
}

// adminErrStop ends a walk of the messages early.
var adminErrStop = errors.New("stop")

func (a *admin) getMessage(w http.ResponseWriter, r *http.Request) error {
	seq, err := adminPathSeq(r)
	if err != nil {
		return err
	}
	var found *idemcore.Message
	err = a.op.Messages(func(m *idemcore.Message, merr error) error {
		if m.Seq != seq {
			return nil
		}
		if merr != nil {
			return merr
		}
		found = m
		return adminErrStop
	})
	switch {
	case errors.Is(err, adminErrStop):
	case err != nil:
		return err
	case found == nil:
		return fmt.Errorf("%w: message %d (delivered, dropped, expired or never enqueued)", idemcore.ErrMessageNotFound, seq)
	}
	return adminWriteJSON(w, http.StatusOK, a.message(found))
}

func (a *admin) retryDead(w http.ResponseWriter, r *http.Request) error {
	return a.operateDead(w, r, "retry", a.op.RetryDead)
}

func (a *admin) dropDead(w http.ResponseWriter, r *http.Request) error {
	return a.operateDead(w, r, "drop", a.op.DropDead)
}

func (a *admin) operateDead(w http.ResponseWriter, r *http.Request, name string, do func(uint64) error) error {
	seq, err := adminPathSeq(r)
	if err != nil {
		return err
	}
	if err := do(seq); err != nil {
		return err
	}
	return adminWriteJSON(w, http.StatusOK, adminDeadOp{Op: name, Seq: seq})
}

// record renders rec, with its response only under ShowResponses.
func (a *admin) record(rec *idemcore.Record) AdminRecord {
	return NewAdminRecord(rec, idemcore.Expiry(rec, a.op.Retention()), a.opts.ShowResponses)
}

// message renders m, with its payload only under ShowResponses.
func (a *admin) message(m *idemcore.Message) AdminMessage {
	return NewAdminMessage(m, 0, a.opts.ShowResponses)
}
