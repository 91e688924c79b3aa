package idemhttp_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/testkit/boltkit"
)

// The bbolt engine is an Operator.
var _ idemhttp.Operator = (*idem.Engine)(nil)

const adminToken = "s3cret-token"

// adminServer serves Admin(e, opts) on loopback, mounted under /admin/ as the
// docs show, and returns its base URL.
func adminServer(t *testing.T, e idemhttp.Operator, opts *idemhttp.AdminOptions) string {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle("/admin/", http.StripPrefix("/admin", idemhttp.Admin(e, opts)))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL + "/admin"
}

func adminBearerOpts(show bool) *idemhttp.AdminOptions {
	return &idemhttp.AdminOptions{Authorize: idemhttp.AllowBearer(adminToken), ShowResponses: show}
}

type adminReply struct {
	status int
	header http.Header
	body   []byte
}

// adminCall sends one request with a real client; body, if not nil, goes as JSON.
func adminCall(t *testing.T, method, u, token string, body any) adminReply {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		require.NoError(t, err)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, u, rd)
	require.NoError(t, err)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return adminReply{resp.StatusCode, resp.Header, b}
}

func adminDecode[T any](t *testing.T, r adminReply) T {
	t.Helper()
	var v T
	dec := json.NewDecoder(bytes.NewReader(r.body))
	dec.DisallowUnknownFields()
	require.NoError(t, dec.Decode(&v), "body: %s", r.body)
	return v
}

// adminProblemOf checks that r is a problem details answer with status and code.
func adminProblemOf(t *testing.T, r adminReply, status int, code string) idemhttp.AdminProblem {
	t.Helper()
	require.Equal(t, status, r.status, "body: %s", r.body)
	require.Equal(t, "application/problem+json", r.header.Get("Content-Type"))
	p := adminDecode[idemhttp.AdminProblem](t, r)
	require.Equal(t, code, p.Code)
	require.Equal(t, status, p.Status)
	require.True(t, strings.HasSuffix(p.Type, "#AdminProblem-"+code), p.Type)
	return p
}

func adminKeyURL(base, route, key string) string {
	return base + route + "?key=" + url.QueryEscape(key)
}

// adminSeed stores a done record for key with resp.
func adminSeed(t *testing.T, e *idem.Engine, key string, resp []byte) {
	t.Helper()
	_, err := e.Do(context.Background(), key, []byte("args"), func(context.Context) ([]byte, error) { return resp, nil })
	require.NoError(t, err)
}

// adminInterrupt leaves key as an interrupted execution: its fn panics.
func adminInterrupt(t *testing.T, e *idem.Engine, key string) {
	t.Helper()
	func() {
		defer func() { require.NotNil(t, recover()) }()
		_, _ = e.Do(context.Background(), key, []byte("args"), func(context.Context) ([]byte, error) { panic("crash") })
	}()
	rec, err := e.Get(key)
	require.NoError(t, err)
	require.Equal(t, idem.StateStarted, rec.State)
}

// adminWriteRoutes are every route that changes state, as method and path.
var adminWriteRoutes = []struct{ method, path string }{
	{http.MethodDelete, "/records?key=order-1"},
	{http.MethodPost, "/records/resolve?key=order-2"},
	{http.MethodPost, "/outbox/1/retry"},
	{http.MethodDelete, "/outbox/1"},
}

func TestAdminRefusesEveryRequestByDefault(t *testing.T) {
	e, _ := boltkit.OpenFile(t, &idem.BoltOptions{NoSync: true}, nil)
	adminSeed(t, e, "order-1", []byte("r1"))
	adminInterrupt(t, e, "order-2")
	for name, opts := range map[string]*idemhttp.AdminOptions{
		"nil options":        nil,
		"nil Authorize":      {ShowResponses: true},
		"empty bearer":       {Authorize: idemhttp.AllowBearer("")},
		"wrong bearer":       adminBearerOpts(true),
		"refusing Authorize": {Authorize: func(*http.Request, idemhttp.AdminAction) bool { return false }},
	} {
		t.Run(name, func(t *testing.T) {
			base := adminServer(t, e, opts)
			for _, path := range []string{"/", "/stats", "/records?key=order-1", "/outbox", "/outbox/1"} {
				p := adminProblemOf(t, adminCall(t, http.MethodGet, base+path, "wrong", nil), http.StatusForbidden, "forbidden")
				require.NotContains(t, p.Detail, "r1")
			}
			for _, wr := range adminWriteRoutes {
				adminProblemOf(t, adminCall(t, wr.method, base+wr.path, "wrong", map[string]any{"response": "x"}), http.StatusForbidden, "forbidden")
			}
		})
	}
	rec, err := e.Get("order-1")
	require.NoError(t, err, "forget was refused")
	require.Equal(t, []byte("r1"), rec.Response)
	rec, err = e.Get("order-2")
	require.NoError(t, err)
	require.Equal(t, idem.StateStarted, rec.State, "resolve was refused")
}

