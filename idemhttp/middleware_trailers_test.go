package idemhttp_test

// Trailers behind the middleware: what plain net/http sends (the same
// handler on a server of its own, HTTP/1.1 and HTTP/2) is what the first
// caller and every replay get.

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
)

// checksummed writes a body in three parts (flushing between them, as a
// streaming handler does, by http.Flusher and by http.ResponseController)
// and sets its trailers after the body: X-Checksum declared in the Trailer
// header, X-Parts undeclared through http.TrailerPrefix. It also sets a
// header after WriteHeader, which net/http does not send.
type checksummed struct {
	runs  atomic.Int64
	parts []string
}

func (c *checksummed) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	c.runs.Add(1)
	w.Header().Set("Trailer", "X-Checksum")
	w.Header().Set("Content-Type", "text/plain")
	w.WriteHeader(http.StatusCreated)
	w.Header().Set("Location", "/too-late") // after WriteHeader: not sent
	sum := sha256.New()
	for i, p := range c.parts {
		io.WriteString(w, p)
		sum.Write([]byte(p))
		if i%2 == 0 {
			w.(http.Flusher).Flush()
		} else if err := http.NewResponseController(w).Flush(); err != nil {
			panic(err)
		}
	}
	w.Header().Set("X-Checksum", hex.EncodeToString(sum.Sum(nil)))
	w.Header().Set(http.TrailerPrefix+"X-Parts", strings.Repeat("p", len(c.parts)))
}

// observed is what a client sees of a response.
type observed struct {
	status        int
	contentType   string
	location      string
	headerSum     string // X-Checksum as a header
	declared      string // the Trailer header
	trailer       http.Header
	contentLength int64
	body          string
	replayed      string // Idempotent-Replayed, not in String
}

func observe(t *testing.T, resp *http.Response) observed {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return observed{
		status: resp.StatusCode, contentType: resp.Header.Get("Content-Type"),
		location: resp.Header.Get("Location"), headerSum: resp.Header.Get("X-Checksum"),
		declared: resp.Header.Get("Trailer"), trailer: resp.Trailer, contentLength: resp.ContentLength,
		body: string(b), replayed: resp.Header.Get(idemhttp.HeaderReplayed),
	}
}

func (o observed) String() string {
	return strings.Join([]string{
		"status " + http.StatusText(o.status), "type " + o.contentType, "location " + o.location,
		"header X-Checksum " + o.headerSum, "Trailer " + o.declared, "trailers " + headerString(o.trailer),
		"body " + o.body,
	}, "; ")
}

func headerString(h http.Header) string {
	var b bytes.Buffer
	h.Write(&b)
	return strings.ReplaceAll(b.String(), "\r\n", " ")
}

// sameAnswer compares what a client sees; with framing, whether the body
// came with a Content-Length (HTTP/1.1 sends trailers only in the chunked
// encoding; HTTP/2 frames them either way, and net/http sets a
// Content-Length there for a body written whole, as the middleware writes
// a buffered one).
func sameAnswer(t *testing.T, what string, got, want observed, framing bool) {
	t.Helper()
	if got.String() != want.String() || framing && (got.contentLength == -1) != (want.contentLength == -1) {
		t.Fatalf("%s:\n got  %s (Content-Length %d)\n want %s (Content-Length %d)", what, got, got.contentLength, want, want.contentLength)
	}
}

func TestTrailers(t *testing.T) {
	parts := []string{"alpha ", "beta ", "gamma"}
	for _, h2 := range []bool{false, true} {
		proto := map[bool]string{false: "HTTP/1.1", true: "HTTP/2"}[h2]
		t.Run(proto, func(t *testing.T) {
			start := func(h http.Handler) (string, *http.Client) {
				srv := httptest.NewUnstartedServer(h)
				if h2 {
					srv.EnableHTTP2 = true
					srv.StartTLS()
				} else {
					srv.Start()
				}
				t.Cleanup(srv.Close)
				return srv.URL, srv.Client()
			}
			send := func(c *http.Client, url string) observed {
				req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader("x"))
				req.Header.Set(idemhttp.HeaderKey, "k")
				resp, err := c.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				if h2 && resp.ProtoMajor != 2 {
					t.Fatalf("protocol %s", resp.Proto)
				}
				return observe(t, resp)
			}
			plainURL, plainClient := start(&checksummed{parts: parts})
			want := send(plainClient, plainURL)
			if want.trailer.Get("X-Checksum") == "" || want.trailer.Get("X-Parts") != "ppp" || want.headerSum != "" || want.location != "" {
				t.Fatalf("net/http itself: %s", want)
			}

			h := &checksummed{parts: parts}
			url, c := start(idemhttp.Middleware(openEngine(t, nil), nil)(h))
			first := send(c, url)
			sameAnswer(t, "first caller", first, want, !h2)
			for range 2 {
				again := send(c, url)
				sameAnswer(t, "replay", again, want, !h2)
				if first.replayed != "" || again.replayed != "true" {
					t.Fatalf("replayed: first %q, then %q", first.replayed, again.replayed)
				}
			}
			if h.runs.Load() != 1 {
				t.Fatalf("the handler ran %d times", h.runs.Load())
			}
		})
	}
}

