package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
)

// remoteTimeout bounds one request to the admin handler.
const remoteTimeout = 30 * time.Second

// remoteCommands are the commands that work with --url: they talk to a
// running program's admin handler (idemhttp.Admin) instead of a file.
var remoteCommands = map[string]bool{
	"idem stats": true, "idem get": true, "idem forget": true, "idem resolve": true,
	"idem outbox ls": true, "idem outbox get": true, "idem outbox retry": true, "idem outbox drop": true,
}

// remoteNeutral are the commands that take --url without using it: they
// print help.
var remoteNeutral = map[string]bool{"idem": true, "idem outbox": true, "idem help": true}

// operator is what the commands that work both on a file and through --url
// call: an *idem.Engine on the file, or a *remote.
type operator interface {
	idemhttp.Operator
	idemhttp.FileScanner
	Close() error
}

var (
	_ operator = (*idem.Engine)(nil)
	_ operator = (*remote)(nil)
)

// remoteFlags are the flags of online operation.
type remoteFlags struct {
	url   string
	token string
	ctx   context.Context
	// keepRetention: --retention was given, or is zero (each record's own
	// window): the server's window does not replace it.
	keepRetention bool
	// conn is the connection made by openOperator, for the renderings that
	// depend on what the server hides.
	conn *remote
}

// addRemote adds --url and --token to the root command, and says so in its
// help.
func (a *app) addRemote(root *cobra.Command) {
	root.Long += `

With --url, stats, get, forget, resolve and outbox ls|get|retry|drop talk to a
running program's admin handler (idemhttp.Admin) instead of a file, sending
--token (or $IDEM_TOKEN) as a bearer token (use https beyond loopback: the
token and the keys travel in the request); the retention window is then the
server's.`
	f := root.PersistentFlags()
	f.StringVar(&a.remote.url, "url", "", "talk to a running program's admin handler at this URL instead of opening --db ($IDEM_URL)")
	f.StringVar(&a.remote.token, "token", "", "bearer token for --url, handed to the handler's authorization function ($IDEM_TOKEN; the variable keeps it out of ps)")
}

// resolveRemote applies $IDEM_URL (unless --db is given) and $IDEM_TOKEN,
// and refuses the commands that need the file itself.
func (a *app) resolveRemote(cmd *cobra.Command) error {
	r := &a.remote
	r.ctx = cmd.Context()
	r.keepRetention = cmd.Flags().Changed("retention") || a.retention == 0
	if !cmd.Flags().Changed("url") && !cmd.Flags().Changed("db") {
		r.url = a.getenv("IDEM_URL") // --db given: the file, whatever the environment says
	}
	if !cmd.Flags().Changed("token") {
		r.token = a.getenv("IDEM_TOKEN")
	}
	if r.url == "" {
		return nil
	}
	if cmd.Flags().Changed("db") {
		return &usageError{errors.New("give --db or --url, not both")}
	}
	a.db = r.url // where the commands say they read (stats' "file")
	u, err := url.Parse(r.url)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return &usageError{fmt.Errorf("--url must be an http or https URL, such as http://127.0.0.1:8080/admin/idem, not %q", r.url)}
	}
	if path := cmd.CommandPath(); !remoteCommands[path] && !remoteNeutral[path] {
		return &usageError{fmt.Errorf("%s works on a file and does not take --url (with --url: stats, get, forget, resolve, outbox ls|get|retry|drop)", cmd.CommandPath())}
	}
	return nil
}

// openOperator opens the file at --db, or connects to --url: the server's
// retention window then replaces the default of --retention.
func (a *app) openOperator() (operator, error) {
	if a.remote.url == "" {
		return a.openEngine()
	}
	rm := &remote{
		base:   strings.TrimSuffix(a.remote.url, "/"),
		token:  a.remote.token,
		ctx:    a.remote.ctx,
		client: &http.Client{Timeout: remoteTimeout},
	}
	var idx idemhttp.AdminIndex
	if err := rm.do(http.MethodGet, "/", nil, &idx); err != nil {
		return nil, err
	}
	rm.retention = time.Duration(idx.RetentionSeconds * float64(time.Second))
	if rm.retention > 0 && !a.remote.keepRetention {
		a.retention = rm.retention
	}
	a.remote.conn = rm
	return rm, nil
}