func TestAdminAuthorizeSeesTheAction(t *testing.T) {
	e, _ := boltkit.OpenFile(t, &idem.BoltOptions{NoSync: true}, nil)
	adminSeed(t, e, "order-1", []byte("r1"))
	var mu sync.Mutex
	var seen []idemhttp.AdminAction
	readOnly := func(r *http.Request, a idemhttp.AdminAction) bool {
		mu.Lock()
		seen = append(seen, a)
		mu.Unlock()
		return a == idemhttp.AdminRead
	}
	base := adminServer(t, e, &idemhttp.AdminOptions{Authorize: readOnly})
	require.Equal(t, http.StatusOK, adminCall(t, http.MethodGet, adminKeyURL(base, "/records", "order-1"), "", nil).status)
	adminProblemOf(t, adminCall(t, http.MethodDelete, adminKeyURL(base, "/records", "order-1"), "", nil), http.StatusForbidden, "forbidden")
	require.Equal(t, []idemhttp.AdminAction{idemhttp.AdminRead, idemhttp.AdminWrite}, seen)
	_, err := e.Get("order-1")
	require.NoError(t, err, "a read-only caller forgot nothing")
}

func TestAdminNoGetChangesState(t *testing.T) {
	e, _ := boltkit.OpenFile(t, &idem.BoltOptions{NoSync: true}, nil)
	adminSeed(t, e, "order-1", []byte("r1"))
	adminInterrupt(t, e, "order-2")
	base := adminServer(t, e, adminBearerOpts(true))
	for _, wr := range adminWriteRoutes {
		for _, m := range []string{http.MethodGet, http.MethodHead} {
			r := adminCall(t, m, base+wr.path, adminToken, nil)
			if wr.method == http.MethodDelete {
				// GET on a DELETE route's path is the read of the resource.
				require.Contains(t, []int{http.StatusOK, http.StatusNotFound}, r.status, "%s %s", m, wr.path)
				continue
			}
			require.Equal(t, http.StatusMethodNotAllowed, r.status, "%s %s", m, wr.path)
			require.Contains(t, r.header.Get("Allow"), wr.method)
		}
	}
	// A write method on a read route is refused too.
	require.Equal(t, http.StatusMethodNotAllowed, adminCall(t, http.MethodPost, base+"/stats", adminToken, nil).status)
	rec, err := e.Get("order-1")
	require.NoError(t, err)
	require.Equal(t, idem.StateDone, rec.State)
	rec, err = e.Get("order-2")
	require.NoError(t, err)
	require.Equal(t, idem.StateStarted, rec.State)
}