// TestTrailersSizeLimit: trailers count in Options.MaxResponseSize. A
// response whose body fits but whose trailers pass the limit reaches its
// caller whole, trailers included, and is not stored (replays: 500
// ProblemResponseNotStored); so does a response that passes the limit while
// the handler writes (it streams), with its trailers.
func TestTrailersSizeLimit(t *testing.T) {
	parts := []string{"alpha ", "beta ", "gamma"} // 16 bytes
	for _, tc := range []struct {
		name  string
		limit int
	}{
		{"trailers pass the limit", 20},
		{"the body passes the limit", 8},
	} {
		t.Run(tc.name, func(t *testing.T) {
			plainURL := httptestServer(t, &checksummed{parts: parts})
			resp, _, err := post(t, noKeepAlive(), plainURL, "k", "x")
			if err != nil {
				t.Fatal(err)
			}
			wantSum := resp.Trailer.Get("X-Checksum")

			h := &checksummed{parts: parts}
			s := newServer(t, openEngine(t, nil), &idemhttp.Options{MaxResponseSize: tc.limit}, h)
			resp, body := mustPost(t, noKeepAlive(), s.URL, "k", "x")
			if resp.StatusCode != http.StatusCreated || string(body) != strings.Join(parts, "") ||
				resp.Trailer.Get("X-Checksum") != wantSum || resp.Trailer.Get("X-Parts") != "ppp" || resp.Header.Get("X-Checksum") != "" {
				t.Fatalf("first caller: %d %q, header %v, trailer %v", resp.StatusCode, body, resp.Header, resp.Trailer)
			}
			resp, body = mustPost(t, noKeepAlive(), s.URL, "k", "x")
			if resp.StatusCode != http.StatusInternalServerError || problemOf(t, resp, body).Type != idemhttp.ProblemResponseNotStored || h.runs.Load() != 1 {
				t.Fatalf("replay: %d %s, runs %d", resp.StatusCode, body, h.runs.Load())
			}
		})
	}
	t.Run("the stored record passes the engine's limit", func(t *testing.T) {
		h := &checksummed{parts: parts}
		s := newServer(t, openEngine(t, &idem.Options{MaxResponseSize: 64}), nil, h)
		resp, body := mustPost(t, noKeepAlive(), s.URL, "k", "x")
		if resp.StatusCode != http.StatusCreated || string(body) != strings.Join(parts, "") || resp.Trailer.Get("X-Checksum") == "" || resp.Trailer.Get("X-Parts") != "ppp" {
			t.Fatalf("first caller: %d %q, trailer %v", resp.StatusCode, body, resp.Trailer)
		}
		resp, body = mustPost(t, noKeepAlive(), s.URL, "k", "x")
		if resp.StatusCode != http.StatusInternalServerError || problemOf(t, resp, body).Type != idemhttp.ProblemResponseNotStored || h.runs.Load() != 1 {
			t.Fatalf("replay: %d %s, runs %d", resp.StatusCode, body, h.runs.Load())
		}
	})
}

// TestOldFormatReplays: a response stored by an earlier version of the
// middleware (format version 1, no trailers; testdata/response-v1.bin, as
// that version's encoder wrote it, with an X-Checksum header stored among
// the headers) still replays as it was stored.
func TestOldFormatReplays(t *testing.T) {
	old, err := os.ReadFile("testdata/response-v1.bin")
	if err != nil {
		t.Fatal(err)
	}
	e := openEngine(t, &idem.Options{Recovery: idem.RecoverRefuse})
	s := newServer(t, e, nil, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { panic("interrupted") }))
	if _, _, err := post(t, noKeepAlive(), s.URL, "k", "x"); err == nil {
		t.Fatal("the panicking request got an answer")
	}
	if err := e.Resolve("k", old, nil); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		resp, body := mustPost(t, noKeepAlive(), s.URL, "k", "x")
		if resp.StatusCode != http.StatusCreated || string(body) != `{"id":"ord_1"}`+"\n" || resp.ContentLength != int64(len(body)) ||
			resp.Header.Get("Content-Type") != "application/json" || resp.Header.Get("Location") != "/v1/orders/ord_1" ||
			resp.Header.Get("X-Checksum") != "sha256=old" || resp.Header.Get(idemhttp.HeaderReplayed) != "true" || len(resp.Trailer) != 0 {
			t.Fatalf("replay of a version 1 record: %d %q, header %v, trailer %v", resp.StatusCode, body, resp.Header, resp.Trailer)
		}
	}
}

// TestTrailersNeverStored: a trailer net/http refuses (Content-Length,
// declared) is neither declared nor sent (net/http itself sends the Trailer
// header as given, which its own client then refuses: "bad trailer key");
// one that is never stored (Set-Cookie, through http.TrailerPrefix) reaches
// the first caller, as from net/http, and no replay.
func TestTrailersNeverStored(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Trailer", "content-length, x-checksum")
		io.WriteString(w, "body")
		w.Header().Set("Content-Length", "99")
		w.Header().Set("X-Checksum", "c")
		w.Header().Set(http.TrailerPrefix+"Set-Cookie", "session=1")
	})
	s := newServer(t, openEngine(t, nil), nil, h)
	resp, body := mustPost(t, noKeepAlive(), s.URL, "k", "x")
	if got := headerString(resp.Trailer); got != "Set-Cookie: session=1 X-Checksum: c " || string(body) != "body" {
		t.Fatalf("first caller: trailers %q; body %q", got, body)
	}
	resp, body = mustPost(t, noKeepAlive(), s.URL, "k", "x")
	if got := headerString(resp.Trailer); got != "X-Checksum: c " || string(body) != "body" || resp.Header.Get(idemhttp.HeaderReplayed) != "true" {
		t.Fatalf("replay: trailers %q; body %q", got, body)
	}
}