// sizeOf is the file's size for stats: on disk, or with --url the size in
// use that the server reports (s.FileSize).
func (a *app) sizeOf(s idem.FileStats) (int64, error) {
	if a.remote.url != "" {
		return s.FileSize, nil
	}
	return fileSize(a.db)
}

// hiddenResponse reports the size of key's response when the server hides
// it (its AdminOptions.ShowResponses is off).
func (a *app) hiddenResponse(key string) (int, bool) {
	if a.remote.conn == nil {
		return 0, false
	}
	n, ok := a.remote.conn.hiddenResponses[key]
	return n, ok
}

// serverExpiry is when key's record expires as the server judges it (nil:
// never), with --url: the server knows the engine's window and each record's.
func (a *app) serverExpiry(key string) (*time.Time, bool) {
	if a.remote.conn == nil {
		return nil, false
	}
	at, ok := a.remote.conn.expiries[key]
	return at, ok
}

// hiddenPayload is hiddenResponse for message seq's payload.
func (a *app) hiddenPayload(seq uint64) (int, bool) {
	if a.remote.conn == nil {
		return 0, false
	}
	n, ok := a.remote.conn.hiddenPayloads[seq]
	return n, ok
}

// remote is a running program's admin handler, as an operator: the engine
// calls become HTTP requests, the answers idem's types and errors again.
type remote struct {
	base      string
	token     string
	ctx       context.Context
	client    *http.Client
	retention time.Duration

	// The sizes of what the server hid, by key and by seq.
	hiddenResponses map[string]int
	hiddenPayloads  map[uint64]int
	// expiries are the records' expiry times as the server judges them, by
	// key (nil: never).
	expiries map[string]*time.Time
}

func (r *remote) Close() error { return nil }

func (r *remote) Retention() time.Duration { return r.retention }

// Records fails: the admin handler lists no records (ls reads a file only,
// and takes no --url).
func (r *remote) Records(func(*idem.Record, error) error) error {
	return fmt.Errorf("idem: %s: the admin handler lists no records: run idem ls on the file", r.base)
}

func keyPath(route, key string) string { return route + "?key=" + url.QueryEscape(key) }

func (r *remote) Get(key string) (*idem.Record, error) {
	var rec idemhttp.AdminRecord
	if err := r.do(http.MethodGet, keyPath("/records", key), nil, &rec); err != nil {
		return nil, err
	}
	return r.record(&rec)
}

func (r *remote) Forget(key string) error {
	return r.do(http.MethodDelete, keyPath("/records", key), nil, nil)
}

func (r *remote) Resolve(key string, response []byte, outcome *idem.Error) error {
	body := map[string]any{}
	if response != nil {
		body["response"], body["response_encoding"] = base64.StdEncoding.EncodeToString(response), "base64"
	}
	if outcome != nil {
		body["error"] = idemhttp.AdminErrorJSON{Code: outcome.Code, Message: outcome.Message}
	}
	return r.do(http.MethodPost, keyPath("/records/resolve", key), body, nil)
}

func (r *remote) Messages(fn func(*idem.Message, error) error) error {
	var list idemhttp.AdminMessages
	if err := r.do(http.MethodGet, "/outbox?state=all", nil, &list); err != nil {
		return err
	}
	for i := range list.Messages {
		m, err := r.message(&list.Messages[i])
		if err != nil {
			return err
		}
		if err := fn(m, nil); err != nil {
			return err
		}
	}
	for _, c := range list.Corrupt {
		if err := fn(&idem.Message{Seq: c.Seq, Dead: c.Dead}, fmt.Errorf("message %d: %w", c.Seq, idem.ErrCorrupt)); err != nil {
			return err
		}
	}
	return nil
}