func TestAdminRecordResponseShownOnlyByOption(t *testing.T) {
	e, _ := boltkit.OpenFile(t, &idem.BoltOptions{NoSync: true}, &idem.Options{Retention: time.Hour})
	adminSeed(t, e, "text", []byte(`{"order":"o-1"}`))
	adminSeed(t, e, "binary", []byte("\xff\x00\xfe"))
	adminSeed(t, e, "empty", []byte{})
	adminSeed(t, e, "none", nil)
	_, err := e.Do(context.Background(), "declined", nil, func(context.Context) ([]byte, error) {
		return nil, idem.WithCode(errors.New("card declined"), "card_declined")
	})
	require.Error(t, err)

	hidden := adminServer(t, e, adminBearerOpts(false))
	shown := adminServer(t, e, adminBearerOpts(true))
	size := func(n int) *int { return &n }
	str := func(s string) *string { return &s }
	tests := []struct {
		key              string
		size             *int
		response         *string
		encoding         string
		hiddenWhenHidden bool
	}{
		{"text", size(15), str(`{"order":"o-1"}`), "utf-8", true},
		{"binary", size(3), str("/wD+"), "base64", true},
		{"empty", size(0), str(""), "utf-8", true},
		{"none", nil, nil, "", false},
	}
	for _, tt := range tests {
		t.Run(tt.key, func(t *testing.T) {
			r := adminCall(t, http.MethodGet, adminKeyURL(hidden, "/records", tt.key), adminToken, nil)
			require.Equal(t, http.StatusOK, r.status)
			require.Equal(t, "no-store", r.header.Get("Cache-Control"))
			rec := adminDecode[idemhttp.AdminRecord](t, r)
			require.Equal(t, tt.key, rec.Key)
			require.Equal(t, "done", rec.State)
			require.Equal(t, tt.size, rec.ResponseSize)
			require.Nil(t, rec.Response)
			require.Equal(t, tt.hiddenWhenHidden, rec.ResponseHidden)
			if tt.response != nil && *tt.response != "" {
				require.NotContains(t, string(r.body), *tt.response+`"`, "hidden means absent from the bytes")
			}

			rec = adminDecode[idemhttp.AdminRecord](t, adminCall(t, http.MethodGet, adminKeyURL(shown, "/records", tt.key), adminToken, nil))
			require.Equal(t, tt.size, rec.ResponseSize)
			require.Equal(t, tt.response, rec.Response)
			require.Equal(t, tt.encoding, rec.ResponseEncoding)
			require.False(t, rec.ResponseHidden)
			require.NotNil(t, rec.ExpiresAt)
			require.Equal(t, rec.CompletedAt.Add(time.Hour), *rec.ExpiresAt)
		})
	}
	rec := adminDecode[idemhttp.AdminRecord](t, adminCall(t, http.MethodGet, adminKeyURL(hidden, "/records", "declined"), adminToken, nil))
	require.Equal(t, &idemhttp.AdminErrorJSON{Code: "card_declined", Message: "card declined"}, rec.Error)

	idx := adminDecode[idemhttp.AdminIndex](t, adminCall(t, http.MethodGet, hidden+"/", adminToken, nil))
	require.Equal(t, idemhttp.AdminIndex{Retention: "1h0m0s", RetentionSeconds: 3600, ShowResponses: false}, idx)
}

func TestAdminKeysTravelEscaped(t *testing.T) {
	e, _ := boltkit.OpenFile(t, &idem.BoltOptions{NoSync: true}, nil)
	base := adminServer(t, e, adminBearerOpts(true))
	for _, key := range []string{"a/b/../c", "with space&x=1?#", "ключ-%2F", ".."} {
		adminSeed(t, e, key, []byte("v"))
		rec := adminDecode[idemhttp.AdminRecord](t, adminCall(t, http.MethodGet, adminKeyURL(base, "/records", key), adminToken, nil))
		require.Equal(t, key, rec.Key)
		require.Equal(t, http.StatusOK, adminCall(t, http.MethodDelete, adminKeyURL(base, "/records", key), adminToken, nil).status)
		_, err := e.Get(key)
		require.ErrorIs(t, err, idem.ErrNotFound, key)
	}
	adminProblemOf(t, adminCall(t, http.MethodGet, base+"/records", adminToken, nil), http.StatusBadRequest, "bad_request")
	adminProblemOf(t, adminCall(t, http.MethodGet, base+"/records?key=a&key=b", adminToken, nil), http.StatusBadRequest, "bad_request")
	p := adminProblemOf(t, adminCall(t, http.MethodGet, adminKeyURL(base, "/records", ""), adminToken, nil), http.StatusBadRequest, "invalid_key")
	require.Equal(t, "get", p.Op)
}

func TestAdminForget(t *testing.T) {
	e, _ := boltkit.OpenFile(t, &idem.BoltOptions{NoSync: true}, nil)
	adminSeed(t, e, "order-1", []byte("r1"))
	base := adminServer(t, e, adminBearerOpts(false))
	r := adminCall(t, http.MethodDelete, adminKeyURL(base, "/records", "order-1"), adminToken, nil)
	require.Equal(t, http.StatusOK, r.status)
	require.JSONEq(t, `{"key":"order-1","forgotten":true}`, string(r.body))
	p := adminProblemOf(t, adminCall(t, http.MethodGet, adminKeyURL(base, "/records", "order-1"), adminToken, nil), http.StatusNotFound, "not_found")
	require.Equal(t, idemhttp.AdminProblem{Type: p.Type, Title: "Not Found", Status: 404, Detail: "record not found",
		Code: "not_found", Op: "get", Key: "order-1"}, p)
	adminProblemOf(t, adminCall(t, http.MethodDelete, adminKeyURL(base, "/records", "order-1"), adminToken, nil), http.StatusNotFound, "not_found")

	ran := false
	_, err := e.Do(context.Background(), "order-1", []byte("args"), func(context.Context) ([]byte, error) { ran = true; return nil, nil })
	require.NoError(t, err)
	require.True(t, ran, "a forgotten key runs as new")
}

