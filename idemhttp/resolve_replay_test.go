package idemhttp_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
)

// TestResolvedKeyReplays: a key left interrupted under RecoverRefuse (the
// handler panicked), resolved by an operator through the admin handler in
// each of its forms, is answered to a retry as doc.go's table says, over a
// real loopback server and net/http.
func TestResolvedKeyReplays(t *testing.T) {
	cases := []struct {
		name, resolve string
		status        int
		contentType   string
		body          string // exact body; "" with problem set
		problem       string // problem type, when the answer is a problem
		code          string // the problem's Stripe code
	}{
		{name: "raw response", resolve: `{"response":"manual"}`,
			status: http.StatusOK, contentType: "application/octet-stream", body: "manual"},
		{name: "error", resolve: `{"error":{"code":"refunded","message":"refunded by hand"}}`,
			status: http.StatusInternalServerError, contentType: "application/problem+json",
			problem: idemhttp.ProblemStoredError, code: "refunded"},
		{name: "http form", resolve: `{"http":{"status":201,"headers":{"Content-Type":["application/json"],"Location":["/v1/orders/ord_9"]},"body":"{\"id\":\"ord_9\"}"}}`,
			status: http.StatusCreated, contentType: "application/json", body: `{"id":"ord_9"}`},
		{name: "http form base64", resolve: `{"http":{"status":202,"body":"AAEC","body_encoding":"base64"}}`,
			// No Content-Type stored: net/http sniffs one from the body.
			status: http.StatusAccepted, contentType: "application/octet-stream", body: "\x00\x01\x02"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := openEngine(t, &idem.Options{Recovery: idem.RecoverRefuse})
			var runs atomic.Int64
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs.Add(1)
				panic("handler bug")
			})
			s := newServer(t, e, nil, h)
			admin := adminServer(t, e, adminBearerOpts(false))
			c := noKeepAlive()
			if _, _, err := post(t, c, s.URL, "k1", "x"); err == nil {
				t.Fatal("the panicking request got an answer")
			}
			resp, body := mustPost(t, c, s.URL, "k1", "x")
			if resp.StatusCode != http.StatusConflict || problemOf(t, resp, body).Type != idemhttp.ProblemIncomplete {
				t.Fatalf("before resolve: %d %s", resp.StatusCode, body)
			}
			if ar := adminCall(t, http.MethodPost, admin+"/records/resolve?key=k1", adminToken, json.RawMessage(tc.resolve)); ar.status != http.StatusOK {
				t.Fatalf("resolve: %d %s", ar.status, ar.body)
			}
			for range 2 { // every retry gets the same answer
				resp, body = mustPost(t, c, s.URL, "k1", "x")
				if resp.StatusCode != tc.status || resp.Header.Get("Content-Type") != tc.contentType ||
					resp.Header.Get(idemhttp.HeaderReplayed) != "true" {
					t.Fatalf("retry: %d %q replayed %q: %s", resp.StatusCode, resp.Header.Get("Content-Type"),
						resp.Header.Get(idemhttp.HeaderReplayed), body)
				}
				if tc.problem != "" {
					p := problemOf(t, resp, body)
					if p.Type != tc.problem || p.Error.Code != tc.code || !strings.Contains(string(body), "refunded by hand") {
						t.Fatalf("retry problem: %s", body)
					}
				} else if string(body) != tc.body {
					t.Fatalf("retry body %q, want %q", body, tc.body)
				}
			}
			if tc.name == "http form" && resp.Header.Get("Location") != "/v1/orders/ord_9" {
				t.Fatalf("Location %q", resp.Header.Get("Location"))
			}
			if runs.Load() != 1 {
				t.Fatalf("handler ran %d times", runs.Load())
			}
		})
	}
}

// TestResolveHTTPFormRefused: a bad HTTP form is a 400 and resolves nothing.
func TestResolveHTTPFormRefused(t *testing.T) {
	for name, body := range map[string]string{
		"status 99":         `{"http":{"status":99}}`,
		"status 1000":       `{"http":{"status":1000}}`,
		"set-cookie":        `{"http":{"status":200,"headers":{"Set-Cookie":["a=b"]}}}`,
		"bad header value":  `{"http":{"status":200,"headers":{"X-A":["a\r\nb"]}}}`,
		"bad header name":   `{"http":{"status":200,"headers":{"X A":["a"]}}}`,
		"with response":     `{"http":{"status":200},"response":"x"}`,
		"with error":        `{"http":{"status":200},"error":{"code":"c"}}`,
		"bad body encoding": `{"http":{"status":200,"body":"x","body_encoding":"hex"}}`,
	} {
		t.Run(name, func(t *testing.T) {
			e := openEngine(t, &idem.Options{Recovery: idem.RecoverRefuse})
			s := newServer(t, e, nil, http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("handler bug") }))
			admin := adminServer(t, e, adminBearerOpts(false))
			if _, _, err := post(t, noKeepAlive(), s.URL, "k1", "x"); err == nil {
				t.Fatal("the panicking request got an answer")
			}
			if ar := adminCall(t, http.MethodPost, admin+"/records/resolve?key=k1", adminToken, json.RawMessage(body)); ar.status != http.StatusBadRequest {
				t.Fatalf("resolve: %d %s", ar.status, ar.body)
			}
			rec, err := e.Get("k1")
			if err != nil || rec.State != idem.StateStarted {
				t.Fatalf("after a refused resolve: %+v %v", rec, err)
			}
		})
	}
}

// TestEncodeResponseReplays: what EncodeResponse returns, resolved with the
// engine directly, replays as that answer.
func TestEncodeResponseReplays(t *testing.T) {
	e := openEngine(t, &idem.Options{Recovery: idem.RecoverRefuse})
	s := newServer(t, e, nil, http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("handler bug") }))
	if _, _, err := post(t, noKeepAlive(), s.URL, "k1", "x"); err == nil {
		t.Fatal("the panicking request got an answer")
	}
	b, err := idemhttp.EncodeResponse(http.StatusNoContent, http.Header{"Etag": {`"v1"`}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Resolve("k1", b, nil); err != nil {
		t.Fatal(err)
	}
	resp, body := mustPost(t, noKeepAlive(), s.URL, "k1", "x")
	if resp.StatusCode != http.StatusNoContent || resp.Header.Get("ETag") != `"v1"` || len(body) != 0 {
		t.Fatalf("replay: %d %v %q", resp.StatusCode, resp.Header, body)
	}
	if _, err := idemhttp.EncodeResponse(http.StatusOK, http.Header{"Date": {"x"}}, nil); !errors.Is(err, idemhttp.ErrInvalidResponse) {
		t.Fatalf("EncodeResponse with a Date header: %v", err)
	}

	// Bytes that start as the format (version byte 1) but do not decode
	// are corrupt, not a raw body.
	if _, _, err := post(t, noKeepAlive(), s.URL, "k2", "x"); err == nil {
		t.Fatal("the panicking request got an answer")
	}
	if err := e.Resolve("k2", []byte{1, 0xff}, nil); err != nil {
		t.Fatal(err)
	}
	resp, body = mustPost(t, noKeepAlive(), s.URL, "k2", "x")
	if resp.StatusCode != http.StatusInternalServerError || problemOf(t, resp, body).Type != idemhttp.ProblemStoredResponseCorrupt {
		t.Fatalf("corrupt replay: %d %s", resp.StatusCode, body)
	}
}