// Message returns message seq, pending or dead; nil if there is none.
func (r *remote) Message(seq uint64) (*idem.Message, error) {
	var m idemhttp.AdminMessage
	err := r.do(http.MethodGet, "/outbox/"+strconv.FormatUint(seq, 10), nil, &m)
	if errors.Is(err, idem.ErrMessageNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return r.message(&m)
}

func (r *remote) RetryDead(seq uint64) error {
	return r.do(http.MethodPost, "/outbox/"+strconv.FormatUint(seq, 10)+"/retry", nil, nil)
}

func (r *remote) DropDead(seq uint64) error {
	return r.do(http.MethodDelete, "/outbox/"+strconv.FormatUint(seq, 10), nil, nil)
}

// Stats is the server engine's counters since Open, from /stats.
func (r *remote) Stats() idem.Stats {
	var s idemhttp.AdminStats
	if err := r.do(http.MethodGet, "/stats", nil, &s); err != nil {
		return idem.Stats{}
	}
	return idem.Stats{
		Pruned: s.SinceOpen.Pruned, Replays: s.SinceOpen.Replays,
		Executions: s.SinceOpen.Executions, Conflicts: s.SinceOpen.Conflicts,
		Commits: s.SinceOpen.Commits, Writes: s.SinceOpen.Writes,
	}
}

func (r *remote) ScanFile() (idem.FileStats, error) {
	var s idemhttp.AdminStats
	if err := r.do(http.MethodGet, "/stats", nil, &s); err != nil {
		return idem.FileStats{}, err
	}
	return idem.FileStats{
		Started: s.Records.Started, Done: s.Records.Done,
		ExpiredPending: s.Records.ExpiredPending, Corrupt: s.Records.Corrupt,
		FileSize: s.FileSize,
		Outbox: idem.OutboxStats{
			Pending: s.Outbox.Pending, Retrying: s.Outbox.Retrying, Waiting: s.Outbox.Waiting,
			Dead: s.Outbox.Dead, Corrupt: s.Outbox.Corrupt, Delivered: s.Outbox.Delivered,
		},
	}, nil
}

func (r *remote) record(a *idemhttp.AdminRecord) (*idem.Record, error) {
	state, err := parseState(a.State)
	if err != nil {
		return nil, r.badAnswer(err)
	}
	fp, err := strconv.ParseUint(a.Fingerprint, 16, 64)
	if err != nil {
		return nil, r.badAnswer(fmt.Errorf("fingerprint %q: %w", a.Fingerprint, err))
	}
	window, err := time.ParseDuration(a.Retention)
	if err != nil {
		return nil, r.badAnswer(fmt.Errorf("retention %q: %w", a.Retention, err))
	}
	rec := &idem.Record{Key: a.Key, State: state, Fingerprint: fp, Attempt: a.Attempt, StartedAt: a.StartedAt,
		Retention: window, KeptUntilResolved: a.KeptUntilResolved}
	if a.CompletedAt != nil {
		rec.CompletedAt = *a.CompletedAt
	}
	if a.Error != nil {
		rec.Err = &idem.Error{Code: a.Error.Code, Message: a.Error.Message}
	}
	if r.expiries == nil {
		r.expiries = map[string]*time.Time{}
	}
	r.expiries[a.Key] = a.ExpiresAt
	if a.ResponseHidden && a.ResponseSize != nil {
		if r.hiddenResponses == nil {
			r.hiddenResponses = map[string]int{}
		}
		r.hiddenResponses[a.Key] = *a.ResponseSize
	}
	if rec.Response, err = r.userBytes(a.Response, a.ResponseEncoding); err != nil {
		return nil, err
	}
	return rec, nil
}

func (r *remote) message(a *idemhttp.AdminMessage) (*idem.Message, error) {
	m := &idem.Message{
		Seq: a.Seq, Topic: a.Topic, Key: a.Key, Index: a.Index,
		DownstreamKey: a.DownstreamKey, OrderingKey: a.OrderingKey,
		Failures: a.Attempt, EnqueuedAt: a.EnqueuedAt, Dead: a.Dead,
	}
	if a.NextAttemptAt != nil {
		m.NextAttemptAt = *a.NextAttemptAt
	}
	if a.DeadAt != nil {
		m.DeadAt = *a.DeadAt
	}
	if a.LastError != nil {
		m.LastError = *a.LastError
	}
	if a.PayloadHidden && a.PayloadSize != nil {
		if r.hiddenPayloads == nil {
			r.hiddenPayloads = map[uint64]int{}
		}
		r.hiddenPayloads[a.Seq] = *a.PayloadSize
	}
	var err error
	if m.Payload, err = r.userBytes(a.Payload, a.PayloadEncoding); err != nil {
		return nil, err
	}
	return m, nil
}

// userBytes is the inverse of the handler's rendering of stored bytes.
func (r *remote) userBytes(text *string, encoding string) ([]byte, error) {
	if text == nil {
		return nil, nil
	}
	if encoding == "base64" {
		b, err := base64.StdEncoding.DecodeString(*text)
		if err != nil {
			return nil, r.badAnswer(err)
		}
		return append([]byte{}, b...), nil
	}
	return []byte(*text), nil
}

func (r *remote) badAnswer(err error) error {
	return fmt.Errorf("idem: %s: unexpected answer from the admin handler: %w", r.base, err)
}

// do sends one request (body, if not nil, as JSON) and decodes the answer
// into out (if not nil); an error answer becomes the engine's error again.
func (r *remote) do(method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(r.ctx, method, r.base+path, rd)
	if err != nil {
		return fmt.Errorf("idem: %s: %w", r.base, err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	if r.token != "" {
		req.Header.Set("Authorization", "Bearer "+r.token)
	}
	resp, err := r.client.Do(req)
	if err != nil {
		return fmt.Errorf("idem: %w", err) // *url.Error names the method and URL
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 256<<20))
	if err != nil {
		return fmt.Errorf("idem: %s %s: %w", method, r.base+path, err)
	}
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if resp.StatusCode >= 300 {
		if mt != "application/problem+json" {
			return fmt.Errorf("idem: %s: HTTP %s from %s %s: not an idem admin handler (idemhttp.Admin)?", r.base, resp.Status, method, path)
		}
		var p idemhttp.AdminProblem
		if err := json.Unmarshal(b, &p); err != nil {
			return r.badAnswer(err)
		}
		return r.problem(&p)
	}
	if mt != "application/json" {
		return fmt.Errorf("idem: %s: %s answers %s %s with %q, not JSON: not an idem admin handler (idemhttp.Admin)?", r.base, resp.Status, method, path, mt)
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(b, out); err != nil {
		return r.badAnswer(err)
	}
	return nil
}

// problemErrors are the engine's sentinels by problem code.
var problemErrors = map[string]error{
	"invalid_key":       idem.ErrInvalidKey,
	"not_found":         idem.ErrNotFound,
	"message_not_found": idem.ErrMessageNotFound,
	"wrong_state":       idem.ErrState,
	"in_progress":       idem.ErrInProgress,
	"corrupt":           idem.ErrCorrupt,
	"closed":            idem.ErrClosed,
}

// problem turns an error answer back into the engine's error: an
// *idem.OpError when the server named the operation, wrapping the sentinel
// of its code, so that the commands print and test it as for a file.
func (r *remote) problem(p *idemhttp.AdminProblem) error {
	if p.Code == "forbidden" {
		hint := "give a token with --token or $IDEM_TOKEN"
		if r.token != "" {
			hint = "the server refused the token"
		}
		return fmt.Errorf("idem: %s: %s (HTTP %d; %s)", r.base, p.Detail, p.Status, hint)
	}
	sentinel, ok := problemErrors[p.Code]
	if !ok {
		return fmt.Errorf("idem: %s: %s (HTTP %d, %s)", r.base, p.Detail, p.Status, p.Code)
	}
	err := &remoteError{msg: p.Detail, sentinel: sentinel}
	if p.Op != "" {
		return &idem.OpError{Op: p.Op, Key: p.Key, Err: err}
	}
	return err
}

// remoteError is an engine error as the admin handler reported it: its text,
// matching its sentinel with errors.Is.
type remoteError struct {
	msg      string
	sentinel error
}

func (e *remoteError) Error() string { return e.msg }
func (e *remoteError) Unwrap() error { return e.sentinel }

// hiddenNote says why a response or payload is not shown with --url.
const hiddenNote = "hidden by the server (idemhttp.AdminOptions.ShowResponses is off)"

func errHiddenByServer(what string) error {
	return fmt.Errorf("idem: the server hides the %s: its idemhttp.AdminOptions.ShowResponses is off", what)
}

// writeRaw writes stored bytes b (a response, a payload: what) to stdout as
// they are, for --raw; refused when the server hides them.
func (a *app) writeRaw(b []byte, hidden bool, what string) error {
	if hidden {
		return errHiddenByServer(what)
	}
	_, err := a.stdout.Write(b)
	return err
}