func TestAdminForgetWhileRunningIsInProgress(t *testing.T) {
	e, _ := boltkit.OpenFile(t, &idem.BoltOptions{NoSync: true}, &idem.Options{RetryAfter: 1500 * time.Millisecond})
	base := adminServer(t, e, adminBearerOpts(false))
	running, release := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := e.Do(context.Background(), "slow", nil, func(context.Context) ([]byte, error) {
			close(running)
			<-release
			return []byte("ok"), nil
		})
		done <- err
	}()
	<-running
	r := adminCall(t, http.MethodDelete, adminKeyURL(base, "/records", "slow"), adminToken, nil)
	close(release)
	adminProblemOf(t, r, http.StatusConflict, "in_progress")
	require.NotEmpty(t, r.header.Get("Retry-After"))
	require.NoError(t, <-done)
	rec, err := e.Get("slow")
	require.NoError(t, err)
	require.Equal(t, []byte("ok"), rec.Response, "the running call kept its key")
}

func TestAdminResolve(t *testing.T) {
	e, _ := boltkit.OpenFile(t, &idem.BoltOptions{NoSync: true}, &idem.Options{Recovery: idem.RecoverRefuse})
	base := adminServer(t, e, &idemhttp.AdminOptions{Authorize: idemhttp.AllowBearer(adminToken), MaxBody: 1024})
	adminInterrupt(t, e, "order-1")
	adminInterrupt(t, e, "order-2")
	adminInterrupt(t, e, "order-3")
	adminSeed(t, e, "done", []byte("d"))

	t.Run("refusals change nothing", func(t *testing.T) {
		u := adminKeyURL(base, "/records/resolve", "order-1")
		req, err := http.NewRequest(http.MethodPost, u, strings.NewReader(`{"response":"x"}`))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+adminToken)
		req.Header.Set("Content-Type", "text/plain") // a form or text post: not JSON
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusUnsupportedMediaType, resp.StatusCode)

		adminProblemOf(t, adminCall(t, http.MethodPost, u, adminToken, map[string]any{"respnse": "typo"}), http.StatusBadRequest, "bad_request")
		adminProblemOf(t, adminCall(t, http.MethodPost, u, adminToken, map[string]any{"response": "!", "response_encoding": "base64"}), http.StatusBadRequest, "bad_request")
		adminProblemOf(t, adminCall(t, http.MethodPost, u, adminToken, map[string]any{"response": "x", "response_encoding": "latin1"}), http.StatusBadRequest, "bad_request")
		adminProblemOf(t, adminCall(t, http.MethodPost, u, adminToken, map[string]any{"response": strings.Repeat("x", 2048)}), http.StatusRequestEntityTooLarge, "too_large")
		rec, err := e.Get("order-1")
		require.NoError(t, err)
		require.Equal(t, idem.StateStarted, rec.State)
	})

	t.Run("with a response", func(t *testing.T) {
		r := adminCall(t, http.MethodPost, adminKeyURL(base, "/records/resolve", "order-1"), adminToken, map[string]any{"response": "/wD+", "response_encoding": "base64"})
		require.Equal(t, http.StatusOK, r.status, "%s", r.body)
		rec := adminDecode[idemhttp.AdminRecord](t, r)
		require.Equal(t, "done", rec.State)
		require.Equal(t, 3, *rec.ResponseSize)
		res, err := e.Do(context.Background(), "order-1", []byte("args"), func(context.Context) ([]byte, error) { panic("must not run") })
		require.NoError(t, err)
		require.True(t, res.Replayed)
		require.Equal(t, []byte("\xff\x00\xfe"), res.Response)
	})

	t.Run("with an error", func(t *testing.T) {
		r := adminCall(t, http.MethodPost, adminKeyURL(base, "/records/resolve", "order-2"), adminToken,
			map[string]any{"error": map[string]string{"code": "card_declined", "message": "declined downstream"}})
		require.Equal(t, http.StatusOK, r.status, "%s", r.body)
		_, err := e.Do(context.Background(), "order-2", []byte("args"), func(context.Context) ([]byte, error) { panic("must not run") })
		var ie *idem.Error
		require.ErrorAs(t, err, &ie)
		require.Equal(t, "card_declined", ie.Code)
		require.Equal(t, "declined downstream", ie.Message)
	})

	t.Run("empty is not none", func(t *testing.T) {
		r := adminCall(t, http.MethodPost, adminKeyURL(base, "/records/resolve", "order-3"), adminToken, map[string]any{"response": ""})
		require.Equal(t, http.StatusOK, r.status, "%s", r.body)
		rec, err := e.Get("order-3")
		require.NoError(t, err)
		require.NotNil(t, rec.Response)
		require.Empty(t, rec.Response)
	})

	t.Run("a done record", func(t *testing.T) {
		p := adminProblemOf(t, adminCall(t, http.MethodPost, adminKeyURL(base, "/records/resolve", "done"), adminToken, map[string]any{"response": "x"}),
			http.StatusConflict, "wrong_state")
		require.Equal(t, "resolve", p.Op)
		adminProblemOf(t, adminCall(t, http.MethodPost, adminKeyURL(base, "/records/resolve", "nothing"), adminToken, map[string]any{}),
			http.StatusNotFound, "not_found")
	})
}

