package idemhttp

import (
	"encoding/json"
	"fmt"
	"net/http"
)

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

// AdminIndex is the answer of GET /.
type AdminIndex struct {
	// Retention is the retention window as a Go duration ("24h0m0s"), and
	// RetentionSeconds the same in seconds.
	Retention        string  `json:"retention"`
	RetentionSeconds float64 `json:"retention_seconds"`
	// ShowResponses tells whether answers carry stored responses and
	// payloads (AdminOptions.ShowResponses).
	ShowResponses bool `json:"show_responses"`
}

func adminWriteJSON(w http.ResponseWriter, status int, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
	return nil
}