func TestAdminStats(t *testing.T) {
	e, _ := boltkit.OpenFile(t, &idem.BoltOptions{NoSync: true}, nil)
	adminSeed(t, e, "a", []byte("1"))
	adminSeed(t, e, "a", []byte("1")) // a replay
	adminInterrupt(t, e, "b")
	base := adminServer(t, e, adminBearerOpts(false))
	s := adminDecode[idemhttp.AdminStats](t, adminCall(t, http.MethodGet, base+"/stats", adminToken, nil))
	require.Equal(t, 1, s.Records.Started)
	require.Equal(t, 1, s.Records.Done)
	require.Equal(t, uint64(2), s.SinceOpen.Executions)
	require.Equal(t, uint64(1), s.SinceOpen.Replays)
	require.Positive(t, s.FileSize)
	require.Equal(t, "24h0m0s", s.Retention)
}

// adminDeadLetters opens an engine whose "charge" handler fails (one attempt
// each: a dead letter) until the returned function is called, enqueues one
// charge per key and one "email" message (no handler: it stays pending), and
// waits until the charges are dead letters.
func adminDeadLetters(t *testing.T, keys ...string) (e *idem.Engine, acceptCharges func()) {
	t.Helper()
	var accept atomic.Bool
	e, _ = boltkit.OpenFile(t, &idem.BoltOptions{NoSync: true}, &idem.Options{Outbox: idem.OutboxOptions{
		Dispatch: true, PollInterval: time.Millisecond, MaxAttempts: 1,
		Handlers: map[string]idem.Handler{"charge": func(context.Context, idem.Message) error {
			if accept.Load() {
				return nil
			}
			return errors.New("declined")
		}},
	}})
	for _, k := range keys {
		_, err := e.DoTx(context.Background(), k, nil, func(_ context.Context, tx *idem.Tx) ([]byte, error) {
			return nil, tx.Enqueue("charge", []byte("pay "+k))
		})
		require.NoError(t, err)
	}
	_, err := e.DoTx(context.Background(), "mail", nil, func(_ context.Context, tx *idem.Tx) ([]byte, error) {
		return nil, tx.Enqueue("email", []byte("\xffhello"))
	})
	require.NoError(t, err)
	deadline := time.Now().Add(10 * time.Second)
	for {
		s, err := e.ScanFile()
		require.NoError(t, err)
		if s.Outbox.Dead == len(keys) {
			return e, func() { accept.Store(true) }
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %d dead letters after 10 s: %+v", len(keys), s.Outbox)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestAdminOutbox(t *testing.T) {
	e, acceptCharges := adminDeadLetters(t, "order-1", "order-2")
	hidden := adminServer(t, e, adminBearerOpts(false))
	shown := adminServer(t, e, adminBearerOpts(true))

	all := adminDecode[idemhttp.AdminMessages](t, adminCall(t, http.MethodGet, hidden+"/outbox", adminToken, nil))
	require.Equal(t, 3, all.Matched)
	require.Len(t, all.Messages, 3)
	require.Equal(t, "email", all.Messages[0].Topic, "pending first")
	require.False(t, all.Messages[0].Dead)
	require.True(t, all.Messages[1].Dead)
	require.Equal(t, "declined", *all.Messages[1].LastError)
	for _, m := range all.Messages {
		require.True(t, m.PayloadHidden)
		require.Nil(t, m.Payload)
	}
	require.NotContains(t, string(adminCall(t, http.MethodGet, hidden+"/outbox", adminToken, nil).body), "pay order")

	dead := adminDecode[idemhttp.AdminMessages](t, adminCall(t, http.MethodGet, shown+"/outbox?state=dead&limit=1", adminToken, nil))
	require.Equal(t, 2, dead.Matched)
	require.Len(t, dead.Messages, 1)
	first := dead.Messages[0]
	require.Equal(t, "order-1", first.Key)
	require.Equal(t, "order-1/0", first.DownstreamKey)
	require.Equal(t, "pay order-1", *first.Payload)
	require.Equal(t, "utf-8", first.PayloadEncoding)

	pending := adminDecode[idemhttp.AdminMessages](t, adminCall(t, http.MethodGet, shown+"/outbox?state=pending&topic=email", adminToken, nil))
	require.Len(t, pending.Messages, 1)
	mail := pending.Messages[0]
	require.Equal(t, "base64", mail.PayloadEncoding)
	none := adminDecode[idemhttp.AdminMessages](t, adminCall(t, http.MethodGet, shown+"/outbox?topic=sms", adminToken, nil))
	require.Zero(t, none.Matched)
	require.NotNil(t, none.Messages)
	adminProblemOf(t, adminCall(t, http.MethodGet, shown+"/outbox?state=gone", adminToken, nil), http.StatusBadRequest, "bad_request")
	adminProblemOf(t, adminCall(t, http.MethodGet, shown+"/outbox?limit=-1", adminToken, nil), http.StatusBadRequest, "bad_request")

	seqURL := func(seq uint64) string { return hidden + "/outbox/" + adminItoa(seq) }
	one := adminDecode[idemhttp.AdminMessage](t, adminCall(t, http.MethodGet, seqURL(first.Seq), adminToken, nil))
	require.Equal(t, first.Key, one.Key)
	adminProblemOf(t, adminCall(t, http.MethodGet, hidden+"/outbox/999", adminToken, nil), http.StatusNotFound, "message_not_found")
	adminProblemOf(t, adminCall(t, http.MethodGet, hidden+"/outbox/x", adminToken, nil), http.StatusBadRequest, "bad_request")

	// A pending message is neither retried nor dropped.
	adminProblemOf(t, adminCall(t, http.MethodPost, seqURL(mail.Seq)+"/retry", adminToken, nil), http.StatusNotFound, "message_not_found")
	adminProblemOf(t, adminCall(t, http.MethodDelete, seqURL(mail.Seq), adminToken, nil), http.StatusNotFound, "message_not_found")

	r := adminCall(t, http.MethodDelete, seqURL(dead.Messages[0].Seq), adminToken, nil)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	require.JSONEq(t, `{"op":"drop","seq":`+adminItoa(first.Seq)+`}`, string(r.body))

	second := all.Messages[2]
	acceptCharges()
	r = adminCall(t, http.MethodPost, seqURL(second.Seq)+"/retry", adminToken, nil)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	deadline := time.Now().Add(10 * time.Second)
	for {
		s, err := e.ScanFile()
		require.NoError(t, err)
		if s.Outbox.Delivered == 1 {
			require.Zero(t, s.Outbox.Dead)
			require.Equal(t, 1, s.Outbox.Pending, "only the email is left")
			break
		}
		require.False(t, time.Now().After(deadline), "the retried dead letter was not delivered: %+v", s.Outbox)
		time.Sleep(time.Millisecond)
	}
	adminProblemOf(t, adminCall(t, http.MethodPost, seqURL(second.Seq)+"/retry", adminToken, nil), http.StatusNotFound, "message_not_found")
}

func adminItoa(n uint64) string { return strconv.FormatUint(n, 10) }
